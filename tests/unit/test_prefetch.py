"""Claiming ahead of the slots: how much (runtime/prefetch.py), and a worker that does it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

import headrace as hr
from headrace.policy.errors import ConfigError, HeadraceError
from headrace.runtime.prefetch import Prefetch
from headrace.store.protocol.types import AttemptOutcome, ClaimResult, Lease, Outcome, TaskState
from headrace.store.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio

CLAIM = 0.003  # seconds a claim takes in the stores below


def measured(most: int, slots: int, claim: float, task: float) -> Prefetch:
    ahead = Prefetch(most, slots)
    ahead.claimed(claim)
    ahead.ran(task)
    return ahead


def test_nothing_is_claimed_ahead_before_a_task_and_a_claim_were_timed() -> None:
    ahead = Prefetch(64, 16)
    ahead.pace(16, 16, 0)
    assert ahead.ahead == 0
    ahead.claimed(CLAIM)
    ahead.pace(16, 16, 0)
    assert ahead.ahead == 0


def test_short_tasks_grow_it_by_doubling_up_to_the_most() -> None:
    ahead = measured(64, 16, CLAIM, 30e-6)
    sizes = []
    for _ in range(4):
        ahead.pace(16 + ahead.room(0), 16, ahead.room(0))
        sizes.append(ahead.ahead)
    assert sizes == [16, 32, 64, 64]


def test_it_holds_what_the_slots_finish_while_a_claim_is_on_its_way() -> None:
    ahead = measured(1000, 4, CLAIM, 0.001)  # 4 slots x 3 ms / 1 ms: 12
    for _ in range(5):
        ahead.pace(4 + ahead.room(0), 4, ahead.room(0))
    assert ahead.ahead == 12


def test_tasks_longer_than_a_claim_are_not_claimed_ahead() -> None:
    ahead = measured(64, 16, CLAIM, 0.05)
    ahead.pace(16, 16, 0)
    assert ahead.ahead == 0


def test_a_short_claim_ends_it_and_a_part_filled_one_keeps_what_came() -> None:
    ahead = measured(64, 16, CLAIM, 30e-6)
    ahead.pace(16, 16, 0)
    ahead.pace(48, 16, 32)
    assert ahead.ahead == 32
    ahead.pace(16 + 10, 16, 32)  # ten of the 32 asked for ahead
    assert ahead.ahead == 10
    assert ahead.room(4) == 6
    assert ahead.low(5) and not ahead.low(6)
    ahead.pace(3, 16, 10)  # short of the free slots: no backlog
    assert ahead.ahead == 0
    assert not ahead.low(0)


def test_zero_turns_it_off() -> None:
    ahead = measured(0, 16, CLAIM, 30e-6)
    ahead.pace(16, 16, 0)
    assert ahead.ahead == 0


def test_a_negative_prefetch_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"worker\.prefetch"):
        hr.Worker(hr.App("memory://"), prefetch=-1)


class SlowClaims(SQLiteStore):
    """An in-memory store whose claims take CLAIM seconds, as a round trip would; counts them."""

    def __init__(self) -> None:
        super().__init__(":memory:")
        self.claims = 0
        self.carrying = 0  # claims that recorded outcomes too
        self.alone = 0
        self.asked_ahead: list[int] = []

    async def claim(self, *args: Any, **kwargs: Any) -> ClaimResult:
        self.claims += 1
        self.asked_ahead.append(int(kwargs.get("ahead", 0)))
        self.carrying += bool(kwargs.get("finished"))
        await asyncio.sleep(CLAIM)
        return await super().claim(*args, **kwargs)  # its outcomes: not by finish_many

    async def finish_many(
        self, finished: Sequence[tuple[Lease, Outcome]]
    ) -> list[HeadraceError | None]:
        self.alone += 1  # outcomes written in a transaction of their own
        await asyncio.sleep(CLAIM)
        return await super().finish_many(finished)


async def test_a_worker_claims_short_tasks_ahead_and_runs_each_once_in_order() -> None:
    store = SlowClaims()
    app = hr.App("memory://", store=store)
    ran: list[str] = []

    @app.task()
    async def short(ctx: hr.Context, ref: str) -> None:
        ran.append(ref)

    async with app:
        await app.submit([short.spec(f"t{i:03}") for i in range(200)])
        stats = await hr.Worker(app, slots=2).drain()
        counts = await app.store.counts()
    assert counts[TaskState.SUCCEEDED] == 200
    assert sorted(ran) == [f"t{i:03}" for i in range(200)]  # each once
    assert ran == sorted(ran)  # in claim order: one flow's tasks first in, first out
    assert stats.claimed_ahead > 100
    assert max(store.asked_ahead) == 32  # 16 per slot
    assert store.claims < 60  # two slots a claim would take 100


async def test_the_outcomes_of_short_tasks_ride_the_claims_that_refill_their_slots() -> None:
    """Tasks shorter than the wake-up that sends the next claim empty the queue first: their
    outcomes wait for that claim rather than going in a transaction of their own beside it."""
    store = SlowClaims()
    app = hr.App("memory://", store=store)

    @app.task()
    async def short(ctx: hr.Context, ref: str) -> None:
        return None

    async with app:
        await app.submit([short.spec(f"t{i:04}") for i in range(4000)])
        stats = await hr.Worker(app, slots=16).drain()
    assert stats.succeeded == 4000
    # All but the first two claims (no task has ended yet) and the last two, as the queue runs
    # out (what ends after them goes alone)
    assert store.carrying >= store.claims - 4
    assert store.alone <= 3  # the last outcomes, once no claim comes


async def test_gated_tasks_are_never_claimed_ahead() -> None:
    store = SlowClaims()
    app = hr.App("memory://", store=store)
    app.gate("provider:api", concurrency=50)

    @app.task(gates=["provider:api"])
    async def call(ctx: hr.Context, ref: str) -> None:
        return None

    async with app:
        await app.submit([call.spec(f"t{i}") for i in range(60)])
        stats = await hr.Worker(app, slots=2).drain()
    assert stats.succeeded == 60
    assert stats.claimed_ahead == 0


async def test_tasks_claimed_ahead_go_back_unstarted_and_uncounted_at_shutdown() -> None:
    store = SlowClaims()
    app = hr.App("memory://", store=store)
    release = asyncio.Event()
    blocked = asyncio.Event()
    started: list[str] = []

    @app.task(max_attempts=1)
    async def work(ctx: hr.Context, ref: str) -> None:
        started.append(ref)
        if ref >= "t100":
            blocked.set()
            await release.wait()  # the slot stays busy: what was claimed ahead waits

    async with app:
        await app.submit([work.spec(f"t{i:03}") for i in range(140)])
        worker = hr.Worker(app, slots=1, grace="10s")
        running = asyncio.create_task(worker.run())
        await blocked.wait()
        assert worker.stats.claimed_ahead > 0
        worker.stop()
        release.set()
        await running
        tasks = await app.store.tasks(limit=200)
        attempts = {t.ref: await app.store.attempts(t.id) for t in tasks}
    assert len(started) == len(set(started))  # nothing ran twice
    ready = [t for t in tasks if t.state is TaskState.READY]
    for record in ready:  # never started, and their one attempt still theirs
        assert record.ref not in started
        assert record.attempts_used == 0
    handed_back = [t for t in ready if attempts[t.ref]]  # claimed ahead, then handed back
    assert handed_back
    for record in handed_back:
        assert [a.outcome for a in attempts[record.ref]] == [AttemptOutcome.RETRY]
    assert {t.state for t in tasks} == {TaskState.SUCCEEDED, TaskState.READY}


def test_a_slow_claim_does_not_make_a_worker_hoard() -> None:
    ahead = measured(64, 4, CLAIM, 0.1)  # 100 ms tasks: nothing ahead
    ahead.claimed(2.0)  # a claim that waited out a server restart
    ahead.pace(4, 4, 0)
    assert ahead.claim_time == CLAIM
    assert ahead.ahead == 0
