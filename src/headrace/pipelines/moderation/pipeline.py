"""The moderation pipeline's stages on the runtime: accepted -> validate -> scan -> derive ->
reviewable, with an item quarantined when the scan finds something and refused (with a safe
code) when validation or derive finds the file is not media it takes.

A refusal is the item's outcome, not a failed task: the stage that found it ends `succeeded`,
with the item `refused` and its reason, and nothing reaches the dead letters. A contributor's
bad file is nothing an operator can act on, and a redrive could not help (its bytes are
released). Dead letters stay for what an operator can act on: a store or media store that
failed past the attempts, a decoding host out of disk, a bug.

An upload is accepted once its bytes are kept (`MediaStore.writer`) and its item's record is
written; then its validate task is submitted, in the upload's event (the task's group) and
contributor session (its flow: sessions share the stages fairly; a staff upload may carry a
weight, written to the audit log). Every stage runs once per class (`moderation.validate.image`,
`moderation.scan.video`, ...), declared with the class as its cost class, so a worker's video
slots take only videos and a queue of videos never holds photos back: an upload waits for
validation in the class its first bytes announce (`sniff`); validation decodes it and decides.
Tasks carry the media id, never bytes, names or credentials.

Admission (`Admission`): each validate stage holds at most so many waiting uploads per event
and per session (`QueueFull` past them: the caller says "try later"), and each later stage a
bound in all and per session, so one contributor cannot fill a stage for everyone. Each stage
feeds the next: while scan is full, validation waits; while derive is full, scanning does. An
item waiting in a stage is *queued*, one whose task runs is *processing* (`Moderation.phase`).

Each item's record (kind `item`, scoped to its event: `items.py`, over `store/protocol/records.py`)
says what a moderator sees: its state, class and format, the reason of an automatic flag, where
its derivatives are. A moderator's decision commits with its audit row and the notice it owes
(the outbox), in one transaction. Stage handlers are plain functions (CPU work runs off the event
loop) and safe to run again: a record's keys are set, not added to, and derivatives are made
once per (media id, stage version).

Decoding (validation's full decode, the derivatives) runs in a child process per item with a
memory limit and a timeout (`isolate`); the estimate of its memory (`Item.memory`, bytes) is
read from headers when the upload is accepted. A validated image with bytes past its own end (a
page or an archive appended: a polyglot) is kept as received and flagged `media.trailing_data`
(`Item.flags`) for moderators. A refused item's original is deleted unless another item needs
the same bytes (`Moderation._release_original`).

An upload's bytes are kept before its record is written. When recording them fails, or the
item they were kept for turns out to be another's or refused, they are released at once
(`Moderation.accept_blob`); the pruner finds what a killed process left (`upkeep`). An upload
of the same bytes as an item being refused at that moment may find them deleted under it once
its record is written: it keeps them again from its own spool file (its record now holds them),
so the contributor is never asked to send them twice.

Retention (`upkeep`): when the pruner runs, the items turned away (rejected, quarantined, refused)
and the settled items of a closed event go once old enough, with their derivatives and, unless
another item still names it, their original; an accepted upload no task names is queued.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import io
import json
import logging
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal, Protocol, TypeVar

import headrace as hr
from headrace.pipelines.moderation.derive import METADATA, derive
from headrace.pipelines.moderation.isolate import DEFAULT_ISOLATION, Isolation, run_isolated
from headrace.pipelines.moderation.items import (
    CLOSED,
    EVENT,
    ITEM,
    Item,
    ItemState,
    Records,
    Reviewed,
    check_label,
    validate_key,
)
from headrace.pipelines.moderation.media import (
    Blob,
    Derived,
    MediaStore,
    TooLarge,
    check_media_id,
)
from headrace.pipelines.moderation.originals import Originals
from headrace.pipelines.moderation.probe import (
    DEFAULT_LIMITS,
    Limits,
    MediaClass,
    Probed,
    Refused,
    decode_fully,
    inspect,
    sniff,
)
from headrace.pipelines.moderation.review import Review, ReviewRules
from headrace.pipelines.moderation.scan import Scanner, ScanUnavailable, Verdict
from headrace.pipelines.moderation.trailing import TRAILING_DATA
from headrace.pipelines.moderation.upkeep import Upkeep
from headrace.policy.errors import ConfigError, HeadraceError, QueueFull
from headrace.policy.text import check_text
from headrace.runtime.calls import off_loop
from headrace.store.protocol.records import Audit
from headrace.store.protocol.types import TaskState

log = logging.getLogger("headrace.moderation")

DERIVE_VERSION = 2  # 2: playable copies of audio and video, the waveform on a decibel scale
# A decoding child's own memory beside what it decodes: the pages it writes of the forkserver's
# interpreter and libraries (the rest it shares with the forkserver), its stack and arenas.
CHILD_BASE = 32 << 20
T = TypeVar("T")
MAX_STAFF_WEIGHT = 100.0


class Phase(enum.Enum):
    """Where an item's work is: waiting for a stage, in one, or through them all."""

    QUEUED = "queued"  # accepted, waiting its turn: the scheduler holds it on purpose
    PROCESSING = "processing"  # a stage runs on it (or waits on a remote job for it)
    DONE = "done"  # reviewable, decided, quarantined or refused


@dataclass(frozen=True)
class Admission:
    """How much waiting work the pipeline takes. `per_event` and `per_session`: uploads waiting
    for validation (in each class), past which `submit` raises QueueFull; `stage_bound`: tasks
    waiting in each scan and derive stage, of which one session may hold `per_session`."""

    per_event: int = 500
    per_session: int = 25
    stage_bound: int = 100


@dataclass(frozen=True)
class Staff:
    """An upload by event staff, given `weight` times a session's share of turns: who granted
    it and why go to the audit log with it."""

    weight: float
    by: str
    reason: str

    def __post_init__(self) -> None:
        weight = self.weight
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ConfigError(f"staff.weight: expected a number, got {weight!r}")
        if not 0 < weight <= MAX_STAFF_WEIGHT:
            raise ConfigError(
                f"staff.weight: expected > 0 and <= {MAX_STAFF_WEIGHT:g}, got {weight}"
            )
        check_label(self.by, "staff.by")
        if not isinstance(self.reason, str) or not 0 < len(self.reason) <= 200:
            raise ConfigError("staff.reason: expected 1 to 200 characters")


class OriginalGone(HeadraceError):
    """An upload's bytes were deleted as its record was written (an item of the same content
    was refused at that moment, and nothing else needed them), and no local copy was given to
    keep them again from: send the upload again."""

    def __init__(self, media_id: str) -> None:
        super().__init__(f"media id {media_id}: the upload's bytes were not kept; send it again")
        self.media_id = media_id


class EventClosed(ConfigError):
    """An upload to an event that was closed (`upkeep.close_event`)."""

    def __init__(self, event: str) -> None:
        super().__init__(f"event {event}: closed; it takes no more uploads")
        self.event = event


class UploadConflict(ConfigError):
    """An upload sent again under a media id (an idempotency key) that names other content."""

    def __init__(self, media_id: str, field: str) -> None:
        super().__init__(
            f"media id {media_id}: already names an upload whose {field} differs; send the same "
            "upload again, or another upload under a new idempotency key"
        )
        self.media_id = media_id
        self.field = field


Order = Literal["fair", "fifo"]


class Moderation:
    """The pipeline's stages, declared on `app`; `accept` takes uploads. `order="fifo"` declares
    them as one arrival-order queue over shared slots, with no caps: the baseline the burst
    report compares with. `work`: what the stages do to files (`RealWork` unless given)."""

    def __init__(
        self,
        app: hr.App,
        media: MediaStore,
        scanner: Scanner | None,
        *,
        limits: Mapping[MediaClass, Limits] | None = None,
        admission: Admission | None = None,
        order: Order = "fair",
        work: MediaWork | None = None,
        isolation: Isolation | None = None,
        review: ReviewRules | None = None,
    ) -> None:
        if order not in ("fair", "fifo"):
            raise ConfigError(f"moderation.order: expected 'fair' or 'fifo', got {order!r}")
        self.app = app
        self.media = media
        self.records = Records(app)
        self.originals = Originals(app, media)
        self.limits = dict(limits or DEFAULT_LIMITS)
        if work is None:
            if scanner is None:
                raise ConfigError("moderation: give a scanner (or the work the stages do)")
            work = RealWork(scanner, self.limits, isolation)
        self.work: MediaWork = work
        self.admission = admission or Admission()
        self.order = order
        self._declare()
        self.reviews = Review(app, self.records, review)

        app.on_prune(Upkeep(self).prune)
        # A worker process checks its media store before it takes work (originals.py).
        app.on_start(self.originals.check_at_start)

    # -- accepting

    async def accept(
        self,
        source: BinaryIO,
        *,
        event: str,
        session: str,
        staff: Staff | None = None,
        media_id: str | None = None,
        caption: str | None = None,
    ) -> Item:
        """Keep an upload's bytes and write its record (state accepted); `submit` queues it.
        Raises TooLarge past the largest size any class takes, with nothing kept. A `staff`
        upload's weight goes to the audit log with the record. Given a `media_id` that has a
        record already, that item is returned as it is (compare its digest: the bytes kept
        are the first upload's)."""
        check_label(event, "event")
        check_label(session, "session")
        if await self.closed(event):  # before the bytes are kept: nothing to clear after
            raise EventClosed(event)
        async with self.media.writer(limit=self.max_bytes) as writer:
            await off_loop(writer.write_from, source)
            blob = await writer.keep()
            return await self.accept_blob(
                blob,
                event=event,
                session=session,
                staff=staff,
                media_id=media_id,
                caption=caption,
                local=writer.path,
            )

    @property
    def max_bytes(self) -> int:
        """The largest upload any class takes."""
        return max(limit.max_bytes for limit in self.limits.values())

    async def accept_blob(
        self,
        blob: Blob,
        *,
        event: str,
        session: str,
        staff: Staff | None = None,
        media_id: str | None = None,
        caption: str | None = None,
        local: Path | None = None,
    ) -> Item:
        """`accept` for bytes kept already (`MediaStore.writer`, as an upload streams in);
        `local`: a local file with the same bytes (the writer's), read instead of fetching
        the original from the media store, and kept again from if they were deleted as the
        record was written. The bytes are released again (unless an item names them) when
        this fails, or the item returned is refused or holds other bytes: no upload leaves
        an original that no item names."""
        try:
            kept = await self._record(
                blob,
                event=event,
                session=session,
                staff=staff,
                media_id=media_id,
                caption=caption,
                local=local,
            )
        except Exception:
            await self.release_unnamed(blob.digest)
            raise
        if kept.digest != blob.digest or kept.state is ItemState.REFUSED:
            await self.release_unnamed(blob.digest)
        return kept

    async def release_unnamed(self, digest: str, *, leaving: Collection[str] = ()) -> int:
        """Release an original unless an item that is not refused (but those `leaving`) names
        it: one read when one does, and the original stays where it is for the validations
        reading it; a `release_originals` when none seems to."""
        if await self.naming({digest}, leaving=leaving):
            return 0
        return await self.release_originals({digest}, leaving=leaving)

    async def _record(
        self,
        blob: Blob,
        *,
        event: str,
        session: str,
        staff: Staff | None,
        media_id: str | None,
        caption: str | None,
        local: Path | None,
    ) -> Item:
        check_label(event, "event")
        check_label(session, "session")
        if media_id is not None:
            check_media_id(media_id)
        check_caption(caption)
        if await self.closed(event):
            raise EventClosed(event)
        async with self._readable(blob.digest, local) as path:
            queued_as = await off_loop(sniff, path) or MediaClass.IMAGE
            memory = await self.work.estimate(path)
        item = Item(
            media_id or self.media.new_media_id(),
            event,
            session,
            blob.digest,
            blob.size,
            queued_as=queued_as.value,
            weight=1.0 if staff is None else float(staff.weight),
            caption=caption,
            memory=memory,
        )
        audit = None
        if staff is not None:
            detail = {"weight": item.weight, "reason": staff.reason}
            audit = Audit("upload.weighted", staff.by, detail)
        kept, _ = await self.records.put(item, audit)
        if kept.digest != blob.digest or kept.state is ItemState.REFUSED:
            return kept  # another upload's item (the caller compares), or one done with them
        # A refused item of the same bytes may have deleted them between their keeping and
        # this record: its deleter re-checks records after taking the file away, so from here
        # on this record holds them, and if they are gone already they are kept again.
        if await self.media.has_blob(kept.digest):
            return kept
        if local is None:
            raise OriginalGone(kept.media_id)
        await self.media.keep_original(blob, local)
        log.info("upload %s: its bytes went with a refused item's; kept again", kept.media_id)
        return kept

    def _readable(self, digest: str, local: Path | None) -> AbstractAsyncContextManager[Path]:
        """The original as a local file: `local` when given, else fetched for the block."""
        return contextlib.nullcontext(local) if local is not None else self.media.original(digest)

    async def receive(
        self,
        blob: Blob,
        *,
        event: str,
        session: str,
        media_id: str | None = None,
        caption: str | None = None,
        local: Path | None = None,
    ) -> Item:
        """An upload as a client sends it, its bytes kept (and in the local file `local`, when
        given): its record written and its validation queued, once however often it is sent
        under one `media_id`. Raises UploadConflict when that media id names other content,
        and QueueFull when admission is full (the item is then `declined`, until it is sent
        again)."""
        item = await self.accept_blob(
            blob, event=event, session=session, media_id=media_id, caption=caption, local=local
        )
        for field, first, now in (
            ("event", item.event, event),
            ("content", item.digest, blob.digest),
            ("caption", item.caption, caption),
        ):
            if first != now:
                raise UploadConflict(item.media_id, field)
        if item.state is ItemState.DECLINED:
            item = await self.records.write_if(
                item.media_id, ItemState.DECLINED, ItemState.ACCEPTED
            )
        if item.state is ItemState.ACCEPTED:
            try:
                await self.submit(item)
            except QueueFull:
                await self.records.write_if(item.media_id, ItemState.ACCEPTED, ItemState.DECLINED)
                raise
        return item

    async def closed(self, event: str) -> bool:
        """Whether `event` was closed."""
        found = await self.app.store.records.get_record(EVENT, check_label(event, "event"))
        return found is not None and found.state == CLOSED

    async def accept_bytes(
        self, data: bytes, *, event: str, session: str, staff: Staff | None = None
    ) -> Item:
        """`accept` for an upload already in memory."""
        return await self.accept(io.BytesIO(data), event=event, session=session, staff=staff)

    async def submit(self, item: Item) -> int:
        """Queue an accepted item's validation (once, whatever the retries of the caller).
        Raises QueueFull when its event or session has as many uploads waiting as admitted."""
        stage = self.app.definition(validate_stage(MediaClass(item.queued_as)))
        spec = stage.spec(
            item.media_id,
            group=item.event,
            flow=item.session if self.order == "fair" else "arrival",
            key=validate_key(item.media_id),
            weight=item.weight,
            memory=decode_charge(item.memory),
        )
        [task_id] = await self.app.submit([spec])
        return task_id

    async def phase(self, item: Item) -> Phase:
        """Whether an item waits for a stage or is in one: its record says which stage, the
        store whether that stage's task runs."""
        item = await self.records.get(item.media_id)
        if item.state.settled:
            return Phase.DONE
        stage = {ItemState.ACCEPTED: "validate", ItemState.VALIDATED: "scan"}.get(
            item.state, "derive"
        )
        task = await self.app.store.find(f"{stage}:{item.media_id}")
        if task is None or task.state in (TaskState.PENDING, TaskState.READY):
            return Phase.QUEUED
        return Phase.PROCESSING

    async def review(
        self, media_id: str, *, approve: bool, by: str, reason: str | None = None
    ) -> Reviewed:
        """A moderator's decision on a reviewable item (`review.Review.decide`: the first one
        stands and owes one notice, a repeat is a no-op, every attempt is audited; another
        moderator's claim or another decision raises ConfigError)."""
        return await self.reviews.decide(media_id, approve=approve, by=by, reason=reason)

    # -- stages

    def _declare(self) -> None:
        for media_class in MediaClass:
            self._declare_class(media_class)

    def _declare_class(self, media_class: MediaClass) -> None:
        app, records, work = self.app, self.records, self.work
        validate_options, scan_options, derive_options = stage_options(
            media_class, self.admission, self.order
        )

        @app.task(name=validate_stage(media_class), max_attempts=3, **validate_options)
        async def validate(ctx: hr.Context, media_id: str) -> None:
            item = await records.get(media_id)
            try:
                async with self.originals.of(media_id, item.digest) as original:
                    found = await work.probe(original)
            except Refused as refused:
                await self._refuse(item, ItemState.ACCEPTED, refused)
                return
            # If scan has no room when this ends, the attempt is deferred: it runs again later
            # and writes the same record.
            ctx.spawn(
                scan_stage(found.media_class),
                media_id,
                key=f"scan:{media_id}",
                weight=item.weight,
                continues=True,  # an item started goes on before new ones start
            )
            await records.write_if(
                media_id,
                ItemState.ACCEPTED,
                ItemState.VALIDATED,
                media_class=found.media_class.value,
                format=found.format,
                metadata=found.as_dict(),
                memory=found.memory,  # read again in the decoding child: what derive charges
                flags=[TRAILING_DATA] if found.trailing else [],
            )

        @app.task(name=scan_stage(media_class), max_attempts=5, **scan_options)
        async def scan(ctx: hr.Context, media_id: str) -> None:
            item = await records.get(media_id)
            try:
                async with self.originals.of(media_id, item.digest) as original:
                    verdict = await work.scan(original)
            except ScanUnavailable as error:
                raise hr.Unavailable(str(error), code="scan.unavailable") from None
            if verdict.infected:
                await records.write_if(
                    media_id, ItemState.VALIDATED, ItemState.QUARANTINED, reason=verdict.signature
                )
                return
            ctx.spawn(
                derive_stage(media_class),
                media_id,
                key=f"derive:{media_id}",
                weight=item.weight,
                memory=decode_charge(item.memory),
                continues=True,
            )
            await records.write_if(media_id, ItemState.VALIDATED, ItemState.SCANNED)

        @app.task(name=derive_stage(media_class), max_attempts=3, **derive_options)
        async def make_derivatives(ctx: hr.Context, media_id: str) -> None:
            item = await records.get(media_id)
            try:
                made = await self._derivatives(item)
            except Refused as refused:  # the decoders read what validation did not
                await self._refuse(item, ItemState.SCANNED, refused)
                return
            await records.write_if(
                media_id,
                ItemState.SCANNED,
                ItemState.REVIEWABLE,
                derived=made.prefix,
                metadata=json.loads(await self.media.read_derived(made, METADATA)),
            )

    async def _refuse(self, item: Item, was: ItemState, refused: Refused) -> None:
        """The item's outcome when a stage finds its file is not media it takes: `refused`
        with the safe code (the stage's task succeeds), its derivatives and, unless another
        item names it, its original gone."""
        now = await self.records.write_if(
            item.media_id, was, ItemState.REFUSED, reason=refused.code
        )
        if now.state is not ItemState.REFUSED:
            return  # moved on under a late attempt: nothing of it is this attempt's to clear
        log.info("item %s refused: %s", item.media_id, refused.code)
        await self.media.remove_derived(item.media_id)
        await self._release_original(item)

    async def _release_original(self, item: Item) -> None:
        """Delete a refused item's original unless another item that is not refused names the
        same digest (`release_unnamed`)."""
        await self.release_unnamed(item.digest, leaving={item.media_id})

    async def release_originals(self, digests: Collection[str], *, leaving: Collection[str]) -> int:
        """Delete the originals of `digests` that no item but those `leaving` (and refused
        ones) names; return how many went. Safe against an upload of the same bytes at that
        moment: each original is first taken out of its place (moved), then the records are
        read; an upload whose record was written before that read is seen and the original is
        put back, and one whose record comes after finds it missing (`MissingMedia`) or, kept
        after the taking, its own copy in place, which the deletion does not touch. On a
        bucket a move is a copy and a delete: the records are read after the delete, so the
        same holds."""
        taken = {}
        for digest in sorted(digests):
            found = await self.media.take_blob(digest)
            if found is not None:
                taken[digest] = found
        named = await self.naming(taken, leaving=leaving) if taken else {}
        for digest, where in taken.items():
            await self.media.settle_blob(digest, where, keep=digest in named)
        return len(taken.keys() - named.keys())

    async def naming(
        self, digests: Collection[str], *, leaving: Collection[str]
    ) -> dict[str, list[str]]:
        """The items (media ids) that still need one of `digests`, by digest
        (`Records.holders`)."""
        return await self.records.holders(digests, leaving=leaving)

    async def _derivatives(self, item: Item) -> Derived:
        """(media id, stage version)'s derivatives: made once, reused by every later attempt
        (a worker that died after making them, a racing second attempt)."""

        async def make(into: Path) -> None:
            async with self.originals.of(item.media_id, item.digest) as original:
                await self.work.derive(original, into)

        return await self.media.derive_once(item.media_id, "derive", DERIVE_VERSION, make)


class MediaWork(Protocol):
    """What the stages do to an item's original, awaited (CPU work off the event loop).
    `derive` writes the derivatives into `into`, their metadata as `metadata.json` among them.
    `estimate`: decoding's peak memory in bytes, from headers only (None: they do not read)."""

    async def estimate(self, original: Path) -> int | None: ...

    async def probe(self, original: Path) -> Probed: ...

    async def scan(self, original: Path) -> Verdict: ...

    async def derive(self, original: Path, into: Path) -> None: ...


class RealWork:
    """The media code: libvips, Pillow and PyAV to probe and derive, each decode in a child
    process under `isolation` (`isolate`); a `Scanner` to scan."""

    def __init__(
        self,
        scanner: Scanner,
        limits: Mapping[MediaClass, Limits],
        isolation: Isolation | None = None,
    ) -> None:
        self.scanner = scanner
        self.limits = dict(limits)
        self.isolation = isolation or DEFAULT_ISOLATION

    async def estimate(self, original: Path) -> int | None:
        try:
            found = await self._isolated(_headers, original)
        except Refused:
            return None  # validation will refuse it, with the reason
        return found.memory

    async def probe(self, original: Path) -> Probed:
        return await self._isolated(_validated, original)

    async def scan(self, original: Path) -> Verdict:
        return await off_loop(self.scanner.scan, original)

    async def derive(self, original: Path, into: Path) -> None:
        await self._isolated(_derived, original, into)

    async def _isolated(self, work: Callable[..., T], original: Path, *args: Any) -> T:
        sizing = functools.partial(inspect, original, self.limits)
        return await off_loop(run_isolated, work, sizing, original, *args, isolation=self.isolation)


# What a decoding child runs, given what `inspect` read from the headers.


def _headers(found: Probed, original: Path) -> Probed:
    return found


def _validated(found: Probed, original: Path) -> Probed:
    decode_fully(original, found)
    return found


def _derived(found: Probed, original: Path, into: Path) -> None:
    derive(original, found, into)


def decode_charge(estimate: int | None) -> int:
    """What a decoding stage charges its worker's memory budget (`Worker(memory=)`): the
    estimate read from the item's headers, plus the decoding child's own pages (`CHILD_BASE`);
    headers that did not read cost a child that reads headers and refuses."""
    return CHILD_BASE + (estimate or 0)


def stage_options(
    media_class: MediaClass, admission: Admission, order: Order
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The options of a class's validate, scan and derive stages. `fair`: the class's worker
    slots, admission caps, bounds, each stage feeding the next. `fifo` (a baseline to compare
    with): one queue in arrival order, shared slots, no caps."""
    if order == "fifo":
        return {}, {}, {}
    shared = {"cost_class": media_class.value, "per_flow": admission.per_session}
    bounded = {**shared, "bound": admission.stage_bound}
    return (
        {
            **shared,
            "per_group": admission.per_event,
            "on_full": "refuse",
            "feeds": [scan_stage(media_class)],
        },
        {**bounded, "feeds": [derive_stage(media_class)]},
        bounded,
    )


def validate_stage(media_class: MediaClass) -> str:
    return f"moderation.validate.{media_class.value}"


def scan_stage(media_class: MediaClass) -> str:
    return f"moderation.scan.{media_class.value}"


def derive_stage(media_class: MediaClass) -> str:
    return f"moderation.derive.{media_class.value}"


MAX_CAPTION = 1000


def check_caption(caption: str | None) -> None:
    if caption is not None and (not isinstance(caption, str) or len(caption) > MAX_CAPTION):
        raise ConfigError(f"caption: expected at most {MAX_CAPTION} characters")
    if caption is not None:
        check_text(caption, "caption")


__all__ = [
    "CLOSED",
    "DERIVE_VERSION",
    "EVENT",
    "ITEM",
    "Admission",
    "EventClosed",
    "Item",
    "ItemState",
    "MediaWork",
    "Moderation",
    "Order",
    "OriginalGone",
    "Phase",
    "RealWork",
    "Records",
    "Reviewed",
    "Staff",
    "TooLarge",
    "UploadConflict",
    "check_label",
    "derive_stage",
    "scan_stage",
    "stage_options",
    "validate_key",
    "validate_stage",
]
