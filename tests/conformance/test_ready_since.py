"""A ready task's age counts from when it last became ready to run (store/protocol/ages.py), on
every backend: never from its creation, never through time spent dead, running, waiting on a remote
job or backing off. Each transition into `ready` is read back through both readers of the age,
`stages` (the oldest) and `ready_ages` (the histogram's and the p95's sample)."""

from __future__ import annotations

import pytest

from headrace.policy import ErrorClass, ManualClock
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import (
    AttemptError,
    AwaitRemote,
    Dead,
    NewTask,
    Retry,
    Sibling,
    Succeeded,
)

pytestmark = pytest.mark.anyio

LEASE = 30.0
FAILED = AttemptError.of(ErrorClass.TRANSIENT, "boom", "")
NEVER = AttemptError.of(ErrorClass.FATAL, "bad", "")


def scan(ref: str, **fields: object) -> NewTask:
    return NewTask(kind="scan", ref=ref, **fields)  # type: ignore[arg-type]


async def ages(store: Store) -> tuple[float | None, tuple[float, ...]]:
    """The scan stage's oldest ready age, and every ready task's age (longest first)."""
    oldest = {s.kind: s.oldest_ready_age for s in await store.stages()}.get("scan")
    sample = (await store.ready_ages()).get("scan")
    return oldest, () if sample is None else (*sample.oldest, *sample.newest)


async def test_a_task_dead_for_20_minutes_then_redriven_is_ready_from_the_redrive(
    store: Store, clock: ManualClock
) -> None:
    await store.submit([scan("a")])
    clock.advance(12.0)
    [lease] = (await store.claim("w1", 1, lease_for=LEASE)).leases
    await store.finish(lease, Dead(NEVER))
    clock.advance(20 * 60.0)
    assert await store.redrive() == [lease.task.id]
    assert await ages(store) == (0.0, (0.0,))
    clock.advance(3.0)
    assert await ages(store) == (3.0, (3.0,))


async def test_a_retry_is_ready_from_its_run_at_and_reads_0_while_it_backs_off(
    store: Store, clock: ManualClock
) -> None:
    await store.submit([scan("a"), scan("b")])
    clock.advance(10.0)
    [lease] = (await store.claim("w1", 1, lease_for=LEASE)).leases
    clock.advance(5.0)
    await store.finish(lease, Retry(FAILED, delay=60.0))
    assert await ages(store) == (15.0, (15.0, 0.0))  # b has waited since it was submitted
    [other] = (await store.claim("w1", 1, lease_for=LEASE)).leases  # b; a backs off
    await store.finish(other, Succeeded())
    clock.advance(30.0)
    assert await ages(store) == (0.0, (0.0,))
    clock.advance(40.0)  # run_at came 10 s ago
    assert await ages(store) == (10.0, (10.0,))


async def test_a_lost_lease_makes_its_task_ready_from_the_expiry(
    store: Store, clock: ManualClock
) -> None:
    await store.submit([scan("a")])
    clock.advance(7.0)
    await store.claim("w1", 1, lease_for=LEASE)
    clock.advance(LEASE + 1.0)
    assert await store.reap() == 1
    assert await ages(store) == (0.0, (0.0,))
    clock.advance(2.0)
    assert await ages(store) == (2.0, (2.0,))


async def test_a_dependent_is_ready_from_its_last_dependency_s_success(
    store: Store, clock: ManualClock
) -> None:
    await store.submit([NewTask(kind="fetch", ref="f"), scan("a", after=(Sibling(0),))])
    clock.advance(10.0)
    [lease] = (await store.claim("w1", 1, lease_for=LEASE)).leases
    clock.advance(5.0)
    await store.finish(lease, Succeeded())
    assert await ages(store) == (0.0, (0.0,))
    clock.advance(4.0)
    assert await ages(store) == (4.0, (4.0,))


async def test_a_delayed_task_is_ready_from_its_run_at(store: Store, clock: ManualClock) -> None:
    await store.submit([scan("a", delay=20.0)])
    clock.advance(10.0)
    assert await ages(store) == (0.0, (0.0,))
    clock.advance(15.0)
    assert await ages(store) == (5.0, (5.0,))


async def test_a_remote_job_that_fails_is_ready_from_its_retry_s_run_at(
    store: Store, clock: ManualClock
) -> None:
    await store.submit([scan("a")])
    [lease] = (await store.claim("w1", 1, lease_for=LEASE)).leases
    await store.finish(lease, AwaitRemote("job-1", poll_every=10.0))
    clock.advance(100.0)
    [poll] = (await store.claim_polls("w1", 1, lease_for=LEASE)).leases
    await store.finish(poll, Retry(FAILED, delay=5.0))
    clock.advance(8.0)
    assert await ages(store) == (3.0, (3.0,))
