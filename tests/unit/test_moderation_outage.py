"""A media store that cannot be reached is an outage, never an item's fault: the stages back
off and run again, their attempts not counted, and finish once it returns; an item whose own
original is gone is its own loss; a worker given a media store that holds none of the waiting
items' originals stops before it claims anything. On the virtual clock, over real files."""

from __future__ import annotations

import asyncio
import itertools
import shutil
from pathlib import Path

import pytest

import headrace as hr
from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.media import DirectoryBackend, MediaStore, MediaStoreUnusable
from headrace.pipelines.moderation.originals import MISSING, SETTLING
from headrace.pipelines.moderation.pipeline import Item, ItemState, Moderation
from headrace.pipelines.moderation.scan import BuiltinScanner
from headrace.policy.retry import RetryPolicy
from headrace.store.protocol.types import Attempt, AttemptOutcome, TaskRecord, TaskState

pytestmark = pytest.mark.anyio

OUTAGE = 300.0  # seconds of virtual time the media store stays away
MOST_APART = RetryPolicy().outage_max_delay


async def uploaded(moderation: Moderation, count: int) -> list[Item]:
    items = []
    for n in range(count):
        data = samples.jpeg(320 + n, 240, gps=False, shade=10 * n)
        item = await moderation.accept_bytes(data, event="gala", session=f"s{n}")
        await moderation.submit(item)
        items.append(item)
    return items


async def history(app: hr.App) -> dict[TaskRecord, list[Attempt]]:
    tasks = await app.store.tasks(limit=10_000)
    return {task: await app.store.attempts(task.id) for task in tasks}


def moderation_over(app: hr.App, root: Path) -> Moderation:
    return Moderation(app, MediaStore(DirectoryBackend(root)), BuiltinScanner())


async def test_a_media_store_gone_mid_run_is_waited_out_and_every_item_finishes(
    tmp_path: Path,
) -> None:
    app = hr.App("memory://")
    root, away = tmp_path / "media", tmp_path / "unmounted"
    moderation = moderation_over(app, root)
    async with app:
        items = await uploaded(moderation, 4)
        root.rename(away)  # the volume goes away as the worker starts
        draining = asyncio.create_task(hr.Worker(app, seed=1).drain(fail_fast=False))
        await asyncio.sleep(OUTAGE)
        waited = await history(app)
        away.rename(root)
        back = await app.store.now()
        await draining
        after = await history(app)
        states = [(await moderation.records.get(item.media_id)).state for item in items]
    assert states == [ItemState.REVIEWABLE] * 4
    assert all(task.state is TaskState.SUCCEEDED for task in after)  # none dead
    for task, attempts in waited.items():
        assert task.state is not TaskState.DEAD
        retries = [a for a in attempts if a.outcome is AttemptOutcome.RETRY]
        assert len(retries) > task.max_attempts  # the outage spent none of its attempts
        assert {a.code for a in retries} == {"media.unavailable"}
        gaps = [b.started_at - a.started_at for a, b in itertools.pairwise(attempts)]
        assert gaps[0] < 1.0 and max(gaps) > MOST_APART / 2  # backing off ...
        assert max(gaps) <= MOST_APART + 0.5  # ... at most this far apart
    for task, attempts in after.items():
        assert task.attempts_used == 1  # only the attempt that succeeded counted
        resumed = [a.started_at for a in attempts if a.started_at >= back]
        if task in waited:  # it waited out the outage: it ran again soon after the return
            assert min(resumed) - back <= MOST_APART + 0.5


async def test_an_item_whose_own_original_is_gone_is_its_own_loss(tmp_path: Path) -> None:
    app = hr.App("memory://")
    moderation = moderation_over(app, tmp_path / "media")
    async with app:
        lost, *kept = await uploaded(moderation, 3)
        assert await moderation.media.remove_blob(lost.digest)
        await hr.Worker(app).drain(fail_fast=False)
        task = await app.store.find(f"validate:{lost.media_id}")
        others = [(await moderation.records.get(item.media_id)).state for item in kept]
    assert task is not None and task.state is TaskState.DEAD
    assert (task.error_code, task.attempt) == (MISSING, 1)  # never retried
    assert others == [ItemState.REVIEWABLE] * 2


async def test_an_original_out_of_its_place_for_a_moment_is_read_again_shortly(
    tmp_path: Path,
) -> None:
    """The refusal of an item with the same bytes has taken the original out of its place to
    settle it: a stage that misses it meanwhile runs again, and finds it put back."""
    app = hr.App("memory://")
    moderation = moderation_over(app, tmp_path / "media")
    async with app:
        [item] = await uploaded(moderation, 1)
        taken = await moderation.media.take_blob(item.digest)
        assert taken is not None
        draining = asyncio.create_task(hr.Worker(app, seed=3).drain(fail_fast=False))
        await asyncio.sleep(1.0)
        await moderation.media.settle_blob(item.digest, taken, keep=True)
        await draining
        task = await app.store.find(f"validate:{item.media_id}")
        assert task is not None
        attempts = await app.store.attempts(task.id)
        state = (await moderation.records.get(item.media_id)).state
    assert state is ItemState.REVIEWABLE
    assert task.state is TaskState.SUCCEEDED
    assert {a.code for a in attempts if a.outcome is AttemptOutcome.RETRY} == {SETTLING}


async def test_a_media_store_holding_none_of_the_waiting_originals_is_an_outage(
    tmp_path: Path,
) -> None:
    """Another volume mounted in the media store's place: every original missing at once is
    not every item's fault. Once the right one is back, the items go on."""
    app = hr.App("memory://")
    root, saved = tmp_path / "media", tmp_path / "saved"
    moderation = moderation_over(app, root)
    async with app:
        items = await uploaded(moderation, 3)
        shutil.copytree(root, saved)
        shutil.rmtree(root / "blobs")
        draining = asyncio.create_task(hr.Worker(app, seed=2).drain(fail_fast=False))
        await asyncio.sleep(OUTAGE / 2)
        dead = await app.store.tasks(state=TaskState.DEAD)
        shutil.copytree(saved / "blobs", root / "blobs")
        await draining
        states = [(await moderation.records.get(item.media_id)).state for item in items]
    assert dead == []
    assert states == [ItemState.REVIEWABLE] * 3


async def test_a_worker_given_the_wrong_media_store_stops_before_claiming(tmp_path: Path) -> None:
    app = hr.App("memory://")
    moderation = moderation_over(app, tmp_path / "media")
    async with app:
        await uploaded(moderation, 3)
        moderation.media.backend = DirectoryBackend(tmp_path / "elsewhere")
        with pytest.raises(MediaStoreUnusable, match="holds none of the originals of the 3"):
            await hr.Worker(app).run()
        tasks = await app.store.tasks(limit=100)
    assert [(task.state, task.attempt) for task in tasks] == [(TaskState.READY, 0)] * 3
