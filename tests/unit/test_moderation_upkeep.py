"""The moderation pipeline when the pruner runs: items past their retention go with their
media (an original another item names stays), closed events, and the upload sweep; on the
memory store, the virtual clock and modelled media work."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.items import HOLD
from headrace.pipelines.moderation.media import DirectoryBackend, MediaStore
from headrace.pipelines.moderation.model import ModelWork
from headrace.pipelines.moderation.pipeline import (
    EventClosed,
    ItemState,
    Moderation,
    validate_key,
)
from headrace.pipelines.moderation.upkeep import (
    DERIVATIVES,
    ITEMS,
    LOST,
    ORIGINAL_MISSING,
    ORIGINALS,
    QUEUED,
    close_event,
)
from headrace.policy import ConfigError
from headrace.policy.retention import DAY, Retention
from headrace.runtime.pruner import Pruner
from headrace.store.protocol.records import Record

pytestmark = pytest.mark.anyio


def pipeline(tmp_path: Path, retention: Retention | None = None) -> tuple[Moderation, MediaStore]:
    app = hr.App("memory://", retention=retention)
    media = MediaStore(DirectoryBackend(tmp_path / "media"))
    return Moderation(app, media, None, work=ModelWork()), media


async def prune(moderation: Moderation, *, dry_run: bool = False) -> dict[str, int]:
    report = await Pruner(moderation.app, holder="test").run(dry_run=dry_run)
    return dict(report.removed)


async def processed(moderation: Moderation, data: bytes, session: str) -> str:
    item = await moderation.accept_bytes(data, event="gala", session=session)
    await moderation.submit(item)
    await hr.Worker(moderation.app).drain()
    return item.media_id


def files(media: MediaStore, media_id: str) -> list[Path]:
    assert isinstance(media.backend, DirectoryBackend)
    return [p for p in (media.backend.root / "derived" / media_id).rglob("*") if p.is_file()]


async def test_a_rejected_item_goes_with_its_derivatives_and_a_shared_original_stays(
    tmp_path: Path,
) -> None:
    moderation, media = pipeline(tmp_path)
    photo = samples.jpeg()
    async with moderation.app:
        rejected = await processed(moderation, photo, "s1")
        kept = await processed(moderation, photo, "s2")  # the same bytes: one original
        digest = (await moderation.records.get(rejected)).digest
        assert files(media, rejected) and files(media, kept)
        await moderation.review(rejected, approve=False, by="mod")
        await moderation.review(kept, approve=True, by="mod")
        await asyncio.sleep(6 * DAY)  # virtual time: not old enough yet
        assert (await prune(moderation))[ITEMS] == 0

        await asyncio.sleep(1.5 * DAY)
        would = await prune(moderation, dry_run=True)
        removed = await prune(moderation)

        assert would == removed
        assert (removed[ITEMS], removed[DERIVATIVES], removed[ORIGINALS]) == (1, 1, 0)
        with pytest.raises(ConfigError, match="no such item"):
            await moderation.records.get(rejected)
        assert not files(media, rejected)
        assert await media.has_blob(digest)  # the approved item still names it
        assert files(media, kept)
        assert [row.action for row in await moderation.records.audit(rejected)] == [
            "review.rejected"  # the audit log keeps its own, longer age
        ]


async def test_an_original_goes_with_the_last_item_that_names_it(tmp_path: Path) -> None:
    moderation, media = pipeline(tmp_path)
    async with moderation.app:
        first = await processed(moderation, samples.png(), "s1")
        second = await processed(moderation, samples.png(), "s2")
        digest = (await moderation.records.get(first)).digest
        await moderation.review(first, approve=False, by="mod")
        await moderation.review(second, approve=False, by="mod")
        await close_event(moderation.app.store, "other", by="admin")  # a newer record
        await asyncio.sleep(8 * DAY)
        removed = await prune(moderation)
    assert (removed[ITEMS], removed[DERIVATIVES], removed[ORIGINALS]) == (2, 2, 1)
    assert not await media.has_blob(digest)
    assert not files(media, first) and not files(media, second)


async def test_a_closed_event_takes_no_upload_and_its_settled_items_go_after_the_age(
    tmp_path: Path,
) -> None:
    moderation, media = pipeline(tmp_path)
    async with moderation.app:
        store = moderation.app.store
        done = await processed(moderation, samples.jpeg(), "s1")
        waiting = await moderation.accept_bytes(samples.webp(), event="gala", session="s2")
        await moderation.submit(waiting)  # still queued when the event closes
        assert await close_event(store, "gala", by="admin")
        assert not await close_event(store, "gala", by="admin")
        with pytest.raises(EventClosed):
            await moderation.accept_bytes(samples.png(), event="gala", session="s3")
        actions = [(row.action, row.outcome) for row in await store.records.audit_log(kind="event")]
        assert actions == [("event.closed", "applied"), ("event.closed", "unchanged: closed")]
        await asyncio.sleep(31 * DAY)
        removed = await prune(moderation)
        assert removed[ITEMS] == 1
        with pytest.raises(ConfigError):
            await moderation.records.get(done)
        assert (await moderation.records.get(waiting.media_id)).state is ItemState.ACCEPTED
        assert not files(media, done)


async def test_an_upload_no_task_names_is_queued_once_after_the_grace(tmp_path: Path) -> None:
    moderation, _ = pipeline(tmp_path)
    async with moderation.app:
        store = moderation.app.store
        # Its process died between the record and the submit: the submit never came.
        orphan = await moderation.accept_bytes(samples.jpeg(), event="gala", session="s1")
        await asyncio.sleep(60.0)
        assert (await prune(moderation))[QUEUED] == 0  # within the grace: its submit may come
        await asyncio.sleep(90.0)
        assert (await prune(moderation, dry_run=True))[QUEUED] == 1
        assert await store.find(validate_key(orphan.media_id)) is None
        assert (await prune(moderation))[QUEUED] == 1
        task = await store.find(validate_key(orphan.media_id))
        assert task is not None and task.group == "gala" and task.flow == "s1"
        assert (await prune(moderation))[QUEUED] == 0  # a task names it now
        [row] = await moderation.records.audit(orphan.media_id)
        assert (row.action, row.actor) == ("upload.requeued", "pruner")
        assert row.detail == {"task": task.id}
        await hr.Worker(moderation.app).drain()
        assert (await moderation.records.get(orphan.media_id)).state is ItemState.REVIEWABLE


async def test_an_upload_whose_bytes_were_never_kept_is_refused_with_a_reason(
    tmp_path: Path,
) -> None:
    moderation, media = pipeline(tmp_path)
    async with moderation.app:
        lost = await moderation.accept_bytes(samples.jpeg(), event="gala", session="s1")
        await media.remove_blob(lost.digest)
        await asyncio.sleep(300.0)
        assert (await prune(moderation))[LOST] == 1
        item = await moderation.records.get(lost.media_id)
        assert (item.state, item.reason) == (ItemState.REFUSED, ORIGINAL_MISSING)
        [row] = await moderation.records.audit(lost.media_id)
        assert (row.action, row.detail) == ("upload.swept", {"reason": ORIGINAL_MISSING})


async def test_the_sweep_leaves_an_upload_older_than_a_failed_validation_is_kept(
    tmp_path: Path,
) -> None:
    moderation, _ = pipeline(tmp_path, Retention(cancelled=DAY, dead=30 * DAY))
    async with moderation.app:
        old = await moderation.accept_bytes(samples.jpeg(), event="gala", session="s1")
        await asyncio.sleep(2 * DAY)  # past the horizon: it may have had a task, since pruned
        assert (await prune(moderation))[QUEUED] == 0
        assert await moderation.app.store.find(validate_key(old.media_id)) is None


async def test_which_items_hold_an_original_is_read_by_digest_not_by_every_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moderation, _ = pipeline(tmp_path)
    async with moderation.app:
        store = moderation.app.store
        photo = samples.jpeg()
        first, second = [
            await moderation.accept_bytes(photo, event="gala", session=f"s{n}") for n in (1, 2)
        ]
        for n in range(30):
            await moderation.accept_bytes(samples.jpeg(shade=n + 1), event="gala", session="x")
        # An item kept before holds were written: the first look gives it one, once.
        old = await moderation.accept_bytes(samples.png(), event="gala", session="old")
        await store.records.delete_records(HOLD, [old.media_id])
        assert await moderation.naming({old.digest}, leaving=()) == {old.digest: [old.media_id]}

        listed: list[str] = []
        list_records = store.records.list_records

        async def counting(kind: str, **options: Any) -> list[Record]:
            listed.append(kind)
            return await list_records(kind, **options)

        monkeypatch.setattr(store.records, "list_records", counting)
        found = await moderation.naming({first.digest}, leaving={first.media_id})
        assert found == {first.digest: [second.media_id]}
        assert listed == [HOLD]  # one read by digest, no item listed
