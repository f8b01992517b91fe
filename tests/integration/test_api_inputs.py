"""Hostile input at the API's edge, on SQLite and PostgreSQL alike: text no store can keep
(a NUL, a lone surrogate), JSON nested past reason, numbers JSON has no word for, and a webhook
id sent again with another body. Each is a 4xx naming the field, the same on both stores, and
nothing is kept or acted on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from headrace.pipelines.moderation.pipeline import ITEM
from headrace.runtime import remote

from .api import error_code, error_message, harness

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real time: the SQLite store's thread, real sockets


def refusal(answer: Any) -> tuple[int, str, str]:
    return answer.status_code, error_code(answer), error_message(answer)


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    ("raw", "status", "names"),
    [
        (b'{"id": "e1", "type": "x", "result": ' + DEEP + b"}", 400, "nested deeper"),
        (DEEP, 400, "nested deeper"),
        (b'{"id": "evt\\ud800", "type": "job.done"}', 422, "id: is not valid Unicode"),
        (b'{"id": "evt\\u0000", "type": "job.done"}', 422, "id: holds a NUL"),
        (b'{"id": "e2", "type": "job\\u0000done"}', 422, "type: holds a NUL"),
        (
            b'{"id": "e3", "type": "x", "remote_id": "j\\udfff", "status": "failed"}',
            422,
            "remote_id: is not valid Unicode",
        ),
        (b'{"id": "e4", "type": "x", "result": {"k\\u0000": 1}}', 422, "result: holds a NUL"),
        (b'{"id": "e5", "type": "x", "result": ' + b"[" * 40 + b"]" * 40 + b"}", 422, "result"),
        (b'{"id": "e6", "type": "x", "result": NaN}', 400, "JSON object"),
        (b'{"id": "e7", "type": "x", "result": 1e400}', 400, "JSON object"),
    ],
)
async def test_a_webhook_body_no_store_can_keep_is_a_4xx_naming_its_field(
    tmp_path: Path, store_url: str, raw: bytes, status: int, names: str
) -> None:
    async with harness(tmp_path, url=store_url) as h:
        code, _, message = refusal(await h.deliver(raw))
        assert code == status and names in message, message
        assert await h.moderation.app.store.records.list_records("delivery") == []


async def test_a_webhook_id_sent_again_with_another_body_is_409_and_the_first_stands(
    tmp_path: Path, store_url: str
) -> None:
    async with harness(tmp_path, url=store_url) as h:
        first = b'{"id": "evt-1", "type": "job.done", "remote_id": "job-a", "status": "succeeded"}'
        other = b'{"id": "evt-1", "type": "job.done", "remote_id": "job-b", "status": "failed"}'
        assert (await h.deliver(first)).json()["duplicate"] is False
        assert refusal(await h.deliver(other))[:2] == (409, "conflict")
        assert (await h.deliver(first)).json()["duplicate"] is True  # the same body: acknowledged
        store = h.moderation.app.store
        [kept] = await store.records.list_records("delivery")
        assert kept.body["remote_id"] == "job-a"
        assert await remote.delivery_of(store, "job-b") is None  # never acted on
        outcome = await remote.delivery_of(store, "job-a")
        assert outcome is not None and outcome.succeeded


@pytest.mark.parametrize("caption", ["before\x00after", "\x00"])
async def test_a_caption_no_store_can_keep_is_422_and_nothing_is_kept(
    tmp_path: Path, store_url: str, caption: str
) -> None:
    async with harness(tmp_path, url=store_url) as h:
        status, code, message = refusal(await h.upload(caption=caption))
        assert (status, code) == (422, "invalid") and message.startswith("caption: holds a NUL")
        assert await h.moderation.app.store.records.list_records(ITEM) == []


async def test_a_group_or_filter_with_a_nul_is_422_naming_it(
    tmp_path: Path, store_url: str
) -> None:
    async with harness(tmp_path, url=store_url) as h:
        answers = [
            await h.client.get("/v1/groups/gala%00x", headers=h.auth("admin")),
            await h.client.get("/v1/dead-letters?group=a%00b", headers=h.auth("admin")),
            await h.client.get("/v1/dead-letters?kind=%00", headers=h.auth("admin")),
        ]
        found = [refusal(answer) for answer in answers]
        assert [(status, code) for status, code, _ in found] == [(422, "invalid")] * 3
        assert [message.split(":")[0] for *_, message in found] == [
            "path.group",
            "query.group",
            "query.kind",
        ]
