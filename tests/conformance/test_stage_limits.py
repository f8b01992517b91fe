"""Stage limits on every backend: caps per flow and per group on waiting work, successors that
do not fit deferring their task, and claims held back while a stage downstream is full."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace.policy import ManualClock
from headrace.policy.errors import QueueFull
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import (
    DEFER_DELAY,
    STAGE_FULL,
    AttemptOutcome,
    AwaitRemote,
    NewTask,
    Settings,
    StageLimits,
    Succeeded,
    TaskState,
)

from .conftest import AGING_STEP, GATES, make_backend

pytestmark = pytest.mark.anyio

LEASE = 30.0
STAGES = (
    StageLimits("validate", per_flow=2, per_group=3, feeds=("scan",)),
    StageLimits("scan", bound=2, per_flow=1, feeds=("derive",)),
    StageLimits("derive", bound=3),
)


@pytest.fixture
async def store(
    backend: str, clock: ManualClock, tmp_path: Path, durable: None
) -> AsyncIterator[Store]:
    opened = make_backend(backend, clock, tmp_path)
    await opened.open(Settings(gates=GATES, aging_step=AGING_STEP, stages=STAGES))
    yield opened
    await opened.close()


def task(ref: str, kind: str = "validate", flow: str = "s1", group: str = "e1") -> NewTask:
    return NewTask(kind=kind, ref=ref, flow=flow, group=group)


async def claimed(store: Store, n: int = 10, kinds: list[str] | None = None) -> list[str]:
    leases = (await store.claim("w1", n, lease_for=LEASE, kinds=kinds)).leases
    return [lease.task.ref for lease in leases]


async def test_caps_per_flow_and_per_group_hold_on_submit(store: Store) -> None:
    await store.submit([task("a1"), task("a2")])
    with pytest.raises(QueueFull) as full:
        await store.submit([task("a3")])
    assert (full.value.scope, full.value.label, full.value.bound) == ("flow", "s1", 2)
    await store.submit([task("b1", flow="s2")])  # another session of the event still fits
    with pytest.raises(QueueFull) as full:
        await store.submit([task("c1", flow="s3")])  # but the event has its 3 waiting
    assert (full.value.scope, full.value.label) == ("group", "e1")
    await store.submit([task("c1", flow="s3", group="e2")])  # another event: its own cap
    # Running work is not waiting work: a claimed task makes room for its session.
    assert await claimed(store, 1) == ["a1"]
    await store.submit([task("a3")])
    with pytest.raises(QueueFull, match="stage 'validate': 2 tasks of flow 's1' already waiting"):
        await store.submit([task("a4")])


async def test_a_success_whose_successor_does_not_fit_is_deferred(
    store: Store, clock: ManualClock
) -> None:
    await store.submit([task("x", kind="scan", flow="s1")])  # scan: 1 waiting of s1 at most
    [sub] = await store.submit([task("v")])
    [lease] = (await store.claim("w1", 1, lease_for=LEASE, kinds=["validate"])).leases
    assert lease.task.id == sub.id
    await store.finish(lease, Succeeded(successors=(task("v-scan", kind="scan"),)))

    record = await store.get(sub.id)
    assert record.state is TaskState.READY and record.error_code == STAGE_FULL
    assert record.attempts_used == 0  # backpressure is not a failure: nothing counted
    [attempt] = await store.attempts(sub.id)
    assert (attempt.outcome, attempt.code) == (AttemptOutcome.DEFERRED, STAGE_FULL)
    scans = await store.tasks(kind="scan")
    assert [t.ref for t in scans] == ["x"]  # no successor was made

    assert await claimed(store, 5, ["scan"]) == ["x"]  # room for s1 in scan again
    assert await claimed(store, 5, ["validate"]) == []  # not before its delay
    clock.advance(DEFER_DELAY)
    [again] = (await store.claim("w1", 1, lease_for=LEASE, kinds=["validate"])).leases
    await store.finish(again, Succeeded(successors=(task("v-scan", kind="scan"),)))
    assert (await store.get(sub.id)).state is TaskState.SUCCEEDED
    assert sorted(t.ref for t in await store.tasks(kind="scan")) == ["v-scan", "x"]


async def test_a_remote_success_that_does_not_fit_is_polled_again(
    store: Store, clock: ManualClock
) -> None:
    await store.submit([task("x", kind="scan", flow="s1")])
    [sub] = await store.submit([task("v")])
    [lease] = (await store.claim("w1", 1, lease_for=LEASE, kinds=["validate"])).leases
    await store.finish(lease, AwaitRemote("job-1", poll_every=5.0))
    clock.advance(5.0)
    [poll] = (await store.claim_polls("w1", 1, lease_for=LEASE)).leases
    await store.finish(poll, Succeeded(successors=(task("v-scan", kind="scan"),)))
    record = await store.get(sub.id)
    # Its job is done and known: it is checked again later, never submitted a second time.
    assert record.state is TaskState.WAITING and record.remote_id == "job-1"
    assert record.error_code == STAGE_FULL


async def test_upstream_claims_wait_while_a_stage_downstream_is_full(store: Store) -> None:
    await store.submit([task(f"v{i}", flow=f"s{i}", group=f"e{i}") for i in range(4)])
    # scan holds 2 waiting at most: only 2 validations may start, whatever the claim's limit.
    first = (await store.claim("w1", 10, lease_for=LEASE, kinds=["validate"])).leases
    assert [lease.task.ref for lease in first] == ["v0", "v1"]
    assert await claimed(store, 10, ["validate"]) == []  # running, they may still fill it
    for lease in first:
        successor = task(f"{lease.task.ref}-scan", kind="scan", flow=lease.task.flow)
        await store.finish(lease, Succeeded(successors=(successor,)))
    assert await claimed(store, 10, ["validate"]) == []  # scan is full: v2, v3 stay ready
    assert [t.ref for t in await store.tasks(kind="validate", state=TaskState.READY)] == [
        "v2",
        "v3",
    ]
    # A scan task that starts gives its place back upstream.
    assert await claimed(store, 1, ["scan"]) == ["v0-scan"]
    assert await claimed(store, 10, ["validate"]) == ["v2"]


async def test_a_feeder_that_ends_with_no_successor_wakes_the_claims_it_held_back(
    store: Store,
) -> None:
    """Its end makes room downstream (it may no longer add to the stage), though it returns no
    ticket and readies no dependent: the workers an answer of "held back" let stand are woken."""
    await store.submit([task(f"v{i}", flow=f"s{i}", group=f"e{i}") for i in range(3)])
    first = (await store.claim("w1", 10, lease_for=LEASE, kinds=["validate"])).leases
    assert len(first) == 2  # scan's room, 2, all taken by the running feeders
    assert await claimed(store, 10, ["validate"]) == []
    await store.wait_for_work(0.05)  # what came before is seen (and PostgreSQL listens)
    before = store.wakes
    # No scan task after all: a plain success, written as a worker writes its batches.
    assert await store.finish_many([(first[0], Succeeded())]) == [None]
    await store.wait_for_work(10.0)
    assert store.wakes > before
    assert await claimed(store, 10, ["validate"]) == ["v2"]


async def test_a_claim_does_not_hold_back_stages_that_feed_none(store: Store) -> None:
    await store.submit([task("d", kind="derive"), task("other", kind="work")])
    assert sorted(await claimed(store, 10)) == ["d", "other"]
