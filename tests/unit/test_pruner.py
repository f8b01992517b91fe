"""The pruner in workers and on its own, on the memory store and the virtual clock."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping

import pytest

import headrace as hr
from headrace.policy.errors import PrunerBusy
from headrace.policy.retention import DAY, Retention
from headrace.runtime.prunehooks import PruneRun
from headrace.runtime.pruner import Pruner
from headrace.store.protocol.pruning import SUCCEEDED_TASKS

pytestmark = pytest.mark.anyio


def make_app(retention: Retention) -> hr.App:
    app = hr.App("memory://", retention=retention)

    @app.task()
    async def work(ctx: hr.Context, ref: str) -> None:
        return None

    return app


async def test_a_worker_prunes_by_itself_once_a_run_is_due(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app(Retention(succeeded=3600.0, every=600.0))
    runs: list[PruneRun] = []

    async def counted(run: PruneRun) -> Mapping[str, int]:
        runs.append(run)
        return {"things": 1}

    app.on_prune(counted)
    async with app:
        for n in range(3):
            await app.definition("work").submit(f"t{n}")
        await hr.Worker(app).drain()  # a drain never prunes
        assert runs == []
        await app.definition("work").submit("newest", delay=10 * DAY)
        worker = hr.Worker(app, idle="60s")  # few idle claims: the test is the pruner
        running = asyncio.create_task(worker.run())
        with caplog.at_level(logging.INFO, logger="headrace.pruner"):
            await asyncio.sleep(3600.0 + 700.0)  # virtual time
        worker.stop()
        await running
        left = [task.ref for task in await app.store.tasks()]
    assert left == ["newest"]
    assert [run.dry_run for run in runs] == [False] * len(runs)
    assert 7 <= len(runs) <= 9  # at the start, then about every 600 s
    lines = [r.getMessage() for r in caplog.records if r.name == "headrace.pruner"]
    assert len(lines) == len(runs)
    assert any(f"{SUCCEEDED_TASKS} 3" in line for line in lines)
    assert all("things 1" in line for line in lines)


async def test_workers_of_one_store_prune_one_at_a_time_and_once_a_period() -> None:
    app = make_app(Retention(every=300.0))
    starts: list[float] = []
    inside = 0

    async def slow(run: PruneRun) -> Mapping[str, int]:
        nonlocal inside
        inside += 1
        assert inside == 1, "two pruners at once"
        starts.append(run.now)
        await asyncio.sleep(30.0)
        inside -= 1
        return {}

    app.on_prune(slow)
    async with app:
        workers = [hr.Worker(app, name=f"w{n}", idle="60s") for n in range(3)]
        running = [asyncio.create_task(worker.run()) for worker in workers]
        await asyncio.sleep(3000.0)
        for worker in workers:
            worker.stop()
        await asyncio.gather(*running)
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert 7 <= len(starts) <= 10
    assert min(gaps) >= 300.0 + 30.0  # due `every` after the last run ended


async def test_a_run_now_is_refused_while_another_process_prunes() -> None:
    app = make_app(Retention())
    async with app:
        assert await app.store.take_pruner("elsewhere", lease_for=60.0)
        with pytest.raises(PrunerBusy) as refused:
            await Pruner(app, holder="cli").run()
        assert (refused.value.holder, refused.value.left) == ("elsewhere", 60.0)
        assert (await Pruner(app, holder="cli").run(dry_run=True)).dry_run  # takes no lease


async def test_a_dry_run_tells_the_hooks_and_removes_nothing() -> None:
    app = make_app(Retention(succeeded=0.0))
    seen: list[bool] = []

    async def hook(run: PruneRun) -> Mapping[str, int]:
        seen.append(run.dry_run)
        return {"items": 2}

    app.on_prune(hook)
    async with app:
        await app.definition("work").submit("a")
        await hr.Worker(app).drain()
        await app.definition("work").submit("newest")
        await asyncio.sleep(1.0)
        would = await Pruner(app, holder="cli").run(dry_run=True)
        assert len(await app.store.tasks()) == 2
        done = await Pruner(app, holder="cli").run()
    assert seen == [True, False]
    assert would.removed == done.removed
    assert done.removed[SUCCEEDED_TASKS] == 1 and done.removed["items"] == 2
    assert done.line() == "pruner removed succeeded tasks 1, attempts 1, items 2 (1 store batch)"
    assert would.line().startswith("pruner would remove succeeded tasks 1")


async def test_a_failed_run_gives_the_lease_back_and_the_next_is_due_at_once() -> None:
    app = make_app(Retention(every=300.0))

    async def broken(run: PruneRun) -> Mapping[str, int]:
        raise RuntimeError("disk gone")

    app.on_prune(broken)
    async with app:
        with pytest.raises(RuntimeError):
            await Pruner(app, holder="w1").run_if_due()
        app.prune_hooks.clear()
        assert await Pruner(app, holder="w2").run_if_due() is not None


@pytest.mark.parametrize(
    ("retention", "prune"),
    [(Retention(succeeded=0.0, every=None), True), (Retention(succeeded=0.0), False)],
)
async def test_workers_never_prune_when_told_not_to(retention: Retention, prune: bool) -> None:
    app = make_app(retention)
    async with app:
        await app.definition("work").submit("a")
        await app.definition("work").submit("b", delay=DAY)
        worker = hr.Worker(app, idle="60s", prune=prune)
        running = asyncio.create_task(worker.run())
        await asyncio.sleep(3600.0)
        worker.stop()
        await running
        assert await app.store.pruner_state() is None
        assert len(await app.store.tasks()) == 2
