"""A claim that left slots free stands until the store wakes or the time it named: a worker
checking remote jobs does not ask for work at every check, and still takes what a write frees
at once. On the virtual clock, over the memory store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import headrace as hr
from headrace.store.machine.core import SWEEP_EVERY
from headrace.store.protocol.types import ClaimResult
from headrace.store.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio


def now() -> float:
    return asyncio.get_running_loop().time()


class ClaimLog(SQLiteStore):
    """An in-memory store that notes the time of each claim."""

    def __init__(self) -> None:
        super().__init__(":memory:")
        self.claims: list[float] = []

    async def claim(self, *args: Any, **kwargs: Any) -> ClaimResult:
        self.claims.append(now())
        return await super().claim(*args, **kwargs)

    def between(self, start: float, end: float) -> int:
        return sum(start <= at < end for at in self.claims)


def renders(store: ClaimLog, done: set[str], started: dict[str, float]) -> hr.App:
    """Renders through a gate of one job at once, checked every 0.1 s; a note, ungated."""
    app = hr.App("memory://", store=store)
    app.gate("provider:video", concurrency=1)

    async def check(ctx: hr.Context, job: str) -> hr.Result | hr.Pending:
        return hr.Result() if job in done else hr.Pending()

    @app.task(gates=["provider:video"], poll=check)
    async def render(ctx: hr.Context, ref: str) -> hr.RemoteWait:
        started[ref] = now()
        return ctx.await_remote(f"job-{ref}", every="0.1s", timeout="1h")

    @app.task()
    async def note(ctx: hr.Context, ref: str) -> None:
        started[ref] = now()

    return app


async def test_checking_a_remote_job_is_no_reason_to_claim_and_a_freed_ticket_is_taken() -> None:
    store, done, started = ClaimLog(), set[str](), dict[str, float]()
    app = renders(store, done, started)
    async with app:
        await app.definition("render").submit("first")
        await app.definition("render").submit("second")  # waits for the gate's one job
        worker = hr.Worker(app, slots=2, idle="0.5s")
        running = asyncio.create_task(worker.run())
        await asyncio.sleep(1.0)
        assert list(started) == ["first"]
        # 100 checks of the first job in 10 s, and no claim: nothing written freed work, and
        # a store in memory sees every write (no look every `idle` for another process's).
        await asyncio.sleep(10.0)
        assert store.between(1.0, 11.0) == 0
        done.add("job-first")  # its next check succeeds: the ticket is returned
        finished = now()
        await asyncio.sleep(1.0)
        worker.stop()
        await running
    assert worker.stats.succeeded == 1
    # The check's outcome woke the worker: the second render started within the check's
    # interval, not at the end of a standing answer.
    assert started["second"] - finished <= 0.1 + 1e-6


async def test_a_submission_is_claimed_at_once_while_the_last_answer_would_stand() -> None:
    store, done, started = ClaimLog(), set[str](), dict[str, float]()
    app = renders(store, done, started)
    async with app:
        await app.definition("render").submit("first")
        await app.definition("render").submit("second")
        worker = hr.Worker(app, slots=2, idle="30s")  # the answer would stand 30 s
        running = asyncio.create_task(worker.run())
        await asyncio.sleep(5.0)
        assert list(started) == ["first"]
        submitted = now()
        await app.definition("note").submit("note")
        await asyncio.sleep(1.0)
        worker.stop()
        await running
    assert started["note"] == pytest.approx(submitted, abs=1e-6)


async def test_a_lease_that_runs_out_is_taken_when_it_does_with_no_look_meanwhile() -> None:
    store, done, started = ClaimLog(), set[str](), dict[str, float]()
    app = renders(store, done, started)
    async with app:
        await app.definition("note").submit("lost")
        # A worker that leased the note for 5 s and was never heard of again.
        taken = await store.claim("vanished", 1, lease_for=5.0)
        assert [lease.task.kind for lease in taken.leases] == ["note"]
        worker = hr.Worker(app, slots=2, idle="0.5s")
        running = asyncio.create_task(worker.run())
        await asyncio.sleep(8.0)
        worker.stop()
        await running
    # Reaped and run once its lease ran out (within a sweep's interval), not found by a look
    # every `idle`: the first claim's answer named the lease's end.
    assert 5.0 <= started["lost"] <= 5.0 + SWEEP_EVERY + 1e-6
    assert store.between(0.0 + 1e-9, 5.0) == 0
