"""How the service's answers follow HTTP, in process: compression of text (never media, never a
Range's answer), caching of static files, conditional requests and ranges on media (RFC 9110),
one error shape everywhere (RFC 9457 problems, mounted apps' errors too), forms and JSON bodies
that cannot be read, and the OpenAPI document's security scheme."""

from __future__ import annotations

import gzip
from email.utils import formatdate
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest

from headrace.pipelines.moderation import samples
from headrace.service.api.delivery import DOCS_FILES, PAGE_FILES

from .api import error_code, harness, problem, reviewable, sign_in

pytestmark = pytest.mark.anyio

GZIP = {"Accept-Encoding": "gzip"}
STATIC = Path(str(resources.files("headrace.service.api").joinpath("static")))


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real time: the SQLite store's thread


# -- compression and caching


async def test_text_is_compressed_and_media_never(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        photo = await reviewable(h)
        note = await reviewable(h, data=samples.voice_note(1.0))
        await sign_in(h, "moderator")
        page = await h.client.get("/moderate/gala", headers=GZIP)
        assert page.headers["content-encoding"] == "gzip"
        assert "accept-encoding" in page.headers["vary"].lower()
        async with h.client.stream("GET", "/static/page.js", headers=GZIP) as script:
            sent = b"".join([chunk async for chunk in script.aiter_raw()])
        assert script.headers["content-encoding"] == "gzip"
        assert gzip.decompress(sent) == (STATIC / "page.js").read_bytes()
        assert script.headers["etag"].startswith('W/"')  # its bytes are not the file's
        auth = h.auth("moderator")
        for path in (f"/v1/items/{photo}/preview", f"/v1/items/{note}/playback"):
            media = await h.client.get(path, headers={**auth, **GZIP})
            assert media.status_code == 200 and "content-encoding" not in media.headers
        ranged = await h.client.get("/static/page.js", headers={**GZIP, "Range": "bytes=0-9"})
        assert ranged.status_code == 206 and "content-encoding" not in ranged.headers
        small = await h.client.get("/healthz", headers=GZIP)
        assert "content-encoding" not in small.headers  # below a kilobyte
        plain = await h.client.get("/moderate/gala", headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers and "</html>" in plain.text


async def test_static_files_say_how_long_to_keep_them_and_answer_304(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        for path, policy in (
            ("/static/page.js", PAGE_FILES),
            ("/static/page.css", PAGE_FILES),
            ("/docs/assets/swagger-ui-bundle.js", DOCS_FILES),
            ("/docs/assets/swagger-ui.css", DOCS_FILES),
        ):
            first = await h.client.get(path, headers=GZIP)
            assert first.headers["cache-control"] == policy, path
            again = await h.client.get(
                path, headers={**GZIP, "If-None-Match": first.headers["etag"]}
            )
            assert again.status_code == 304 and again.content == b"", path
            assert again.headers["cache-control"] == policy
            since = await h.client.get(
                path, headers={"If-Modified-Since": first.headers["last-modified"]}
            )
            assert since.status_code == 304, path


# -- media: conditional requests and ranges


async def test_media_answer_conditional_requests(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        photo = await reviewable(h)
        auth = h.auth("moderator")
        path = f"/v1/items/{photo}/preview"
        first = await h.client.get(path, headers=auth)
        etag, modified = first.headers["etag"], first.headers["last-modified"]
        assert first.headers["cache-control"].startswith("private")
        earlier = formatdate(0, usegmt=True)
        for asked, status in (
            ({"If-None-Match": etag}, 304),
            ({"If-None-Match": f'"other", W/{etag}'}, 304),
            ({"If-None-Match": "*"}, 304),
            ({"If-None-Match": '"other"'}, 200),
            ({"If-Modified-Since": modified}, 304),
            ({"If-Modified-Since": earlier}, 200),
            ({"If-Modified-Since": "not a date"}, 200),
            ({"If-None-Match": '"other"', "If-Modified-Since": modified}, 200),
        ):
            answer = await h.client.get(path, headers={**auth, **asked})
            assert answer.status_code == status, asked
            if status == 304:
                assert answer.content == b"" and answer.headers["etag"] == etag
                assert answer.headers["cache-control"] == first.headers["cache-control"]
            else:
                assert answer.content == first.content
        await sign_in(h, "moderator")
        thumbnail = await h.client.get(f"/moderate/media/{photo}")
        again = await h.client.get(
            f"/moderate/media/{photo}", headers={"If-None-Match": thumbnail.headers["etag"]}
        )
        assert again.status_code == 304


async def test_ranges_follow_rfc_9110(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        note = await reviewable(h, data=samples.voice_note(1.0))
        auth = h.auth("moderator")
        path = f"/v1/items/{note}/playback"
        whole = await h.client.get(path, headers=auth)
        size = len(whole.content)
        assert whole.headers["accept-ranges"] == "bytes"

        async def ranged(header: str, **more: str) -> httpx.Response:
            return await h.client.get(path, headers={**auth, "Range": header, **more})

        part = await ranged("bytes=0-99")
        assert part.status_code == 206 and part.content == whole.content[:100]
        assert part.headers["content-range"] == f"bytes 0-99/{size}"
        tail = await ranged("bytes=-10")
        assert tail.status_code == 206 and tail.content == whole.content[-10:]
        past = await ranged(f"bytes={size}-")
        assert past.status_code == 416 and error_code(past) == "range_not_satisfiable"
        assert past.headers["content-range"] == f"bytes */{size}"
        # Some ranges satisfiable: those are sent; the others left out.
        mixed = await ranged(f"bytes=0-0,{size + 10}-")
        assert mixed.status_code == 206 and mixed.content == whole.content[:1]
        # A header it cannot read is ignored: the whole body.
        for header in ("bytes=abc", "bytes=5-3", "items=0-1", "bytes=", "bytes=-", "0-1"):
            ignored = await ranged(header)
            assert ignored.status_code == 200 and ignored.content == whole.content, header
        # If-Range naming another version: the whole body, whatever the range.
        other = await ranged(f"bytes={size}-", **{"If-Range": '"another"'})
        assert other.status_code == 200 and other.content == whole.content
        same = await ranged("bytes=0-9", **{"If-Range": whole.headers["etag"]})
        assert same.status_code == 206


# -- bodies that cannot be read, and one error shape


async def test_an_upload_without_its_closing_boundary_is_400_and_nothing_is_kept(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path) as h:
        cut = (
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="p.jpg"\r\n\r\n'
            + samples.jpeg()
        )
        answer = await h.client.post(
            "/v1/events/gala/uploads",
            headers={**h.auth("uploader"), "Content-Type": "multipart/form-data; boundary=b"},
            content=cut,
        )
        assert answer.status_code == 400 and error_code(answer) == "bad_form"
        assert "closing boundary" in answer.json()["detail"]
        assert await h.moderation.app.store.tasks() == []
        assert await h.moderation.media.backend.keys("blobs") == []
        whole = await h.client.post(
            "/v1/events/gala/uploads",
            headers={**h.auth("uploader"), "Content-Type": "multipart/form-data; boundary=b"},
            content=cut + b"\r\n--b--\r\n",
        )
        assert whole.status_code == 202


async def test_a_body_that_is_not_json_is_400(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        answer = await h.client.post(
            "/v1/events/gala/decisions",
            headers={**h.auth("moderator"), "Content-Type": "application/json"},
            content=b'{"decision": ',
        )
        assert answer.status_code == 400 and error_code(answer) == "bad_request"


async def test_a_validation_error_names_each_field(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        auth = h.auth("moderator")
        listed = await h.client.get("/v1/events/gala/items?limit=0", headers=auth)
        assert error_code(listed) == "invalid"
        assert [found["field"] for found in listed.json()["errors"]] == ["query.limit"]
        asked = {"decision": "maybe", "media_ids": []}
        decided = await h.client.post("/v1/events/gala/decisions", headers=auth, json=asked)
        fields = {found["field"] for found in problem(decided)["errors"]}
        assert fields == {"body.decision", "body.media_ids"}
        assert "maybe" not in decided.text  # what the client sent is not repeated


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/nowhere", 404, "not_found"),
        ("DELETE", "/healthz", 405, "method_not_allowed"),
        ("GET", "/static/nothing.css", 404, "not_found"),
        ("POST", "/static/page.js", 405, "method_not_allowed"),
        ("GET", "/docs/assets/nothing.js", 404, "not_found"),
        ("GET", "/v1/stages", 401, "unauthenticated"),
        ("POST", "/v1/events/gala/uploads", 401, "unauthenticated"),
    ],
)
async def test_every_error_is_a_problem_mounted_apps_too(
    tmp_path: Path, method: str, path: str, status: int, code: str
) -> None:
    async with harness(tmp_path) as h:
        answer = await h.client.request(method, path)
        body = problem(answer)
        assert (answer.status_code, body["code"]) == (status, code)
        assert body["title"] and body["detail"]


# -- the OpenAPI document


async def test_the_openapi_document_declares_the_bearer_scheme(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        document = (await h.client.get("/openapi.json")).json()
        schemes = document["components"]["securitySchemes"]
        assert schemes["bearer"]["type"] == "http" and schemes["bearer"]["scheme"] == "bearer"
        secured: set[str] = set()
        open_: set[str] = set()
        for path, operations in document["paths"].items():
            for method, operation in operations.items():
                named = operation.get("security")
                (secured if named == [{"bearer": []}] else open_).add(f"{method} {path}")
        assert "post /v1/events/{event}/uploads" in secured
        assert "get /metrics" in secured
        assert all(" /v1/" in operation for operation in secured - {"get /metrics"})
        assert open_ == {
            "get /healthz",
            "get /livez",
            "get /readyz",
            "post /webhooks/{provider}",
        }
