"""Claiming ahead (`Store.claim(ahead=...)`): past its free slots a worker may take only tasks
that can wait in it for a slot, the same on every backend."""

from __future__ import annotations

import pytest

from headrace.policy import ManualClock
from headrace.policy.errors import ErrorClass
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import (
    AttemptError,
    AttemptOutcome,
    KindLimit,
    Lease,
    NewTask,
    Retry,
    TaskState,
)

pytestmark = pytest.mark.anyio

LEASE = 30.0
MIB = 1024 * 1024


def task(ref: str, **fields: object) -> NewTask:
    kind = str(fields.pop("kind", "work"))
    return NewTask(kind=kind, ref=ref, **fields)  # type: ignore[arg-type]


async def claim(store: Store, limit: int, ahead: int, **options: object) -> list[Lease]:
    found = await store.claim("w1", limit, lease_for=LEASE, ahead=ahead, **options)  # type: ignore[arg-type]
    return list(found.leases)


def refs(leases: list[Lease]) -> list[str]:
    return [lease.task.ref for lease in leases]


async def test_past_the_limit_only_tasks_that_may_wait_are_taken(store: Store) -> None:
    await store.submit(
        [
            task("a"),
            task("b"),
            task("gated", gates=("provider:image",)),
            task("heavy", memory=100 * MIB),
            task("c"),
            task("d"),
            task("e"),
        ]
    )
    # Two for the free slots, in order; then up to three that pass no gate and charge nothing.
    assert refs(await claim(store, 2, 3)) == ["a", "b", "c", "d", "e"]
    # Those passed over stayed ready, in their place.
    assert refs(await claim(store, 5, 0)) == ["gated", "heavy"]


async def test_within_the_limit_any_task_goes_first(store: Store) -> None:
    await store.submit([task("gated", gates=("provider:image",)), task("a"), task("b")])
    assert refs(await claim(store, 1, 5)) == ["gated", "a", "b"]


async def test_with_no_limit_only_the_ahead_part_is_claimed(store: Store) -> None:
    await store.submit([task("gated", gates=("free",)), task("a"), task("b"), task("c")])
    assert refs(await claim(store, 0, 2)) == ["a", "b"]
    assert refs(await claim(store, 0, 0)) == []


async def test_tasks_claimed_ahead_count_in_the_kind_limits(store: Store) -> None:
    await store.submit([task(f"v{i}", kind="video") for i in range(4)] + [task("a"), task("b")])
    room = (KindLimit(frozenset({"video"}), 1),)
    # One video slot is free: the claim takes one video whatever it may take ahead.
    assert refs(await claim(store, 1, 4, within=room)) == ["v0", "a", "b"]


async def test_a_task_handed_back_unstarted_keeps_its_attempts(
    store: Store, clock: ManualClock
) -> None:
    [sub] = await store.submit([task("a", max_attempts=2)])
    error = AttemptError.of(ErrorClass.TRANSIENT, "interrupted", "worker shut down")
    for _ in range(3):  # more times than its attempts
        [lease] = await claim(store, 0, 1)
        [result] = await store.finish_many([(lease, Retry(error, 0.0, counted=False))])
        assert result is None
    [lease] = await claim(store, 1, 0)
    assert lease.task.attempts_used == 1  # three handed back unstarted, not counted
    history = await store.attempts(sub.id)
    assert [a.outcome for a in history] == [AttemptOutcome.RETRY] * 3 + [AttemptOutcome.RUNNING]
    assert (await store.get(sub.id)).state is TaskState.RUNNING
