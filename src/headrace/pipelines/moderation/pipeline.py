"""The moderation pipeline's stages on the runtime: accepted -> validate -> scan -> derive ->
reviewable, with an item quarantined when the scan finds something and refused (its task dead
with a safe code) when validation does.

An upload is accepted once its bytes are kept (`MediaStore.put`) and its item record is written;
then its validate task is submitted, in the upload's event (the task's group) and contributor
session (its flow: sessions share the stages fairly). Validation learns the item's class
(image, audio, video) from its content; scan and derive run as stages of that class
(`moderation.scan.video`, ...), declared with the class as their cost class, so a worker's video
slots take only videos. Tasks carry the media id, never bytes, names or credentials.

Each item's record (`records/<media id>.json` in the media directory) says what a moderator
sees: its state, class and format, the reason of an automatic flag, where its derivatives are.
Stage handlers are plain functions (CPU work runs off the event loop) and safe to run again: a
record is rewritten whole, and derivatives are made once per (media id, stage version).
"""

from __future__ import annotations

import enum
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import BinaryIO

import headrace as hr
from headrace.pipelines.moderation.derive import derive
from headrace.pipelines.moderation.media import MediaStore, TooLarge, check_media_id
from headrace.pipelines.moderation.probe import DEFAULT_LIMITS, Limits, MediaClass, Refused, probe
from headrace.pipelines.moderation.scan import Scanner, ScanUnavailable
from headrace.policy.errors import ConfigError

DERIVE_VERSION = 1
VALIDATE = "moderation.validate"
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


class ItemState(enum.Enum):
    ACCEPTED = "accepted"  # kept, waiting for (or in) validation
    VALIDATED = "validated"  # its type and size are known and taken; scan next
    SCANNED = "scanned"  # clean; derivatives next
    REVIEWABLE = "reviewable"  # ready for a moderator
    QUARANTINED = "quarantined"  # the scan found something: never derived
    REFUSED = "refused"  # not media this pipeline takes (the reason is a safe code)


@dataclass(frozen=True)
class Item:
    media_id: str
    event: str
    session: str
    digest: str
    size: int
    state: ItemState = ItemState.ACCEPTED
    media_class: str | None = None
    format: str | None = None
    reason: str | None = None  # a safe code, or the name of what the scan found
    derived: str | None = None  # the derivatives' directory, relative to the media root
    metadata: Mapping[str, object] | None = None

    def as_json(self) -> str:
        return json.dumps({**asdict(self), "state": self.state.value}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Item:
        fields = json.loads(text)
        return cls(**{**fields, "state": ItemState(fields["state"])})


class Records:
    """Item records in the media directory, each rewritten whole and renamed into place."""

    def __init__(self, media: MediaStore) -> None:
        self.root = media.root / "records"

    def get(self, media_id: str) -> Item:
        path = self.root / f"{check_media_id(media_id)}.json"
        try:
            return Item.from_json(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"media id {media_id!r}: no such item") from None

    def put(self, item: Item) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=self.root, prefix=".record.")
        with os.fdopen(descriptor, "w") as handle:
            handle.write(item.as_json())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.root / f"{check_media_id(item.media_id)}.json")

    def update(self, media_id: str, **changes: object) -> Item:
        item = replace(self.get(media_id), **changes)  # type: ignore[arg-type]
        self.put(item)
        return item


class Moderation:
    """The pipeline's stages, declared on `app`; `accept` takes uploads."""

    def __init__(
        self,
        app: hr.App,
        media: MediaStore,
        scanner: Scanner,
        *,
        limits: Mapping[MediaClass, Limits] | None = None,
    ) -> None:
        self.app = app
        self.media = media
        self.records = Records(media)
        self.scanner = scanner
        self.limits = dict(limits or DEFAULT_LIMITS)
        self._declare()

    # -- accepting

    def accept(self, source: BinaryIO, *, event: str, session: str) -> Item:
        """Keep an upload and write its record (state accepted); `submit` queues it. Raises
        TooLarge past the largest size any class takes, with nothing kept."""
        check_label(event, "event")
        check_label(session, "session")
        blob = self.media.put(source, limit=max(limit.max_bytes for limit in self.limits.values()))
        item = Item(self.media.new_media_id(), event, session, blob.digest, blob.size)
        self.records.put(item)
        return item

    async def submit(self, item: Item) -> int:
        """Queue an accepted item's validation (once, whatever the retries of the caller)."""
        return await self.app.definition(VALIDATE).submit(
            item.media_id, group=item.event, flow=item.session, key=f"validate:{item.media_id}"
        )

    # -- stages

    def _declare(self) -> None:
        app = self.app

        @app.task(name=VALIDATE, max_attempts=3)
        def validate(ctx: hr.Context, media_id: str) -> None:
            item = self.records.get(media_id)
            try:
                found = probe(self.media.blob_path(item.digest), self.limits)
            except Refused as refused:
                self.records.update(media_id, state=ItemState.REFUSED, reason=refused.code)
                raise hr.Fatal(refused.message, code=refused.code) from None
            self.records.update(
                media_id,
                state=ItemState.VALIDATED,
                media_class=found.media_class.value,
                format=found.format,
                metadata=found.as_dict(),
            )
            ctx.spawn(scan_stage(found.media_class), media_id)

        for media_class in MediaClass:
            self._declare_class(media_class)

    def _declare_class(self, media_class: MediaClass) -> None:
        app = self.app

        @app.task(name=scan_stage(media_class), cost_class=media_class.value, max_attempts=5)
        def scan(ctx: hr.Context, media_id: str) -> None:
            item = self.records.get(media_id)
            try:
                verdict = self.scanner.scan(self.media.blob_path(item.digest))
            except ScanUnavailable as error:
                raise hr.Transient(str(error), code="scan.unavailable") from None
            if verdict.infected:
                self.records.update(media_id, state=ItemState.QUARANTINED, reason=verdict.signature)
                return
            self.records.update(media_id, state=ItemState.SCANNED)
            ctx.spawn(derive_stage(media_class), media_id)

        @app.task(name=derive_stage(media_class), cost_class=media_class.value, max_attempts=3)
        def make_derivatives(ctx: hr.Context, media_id: str) -> None:
            item = self.records.get(media_id)
            original = self.media.blob_path(item.digest)
            with self.media.deriving(media_id, "derive", DERIVE_VERSION) as made:
                if made.created:
                    metadata = derive(original, probe(original, self.limits), made.path)
                else:  # an earlier attempt made them: reuse, never a second set
                    metadata = json.loads(made.file("metadata.json").read_text())
            relative = self.media.derived(media_id, "derive", DERIVE_VERSION)
            assert relative is not None
            self.records.update(
                media_id,
                state=ItemState.REVIEWABLE,
                derived=str(relative.path.relative_to(self.media.root)),
                metadata=metadata,
            )


def scan_stage(media_class: MediaClass) -> str:
    return f"moderation.scan.{media_class.value}"


def derive_stage(media_class: MediaClass) -> str:
    return f"moderation.derive.{media_class.value}"


def check_label(value: str, field: str) -> str:
    """An event or session id: letters, digits, `-` and `_` (they name flows and groups)."""
    if not isinstance(value, str) or not _LABEL.fullmatch(value):
        raise ConfigError(f"{field}: expected 1 to 64 letters, digits, '-' or '_', got {value!r}")
    return value


__all__ = [
    "DERIVE_VERSION",
    "Item",
    "ItemState",
    "Moderation",
    "Records",
    "TooLarge",
    "check_label",
    "derive_stage",
    "scan_stage",
]
