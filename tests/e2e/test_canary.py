"""A canary secret placed in a signed URL, a token and a caption never reaches a sink: the
server's log (at DEBUG), the dead letters, the metrics, or the body of any answer to a request
that carried it."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest

from headrace.pipelines.moderation import samples
from headrace.service.api.webhooks import sign

from .server import WEBHOOK_SECRET, serving

pytestmark = pytest.mark.realtime

CANARY = "canary7f3a9c2e51d84b06"
SIGNED_URL = f"https://cdn.example/clip.mp4?X-Amz-Credential=AKIA&X-Amz-Signature={CANARY}"
TOKEN = f"hr_{CANARY}"
CAPTION = f"meet me at {CANARY}"


def test_a_canary_never_reaches_a_log_a_dead_letter_a_metric_or_an_error(tmp_path: Path) -> None:
    answers: list[httpx.Response] = []
    with (
        serving(tmp_path, verbose=True) as server,
        httpx.Client(base_url=server.url, timeout=30) as client,
    ):
        uploader, admin = server.auth("uploader"), server.auth("admin")

        # In a token: as a bearer token, and typed into the page's sign-in.
        answers.append(client.get("/v1/stages", headers={"Authorization": f"Bearer {TOKEN}"}))
        form = re.search(r'name="form_token" value="([0-9a-f]+)"', client.get("/login").text)
        assert form is not None
        answers.append(client.post("/login", data={"token": TOKEN, "form_token": form[1]}))

        # In a signed URL: in query strings, in an idempotency key, in a webhook.
        answers.append(
            client.post(
                f"/v1/events/gala/uploads?source={SIGNED_URL}",
                headers={**uploader, "Idempotency-Key": SIGNED_URL[-60:]},
                files={"file": ("p.jpg", samples.jpeg(320, 240))},
            )
        )
        media_id = answers[-1].json()["media_id"]
        answers.append(client.get(f"/v1/items/{media_id}/preview?sig={CANARY}", headers=admin))
        answers.append(client.get(f"/v1/items/{CANARY}", headers=admin))
        answers.append(client.get(f"/v1/events/gala/items?limit={CANARY}", headers=admin))
        answers.append(client.get(f"/v1/{CANARY}", headers=admin))
        answers.append(
            client.post(
                "/v1/events/gala/uploads",
                headers={**uploader, "Idempotency-Key": f"{CANARY} with spaces"},
                files={"file": ("p.jpg", samples.jpeg())},
            )
        )
        for body in (
            {
                "id": "evt-1",
                "type": "job.done",
                "remote_id": "j1",
                "status": "succeeded",
                "result": {"url": SIGNED_URL},
            },
            {"id": "evt-2", "type": "job.done", "remote_id": SIGNED_URL, "status": "odd"},
        ):
            raw = json.dumps(body).encode()
            signature = sign(WEBHOOK_SECRET, raw, int(time.time()))
            answers.append(
                client.post(
                    "/webhooks/vidgen", content=raw, headers={"Webhook-Signature": signature}
                )
            )
        raw = json.dumps({"id": "evt-3", "type": SIGNED_URL}).encode()
        answers.append(
            client.post(
                "/webhooks/vidgen", content=raw, headers={"Webhook-Signature": f"t=1,v1={CANARY}"}
            )
        )

        # In a caption: on a file that fails validation (refused), and one too long.
        broken = client.post(
            "/v1/events/gala/uploads",
            headers=uploader,
            files={"file": ("p.jpg", samples.jpeg()[:200])},
            data={"caption": CAPTION},
        )
        answers.append(broken)
        answers.append(
            client.post(
                "/v1/events/gala/uploads",
                headers=uploader,
                files={"file": ("p.jpg", samples.jpeg())},
                data={"caption": CAPTION * 100},
            )
        )
        refused = f"/v1/items/{broken.json()['media_id']}"
        deadline = time.monotonic() + 60
        while client.get(refused, headers=admin).json()["state"] != "refused":
            assert time.monotonic() < deadline, "the broken upload was never refused"
            time.sleep(0.1)

        sinks = {"answers": "\n".join(f"{a.status_code} {a.headers} {a.text}" for a in answers)}
        letters = client.get("/v1/dead-letters", headers=admin)
        sinks["dead letters"] = letters.text + "".join(
            client.get(f"/v1/dead-letters/{letter['id']}", headers=admin).text
            for letter in letters.json()
        )
        reason = client.get(refused, headers=admin).json()["reason"]  # shows moderators the caption
        sinks["metrics"] = client.get("/metrics", headers=admin).text
        sinks["audit"] = client.get(f"/v1/items/{media_id}/audit", headers=admin).text
    sinks["log"] = "".join(server.log)

    assert {a.status_code for a in answers} >= {401, 404, 422}
    assert reason == "media.corrupt"
    assert letters.json() == []  # a contributor's bad file is its item's outcome, no dead letter
    assert "headrace.http" in sinks["log"] and "moderation.validate" in sinks["log"]
    leaked = {name: text.count(CANARY) for name, text in sinks.items() if CANARY in text}
    assert leaked == {}
