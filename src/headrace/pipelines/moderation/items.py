"""A moderation item as the store keeps it: its states, its record (kind `item`, scoped to its
event), the hold naming the original it needs, and the checks of the labels that name events
and sessions. The pipeline (`pipeline.py`), the moderators' side (`review.py`) and retention
(`upkeep.py`) all build on this module, and it on none of them.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass

from headrace.pipelines.moderation.media import check_media_id
from headrace.pipelines.moderation.probe import MediaClass
from headrace.policy.errors import ConfigError
from headrace.runtime.app import App
from headrace.store.protocol.records import Audit, AuditRow, Record

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


class ItemState(enum.Enum):
    ACCEPTED = "accepted"  # kept, waiting for (or in) validation
    VALIDATED = "validated"  # its type and size are known and taken; scan next
    SCANNED = "scanned"  # clean; derivatives next
    REVIEWABLE = "reviewable"  # ready for a moderator
    APPROVED = "approved"  # a moderator approved it
    REJECTED = "rejected"  # a moderator rejected it
    QUARANTINED = "quarantined"  # the scan found something: never derived
    REFUSED = "refused"  # not media this pipeline takes (the reason is a safe code)
    DECLINED = "declined"  # kept, but admission was full: the client was told to send it again

    @property
    def settled(self) -> bool:
        """No stage has work left for it."""
        return self not in (ItemState.ACCEPTED, ItemState.VALIDATED, ItemState.SCANNED)


ITEM = "item"  # the kind of an item's record in the store
# A record per item naming the original it holds: id the media id, scope the digest, so the
# items that hold an original are one indexed lookup away, however many items there are.
HOLD = "original"
HOLDING = "holds"
# Written once every item kept before holds were has one (`Records.holders`).
HOLDS_INDEXED = ("meta", "originals-held")
PAGE = 1000  # records read a statement
EVENT = "event"  # the kind of an event's record: written when it is closed
CLOSED = "closed"  # a closed event's state: it takes no upload, its items go after a while


@dataclass(frozen=True)
class Item:
    media_id: str
    event: str
    session: str
    digest: str
    size: int
    state: ItemState = ItemState.ACCEPTED
    queued_as: str = MediaClass.IMAGE.value  # the class it waits for validation in
    weight: float = 1.0  # its share of its session's turns (a staff upload's may be more)
    media_class: str | None = None
    format: str | None = None
    reason: str | None = None  # a safe code, or the name of what the scan found
    derived: str | None = None  # the key prefix of its derivative set in the media store
    metadata: Mapping[str, object] | None = None
    caption: str | None = None  # the contributor's words: shown to moderators, never logged
    memory: int | None = None  # decoding's estimated peak bytes, from headers (None: unreadable)
    flags: tuple[str, ...] = ()  # safe codes moderators see beside a reviewable item
    decided_by: str | None = None  # the moderator whose decision stands (`review`)
    decision_reason: str | None = None  # why it was rejected: a code of `review.REJECT_REASONS`
    reopened_by: str | None = None  # the moderator whose undo made it reviewable again
    uploaded_at: float = 0.0  # when its record was made, by the store's clock
    seq: int = 0  # the order of its last change of state (`store/protocol/records.py`)

    def body(self) -> dict[str, object]:
        """What its record keeps besides its id, event and state."""
        fields = asdict(self)
        for kept_apart in ("media_id", "event", "state", "seq", "uploaded_at"):
            del fields[kept_apart]
        return fields

    @classmethod
    def of(cls, record: Record) -> Item:
        body = dict(record.body)
        body["flags"] = tuple(body.get("flags") or ())  # a JSON list as kept
        return cls(
            media_id=record.id,
            event=record.scope,
            state=ItemState(record.state),
            seq=record.seq,
            uploaded_at=record.created_at,
            **body,
        )


@dataclass(frozen=True)
class Reviewed:
    """A decision's result: the item, and whether this decision was the one that applied."""

    item: Item
    applied: bool


class Records:
    """Items as records in the app's store (kind `item`, scope the event): a stage's write is
    one transaction, and a moderator's decision commits with its audit row and its notice.
    Beside each, a hold (kind `original`, scope the digest) says which original it needs."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._holds_indexed = False

    async def get(self, media_id: str) -> Item:
        found = await self.app.store.records.get_record(ITEM, check_media_id(media_id))
        if found is None:
            raise ConfigError(f"media id {media_id!r}: no such item")
        return Item.of(found)

    async def put(self, item: Item, audit: Audit | None = None) -> tuple[Item, bool]:
        """Keep a new item's record (with `audit`); an item of that media id kept before is
        returned instead, with False. Its hold on its original is written first: an item
        never exists without one (a hold without its item, after a crash, keeps an original
        longer, never less)."""
        await self._hold(item.media_id, item.digest)
        made = await self.app.store.records.put_record(
            ITEM,
            item.media_id,
            scope=item.event,
            state=item.state.value,
            body=item.body(),
            audit=audit,
        )
        return Item.of(made.record), made.applied

    async def write_if(
        self, media_id: str, was: ItemState, state: ItemState, **body: object
    ) -> Item:
        """Move an item from `was` to `state` (with `body`'s fields); as it is when it is no
        longer `was`. A stage moves its item this way: an attempt that lost its lease and
        finishes late (its host cut off, then back) finds the item moved on and changes
        nothing, where a plain write would set it back."""
        changed = await self.app.store.records.change_record(
            ITEM, media_id, state=state.value, body=body, when={was.value}
        )
        return Item.of(changed.record)

    async def all(self, *, event: str | None = None, state: ItemState | None = None) -> list[Item]:
        """Every item (of an event, in a state), in the order of their last change of state."""
        found: list[Item] = []
        wanted = None if state is None else state.value
        while True:
            page = await self.app.store.records.list_records(
                ITEM, scope=event, state=wanted, after=found[-1].seq if found else 0, limit=PAGE
            )
            found.extend(Item.of(record) for record in page)
            if len(page) < PAGE:
                return found

    async def audit(self, media_id: str | None = None) -> list[AuditRow]:
        return await self.app.store.records.audit_log(kind=ITEM, record_id=media_id)

    async def holders(
        self, digests: Collection[str], *, leaving: Collection[str]
    ) -> dict[str, list[str]]:
        """The media ids of the items that still need one of `digests`, by digest: every item
        but those `leaving` and those refused holds its original (a refused one's was
        released). One indexed read per digest and one per holder, whatever the history."""
        await self._index_holds()
        found: dict[str, list[str]] = {}
        store = self.app.store
        for digest in sorted(digests):
            for media_id in await self._holding(digest):
                if media_id in leaving:
                    continue
                item = await store.records.get_record(ITEM, media_id)
                if item is not None and item.state != ItemState.REFUSED.value:
                    found.setdefault(digest, []).append(media_id)
        return found

    async def _holding(self, digest: str) -> list[str]:
        """The media ids whose holds name `digest`."""
        held: list[str] = []
        after = 0
        while True:
            page = await self.app.store.records.list_records(
                HOLD, scope=digest, after=after, limit=PAGE
            )
            held.extend(hold.id for hold in page)
            if len(page) < PAGE:
                return held
            after = page[-1].seq

    async def forget(self, media_ids: Collection[str]) -> int:
        """Delete the records of items that are gone (settled ones pruned), with their holds;
        how many items went. An item that moved on meanwhile keeps both."""
        store = self.app.store
        settled = {state.value for state in ItemState if state.settled}
        removed = await store.records.delete_records(ITEM, media_ids, when=settled)
        gone = [m for m in media_ids if await store.records.get_record(ITEM, m) is None]
        await store.records.delete_records(HOLD, gone)
        return removed

    async def _hold(self, media_id: str, digest: str) -> None:
        await self.app.store.records.put_record(HOLD, media_id, scope=digest, state=HOLDING)

    async def _index_holds(self) -> None:
        """Give every item kept before holds were written its hold, once per store (a store
        written by an older headrace); a marker record says it is done."""
        if self._holds_indexed:
            return
        store = self.app.store
        if await store.records.get_record(*HOLDS_INDEXED) is None:
            for item in await self.all():
                await self._hold(item.media_id, item.digest)
            await store.records.put_record(*HOLDS_INDEXED, scope="moderation", state="done")
        self._holds_indexed = True


def check_label(value: str, field: str) -> str:
    """An event or session id: letters, digits, `-` and `_` (they name flows and groups)."""
    if not isinstance(value, str) or not _LABEL.fullmatch(value):
        raise ConfigError(f"{field}: expected 1 to 64 letters, digits, '-' or '_', got {value!r}")
    return value


def validate_key(media_id: str) -> str:
    """The idempotency key of an item's validate task: it is queued once."""
    return f"validate:{media_id}"
