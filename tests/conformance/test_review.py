"""Moderators' claims, decisions, bulk decisions and undo (pipelines/moderation/review.py), on
every backend with the store's clock a ManualClock."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

import headrace as hr
from headrace.pipelines.moderation.media import DirectoryBackend, MediaStore
from headrace.pipelines.moderation.model import ModelWork
from headrace.pipelines.moderation.pipeline import ITEM, Item, ItemState, Moderation
from headrace.pipelines.moderation.review import (
    CLAIM,
    ClaimedByOther,
    NotReviewable,
    Review,
    ReviewRules,
    session_label,
)
from headrace.policy import ConfigError, ManualClock

from .conftest import make_backend

pytestmark = pytest.mark.anyio

T = TypeVar("T")
# Set in a task whose store calls `Stop` holds: one request among several.
STOPPING = contextvars.ContextVar("stopping", default=False)


@dataclass
class Desk:
    review: Review
    moderation: Moderation
    clock: ManualClock

    async def items(self, count: int, *, session: str = "s1", event: str = "gala") -> list[str]:
        ids = []
        for n in range(count):
            media_id = hashlib.sha256(f"{event}/{session}/{n}".encode()).hexdigest()[:32]
            item = Item(media_id, event, session, "0" * 64, 10, state=ItemState.REVIEWABLE)
            await self.moderation.records.put(item)
            ids.append(media_id)
        return ids


@dataclass
class Stop:
    """Holds a marked task (`late`) at its first call of one store verb on one kind of record,
    until `go`: a request stopped between two of its steps while others run."""

    reached: asyncio.Event
    go: asyncio.Event

    @classmethod
    def before(cls, monkeypatch: pytest.MonkeyPatch, desk: Desk, verb: str, kind: str) -> Stop:
        stop = cls(asyncio.Event(), asyncio.Event())
        store = desk.moderation.app.store
        original: Callable[..., Awaitable[Any]] = getattr(store.records, verb)

        async def held(*args: Any, **kwargs: Any) -> Any:
            if STOPPING.get() and args[0] == kind and not stop.go.is_set():
                stop.reached.set()
                await stop.go.wait()
            return await original(*args, **kwargs)

        monkeypatch.setattr(store.records, verb, held)
        return stop

    async def late(self, call: Awaitable[T]) -> asyncio.Task[T]:
        """`call` in a task of its own, once it is held."""

        async def marked() -> T:
            STOPPING.set(True)
            return await call

        task = asyncio.create_task(marked())
        await self.reached.wait()
        return task


@pytest.fixture
async def desk(
    backend: str, clock: ManualClock, tmp_path: Path, durable: None
) -> AsyncIterator[Desk]:
    store = make_backend(backend, clock, tmp_path)
    app = hr.App(store=store, clock=clock)
    moderation = Moderation(
        app,
        MediaStore(DirectoryBackend(tmp_path / "media")),
        None,
        work=ModelWork(),
        review=ReviewRules(claim_ttl=300, undo_window=30),
    )
    async with app:
        yield Desk(moderation.reviews, moderation, clock)


async def test_a_claim_keeps_others_off_until_it_is_released_or_lapses(desk: Desk) -> None:
    [media_id] = await desk.items(1)
    mine = await desk.review.claim(media_id, "ana")
    assert (mine.holder, mine.until - mine.since) == ("ana", 300)
    with pytest.raises(ClaimedByOther, match="ana is reviewing it"):
        await desk.review.claim(media_id, "ben")
    desk.clock.advance(200)
    renewed = await desk.review.claim(media_id, "ana")  # renewed while she is on it
    assert renewed.since == mine.since + 200
    desk.clock.advance(200)  # 400 s after taking it, 200 after renewing it: still hers
    with pytest.raises(ClaimedByOther):
        await desk.review.claim(media_id, "ben")
    desk.clock.advance(101)  # lapsed by itself
    assert (await desk.review.claim(media_id, "ben")).holder == "ben"
    assert await desk.review.release(media_id, "ben")
    assert not await desk.review.release(media_id, "ben")  # free already
    assert (await desk.review.claim(media_id, "cy")).holder == "cy"
    with pytest.raises(ConfigError, match="says why"):
        await desk.review.release(media_id, "root", admin=True)
    assert await desk.review.release(media_id, "root", admin=True, reason="cy went home")
    assert await desk.review.claims("gala") == {}
    rows = await desk.moderation.app.store.records.audit_log(kind=CLAIM, record_id=media_id)
    outcomes = [(row.action, row.actor, row.outcome) for row in rows]
    assert outcomes[:4] == [
        ("claim.taken", "ana", "applied"),
        ("claim.taken", "ben", "unchanged: held:ana"),
        ("claim.renewed", "ana", "applied"),
        ("claim.taken", "ben", "unchanged: held:ana"),
    ]
    assert outcomes[-1] == ("claim.released", "root", "applied")
    assert rows[-1].detail == {"reason": "cy went home", "holder": "cy"}


async def test_two_moderators_taking_a_lapsed_claim_at_once_one_gets_it(desk: Desk) -> None:
    [media_id] = await desk.items(1)
    await desk.review.claim(media_id, "ana")
    desk.clock.advance(301)

    async def take(who: str) -> str | None:
        try:
            return (await desk.review.claim(media_id, who)).holder
        except ClaimedByOther:
            return None

    got = await asyncio.gather(take("ben"), take("cy"))
    assert sorted(map(str, got)) in (["None", "ben"], ["None", "cy"])
    [claim] = (await desk.review.claims("gala")).values()
    assert claim.holder in got


async def test_a_decision_needs_the_claim_and_drops_it(desk: Desk) -> None:
    first, second = await desk.items(2)
    await desk.review.claim(first, "ana")
    with pytest.raises(ClaimedByOther):
        await desk.moderation.review(first, approve=True, by="ben")
    done = await desk.moderation.review(first, approve=False, by="ana", reason="off_topic")
    assert done.applied and done.item.state is ItemState.REJECTED
    assert (done.item.decided_by, done.item.decision_reason) == ("ana", "off_topic")
    assert await desk.moderation.app.store.records.get_record(CLAIM, first) is None
    again = await desk.moderation.review(first, approve=False, by="ana", reason="off_topic")
    assert not again.applied
    with pytest.raises(NotReviewable):
        await desk.moderation.review(first, approve=True, by="ben")
    with pytest.raises(ConfigError, match="reason: expected one of"):
        await desk.moderation.review(second, approve=False, by="ana", reason="ugly")
    store = desk.moderation.app.store
    [notice] = await store.records.outbox()
    assert (notice.topic, notice.body) == (
        "item.rejected",
        {"media_id": first, "reason": "off_topic"},
    )
    outcomes = [row.outcome for row in await store.records.audit_log(kind=ITEM, record_id=first)]
    assert outcomes == [
        "unchanged: held by ana",
        "applied",
        "unchanged: rejected",  # her repeat
        "unchanged: rejected",  # his approval, too late
    ]


async def test_next_hands_each_moderator_an_item_nobody_else_holds(desk: Desk) -> None:
    ids = await desk.items(4)
    handed = []
    for who in ("ana", "ben", "cy"):
        item, _ = await desk.review.next_item("gala", who)
        assert item is not None
        handed.append(item.media_id)
    assert handed == ids[:3]
    await desk.moderation.review(ids[0], approve=True, by="ana")
    item, met = await desk.review.next_item("gala", "ana")
    assert item is not None and item.media_id == ids[3]
    assert [claim.holder for claim in met] == ["ben", "cy"]
    nothing, _ = await desk.review.next_item("gala", "dee")
    assert nothing is None
    live = await desk.review.claims("gala")
    assert {claim.holder for claim in live.values()} == {"ana", "ben", "cy"}


async def test_bulk_decides_item_by_item_and_reports_each_conflict(desk: Desk) -> None:
    ids = await desk.items(5, session="s9")
    await desk.review.claim(ids[1], "ben")
    await desk.moderation.review(ids[2], approve=False, by="cy", reason="other")
    results = await desk.review.decide_many(ids, approve=True, by="ana")
    assert [(r.applied, r.state, r.conflict, r.holder) for r in results] == [
        (True, "approved", None, None),
        (False, "reviewable", "claimed", "ben"),
        (False, "rejected", "decided", None),
        (True, "approved", None, None),
        (True, "approved", None, None),
    ]
    store = desk.moderation.app.store
    topics = [(n.topic, n.record_id) for n in await store.records.outbox()]
    assert topics.count(("item.approved", ids[0])) == 1 and len(topics) == 4
    for media_id in (ids[0], ids[3], ids[4]):
        rows = await store.records.audit_log(kind=ITEM, record_id=media_id)
        assert [(r.action, r.outcome) for r in rows] == [("review.approved", "applied")]
    assert await desk.review.pending_by_session("gala") == {"s9": 1}
    with pytest.raises(ConfigError, match="media_ids"):
        await desk.review.decide_many([], approve=True, by="ana")


async def test_undo_within_the_window_reopens_with_one_correction(desk: Desk) -> None:
    first, second = await desk.items(2)
    await desk.moderation.review(first, approve=True, by="ana")
    with pytest.raises(ConfigError, match="only they may undo"):
        await desk.review.undo(first, "ben")
    desk.clock.advance(29)
    reopened = await desk.review.undo(first, "ana")
    assert reopened.state is ItemState.REVIEWABLE and reopened.decided_by is None
    assert (await desk.review.claims("gala"))[first].holder == "ana"  # back in her hands
    store = desk.moderation.app.store
    assert [(n.topic, n.body.get("was")) for n in await store.records.outbox()] == [
        ("item.approved", None),
        ("item.reopened", "approved"),
    ]
    # past the window: only an admin changes it, with a reason, and says so once
    await desk.moderation.review(second, approve=True, by="ana")
    desk.clock.advance(31)
    with pytest.raises(NotReviewable, match="undone after 30 s"):
        await desk.review.undo(second, "ana")
    changed = await desk.review.change(second, approve=False, by="root", reason="a face shows")
    assert changed.state is ItemState.REJECTED
    with pytest.raises(NotReviewable):
        await desk.review.change(second, approve=False, by="root", reason="again")
    topics = [n.topic for n in await store.records.outbox() if n.record_id == second]
    assert topics == ["item.approved", "item.decision_changed"]
    trail = [
        (r.action, r.outcome) for r in await store.records.audit_log(kind=ITEM, record_id=second)
    ]
    assert trail[-3:] == [
        ("review.undone", "unchanged: approved, changed 31 s before"),
        ("review.changed", "applied"),
        ("review.changed", "unchanged: rejected"),
    ]


def test_a_session_shows_as_a_short_label_of_its_digest() -> None:
    label = session_label("s" + "ab" * 12)
    assert label.startswith("guest-") and len(label) == 12 and "abab" not in label
    with pytest.raises(ConfigError, match="claim_ttl"):
        ReviewRules(claim_ttl=0)


# Where a repeat of a decision stops while the first one applies: before it takes the claim
# (it read the item reviewable), before it renews the claim it found (which then goes with the
# decision), before it moves the item (holding the claim the first one renews and drops).
STEPS = [("put_record", CLAIM), ("change_record", CLAIM), ("change_record", ITEM)]


@pytest.mark.parametrize(("verb", "kind"), STEPS)
async def test_a_decision_sent_again_at_once_applies_once_and_the_repeat_answers_as_one(
    desk: Desk, monkeypatch: pytest.MonkeyPatch, verb: str, kind: str
) -> None:
    [media_id] = await desk.items(1)
    await desk.review.claim(media_id, "ana")  # the page claimed it as it came into focus
    stop = Stop.before(monkeypatch, desk, verb, kind)
    late = await stop.late(desk.moderation.review(media_id, approve=True, by="ana"))
    first = await desk.moderation.review(media_id, approve=True, by="ana")
    stop.go.set()
    again = await late
    assert (first.applied, again.applied) == (True, False)
    assert again.item.state is ItemState.APPROVED and again.item.decided_by == "ana"
    store = desk.moderation.app.store
    assert [(n.topic, n.record_id) for n in await store.records.outbox()] == [
        ("item.approved", media_id)
    ]
    trail = [
        (r.actor, r.outcome) for r in await store.records.audit_log(kind=ITEM, record_id=media_id)
    ]
    assert trail == [("ana", "applied"), ("ana", "unchanged: approved")]
    assert await desk.review.claims("gala") == {}  # nobody holds a decided item


async def test_a_decision_that_comes_after_another_moderators_leaves_no_claim(
    desk: Desk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ben read the item reviewable, and claims it only once Ana's approval has applied (and
    dropped her claim): his rejection is refused and his claim freed, so Ana's undo hands the
    item back to her."""
    [media_id] = await desk.items(1)
    stop = Stop.before(monkeypatch, desk, "put_record", CLAIM)
    late = await stop.late(
        desk.moderation.review(media_id, approve=False, by="ben", reason="other")
    )
    await desk.moderation.review(media_id, approve=True, by="ana")
    stop.go.set()
    with pytest.raises(NotReviewable, match="it is approved"):
        await late
    assert await desk.review.claims("gala") == {}
    await desk.review.undo(media_id, "ana")
    assert (await desk.review.claims("gala"))[media_id].holder == "ana"


async def test_an_undo_sent_again_reopens_once_and_the_repeats_answer_as_one(
    desk: Desk, monkeypatch: pytest.MonkeyPatch
) -> None:
    [media_id] = await desk.items(1)
    await desk.moderation.review(media_id, approve=True, by="ana")
    stop = Stop.before(monkeypatch, desk, "change_record", ITEM)
    late = await stop.late(desk.review.undo(media_id, "ana"))  # read it approved
    first = await desk.review.undo(media_id, "ana")
    stop.go.set()
    again = await late
    later = await desk.review.undo(media_id, "ana")  # read it reviewable
    for item in (first, again, later):
        assert item.state is ItemState.REVIEWABLE and item.reopened_by == "ana"
    store = desk.moderation.app.store
    assert [n.topic for n in await store.records.outbox()] == ["item.approved", "item.reopened"]
    trail = [
        (r.action, r.outcome) for r in await store.records.audit_log(kind=ITEM, record_id=media_id)
    ]
    assert trail == [
        ("review.approved", "applied"),
        ("review.undone", "applied"),
        ("review.undone", "unchanged: reviewable"),
        ("review.undone", "unchanged: reviewable"),
    ]
    assert (await desk.review.claims("gala"))[media_id].holder == "ana"
    with pytest.raises(NotReviewable, match="cannot be undone, it is reviewable"):
        await desk.review.undo(media_id, "ben")  # his undo is no repeat: he reopened nothing


async def test_a_release_that_finds_the_claim_gone_with_the_decision_releases_nothing(
    desk: Desk, monkeypatch: pytest.MonkeyPatch
) -> None:
    [media_id] = await desk.items(1)
    await desk.review.claim(media_id, "ana")
    stop = Stop.before(monkeypatch, desk, "change_record", CLAIM)
    late = await stop.late(desk.review.release(media_id, "ana"))  # focus left it, as she decided
    await desk.moderation.review(media_id, approve=True, by="ana")
    stop.go.set()
    assert await late is False


async def test_signing_out_releases_every_claim_the_moderator_holds(desk: Desk) -> None:
    first, second = await desk.items(2)
    [elsewhere] = await desk.items(1, event="fair")
    [bens] = await desk.items(1, session="s2")
    for media_id in (first, second, elsewhere):
        await desk.review.claim(media_id, "ana")
    await desk.review.claim(bens, "ben")
    await desk.review.release(second, "ana")  # given back before: not counted again
    assert await desk.review.release_all("ana", reason="signed out") == 2
    assert {c.media_id: c.holder for c in (await desk.review.claims("gala")).values()} == {
        bens: "ben"
    }
    assert await desk.review.claims("fair") == {}
    assert (await desk.review.claim(first, "ben")).holder == "ben"  # free for others at once
    rows = await desk.moderation.app.store.records.audit_log(kind=CLAIM, record_id=elsewhere)
    assert [(r.action, r.actor, r.outcome, dict(r.detail)) for r in rows][-1] == (
        "claim.released",
        "ana",
        "applied",
        {"reason": "signed out"},
    )
    assert await desk.review.release_all("ana", reason="signed out") == 0
