"""A PostgreSQL claim sweeps (reaps run-out leases, ages low tasks) in a transaction of its own
only when the sweep would find something: the claim's first statement looks (`SweepDue`), and
a claim that finds a lease run out or a task old enough to age is dropped, the sweep run, and
the claim made again. Needs the test server (skips without it, fails when `CI` is set)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from headrace.policy.clock import ManualClock
from headrace.policy.tiers import Tier
from headrace.store.machine import FOLD_EVERY, SWEEP_EVERY, Transaction
from headrace.store.machine import claim as claim_steps
from headrace.store.postgres import PostgresStore
from headrace.store.protocol.types import NewTask, Settings, TaskState
from tests.integration.postgres import opened_store

pytestmark = pytest.mark.anyio

AGING_STEP = FOLD_EVERY / 2  # aged before the tallies are due to be folded again


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": False})


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def sweeps(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each sweep transaction a store runs, by whether it folded the tallies."""
    ran: list[bool] = []
    sweep = claim_steps.sweep

    async def counted(tx: Transaction, *, fold: bool = False) -> float:
        ran.append(fold)
        return await sweep(tx, fold=fold)

    monkeypatch.setattr(claim_steps, "sweep", counted)
    return ran


@pytest.fixture
async def store(clock: ManualClock) -> AsyncIterator[PostgresStore]:
    settings = Settings(aging_step=AGING_STEP)
    async with opened_store("headrace_sweeps", clock=clock, settings=settings) as opened:
        yield opened


def task(ref: str, tier: Tier = Tier.NORMAL) -> NewTask:
    return NewTask(kind="work", ref=ref, tier=tier)


async def test_claims_with_nothing_to_sweep_run_no_sweep(
    store: PostgresStore, clock: ManualClock, sweeps: list[bool]
) -> None:
    await store.submit([task(f"t{n}") for n in range(5)])
    for _ in range(5):
        clock.advance(SWEEP_EVERY * 2)
        claimed = await store.claim("w1", 1, lease_for=60.0)
        assert len(claimed.leases) == 1
    # The first claim folds the tallies (never folded yet): that sweep runs whatever it finds.
    assert sweeps == [True]
    clock.advance(FOLD_EVERY)
    await store.claim("w1", 1, lease_for=60.0)
    assert sweeps == [True, True]


async def test_a_claim_after_a_lease_ran_out_reaps_it_first_and_takes_it_again(
    store: PostgresStore, clock: ManualClock, sweeps: list[bool]
) -> None:
    [sub] = await store.submit([task("lost")])
    [first] = (await store.claim("w1", 1, lease_for=1.0)).leases
    clock.advance(2.0)
    [again] = (await store.claim("w2", 1, lease_for=60.0)).leases
    assert again.task.id == sub.id and again.task.attempt == 2
    assert again.token != first.token
    assert sweeps == [True, False]  # the first claim's fold; the reap the second one asked for


async def test_a_claim_after_a_low_task_waited_an_aging_step_ages_it_first(
    store: PostgresStore, clock: ManualClock, sweeps: list[bool]
) -> None:
    await store.claim("w1", 1, lease_for=60.0)  # the first fold, with nothing queued
    [low] = await store.submit([task("low", Tier.LOW)])
    await store.submit([task("normal")])
    clock.advance(AGING_STEP + 1.0)  # within FOLD_EVERY of the first claim
    [taken] = (await store.claim("w1", 1, lease_for=60.0)).leases
    assert sweeps == [True, False]
    # Promoted to NORMAL by the sweep, it was submitted before the other NORMAL task.
    assert taken.task.id == low.id
    record = await store.get(low.id)
    assert record.state is TaskState.RUNNING and record.tier is Tier.NORMAL
