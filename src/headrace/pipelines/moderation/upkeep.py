"""What the moderation pipeline does when the pruner runs (`App.on_prune`), and closing events.

- **The upload sweep.** An upload whose process died between its item's record and its
  validate task's submit (acknowledged or not) leaves an item `accepted` that no task names.
  Once older than `retention.upload_grace`, the sweep queues it as the upload would have (the
  same key, `validate:<media id>`, so it is queued once) with an `upload.requeued` audit row;
  one whose bytes were never kept (`OriginalGone`) cannot be: it is refused with the reason
  `upload.original_missing`. One that admission has no room for waits for the next sweep. The
  sweep looks back no further than the shortest age at which a failed validation is pruned
  (`Retention.sweep_horizon`): an older item with no task may have had one.
- **Originals no item names.** An upload keeps its bytes a moment before its item's record
  names them; one that failed in that moment released them itself (`Moderation.accept_blob`),
  but a process killed there, or an older headrace that did not release them, left them with
  no item. Once they are `retention.orphans` old (an hour by default: see `Retention`), by the
  media store's clock, the originals no item names go (`Moderation.release_unnamed`: taken out
  of their place, the records read, then deleted or put back), with what a killed release or
  writer left under `blobs/`. Each run looks at what was written since the last run's end,
  less one `orphans` period of overlap (a mark in the store), so an original is looked at about
  twice, not at every run; the first run looks at every original, old ones included.
- **Items past their retention.** Items turned away (rejected, quarantined, refused) once
  `retention.turned_away` old, and the settled items of an event closed
  `retention.closed_events` ago, go with their derivatives (`MediaStore.remove_derived`) and,
  unless another item still names it, their original (`MediaStore.remove_blob`): the same
  check that releases a refused item's original (`Moderation.naming`). Files go before the
  record, so a run cut short leaves a record to finish with, never a file no record names.
- **Closing an event** (`close_event`, `headrace event close`, `POST /v1/events/{event}/close`):
  a record of kind `event` in state `closed`, audited; uploads to it are refused from then on.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Protocol

from headrace.pipelines.moderation.items import (
    CLOSED,
    EVENT,
    ITEM,
    Item,
    ItemState,
    Records,
    check_label,
    validate_key,
)
from headrace.pipelines.moderation.media import MediaStore
from headrace.pipelines.moderation.review import Review
from headrace.policy.errors import QueueFull
from headrace.runtime.app import App
from headrace.runtime.prunehooks import PruneRun
from headrace.store.protocol.records import Audit, Record
from headrace.store.protocol.tasks import Store

log = logging.getLogger("headrace.pruner")

PRUNER = "pruner"  # the actor of what the sweep writes to the audit log
ORIGINAL_MISSING = "upload.original_missing"  # its bytes were never kept: cannot be queued
# Until when (the media store's clock) originals were looked at for an item that names them.
ORPHANS_SWEPT = ("meta", "orphans-swept")
TURNED_AWAY = (ItemState.REJECTED, ItemState.QUARANTINED, ItemState.REFUSED)
PAGE = 1000

# What a run reports, per kind.
ITEMS = "items"
DERIVATIVES = "derivative sets"
ORIGINALS = "originals"
QUEUED = "uploads queued"
LOST = "uploads lost"
ORPHANS = "originals no item named"
LABELS = (ITEMS, DERIVATIVES, ORIGINALS, QUEUED, LOST, ORPHANS)


async def close_event(store: Store, event: str, *, by: str) -> bool:
    """Close `event`: it takes no upload from now, and its settled items go once
    `retention.closed_events` old. Audited (`event.closed`), a repeat too; whether this call
    closed it."""
    check_label(event, "event")
    audit = Audit("event.closed", by)
    made = await store.records.put_record(EVENT, event, scope=event, state=CLOSED, audit=audit)
    if not made.applied:
        await store.records.write_audit(
            EVENT, event, scope=event, audit=audit, outcome=f"unchanged: {made.record.state}"
        )
    return made.applied


class Pipeline(Protocol):
    """What the prune hook needs of the pipeline it cleans up after (`Moderation`)."""

    app: App
    media: MediaStore
    records: Records
    reviews: Review

    async def submit(self, item: Item) -> int: ...

    async def release_unnamed(self, digest: str, *, leaving: Collection[str] = ()) -> int: ...

    async def release_originals(
        self, digests: Collection[str], *, leaving: Collection[str]
    ) -> int: ...

    async def naming(
        self, digests: Collection[str], *, leaving: Collection[str]
    ) -> dict[str, list[str]]: ...


class Upkeep:
    """The moderation pipeline's prune hook (`prune`), registered by `Moderation`."""

    def __init__(self, moderation: Pipeline) -> None:
        self.moderation = moderation
        self.media = moderation.media

    @property
    def store(self) -> Store:
        return self.moderation.app.store

    async def prune(self, run: PruneRun) -> Mapping[str, int]:
        counts: Counter[str] = Counter()
        counts.update(await self.sweep(run))
        counts.update(await self.orphans(run))
        expired = [item async for item in self.expired(run)]
        for first in range(0, len(expired), run.retention.batch):
            batch = expired[first : first + run.retention.batch]
            counts.update(await self.remove(batch, dry_run=run.dry_run))
        return {label: counts[label] for label in LABELS}

    # -- the upload sweep

    async def sweep(self, run: PruneRun) -> Counter[str]:
        """Queue the accepted items no task names (see the module)."""
        counts: Counter[str] = Counter()
        grace, horizon = run.retention.upload_grace, run.retention.sweep_horizon
        async for record in self.records(ITEM, state=ItemState.ACCEPTED.value):
            age = run.now - record.created_at
            if age < grace or (horizon is not None and age > horizon):
                continue
            if await self.store.find(validate_key(record.id)) is not None:
                continue
            became = await self.requeue(Item.of(record), run.dry_run)
            if became is not None:
                counts[became] += 1
        return counts

    async def requeue(self, item: Item, dry_run: bool) -> str | None:
        """Queue an item no task names; what became of it (`QUEUED`, `LOST`, or None:
        admission is full, the next sweep tries again)."""
        if not await self.media.has_blob(item.digest):
            if not dry_run:
                await self.refuse(item, ORIGINAL_MISSING, "upload.swept")
            return LOST
        if dry_run:
            return QUEUED
        try:
            task_id = await self.moderation.submit(item)
        except QueueFull:
            return None
        audit = Audit("upload.requeued", PRUNER, {"task": task_id})
        await self.store.records.write_audit(
            ITEM, item.media_id, scope=item.event, audit=audit, outcome="applied"
        )
        log.info("pruner: queued upload %s, which no task named, as %d", item.media_id, task_id)
        return QUEUED

    async def refuse(self, item: Item, reason: str, action: str) -> None:
        await self.store.records.change_record(
            ITEM,
            item.media_id,
            state=ItemState.REFUSED.value,
            body={"reason": reason},
            when={ItemState.ACCEPTED.value, ItemState.VALIDATED.value, ItemState.SCANNED.value},
            audit=Audit(action, PRUNER, {"reason": reason}),
        )

    # -- originals no item names

    async def orphans(self, run: PruneRun) -> Counter[str]:
        """Release the originals no item names, written long enough ago (see the module)."""
        counts: Counter[str] = Counter()
        age = run.retention.orphans
        if age is None:
            return counts
        until = self.media.wall() - age
        mark = await self.store.records.get_record(*ORPHANS_SWEPT)
        since = None if mark is None else float(mark.body["until"]) - age
        stale = await self.media.stale_blobs(before=until, since=since)
        for digest in stale.originals:
            if run.dry_run:
                counts[ORPHANS] += not await self.named(digest)
            else:
                counts[ORPHANS] += await self.moderation.release_unnamed(digest)
        for digest, taken in stale.taken:  # a release killed between its take and its settle
            named = await self.named(digest)
            if not run.dry_run:
                await self.media.settle_blob(digest, taken, keep=named)
            counts[ORPHANS] += not named
        for leftover in stale.leftovers:
            if not run.dry_run:
                await self.media.remove_leftover(leftover)
            counts[ORPHANS] += 1
        if not run.dry_run:
            await self.mark_orphans_swept(until)
        return counts

    async def named(self, digest: str) -> bool:
        return bool(await self.moderation.naming({digest}, leaving=()))

    async def mark_orphans_swept(self, until: float) -> None:
        body = {"until": until}
        made = await self.store.records.put_record(
            *ORPHANS_SWEPT, scope="moderation", state="done", body=body
        )
        if not made.applied:
            await self.store.records.change_record(*ORPHANS_SWEPT, body=body)

    # -- items past their retention

    async def expired(self, run: PruneRun) -> AsyncIterator[Item]:
        """The items whose retention ran out: turned away long enough ago, or settled in an
        event closed long enough ago; each once."""
        seen: set[str] = set()
        age = run.retention.turned_away
        if age is not None:
            for state in TURNED_AWAY:
                async for record in self.records(ITEM, state=state.value):
                    if record.changed_at < run.now - age and record.id not in seen:
                        seen.add(record.id)
                        yield Item.of(record)
        age = run.retention.closed_events
        if age is None:
            return
        async for event in self.records(EVENT, state=CLOSED):
            if event.changed_at >= run.now - age:
                continue
            async for record in self.records(ITEM, scope=event.id):
                if ItemState(record.state).settled and record.id not in seen:
                    seen.add(record.id)
                    yield Item.of(record)

    async def remove(self, items: Sequence[Item], *, dry_run: bool) -> Counter[str]:
        """Items' derivatives, the originals no other item names, then their records."""
        counts: Counter[str] = Counter()
        leaving = {item.media_id for item in items}
        for item in items:
            if dry_run:
                counts[DERIVATIVES] += item.derived is not None
            else:
                counts[DERIVATIVES] += await self.media.remove_derived(item.media_id) > 0
        counts[ORIGINALS] += await self.remove_originals(items, leaving, dry_run)
        if dry_run:
            counts[ITEMS] += len(items)
        else:
            counts[ITEMS] += await self.moderation.records.forget(leaving)
            await self.moderation.reviews.forget(leaving)
        return counts

    async def remove_originals(
        self, items: Sequence[Item], leaving: Collection[str], dry_run: bool
    ) -> int:
        digests = {item.digest for item in items}
        if not dry_run:
            return await self.moderation.release_originals(digests, leaving=leaving)
        unneeded = digests - (await self.moderation.naming(digests, leaving=leaving)).keys()
        return sum([await self.media.has_blob(digest) for digest in unneeded])

    async def records(
        self, kind: str, *, state: str | None = None, scope: str | None = None
    ) -> AsyncIterator[Record]:
        """Records of `kind` (in `state`, of `scope`), a page at a time, in seq order."""
        after = 0
        while True:
            page = await self.store.records.list_records(
                kind, scope=scope, state=state, after=after, limit=PAGE
            )
            for record in page:
                yield record
            if len(page) < PAGE:
                return
            after = page[-1].seq
