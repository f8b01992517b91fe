"""The originals the stages read, and whether the media store a process was given is the one
its items' originals are in.

A stage that cannot read an item's original tells two things apart:

- the media store cannot be reached (`MediaUnavailable`): an outage, no item's fault; the task
  backs off and runs again, its attempt not counted (`hr.Unavailable`);
- the item's original is out of its place for a moment, while the refusal of an item with the
  same bytes settles whether to delete it or put it back (`MediaStore.take_blob`): retried
  shortly, its attempt not counted (`media.original_settling`); the item names it, so it is
  put back;
- the item's original is not there: the item's own loss (`media.original_missing`, never
  retried: an operator restores the original and retries the dead letter), unless the store
  holds none of the other waiting items' originals either. Then it is not the deployment's
  media store (a wrong `HEADRACE_MEDIA`, a volume not mounted): an outage again.

A process that runs the pipeline's workers checks its media store once before taking work
(`App.on_start`): that it answers, honours a conditional write, and holds the originals of the
items waiting for a stage. Otherwise it stops with one line that names the setting, its value
and what to do (`MediaStoreUnusable`), and no task is touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Collection
from pathlib import Path

import headrace as hr
from headrace.pipelines.moderation.media import (
    MediaStore,
    MediaStoreUnusable,
    MediaUnavailable,
    MissingMedia,
)
from headrace.pipelines.moderation.media.store import blob_key
from headrace.policy.errors import ConfigError, TaskFailure
from headrace.policy.redact import hide_passwords

ITEM = "item"  # the kind of an item's record (pipeline.ITEM)
# The states of an item some stage still has to read its original for.
WAITING = ("accepted", "validated", "scanned")
SAMPLE = 20  # waiting items looked at per state: the oldest, whose tasks run first
MISSING = "media.original_missing"
SETTLING = "media.original_settling"


class Originals:
    """The originals of the items in `app`'s store, kept in `media`."""

    def __init__(self, app: hr.App, media: MediaStore) -> None:
        self.app = app
        self.media = media

    @contextlib.asynccontextmanager
    async def of(self, media_id: str, digest: str) -> AsyncIterator[Path]:
        """An item's original as a local file for the block; a failure that says whose fault
        it is when it cannot be read (see the module)."""
        try:
            async with self.media.original(digest) as path:
                yield path
        except MissingMedia as missing:
            if missing.key != blob_key(digest):  # something the block read, not the original
                raise
            raise await self.missing(media_id, digest) from None

    async def missing(self, media_id: str, digest: str) -> TaskFailure:
        """Why an item's original could not be found: its own loss, or (none of the other
        waiting items' originals being there either) a media store that is not the
        deployment's; or only out of its place for a moment (see the module)."""
        # Put back since the read missed it, or about to be: either way, there to read again.
        if await self.media.being_settled(digest) or await self.media.has_blob(digest):
            return hr.Unavailable(  # not the item's fault: its attempts are not counted
                f"media id {media_id}: its original is being settled by the refusal of an item "
                "with the same bytes",
                code=SETTLING,
            )
        others = [found for found in await self.waiting() if found != digest]
        if others and not await self.any_kept(others):
            return MediaUnavailable(
                "get",
                blob_key(digest),
                f"none of the {len(others)} other waiting items' originals is there either "
                f"({self.media.setting} {self.media.describe()} may not be this deployment's)",
            )
        gone = f"media id {media_id}: its original is not in the media store"
        return hr.Fatal(gone, code=MISSING)

    async def waiting(self) -> list[str]:
        """The digests of the oldest items waiting for a stage (`SAMPLE` per state)."""
        digests: list[str] = []
        for state in WAITING:
            found = await self.app.store.records.list_records(ITEM, state=state, limit=SAMPLE)
            digests.extend(str(record.body["digest"]) for record in found)
        return list(dict.fromkeys(digests))

    async def any_kept(self, digests: Collection[str]) -> bool:
        for digest in digests:
            if await self.media.has_blob(digest):
                return True
        return False

    async def check_at_start(self) -> None:
        """Fail (MediaStoreUnusable) unless the media store answers, honours a conditional
        write and holds the originals of the items waiting for a stage (any one of them)."""
        where = f"{self.media.setting} {self.media.describe()}"
        try:
            await self.media.check()
        except MediaUnavailable as error:
            raise MediaStoreUnusable(
                f"{where}: {error.reason}; check that this host reaches it and may write there "
                "(a directory mounted and writable; a bucket's endpoint, name and credentials "
                "in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
            ) from None
        except ConfigError as error:
            raise MediaStoreUnusable(f"{where}: {error}") from None
        digests = await self.waiting()
        if digests and not await self.any_kept(digests):
            raise MediaStoreUnusable(
                f"{where}: holds none of the originals of the {len(digests)} items waiting in "
                f"the store {hide_passwords(self.app.url)}; set {self.media.setting} to the "
                "directory or bucket that `headrace serve` keeps this store's uploads in"
            )
