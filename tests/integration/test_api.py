"""The HTTP API, in process over an SQLite store: every endpoint, and each error answer."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.pipeline import ITEM, Admission
from headrace.service.api.uploads import SESSION_COOKIE, media_id_for
from headrace.service.api.webhooks import sign
from headrace.store.protocol.types import TaskState

from .api import (
    WEBHOOK_SECRET,
    Harness,
    error_code,
    error_message,
    form_token_of,
    harness,
    reviewable,
    sign_in,
    sign_in_form,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real time: the SQLite store's thread, real sockets


# -- uploads


async def test_an_upload_is_answered_202_queued_once_its_task_is_durable(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        answer = await h.upload(caption="on stage")
        assert answer.status_code == 202
        body = answer.json()
        assert body["state"] == "queued" and body["event"] == "gala"
        task = await h.moderation.app.store.find(f"validate:{body['media_id']}")
        assert task is not None and task.group == "gala"
        session = answer.cookies[SESSION_COOKIE]
        assert re.fullmatch(r"s[0-9a-f]{24}", session) and task.flow == session
        assert "Path=/v1/events/gala" in answer.headers["set-cookie"]
        again = await h.upload(cookies={SESSION_COOKIE: session})
        assert SESSION_COOKIE not in again.cookies  # the session is kept, not renewed
        second = await h.moderation.app.store.find(f"validate:{again.json()['media_id']}")
        assert second is not None and second.flow == session


async def test_a_retried_upload_with_its_idempotency_key_gets_the_first_answer(
    tmp_path: Path, store_url: str
) -> None:
    async with harness(tmp_path, url=store_url) as h:
        photo = samples.jpeg(320, 240, shade=10)
        first = await h.upload(data=photo, key="k-1", caption="hi")
        again = await h.upload(data=photo, key="k-1", caption="hi")
        assert first.status_code == again.status_code == 202
        assert first.json() == again.json()
        other = await h.upload(data=samples.jpeg(320, 240, shade=90), key="k-1", caption="hi")
        assert other.status_code == 422 and error_code(other) == "idempotency_conflict"
        recaptioned = await h.upload(data=photo, key="k-1", caption="changed")
        assert recaptioned.status_code == 422
        tasks = await h.moderation.app.store.tasks()
        assert [t.ref for t in tasks] == [first.json()["media_id"]]
        assert first.json()["media_id"] == await uploader_media_id(h, "k-1")


async def test_an_upload_past_the_largest_class_is_413_and_nothing_is_kept(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path) as h:
        limit = h.moderation.max_bytes
        answer = await h.upload(data=b"\xff\xd8\xff" + bytes(limit))
        assert answer.status_code == 413 and error_code(answer) == "too_large"
        assert str(limit) in error_message(answer)
        assert await h.moderation.app.store.tasks() == []
        assert await h.moderation.media.backend.keys("blobs") == []
        assert list((tmp_path / "media" / "tmp").iterdir()) == []


async def test_a_full_session_or_event_is_429_with_retry_after_and_the_item_declined(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path, admission=Admission(per_event=3, per_session=2)) as h:
        first = await h.upload(key="a")
        session = {SESSION_COOKIE: first.cookies[SESSION_COOKIE]}
        assert (await h.upload(key="b", cookies=session)).status_code == 202
        full = await h.upload(key="c", cookies=session)
        assert full.status_code == 429 and error_code(full) == "queue_full"
        assert full.headers["retry-after"] == "2"
        assert "your session" in error_message(full)
        declined = await h.moderation.records.get(await uploader_media_id(h, "c"))
        assert declined.state.value == "declined"
        assert (await h.upload(key="d")).status_code == 202  # another session gets in
        event_full = await h.upload(key="e")
        assert event_full.status_code == 429 and "this event" in event_full.text
        await h.drain()
        # Sent again with its key once there is room: accepted, and processed.
        again = await h.upload(key="c", cookies=session)
        assert again.status_code == 202
        await h.drain()
        item = await h.moderation.records.get(again.json()["media_id"])
        assert item.state.value == "reviewable"


async def uploader_media_id(h: Harness, key: str) -> str:
    [token] = await h.moderation.app.store.records.list_records("token", scope="uploader")
    return media_id_for(token.id, "gala", key)


async def test_a_429_keeps_the_contributor_in_its_session(tmp_path: Path) -> None:
    async with harness(tmp_path, admission=Admission(per_event=1, per_session=1)) as h:
        assert (await h.upload()).status_code == 202
        refused = await h.upload()
        assert refused.status_code == 429
        assert SESSION_COOKIE in refused.cookies  # a new session, kept for the retry


async def test_an_admin_closes_an_event_and_it_takes_no_more_uploads(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        refused = await h.client.post("/v1/events/gala/close", headers=h.auth("moderator"))
        assert refused.status_code == 403
        closed = await h.client.post("/v1/events/gala/close", headers=h.auth("admin"))
        assert closed.status_code == 200
        assert closed.json() == {"event": "gala", "state": "closed", "applied": True}
        again = await h.client.post("/v1/events/gala/close", headers=h.auth("admin"))
        assert again.json()["applied"] is False
        upload = await h.upload()
        assert upload.status_code == 409 and error_code(upload) == "event_closed"
        assert not [p for p in (tmp_path / "media").rglob("blobs/*/*") if p.is_file()]
        rows = await h.moderation.app.store.records.audit_log(kind="event", record_id="gala")
        assert [(r.action, r.actor, r.outcome) for r in rows] == [
            ("event.closed", "moderator", "denied"),
            ("event.closed", "admin", "applied"),
            ("event.closed", "admin", "unchanged: closed"),
        ]


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        ({"Content-Type": "application/json"}, b"{}", 415, "unsupported_media_type"),
        ({"Content-Type": "multipart/form-data; boundary=x"}, b"--x\r\n", 400, "bad_form"),
        ({"Content-Type": "multipart/form-data; boundary=x"}, b"--x--\r\n", 400, "bad_form"),
        ({"Idempotency-Key": "with space", "Content-Type": "text/plain"}, b"", 422, "invalid"),
    ],
)
async def test_malformed_uploads_are_refused_with_what_to_send(
    tmp_path: Path, headers: dict[str, str], body: bytes, status: int, code: str
) -> None:
    async with harness(tmp_path) as h:
        answer = await h.client.post(
            "/v1/events/gala/uploads", headers={**h.auth("uploader"), **headers}, content=body
        )
        assert (answer.status_code, error_code(answer)) == (status, code)


async def test_an_unexpected_form_field_or_an_empty_file_is_400(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        answer = await h.client.post(
            "/v1/events/gala/uploads",
            headers=h.auth("uploader"),
            files={"file": ("a.jpg", samples.jpeg())},
            data={"location": "x"},
        )
        assert answer.status_code == 400 and "'file' and a 'caption'" in answer.text
        empty = await h.upload(data=b"")
        assert empty.status_code == 400 and "empty" in empty.text


# -- auth


async def test_no_token_or_an_unknown_one_is_401(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        bare = await h.client.get("/v1/stages")
        assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer"
        wrong = await h.client.get("/v1/stages", headers={"Authorization": "Bearer hr_nope"})
        assert wrong.status_code == 401 and "invalid_token" in wrong.headers["www-authenticate"]


async def test_roles_are_scoped_to_events_and_denials_are_audited(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        media_id = await reviewable(h)
        other = h.auth("other-moderator")
        assert (await h.client.get(f"/v1/items/{media_id}", headers=other)).status_code == 404
        missing = await h.client.get(f"/v1/items/{'0' * 32}", headers=other)
        assert missing.status_code == 404  # the same answer as for another event's item
        assert (await h.client.get("/v1/events/gala/items", headers=other)).status_code == 404
        assert (await h.client.get("/v1/groups/gala", headers=other)).status_code == 404
        # A contributor may upload, not moderate; a moderator may not see gates.
        contributor = await h.client.get(f"/v1/items/{media_id}", headers=h.auth("uploader"))
        assert contributor.status_code == 403
        gates = await h.client.get("/v1/gates", headers=h.auth("moderator"))
        assert gates.status_code == 403
        wrong_event = await h.upload(event="fair")
        assert wrong_event.status_code == 404
        denied = [
            (row.actor, row.action)
            for row in await h.moderation.app.store.records.audit_log()
            if row.outcome == "denied"
        ]
        assert ("other-moderator", "read") in denied
        assert ("uploader", "read") in denied
        assert ("moderator", "gates.read") in denied
        assert ("uploader", "upload") in denied


# -- items and decisions


async def test_items_come_in_a_stable_order_with_a_count_of_newer_ones(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        first = [await reviewable(h) for _ in range(3)]
        page = await h.client.get(
            "/v1/events/gala/items", params={"state": "reviewable"}, headers=h.auth("moderator")
        )
        body = page.json()
        assert [item["media_id"] for item in body["items"]] == first
        assert body["newer"] == 0
        later = await reviewable(h)
        past = await h.client.get(
            "/v1/events/gala/items",
            params={"state": "reviewable", "after": body["next"]},
            headers=h.auth("moderator"),
        )
        assert [item["media_id"] for item in past.json()["items"]] == [later]
        small = await h.client.get(
            "/v1/events/gala/items", params={"limit": 2}, headers=h.auth("moderator")
        )
        assert small.json()["newer"] == 2
        bad = await h.client.get(
            "/v1/events/gala/items", params={"limit": 0}, headers=h.auth("moderator")
        )
        assert bad.status_code == 422 and "limit" in error_message(bad)


async def test_an_item_shows_its_preview_type_state_and_caption(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        media_id = await reviewable(h, caption="the band", data=samples.jpeg(1024, 768))
        item = (await h.client.get(f"/v1/items/{media_id}", headers=h.auth("moderator"))).json()
        assert (item["state"], item["media_type"], item["format"]) == (
            "reviewable",
            "image",
            "jpeg",
        )
        assert item["caption"] == "the band" and item["reason"] is None
        preview = await h.client.get(item["preview"], headers=h.auth("moderator"))
        assert preview.status_code == 200 and preview.headers["content-type"] == "image/webp"
        assert preview.content[:4] == b"RIFF"
        small = await h.client.get(item["thumbnail"], headers=h.auth("moderator"))
        assert small.status_code == 200 and len(small.content) < len(preview.content)


async def test_a_quarantined_item_shows_why(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        answer = await h.upload(data=samples.jpeg() + samples.eicar())
        await h.drain()
        media_id = answer.json()["media_id"]
        item = (await h.client.get(f"/v1/items/{media_id}", headers=h.auth("moderator"))).json()
        assert (item["state"], item["reason"]) == ("quarantined", "Eicar-Test-Signature")
        assert item["preview"] is None
        none = await h.client.get(f"/v1/items/{media_id}/preview", headers=h.auth("moderator"))
        assert none.status_code == 404


async def test_two_moderators_approving_at_once_converge_with_one_notice(
    tmp_path: Path, store_url: str
) -> None:
    async with harness(tmp_path, url=store_url) as h:
        media_id = await reviewable(h)
        answers = await asyncio.gather(
            *(
                h.client.post(f"/v1/items/{media_id}/approve", headers=h.auth(who))
                for who in ("moderator", "admin")
            )
        )
        # the second sees the first's claim (409 `claimed`), or its decision made (200, not
        # applied), depending on when it arrives
        done = [a.json() for a in answers if a.status_code == 200]
        refused = [error_code(a) for a in answers if a.status_code != 200]
        assert [d["applied"] for d in done if d["applied"]] == [True]
        assert refused in ([], ["claimed"])
        assert {d["item"]["state"] for d in done} == {"approved"}
        store = h.moderation.app.store
        rows = await store.records.audit_log(kind=ITEM, record_id=media_id)
        reviews = [row for row in rows if row.action == "review.approved"]
        assert len(reviews) == 2
        notices = await store.records.outbox()
        assert [(n.topic, n.record_id) for n in notices] == [("item.approved", media_id)]
        trail = await h.client.get(f"/v1/items/{media_id}/audit", headers=h.auth("moderator"))
        outcomes = sorted(row["outcome"] for row in trail.json())[-2:]
        assert outcomes[0] == "applied" and outcomes[1].startswith("unchanged: ")
        conflict = await h.client.post(f"/v1/items/{media_id}/reject", headers=h.auth("moderator"))
        assert conflict.status_code == 409 and error_code(conflict) == "conflict"


async def test_an_item_not_yet_reviewable_cannot_be_decided(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        media_id = (await h.upload()).json()["media_id"]
        early = await h.client.post(f"/v1/items/{media_id}/approve", headers=h.auth("moderator"))
        assert early.status_code == 409 and "accepted" in early.text
        bad = await h.client.post("/v1/items/not-an-id/approve", headers=h.auth("moderator"))
        assert bad.status_code == 422


# -- status and operations


async def test_tasks_groups_stages_and_gates(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        queued = (await h.upload()).json()["media_id"]
        store = h.moderation.app.store
        task = await store.find(f"validate:{queued}")
        assert task is not None
        seen = await h.client.get(f"/v1/tasks/{task.id}", headers=h.auth("moderator"))
        assert seen.json()["phase"] == "queued" and seen.json()["state"] == "ready"
        hidden = await h.client.get(f"/v1/tasks/{task.id}", headers=h.auth("other-moderator"))
        assert hidden.status_code == 404
        assert (await h.client.get("/v1/tasks/99999", headers=h.auth("admin"))).status_code == 404
        stages = (await h.client.get("/v1/stages", headers=h.auth("moderator"))).json()
        [validate] = stages["stages"]
        assert (validate["kind"], validate["cost_class"], validate["ready"]) == (
            "moderation.validate.image",
            "image",
            1,
        )
        assert validate["p95_age"] is not None and stages["p95_age_by_class"]["image"] >= 0
        await h.drain()
        group = (await h.client.get("/v1/groups/gala", headers=h.auth("moderator"))).json()
        assert group["percent"] == 100.0 and group["by_state"]["succeeded"] == group["total"] == 3
        assert set(group["cost"]) == {
            "moderation.validate.image",
            "moderation.scan.image",
            "moderation.derive.image",
        }
        assert (await h.client.get("/v1/groups/none", headers=h.auth("admin"))).status_code == 404
        gates = await h.client.get("/v1/gates", headers=h.auth("admin"))
        assert gates.status_code == 200 and isinstance(gates.json(), list)


async def test_dead_letters_are_listed_shown_and_redriven_by_an_admin(tmp_path: Path) -> None:
    def declare(app: hr.App) -> None:
        @app.task(name="publish")
        async def publish(ctx: hr.Context, ref: str) -> None:
            raise hr.Fatal("the album service refused our key", code="album.auth")

    async with harness(tmp_path, declare=declare) as h:
        await h.upload(data=samples.jpeg()[:300])  # a contributor's bad file: refused, no letter
        await h.moderation.app.definition("publish").submit("album-7", group="gala")
        await h.drain()
        letters = (await h.client.get("/v1/dead-letters", headers=h.auth("admin"))).json()
        [letter] = letters  # what an operator can act on, and only that
        assert (letter["ref"], letter["error_code"]) == ("album-7", "album.auth")
        shown = await h.client.get(f"/v1/dead-letters/{letter['id']}", headers=h.auth("admin"))
        assert shown.json()["attempts"][0]["code"] == "album.auth"
        denied = await h.client.get("/v1/dead-letters", headers=h.auth("moderator"))
        assert denied.status_code == 403
        redriven = await h.client.post(
            f"/v1/dead-letters/{letter['id']}/redrive", headers=h.auth("admin")
        )
        assert redriven.json()["state"] == "ready"
        again = await h.client.post(
            f"/v1/dead-letters/{letter['id']}/redrive", headers=h.auth("admin")
        )
        assert again.status_code == 404  # no longer dead


async def test_metrics_in_prometheus_text_for_an_admin(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.upload()
        denied = await h.client.get("/metrics", headers=h.auth("moderator"))
        assert denied.status_code == 403
        text = (await h.client.get("/metrics", headers=h.auth("admin"))).text
        assert (
            'headrace_stage_tasks{class="image",stage="moderation.validate.image",state="ready"}'
            " 1.0" in text
        )
        assert 'headrace_stage_age_seconds_bucket{class="image"' in text
        assert 'headrace_tasks{state="ready"} 1.0' in text
        assert "headrace_remote_jobs_unresolved 0.0" in text
        await h.drain()
        after = (await h.client.get("/metrics", headers=h.auth("admin"))).text
        assert 'headrace_attempts_total{outcome="succeeded"} 3.0' in after
        assert 'headrace_attempts_total{outcome="retry"} 0.0' in after
        assert "# TYPE headrace_stage_oldest_age_seconds gauge" in text


async def test_healthz_and_the_openapi_document(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        assert (await h.client.get("/healthz")).json() == {"status": "ok"}
        document = (await h.client.get("/openapi.json")).json()
        assert "/v1/events/{event}/uploads" in document["paths"]
        assert "/webhooks/{provider}" in document["paths"]
        nowhere = await h.client.get("/v1/nowhere")
        assert nowhere.status_code == 404 and error_code(nowhere) == "not_found"


# -- webhooks


async def delivery(h: Harness, body: dict[str, Any], *, skew: float = 0.0, secret: str = "") -> Any:
    return await h.deliver(json.dumps(body).encode(), skew=skew, secret=secret)


async def test_a_webhook_is_kept_once_and_acknowledged_again(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        body = {"id": "evt_1", "type": "job.done", "remote_id": "job-9", "status": "succeeded"}
        first = await delivery(h, body)
        again = await delivery(h, body)
        assert first.status_code == again.status_code == 200
        assert (first.json()["duplicate"], again.json()["duplicate"]) == (False, True)
        kept = await h.moderation.app.store.records.list_records("delivery")
        assert len(kept) == 1 and kept[0].body["remote_id"] == "job-9"


async def test_a_webhook_resolves_the_task_waiting_on_its_remote_job(tmp_path: Path) -> None:
    def declare(app: hr.App) -> None:
        @app.task(name="render")
        async def render(ctx: hr.Context, ref: str) -> hr.RemoteWait:
            return ctx.await_remote(f"job-{ref}", every="1h")  # no poller: only a webhook

    async with harness(tmp_path, declare=declare) as h:
        app = h.moderation.app
        task_id = await app.definition("render").submit("clip-1")
        worker = hr.Worker(app, idle="0.1s")
        running = asyncio.create_task(worker.run())
        try:
            await until(app, task_id, TaskState.WAITING)
            body = {"id": "evt-9", "type": "job.done", "remote_id": "job-clip-1"}
            answer = await delivery(h, {**body, "status": "succeeded", "result": {"s": 6}})
            assert answer.status_code == 200
            await until(app, task_id, TaskState.SUCCEEDED)
        finally:
            worker.stop()
            await running


async def until(app: hr.App, task_id: int, state: TaskState) -> None:
    for _ in range(200):
        if (await app.store.get(task_id)).state is state:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} never became {state.value}")


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        ({"secret": "another-secret-0123456789"}, 401, "bad_signature"),
        ({"skew": -3600.0}, 401, "stale"),
        ({"body": {"type": "x"}}, 422, "invalid"),
        ({"body": {"id": "e", "type": "x", "remote_id": "j", "status": "maybe"}}, 422, "invalid"),
    ],
)
async def test_a_webhook_that_is_not_signed_fresh_and_whole_is_refused(
    tmp_path: Path, change: dict[str, Any], status: int, code: str
) -> None:
    async with harness(tmp_path) as h:
        body = change.get("body", {"id": "evt_2", "type": "job.done"})
        answer = await delivery(
            h, body, skew=change.get("skew", 0.0), secret=change.get("secret", "")
        )
        assert (answer.status_code, error_code(answer)) == (status, code)
        assert await h.moderation.app.store.records.list_records("delivery") == []


async def test_a_webhook_of_an_unknown_provider_or_unsigned_is_refused(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        unknown = await h.client.post("/webhooks/nobody", content=b"{}")
        assert unknown.status_code == 404
        unsigned = await h.client.post("/webhooks/vidgen", content=b'{"id":"1","type":"x"}')
        assert unsigned.status_code == 401
        raw = b"not json"
        now = int(await h.moderation.app.store.now())
        answer = await h.client.post(
            "/webhooks/vidgen",
            content=raw,
            headers={"Webhook-Signature": sign(WEBHOOK_SECRET, raw, now)},
        )
        assert answer.status_code == 400


# -- the moderator page (its browser test is tests/e2e/test_moderator_page.py)


async def test_the_page_signs_in_once_and_keeps_to_its_events(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        media_id = await reviewable(h)
        flagged = (await h.upload(data=samples.jpeg()[:300], caption="cut short")).json()
        await h.drain()
        assert (await h.client.get("/moderate")).headers["location"] == "/login"
        form = {"token": h.tokens["uploader"], "form_token": await sign_in_form(h)}
        wrong = await h.client.post("/login", data=form)
        assert wrong.status_code == 401 and "does not sign a moderator in" in wrong.text
        cookie = await sign_in(h, "moderator")
        h.client.cookies.set("headrace_login", cookie)
        home = await h.client.get("/moderate")
        assert home.headers["location"] == "/moderate/gala"  # its only event
        page = await h.client.get("/moderate/gala")
        assert page.status_code == 200 and f'id="item-{media_id}"' in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert f'id="flagged-{flagged["media_id"]}"' in page.text and "media.corrupt" in page.text
        upto = re.search(r'data-upto="(\d+)"', page.text)
        assert upto is not None
        newer = await h.client.get("/moderate/gala/new", params={"upto": 0})
        assert newer.json()["newer"] == 1
        thumb = await h.client.get(f"/moderate/media/{media_id}")
        assert thumb.headers["content-type"] == "image/webp"
        assert (await h.client.get("/moderate/fair")).status_code == 404
        stale = await h.client.post(
            f"/moderate/gala/items/{media_id}",
            data={"decision": "approve", "form_token": "0" * 64, "upto": upto[1]},
        )
        assert stale.status_code == 403
        token = form_token_of(page)
        done = await h.client.post(
            f"/moderate/gala/items/{media_id}",
            data={"decision": "approve", "form_token": token, "upto": upto[1]},
        )
        assert done.status_code == 303 and "message=approved" in done.headers["location"]
        out = await h.client.post("/logout", data={"form_token": token})
        assert out.headers["location"] == "/login"
        h.client.cookies.set("headrace_login", cookie)
        assert (await h.client.get("/moderate/gala")).headers["location"] == "/login"
        h.client.cookies.clear()


# -- claims, undo, an admin's change, bulk, playable copies


async def test_a_claim_keeps_another_moderator_off_until_an_admin_releases_it(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path) as h:
        media_id = await reviewable(h)
        mine = await h.client.post(f"/v1/items/{media_id}/claim", headers=h.auth("moderator"))
        assert mine.status_code == 200 and mine.json()["holder"] == "moderator"
        assert mine.json()["until"] - mine.json()["since"] == 300
        theirs = await h.client.post(f"/v1/items/{media_id}/approve", headers=h.auth("admin"))
        assert theirs.status_code == 409 and error_code(theirs) == "claimed"
        assert "moderator is reviewing this item" in error_message(theirs)
        plain = await h.client.post(f"/v1/items/{media_id}/claim/release", headers=h.auth("admin"))
        assert plain.json() == {"released": False}  # not the admin's own claim, and no reason
        released = await h.client.post(
            f"/v1/items/{media_id}/claim/release",
            headers=h.auth("admin"),
            json={"reason": "left for the day"},
        )
        assert released.json() == {"released": True}
        done = await h.client.post(
            f"/v1/items/{media_id}/reject", headers=h.auth("admin"), json={"reason": "offensive"}
        )
        assert done.status_code == 200 and done.json()["item"]["decision_reason"] == "offensive"
        rows = await h.moderation.app.store.records.audit_log(kind="claim", record_id=media_id)
        assert [(r.action, r.actor, r.outcome) for r in rows] == [
            ("claim.taken", "moderator", "applied"),
            ("claim.taken", "admin", "unchanged: held:moderator"),
            ("claim.released", "admin", "unchanged: held:moderator"),  # no reason given
            ("claim.released", "admin", "applied"),
            ("claim.taken", "admin", "applied"),  # with its decision
        ]
        assert rows[3].detail == {"reason": "left for the day", "holder": "moderator"}


async def test_undo_within_the_window_then_an_admin_changes_the_decision(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        media_id = await reviewable(h)
        auth = h.auth("moderator")
        await h.client.post(f"/v1/items/{media_id}/approve", headers=auth)
        undone = await h.client.post(f"/v1/items/{media_id}/undo", headers=auth)
        assert undone.status_code == 200 and undone.json()["state"] == "reviewable"
        await h.client.post(f"/v1/items/{media_id}/approve", headers=auth)
        refused = await h.client.post(
            f"/v1/items/{media_id}/change",
            headers=auth,
            json={"decision": "reject", "reason": "a face shows"},
        )
        assert refused.status_code == 403
        changed = await h.client.post(
            f"/v1/items/{media_id}/change",
            headers=h.auth("admin"),
            json={"decision": "reject", "reason": "a face shows"},
        )
        assert changed.status_code == 200 and changed.json()["state"] == "rejected"
        topics = [n.topic for n in await h.moderation.app.store.records.outbox()]
        assert topics == [
            "item.approved",
            "item.reopened",
            "item.approved",
            "item.decision_changed",
        ]


async def test_a_bulk_decision_reports_each_item(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        ids = [await reviewable(h) for _ in range(3)]
        await h.client.post(f"/v1/items/{ids[1]}/reject", headers=h.auth("admin"))
        answer = await h.client.post(
            "/v1/events/gala/decisions",
            headers=h.auth("moderator"),
            json={"decision": "approve", "media_ids": [*ids, "f" * 32]},
        )
        assert [(r["applied"], r["state"], r["conflict"]) for r in answer.json()] == [
            (True, "approved", None),
            (False, "rejected", "decided"),
            (True, "approved", None),
            (False, None, "missing"),
        ]
        wrong = await h.client.post(
            "/v1/events/gala/decisions",
            headers=h.auth("moderator"),
            json={"decision": "approve", "media_ids": ids, "reason": "other"},
        )
        assert wrong.status_code == 422
        other = await h.client.post(
            "/v1/events/gala/decisions",
            headers=h.auth("other-moderator"),
            json={"decision": "approve", "media_ids": ids},
        )
        assert other.status_code == 404


async def test_voice_notes_and_videos_have_a_playable_copy(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        note = await reviewable(h, data=samples.voice_note(1.0))
        clip = await reviewable(h, data=samples.mp4(1.0, 160, 120))
        photo = await reviewable(h)
        auth = h.auth("moderator")
        for media_id, media_type in ((note, "audio/mp4"), (clip, "video/mp4")):
            item = (await h.client.get(f"/v1/items/{media_id}", headers=auth)).json()
            assert item["playback"] == f"/v1/items/{media_id}/playback"
            whole = await h.client.get(item["playback"], headers=auth)
            assert whole.status_code == 200 and whole.headers["content-type"] == media_type
            assert whole.content[4:8] == b"ftyp"
            part = await h.client.get(item["playback"], headers={**auth, "Range": "bytes=0-99"})
            assert part.status_code == 206 and len(part.content) == 100
        assert (await h.client.get(f"/v1/items/{photo}", headers=auth)).json()["playback"] is None
        none = await h.client.get(f"/v1/items/{photo}/playback", headers=auth)
        assert none.status_code == 404
