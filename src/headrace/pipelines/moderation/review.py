"""Review: moderators' claims on items, their decisions (one item or many), undo, and an
admin's change of a decision.

A claim says who is looking at an item now. It is a record (kind `claim`, id the media id, scope
the event) whose state names its holder (`held:<moderator>`) or says it is `free`, changed with
the same compare-and-set and audit rows as the items' own records (`store/protocol/records.py`):

- taking a free item, or renewing one's own claim, is a change from `free` or `held:<me>`;
- a claim its holder has not renewed for the TTL (`ReviewRules.claim_ttl`, 5 minutes) has
  lapsed: it is taken by a change from `held:<them>` that applies only if the record has not
  changed for the TTL (`Age(at_least=ttl)`, by the store's clock), so of two moderators taking
  a lapsed claim at once one wins, and a holder who renewed a moment before keeps it;
- its holder releases it (`free`), or an admin does, with a reason; signing out releases
  every claim the moderator holds (`release_all`);
- a decision takes (or renews) the decider's claim first, then moves the item: nobody decides
  an item another moderator holds. Once the item is decided, its claim record goes.

Each step is its own transaction, so requests for one item interleave between them: a repeat
of a decision sent at once (a double click, a retry) may find the claim it read gone with the
decision, or take a claim just after the decision. It then reads the item again, and answers as
a repeat does (it frees a claim it took: the item needs none).

Decisions move an item from `reviewable` to `approved` or `rejected` in one transaction with
its audit row and its notice (`item.approved`, `item.rejected`); a repeat changes nothing and
sends nothing. A decision can be undone by the moderator who made it within the undo window
(`ReviewRules.undo_window`, 30 s, checked by the store's clock in the same change): the item is
reviewable again (`reopened_by` them) and the outbox sends one correction (`item.reopened`); a
repeat of the undo changes nothing. After the window an admin may change it to the other
decision, with a reason (`item.decision_changed`). Every attempt, applied or not, is an audit
row.

Bulk decisions are single decisions made in turn, each with its own claim, audit row and at
most one notice; what another moderator decided or holds meanwhile is reported item by item.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from headrace.pipelines.moderation.items import (
    ITEM,
    Item,
    ItemState,
    Records,
    Reviewed,
    check_label,
)
from headrace.pipelines.moderation.media import check_media_id
from headrace.policy.errors import ConfigError, UnknownRecord
from headrace.runtime.app import App
from headrace.store.protocol.records import Age, Audit, Changed, Notice, Record
from headrace.store.protocol.tasks import Store

CLAIM = "claim"  # the kind of a claim's record
FREE = "free"
HELD = "held:"  # a held claim's state: held:<moderator>
DEFAULT_CLAIM_TTL = 300.0
DEFAULT_UNDO_WINDOW = 30.0
MAX_BULK = 500
PAGE = 1000  # claims read a statement
NEXT_PAGE = 100  # reviewable items `next_item` reads a statement: the first free one is near

# Why an item is rejected, picked by number on the page (1 to 6): kept with the decision, sent
# with its notice.
REJECT_REASONS: tuple[tuple[str, str], ...] = (
    ("off_topic", "not about the event"),
    ("personal_data", "shows personal data or a person who did not agree"),
    ("offensive", "offensive or hateful"),
    ("explicit", "sexual or violent"),
    ("low_quality", "blurred, dark or silent"),
    ("other", "another reason"),
)
REASON_CODES = frozenset(code for code, _ in REJECT_REASONS)


@dataclass(frozen=True)
class ReviewRules:
    """How long a claim lasts unrenewed, and how long a decision may be undone by its maker."""

    claim_ttl: float = DEFAULT_CLAIM_TTL
    undo_window: float = DEFAULT_UNDO_WINDOW

    def __post_init__(self) -> None:
        for name, low in (("claim_ttl", 1.0), ("undo_window", 0.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"review.{name}: expected seconds, got {value!r}")
            if not low <= value <= 86400:
                raise ConfigError(f"review.{name}: expected {low:g} to 86400 seconds, got {value}")


@dataclass(frozen=True)
class Claim:
    """An item's claim as it is: who holds it (None: free) since when, until when unrenewed."""

    media_id: str
    event: str
    holder: str | None
    since: float
    until: float

    def live(self, now: float) -> bool:
        return self.holder is not None and now < self.until

    def held_by_other(self, who: str, now: float) -> bool:
        return self.live(now) and self.holder != who


class ClaimedByOther(ConfigError):
    """The item is held by another moderator: look at another one."""

    def __init__(self, claim: Claim) -> None:
        super().__init__(f"media id {claim.media_id}: {claim.holder} is reviewing it")
        self.claim = claim


class NotReviewable(ConfigError):
    """The item is not (or no longer) in the state the action needs."""

    def __init__(self, item: Item, action: str) -> None:
        super().__init__(f"media id {item.media_id}: cannot be {action}, it is {item.state.value}")
        self.item = item


@dataclass(frozen=True)
class BulkResult:
    """One item of a bulk decision: `applied`, or why not (`conflict`: `decided` with the state
    it is in, `claimed` with who holds it, `missing`)."""

    media_id: str
    applied: bool
    state: str | None
    conflict: Literal["decided", "claimed", "missing"] | None = None
    holder: str | None = None


def session_label(session: str) -> str:
    """A short label for a contributor's event-local session, for moderators: a digest of the
    session id (itself a random cookie value), never anything about the device."""
    return "guest-" + hashlib.sha256(session.encode()).hexdigest()[:6]


def check_reason(reason: str | None) -> str | None:
    if reason is not None and reason not in REASON_CODES:
        known = ", ".join(sorted(REASON_CODES))
        raise ConfigError(f"reason: expected one of {known}, got {reason!r}")
    return reason


def check_decision(by: str, approve: bool, reason: str | None) -> None:
    """A decision's decider and reason, checked before anything is read."""
    check_label(by, "by")
    if approve and reason is not None:
        raise ConfigError("reason: only a rejection takes one")
    check_reason(reason)


class Review:
    """Claims and decisions on a moderation pipeline's items (`Moderation.reviews`)."""

    def __init__(self, app: App, records: Records, rules: ReviewRules | None = None) -> None:
        self.app = app
        self.records = records
        self.rules = rules or ReviewRules()

    @property
    def store(self) -> Store:
        return self.app.store

    # -- claims

    def _claim_of(self, record: Record) -> Claim:
        holder = record.state[len(HELD) :] if record.state.startswith(HELD) else None
        since = record.changed_at
        return Claim(record.id, record.scope, holder, since, since + self.rules.claim_ttl)

    async def claim(self, media_id: str, by: str) -> Claim:
        """Take the item for `by` (or renew `by`'s claim): ClaimedByOther while another
        moderator's claim is live, NotReviewable unless the item waits for a decision."""
        check_label(by, "by")
        return await self._take(await self.records.get(media_id), by)

    async def _take(self, item: Item, by: str) -> Claim:
        """`claim` of an item as it was just read."""
        if item.state is not ItemState.REVIEWABLE:
            raise NotReviewable(item, "claimed")
        made = await self._put_claim(item, by)
        for _ in range(3):  # the claim moved while it was read: look again
            if made.applied:
                break
            made = await self._retake(item, made.record, by)
        if not made.applied:
            raise ClaimedByOther(self._claim_of(made.record))
        return self._claim_of(made.record)

    async def _put_claim(self, item: Item, by: str) -> Changed:
        """A claim record held by `by`, made unless the item has one (then that one, unchanged)."""
        audit = Audit("claim.taken", by)
        return await self.store.records.put_record(
            CLAIM, item.media_id, scope=item.event, state=HELD + by, audit=audit
        )

    async def _retake(self, item: Item, record: Record, by: str) -> Changed:
        """One try at `by`'s claim on an item whose claim was found as `record`: taken when free
        or `by`'s (renewed) or lapsed; ClaimedByOther while another's is live, NotReviewable
        when the item was decided meanwhile (its claim went with the decision)."""
        found = self._claim_of(record)
        now = await self.store.now()
        renewing = found.holder == by
        audit = Audit("claim.renewed" if renewing else "claim.taken", by)
        if found.holder is None or renewing:
            when, age = {FREE, HELD + by}, None
        elif found.live(now):
            outcome = f"unchanged: {record.state}"
            await self.store.records.write_audit(
                CLAIM, item.media_id, scope=item.event, audit=audit, outcome=outcome
            )
            raise ClaimedByOther(found)
        else:  # lapsed: taken only if its holder still has not renewed it
            when, age = {record.state}, Age(at_least=self.rules.claim_ttl)
        renewals = int(record.body.get("renewals", 0)) + renewing
        try:
            return await self.store.records.change_record(
                CLAIM,
                item.media_id,
                state=HELD + by,
                body={"renewals": renewals},
                when=when,
                age=age,
                audit=audit,
            )
        except UnknownRecord:  # decided since it was read (and reopened, or not)
            return await self._put_claim(await self._reviewable(item.media_id, "claimed"), by)

    async def _reviewable(self, media_id: str, action: str) -> Item:
        """The item as it now is, if it waits for a decision; else NotReviewable."""
        item = await self.records.get(media_id)
        if item.state is not ItemState.REVIEWABLE:
            raise NotReviewable(item, action)
        return item

    async def release(
        self, media_id: str, by: str, *, admin: bool = False, reason: str | None = None
    ) -> bool:
        """Give a claim back (`by` its holder, or any claim by an admin, with a reason);
        whether it was held and is now free."""
        check_label(by, "by")
        found = await self.store.records.get_record(CLAIM, check_media_id(media_id))
        if found is None or found.state == FREE:
            return False
        if admin:
            if not reason or len(reason) > 200:
                raise ConfigError("reason: an admin releasing a claim says why (1 to 200 chars)")
            holder = found.state[len(HELD) :]
            audit = Audit("claim.released", by, {"reason": reason, "holder": holder})
            when = {found.state}
        else:
            audit = Audit("claim.released", by)
            when = {HELD + by}
        try:
            changed = await self.store.records.change_record(
                CLAIM, found.id, state=FREE, when=when, audit=audit
            )
        except UnknownRecord:  # its item was decided meanwhile: the claim went with it
            return False
        return changed.applied

    async def release_all(self, by: str, *, reason: str) -> int:
        """Give back every claim `by` holds, in every event (`by` signed out): how many."""
        check_label(by, "by")
        held = HELD + by
        mine: list[Record] = []
        after = 0
        while True:  # read them all first: a claim given back moves past the cursor
            page = await self.store.records.list_records(CLAIM, state=held, after=after, limit=PAGE)
            mine.extend(page)
            if len(page) < PAGE:
                break
            after = page[-1].seq
        audit = Audit("claim.released", by, {"reason": reason})
        released = 0
        for record in mine:
            with contextlib.suppress(UnknownRecord):  # decided meanwhile: the claim went
                changed = await self.store.records.change_record(
                    CLAIM, record.id, state=FREE, when={held}, audit=audit
                )
                released += changed.applied
        return released

    async def claims(self, event: str) -> dict[str, Claim]:
        """The live claims on the event's items, by media id."""
        check_label(event, "event")
        now = await self.store.now()
        live: dict[str, Claim] = {}
        after = 0
        while True:
            page = await self.store.records.list_records(
                CLAIM, scope=event, after=after, limit=PAGE
            )
            for record in page:
                claim = self._claim_of(record)
                if claim.live(now):
                    live[claim.media_id] = claim
            if len(page) < PAGE:
                return live
            after = page[-1].seq

    async def next_item(
        self, event: str, by: str, *, after: int = 0, upto: int | None = None
    ) -> tuple[Item | None, list[Claim]]:
        """Claim for `by` the first reviewable item of the event past seq `after` (and up to
        `upto`) that nobody else holds; the item (None: none left) and the claims of others
        met on the way."""
        check_label(by, "by")
        others: list[Claim] = []
        now = await self.store.now()
        held = await self.claims(event)
        while True:
            page = await self.store.records.list_records(
                ITEM, scope=event, state=ItemState.REVIEWABLE.value, after=after, limit=NEXT_PAGE
            )
            for record in page:
                if upto is not None and record.seq > upto:
                    return None, others
                claim = held.get(record.id)
                if claim is not None and claim.held_by_other(by, now):
                    others.append(claim)
                    continue
                item = Item.of(record)
                try:
                    await self._take(item, by)
                except ClaimedByOther as taken:
                    others.append(taken.claim)
                    continue
                except NotReviewable:
                    continue
                return item, others
            if len(page) < NEXT_PAGE:
                return None, others
            after = page[-1].seq

    # -- decisions

    async def decide(
        self, media_id: str, *, approve: bool, by: str, reason: str | None = None
    ) -> Reviewed:
        """A moderator's decision on a reviewable item, once `by` holds its claim: the first
        decision stands and owes one notice; a repeat of it changes nothing. ClaimedByOther
        while another moderator holds it; NotReviewable when it was decided otherwise."""
        check_decision(by, approve, reason)
        item = await self.records.get(media_id)
        return await self._decide(item, approve=approve, by=by, reason=reason)

    async def _decide(self, item: Item, *, approve: bool, by: str, reason: str | None) -> Reviewed:
        """`decide` on an item as it was just read (its arguments checked)."""
        wanted = ItemState.APPROVED if approve else ItemState.REJECTED
        detail: dict[str, object] = {} if reason is None else {"reason": reason}
        audit = Audit(f"review.{wanted.value}", by, detail)
        item, took = await self._claim_to_decide(item, by, audit)
        changed = await self.store.records.change_record(
            ITEM,
            item.media_id,
            state=wanted.value,
            body={"decided_by": by, "decision_reason": reason},
            when={ItemState.REVIEWABLE.value},
            audit=audit,
            notice=Notice(f"item.{wanted.value}", {"media_id": item.media_id, **detail}),
        )
        decided = Item.of(changed.record)
        if changed.applied:
            await self.forget([item.media_id])  # a decided item's claim: nobody needs it now
        elif took:  # decided since it was read: the claim just taken serves nobody
            await self._let_go(item.media_id, by)
        if changed.applied or decided.state is wanted:
            return Reviewed(decided, changed.applied)
        raise NotReviewable(decided, wanted.value)

    async def _claim_to_decide(self, item: Item, by: str, audit: Audit) -> tuple[Item, bool]:
        """`by`'s claim on an item about to be decided: the item (as it now is, when it was
        decided meanwhile) and whether the claim was taken. ClaimedByOther, audited, while
        another moderator holds it."""
        if item.state is not ItemState.REVIEWABLE:
            return item, False
        try:
            await self._take(item, by)
        except NotReviewable as moved:
            return moved.item, False
        except ClaimedByOther as taken:
            await self._refused(item, audit, f"unchanged: held by {taken.claim.holder}")
            raise
        return item, True

    async def _let_go(self, media_id: str, by: str) -> None:
        """Free `by`'s claim on an item decided meanwhile (a repeat of a decision, or another's,
        took it after the decision's own claim went). Freed, not deleted: a store never deletes
        its newest record, which this claim may be."""
        with contextlib.suppress(UnknownRecord):
            await self.store.records.change_record(CLAIM, media_id, state=FREE, when={HELD + by})

    async def decide_many(
        self,
        media_ids: Sequence[str],
        *,
        approve: bool,
        by: str,
        reason: str | None = None,
        event: str | None = None,
    ) -> list[BulkResult]:
        """`decide` for each item in turn (at most MAX_BULK): each its own claim, audit row and
        notice; a conflict on one is reported for it and the rest go on. An item that does not
        exist, or is not of `event` when given, is `missing`."""
        ids = list(dict.fromkeys(check_media_id(media_id) for media_id in media_ids))
        if not 0 < len(ids) <= MAX_BULK:
            raise ConfigError(f"media_ids: expected 1 to {MAX_BULK} items, got {len(ids)}")
        check_decision(by, approve, reason)
        results: list[BulkResult] = []
        for media_id in ids:
            found = await self.store.records.get_record(ITEM, media_id)
            if found is None or (event is not None and found.scope != event):
                results.append(BulkResult(media_id, False, None, "missing"))
                continue
            try:
                done = await self._decide(Item.of(found), approve=approve, by=by, reason=reason)
            except ClaimedByOther as taken:
                results.append(
                    BulkResult(media_id, False, "reviewable", "claimed", taken.claim.holder)
                )
            except NotReviewable as moved:
                results.append(BulkResult(media_id, False, moved.item.state.value, "decided"))
            else:
                results.append(BulkResult(media_id, done.applied, done.item.state.value))
        return results

    async def undo(self, media_id: str, by: str) -> Item:
        """Undo `by`'s decision within the undo window: the item is reviewable again, held by
        `by`, and the outbox sends one correction (`item.reopened`); a repeat of that undo
        changes nothing and answers the same. NotReviewable when the item is not decided, was
        decided by another, or the window has passed."""
        check_label(by, "by")
        item = await self.records.get(media_id)
        audit = Audit("review.undone", by, {"was": item.state.value})
        if reopened_by(item, by):
            await self._refused(item, audit, f"unchanged: {item.state.value}")
            return await self._back_in_hands(item, by)
        if item.state not in (ItemState.APPROVED, ItemState.REJECTED):
            raise NotReviewable(item, "undone")
        if item.decided_by != by:
            await self._refused(item, audit, f"unchanged: decided by {item.decided_by}")
            raise ConfigError(
                f"media id {item.media_id}: {item.decided_by} decided it; only they may undo it"
            )
        changed = await self.store.records.change_record(
            ITEM,
            item.media_id,
            state=ItemState.REVIEWABLE.value,
            body={"decided_by": None, "decision_reason": None, "reopened_by": by},
            when={item.state.value},
            age=Age(at_most=self.rules.undo_window),
            audit=audit,
            notice=Notice("item.reopened", {"media_id": item.media_id, "was": item.state.value}),
        )
        reopened = Item.of(changed.record)
        if not (changed.applied or reopened_by(reopened, by)):
            raise NotReviewable(reopened, f"undone after {self.rules.undo_window:g} s")
        return await self._back_in_hands(reopened, by)

    async def _back_in_hands(self, item: Item, by: str) -> Item:
        """An item `by` reopened, claimed for `by` unless another moderator took it at once."""
        with contextlib.suppress(ClaimedByOther, NotReviewable):
            await self._take(item, by)
        return item

    async def change(self, media_id: str, *, approve: bool, by: str, reason: str) -> Item:
        """An admin's change of a decision, with a reason: the item moves to the other
        decision and the outbox sends the correction (`item.decision_changed`)."""
        check_label(by, "by")
        if not isinstance(reason, str) or not 0 < len(reason.strip()) <= 200:
            raise ConfigError("reason: an admin changing a decision says why (1 to 200 characters)")
        wanted = ItemState.APPROVED if approve else ItemState.REJECTED
        other = ItemState.REJECTED if approve else ItemState.APPROVED
        item = await self.records.get(media_id)
        changed = await self.store.records.change_record(
            ITEM,
            item.media_id,
            state=wanted.value,
            body={"decided_by": by, "decision_reason": None},
            when={other.value},
            audit=Audit("review.changed", by, {"reason": reason, "was": item.state.value}),
            notice=Notice(
                "item.decision_changed",
                {"media_id": item.media_id, "state": wanted.value, "was": other.value},
            ),
        )
        if not changed.applied:
            raise NotReviewable(Item.of(changed.record), f"changed to {wanted.value}")
        return Item.of(changed.record)

    async def pending_by_session(self, event: str) -> dict[str, int]:
        """How many items of each session wait for a decision."""
        counts: dict[str, int] = {}
        for item in await self.records.all(event=event, state=ItemState.REVIEWABLE):
            counts[item.session] = counts.get(item.session, 0) + 1
        return counts

    async def _refused(self, item: Item, audit: Audit, outcome: str) -> None:
        await self.store.records.write_audit(
            ITEM, item.media_id, scope=item.event, audit=audit, outcome=outcome
        )

    async def forget(self, media_ids: Collection[str]) -> None:
        """The claims of items decided or gone."""
        await self.store.records.delete_records(CLAIM, list(media_ids))


def reopened_by(item: Item, by: str) -> bool:
    """Whether `item` waits for a decision because `by` undid one: an undo of `by`'s again is
    its repeat."""
    return item.state is ItemState.REVIEWABLE and item.reopened_by == by
