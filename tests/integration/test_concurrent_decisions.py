"""Decisions sent at once over the API, on SQLite and PostgreSQL: one moderator sending each
decision three times (a double click, a retry after a slow answer) on each of 24 items, two
moderators deciding 24 items against each other, and the page's Approve button clicked twice on
each of 24 items. Every answer is counted by status (none a 5xx), and the audit and outbox rows
of each item: a decision applies once, with one notice."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from headrace.pipelines.moderation.pipeline import ITEM
from headrace.service.api.auth import Role, create_token

from .api import Harness, error_code, form_token_of, harness, sign_in, waiting_items

pytestmark = pytest.mark.anyio

ITEMS = 24
REPEATS = 3
REJECT = {"reason": "other"}
Body = dict[str, str] | None
Ask = tuple[str, str, str, Body]  # who, the media id, the action, the body
# A repeat comes a moment after the first (a double click's second press, a retry after a slow
# answer): a few milliseconds, while the first is between its steps.
REPEAT_GAP = 0.003


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real time: the SQLite store's thread, real sockets


async def at_once(h: Harness, asks: list[Ask], gap: float = 0.0) -> list[httpx.Response]:
    """Each (who, media id, action, body) sent at once, the n-th ask on one item `n * gap`
    seconds after the first: the answers in the order asked."""
    sent = Counter[str]()

    async def send(who: str, media_id: str, action: str, body: Body) -> httpx.Response:
        nth = sent[media_id]
        sent[media_id] += 1
        await asyncio.sleep(nth * gap)
        return await h.client.post(f"/v1/items/{media_id}/{action}", headers=h.auth(who), json=body)

    return list(await asyncio.gather(*(send(*ask) for ask in asks)))


def statuses(answers: list[httpx.Response]) -> Counter[int]:
    return Counter(answer.status_code for answer in answers)


async def trail(h: Harness, media_id: str) -> Counter[tuple[str, str]]:
    """An item's audit rows by action and outcome (`applied`, or `unchanged` whatever why)."""
    rows = await h.moderation.app.store.records.audit_log(kind=ITEM, record_id=media_id)
    return Counter((row.action, row.outcome.split(":")[0]) for row in rows)


async def test_one_moderator_sending_each_decision_three_times_at_once_gets_it_applied_once(
    tmp_path: Path, store_url: str
) -> None:
    async with harness(tmp_path, url=store_url) as h:
        ids = await waiting_items(h, ITEMS)
        for action, body in (("approve", None), ("undo", None), ("reject", REJECT)):
            asks: list[Ask] = [("moderator", m, action, body) for m in ids for _ in range(REPEATS)]
            answers = await at_once(h, asks, REPEAT_GAP)
            assert statuses(answers) == {200: ITEMS * REPEATS}, action
            if action != "undo":  # a decision says which answer was the one that applied
                applied = Counter(
                    media_id
                    for (_, media_id, _, _), answer in zip(asks, answers, strict=True)
                    if answer.json()["applied"]
                )
                assert applied == dict.fromkeys(ids, 1), action
        outbox = await h.moderation.app.store.records.outbox(limit=1000)
        for media_id in ids:
            topics = [n.topic for n in outbox if n.record_id == media_id]
            assert topics == ["item.approved", "item.reopened", "item.rejected"]
            assert await trail(h, media_id) == {
                ("review.approved", "applied"): 1,
                ("review.approved", "unchanged"): REPEATS - 1,
                ("review.undone", "applied"): 1,
                ("review.undone", "unchanged"): REPEATS - 1,
                ("review.rejected", "applied"): 1,
                ("review.rejected", "unchanged"): REPEATS - 1,
            }
            item = await h.moderation.records.get(media_id)
            assert (item.state.value, item.decided_by) == ("rejected", "moderator")
        assert await h.moderation.reviews.claims("gala") == {}


async def test_two_moderators_deciding_against_each_other_get_one_200_and_one_409(
    tmp_path: Path, store_url: str
) -> None:
    async with harness(tmp_path, url=store_url) as h:
        store = h.moderation.app.store
        h.tokens["moderator-2"] = await create_token(
            store, name="moderator-2", role=Role.MODERATOR, events=["gala"]
        )
        ids = await waiting_items(h, ITEMS)
        asks: list[Ask] = [
            ask
            for media_id in ids
            for ask in (
                ("moderator", media_id, "approve", None),
                ("moderator-2", media_id, "reject", REJECT),
            )
        ]
        answers = await at_once(h, asks)
        assert statuses(answers) == {200: ITEMS, 409: ITEMS}
        codes = Counter(error_code(a) for a in answers if a.status_code == 409)
        assert set(codes) <= {"claimed", "conflict"}
        outbox = await store.records.outbox(limit=1000)
        for n, media_id in enumerate(ids):
            first, second = answers[2 * n], answers[2 * n + 1]
            assert sorted([first.status_code, second.status_code]) == [200, 409]
            won = first if first.status_code == 200 else second
            assert won.json()["applied"] is True
            item = await h.moderation.records.get(media_id)
            assert item.state.value == won.json()["item"]["state"]
            assert [n.topic for n in outbox if n.record_id == media_id] == [
                f"item.{item.state.value}"
            ]
            rows = await trail(h, media_id)
            assert sum(rows.values()) == 2 and rows[(f"review.{item.state.value}", "applied")] == 1
        assert await h.moderation.reviews.claims("gala") == {}


async def test_a_double_click_on_the_pages_approve_button_answers_both_clicks_as_approved(
    tmp_path: Path, store_url: str
) -> None:
    async with harness(tmp_path, url=store_url) as h:
        ids = await waiting_items(h, ITEMS)
        await sign_in(h, "moderator")
        token = form_token_of(await h.client.get("/moderate/gala"))
        form = {"decision": "approve", "form_token": token}

        async def click(media_id: str, nth: int) -> httpx.Response:
            await asyncio.sleep(nth * REPEAT_GAP)
            return await h.client.post(f"/moderate/gala/items/{media_id}", data=form)

        answers = await asyncio.gather(*(click(m, nth) for m in ids for nth in range(2)))
        assert statuses(answers) == {303: 2 * ITEMS}
        assert {answer.headers["location"].rsplit("&", 1)[-1] for answer in answers} == {
            "message=approved"
        }
        outbox = await h.moderation.app.store.records.outbox(limit=1000)
        assert Counter(n.record_id for n in outbox) == dict.fromkeys(ids, 1)
