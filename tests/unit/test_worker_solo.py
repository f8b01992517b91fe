"""Tasks lost beside others run alone, and next: a worker that is never idle still takes them
soon, by letting what it holds finish and then claiming alone (virtual clock)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import headrace as hr

pytestmark = pytest.mark.anyio

STREAM_FOR = 30.0  # seconds of new work arriving, always more than the worker's slots take


def now() -> float:
    return asyncio.get_running_loop().time()


async def test_tasks_lost_together_run_alone_soon_under_a_steady_stream() -> None:
    app = hr.App("memory://")
    started: dict[str, float] = {}
    beside: dict[str, int] = {}
    running: set[str] = set()

    @app.task()
    async def work(ctx: hr.Context, ref: str) -> None:
        started.setdefault(ref, now())
        beside.setdefault(ref, len(running))
        running.add(ref)
        try:
            await asyncio.sleep(0.5)
        finally:
            running.discard(ref)

    async def stream() -> None:
        for n in range(int(STREAM_FOR / 0.05)):
            await work.submit(f"s{n}")
            await asyncio.sleep(0.05)  # 20 a second for 4 slots that take 8 a second

    async with app:
        for n in range(3):
            await work.submit(f"lost{n}")
        dead = await app.store.claim("dead", 3, lease_for=1.0)  # a worker that then dies
        assert len(dead.leases) == 3
        lost_at = now() + 1.0
        worker = hr.Worker(app, slots=4, name="live")
        running_worker = asyncio.create_task(worker.run())
        await stream()
        worker.stop()
        await running_worker
    for n in range(3):
        ref = f"lost{n}"
        assert beside[ref] == 0  # alone
        # Reaped by a claim soon after the lease ran out, then run once the worker's four
        # half-second tasks ended: not when the stream does.
        assert started[ref] - lost_at < 5.0, (ref, started[ref] - lost_at)


async def test_a_worker_claims_alone_only_once_its_outcomes_are_written() -> None:
    """`alone` tells the store that a task it leases runs by itself: a crash then is charged to
    it. A worker that still has outcomes on their way to the store has tasks the store counts as
    running, so it does not claim alone until they are written."""
    app = hr.App("memory://")
    writing = 0
    alone_while_writing: list[int] = []

    @app.task()
    async def work(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(0.2)

    async with app:
        store = app.store
        finish_many, claim = store.finish_many, store.claim

        async def slow_finish_many(*args: Any, **kwargs: Any) -> Any:
            nonlocal writing
            writing += 1
            try:
                await asyncio.sleep(0.3)  # a slow store: the outcomes are on their way
                return await finish_many(*args, **kwargs)
            finally:
                writing -= 1

        async def watched_claim(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("alone", True) and writing:
                alone_while_writing.append(writing)
            return await claim(*args, **kwargs)

        store.finish_many = slow_finish_many  # type: ignore[method-assign]
        store.claim = watched_claim  # type: ignore[method-assign]
        for n in range(3):
            await work.submit(f"lost{n}")
        await claim("dead", 3, lease_for=1.0)  # lost together: each runs alone next
        for n in range(20):
            await work.submit(f"s{n}")
        stats = await hr.Worker(app, slots=4, name="live").drain()
    assert stats.succeeded == 23
    assert alone_while_writing == []
