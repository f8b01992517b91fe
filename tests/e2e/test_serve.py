"""`headrace serve` as a team deploys it: a real server process, real sockets."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from headrace.pipelines.moderation import samples
from headrace.store.sqlite.wake import DIRECTORY_SUFFIX
from tests.integration.api import error_code
from tests.objectstore import CREDENTIALS, ENDPOINT, fresh_bucket, keys_in, media_url, reachable

from .commands import ROOT, environment, failure_line, headrace
from .server import Server, serving, start, stop

pytestmark = pytest.mark.realtime

DEPLOYED = "headrace.pipelines.moderation.deploy:make_app"


def wait_for_state(client: httpx.Client, url: str, headers: dict[str, str], state: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if client.get(url, headers=headers).json().get("state") == state:
            return
        time.sleep(0.1)
    raise AssertionError(f"{url} never reached {state}")


def test_an_upload_is_processed_by_the_workers_in_the_serving_process(tmp_path: Path) -> None:
    with serving(tmp_path) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        answer = client.post(
            "/v1/events/gala/uploads",
            headers=server.auth("uploader"),
            files={"file": ("p.jpg", samples.jpeg(640, 480))},
        )
        assert answer.status_code == 202
        item = f"/v1/items/{answer.json()['media_id']}"
        wait_for_state(client, item, server.auth("moderator"), "reviewable")
        approved = client.post(f"{item}/approve", headers=server.auth("moderator"))
        assert approved.json()["item"]["state"] == "approved"
        assert client.get("/healthz").json() == {"status": "ok"}
    # The access log names routes, never raw paths or query strings.
    requests = [line for line in server.log if "headrace.http" in line]
    assert any("POST /v1/events/{event}/uploads 202" in line for line in requests)
    assert not any(answer.json()["media_id"] in line for line in requests)


def test_an_upload_declared_too_large_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    with serving(tmp_path) as server:
        address = urlsplit(server.url)
        assert address.hostname is not None and address.port is not None
        with socket.create_connection((address.hostname, address.port), timeout=10) as conn:
            head = (
                "POST /v1/events/gala/uploads HTTP/1.1\r\n"
                f"Host: {address.netloc}\r\n"
                f"Authorization: Bearer {server.tokens['uploader']}\r\n"
                "Content-Type: multipart/form-data; boundary=b\r\n"
                f"Content-Length: {8 << 30}\r\n\r\n"  # 8 GiB announced, none of it sent
            )
            conn.sendall(head.encode())
            answer = ""
            while "}}" not in answer and (chunk := conn.recv(4096)):
                answer += chunk.decode("latin-1")
        assert answer.startswith("HTTP/1.1 413"), answer
        assert '"code":"too_large"' in answer
        assert not any(server.media.glob("blobs/*/*"))


def test_allowed_hosts_are_the_only_names_answered(tmp_path: Path) -> None:
    hosts = ("--allowed-host", "media.example", "--allowed-host", "LOCALHOST")
    with serving(tmp_path, *hosts) as server, httpx.Client(base_url=server.url) as client:
        port = urlsplit(server.url).port
        refused = client.get("/healthz")  # Host: 127.0.0.1, not named
        assert refused.status_code == 400
        assert error_code(refused) == "bad_host"
        for host in ("media.example", f"localhost:{port}"):
            assert client.get("/healthz", headers={"Host": host}).json() == {"status": "ok"}


def test_workers_zero_leaves_the_work_to_worker_processes(tmp_path: Path) -> None:
    with (
        serving(tmp_path, "--workers", "0") as server,
        httpx.Client(base_url=server.url, timeout=30) as client,
    ):
        answer = client.post(
            "/v1/events/gala/uploads",
            headers=server.auth("uploader"),
            files={"file": ("p.jpg", samples.jpeg(320, 240))},
        )
        stages = client.get("/v1/stages", headers=server.auth("admin")).json()["stages"]
        assert [(s["kind"], s["ready"]) for s in stages] == [("moderation.validate.image", 1)]
        item = f"/v1/items/{answer.json()['media_id']}"
        assert client.get(item, headers=server.auth("moderator")).json()["state"] == "accepted"
        command = [sys.executable, "-m", "headrace", "worker", DEPLOYED, "--db", str(server.db)]
        worker = subprocess.Popen(
            command, cwd=ROOT, env=environment({"HEADRACE_MEDIA": str(server.media)})
        )
        try:
            wait_for_state(client, item, server.auth("moderator"), "reviewable")
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=30) == 0


def test_sigterm_stops_the_server_and_its_workers_cleanly(tmp_path: Path) -> None:
    server = start(tmp_path)
    assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
    assert stop(server, signal.SIGTERM) == 0
    assert not any("Traceback" in line for line in server.log)
    said = "".join(server.log)
    assert "SIGTERM: draining: no new connections" in said
    assert "stopped after" in said and "waited for 0 requests in flight, 1 worker" in said


def test_sigterm_lets_a_request_in_flight_finish_and_says_so(tmp_path: Path) -> None:
    """An upload half sent when SIGTERM comes: the server says it drains, waiting for it; the
    upload's rest arrives, it is answered 202, and the server says it stopped, and exits 0."""
    server = start(tmp_path)
    address = urlsplit(server.url)
    assert address.hostname is not None and address.port is not None
    body, boundary = upload_body(samples.jpeg(320, 240))
    head = (
        "POST /v1/events/gala/uploads HTTP/1.1\r\n"
        f"Host: {address.netloc}\r\n"
        f"Authorization: Bearer {server.tokens['uploader']}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    try:
        with socket.create_connection((address.hostname, address.port), timeout=30) as conn:
            conn.sendall(head.encode() + body[: len(body) // 2])
            # Answered after the upload's first half arrived: the server has its request.
            assert httpx.get(f"{server.url}/livez", timeout=30).status_code == 200
            server.process.send_signal(signal.SIGTERM)
            draining = wait_for_line(server, "SIGTERM: draining")
            assert "waiting for 1 request in flight, 1 worker (up to 30s)" in draining
            conn.sendall(body[len(body) // 2 :])
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 202"), answer[:200]
        assert server.process.wait(timeout=30) == 0
    finally:
        stop(server)
    stopped = wait_for_line(server, "stopped after")
    assert "waited for 1 request in flight, 1 worker" in stopped
    assert "".join(server.log).index("SIGTERM: draining") < "".join(server.log).index(stopped)


def upload_body(data: bytes) -> tuple[bytes, str]:
    """A multipart form with `data` as its file, and its boundary."""
    boundary = "headrace-test-boundary"
    part = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="p.jpg"\r\n'
        "Content-Type: image/jpeg\r\n\r\n"
    )
    return part.encode() + data + f"\r\n--{boundary}--\r\n".encode(), boundary


def wait_for_line(server: Server, text: str) -> str:
    """The first line of the server's log holding `text`, once it is written (30 s at most)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in list(server.log):
            if text in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no line with {text!r} in: {''.join(server.log)}")


def test_a_port_in_use_is_one_line_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = headrace(
            "serve", "--db", str(tmp_path / "x.db"), "--media", str(tmp_path), "--port", str(port)
        )
    line = failure_line(done)
    assert f"127.0.0.1:{port}" in line and "another process listens there" in line


def test_token_commands_make_and_revoke_tokens(tmp_path: Path) -> None:
    db = str(tmp_path / "serve.db")  # the store `serving` runs on
    made = headrace("token", "create", "--db", db, "ana", "--role", "moderator", "--event", "gala")
    assert made.returncode == 0 and made.stdout.startswith("hr_")
    wrong = headrace("token", "create", "--db", db, "bo", "--role", "moderator", "--event", "*")
    assert "only an admin token covers every event" in failure_line(wrong)
    revoked = headrace("token", "revoke", "--db", db, "ana")
    assert revoked.stdout.strip() == "1 token(s) of ana revoked"
    with serving(tmp_path, tokens={}) as server, httpx.Client(base_url=server.url) as client:
        gone = client.get("/v1/stages", headers={"Authorization": f"Bearer {made.stdout.strip()}"})
        assert gone.status_code == 401


def test_media_in_a_bucket_is_served_by_redirect_and_by_stream(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"  # where the service spools uploads and decodes originals
    scratch.mkdir()
    env = {**CREDENTIALS, "TMPDIR": str(scratch)}
    uploads = {"photo": samples.jpeg(640, 480), "clip": samples.mp4(1.0, 320, 240)}
    with fresh_bucket() as bucket:
        where = ("--media", media_url(bucket))
        with (
            serving(tmp_path, *where, env=env) as server,
            httpx.Client(base_url=server.url, timeout=30) as client,
        ):
            assert client.get("/readyz").json() == {"status": "ok"}  # the bucket answers
            ids = []
            for name, data in uploads.items():
                answer = client.post(
                    "/v1/events/gala/uploads",
                    headers=server.auth("uploader"),
                    files={"file": (name, data)},
                )
                assert answer.status_code == 202, answer.text
                ids.append(answer.json()["media_id"])
            for media_id in ids:
                wait_for_state(
                    client, f"/v1/items/{media_id}", server.auth("moderator"), "reviewable"
                )
                redirect = client.get(
                    f"/v1/items/{media_id}/preview", headers=server.auth("moderator")
                )
                assert redirect.status_code == 307, redirect.text
                assert redirect.headers["cache-control"] == "private, no-store"
                location = redirect.headers["location"]
                assert location.startswith(f"{ENDPOINT}/{bucket}/media/derived/{media_id}/")
                assert is_webp(httpx.get(location, timeout=30).content)
        assert f"media s3://{bucket}/media at {ENDPOINT}" in "".join(server.log)
        # The test server's secret is a common word (`test`): looked for as a word of its own.
        secret = re.compile(
            rf"(?<![\w/.-]){re.escape(CREDENTIALS['AWS_SECRET_ACCESS_KEY'])}(?![\w/.-])"
        )
        assert not any("X-Amz" in line or secret.search(line) for line in server.log)
        stream = ("--media-delivery", "stream")
        with (
            serving(tmp_path, *where, *stream, tokens=server.tokens, env=env) as again,
            httpx.Client(base_url=again.url, timeout=30) as client,
        ):
            for media_id in ids:
                streamed = client.get(
                    f"/v1/items/{media_id}/preview", headers=again.auth("moderator")
                )
                assert streamed.status_code == 200 and is_webp(streamed.content)
        kept = keys_in(bucket)
    assert sum(1 for key in kept if key.startswith("media/blobs/")) == len(uploads)
    assert sum(1 for key in kept if key.endswith("/manifest.json")) == len(uploads)
    assert not server.media.exists()  # no local media directory was written
    # Nothing on the way stayed behind. (The SQLite store's wake-up directory is made in the
    # temporary directory when a socket's path beside its file would be too long: it is the
    # store's meeting place, not an upload's.)
    assert [p for p in scratch.iterdir() if not p.name.endswith(DIRECTORY_SUFFIX)] == []


def is_webp(data: bytes) -> bool:
    return data[:4] == b"RIFF" and data[8:12] == b"WEBP"


@pytest.mark.parametrize(
    ("media", "says"),
    [
        ("s3://Media", "--media: expected s3://BUCKET/PREFIX?endpoint="),
        ("s3://media?acl=public", "--media: an s3:// URL takes the options"),
        ("s3://media?endpoint=http://127.0.0.1:9", "--media s3://media/ at http://127.0.0.1:9:"),
        (f"s3://no-such-bucket?endpoint={ENDPOINT}", "<Code>NoSuchBucket</Code>"),
    ],
)
def test_a_media_store_that_cannot_be_used_is_one_line_naming_it(
    tmp_path: Path, media: str, says: str
) -> None:
    if ENDPOINT in media:
        reachable()
    command = ("serve", "--db", str(tmp_path / "x.db"), "--media", media, "--port", "0")
    done = headrace(*command, env=CREDENTIALS)  # given, so no instance role is looked for
    assert says in failure_line(done)
