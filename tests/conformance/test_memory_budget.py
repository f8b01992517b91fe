"""A worker's memory budget, charged by the claim: the same on every backend."""

from __future__ import annotations

import pytest

from headrace.policy import ConfigError
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import KindLimit, Lease, MemoryRoom, NewTask

pytestmark = pytest.mark.anyio

LEASE = 30.0
MIB = 1024 * 1024


def task(ref: str, memory: int, **fields: object) -> NewTask:
    kind = str(fields.pop("kind", "work"))
    return NewTask(kind=kind, ref=ref, memory=memory, **fields)  # type: ignore[arg-type]


async def claim(store: Store, room: MemoryRoom | None, n: int = 10) -> list[Lease]:
    return list((await store.claim("w1", n, lease_for=LEASE, memory=room)).leases)


def refs(leases: list[Lease]) -> list[str]:
    return [lease.task.ref for lease in leases]


async def test_memory_is_stored_with_the_task(store: Store) -> None:
    [sub] = await store.submit([task("a", 300 * MIB)])
    assert (await store.get(sub.id)).memory == 300 * MIB
    [lease] = await claim(store, None)
    assert lease.task.memory == 300 * MIB


async def test_a_task_that_does_not_fit_is_skipped_and_a_smaller_later_one_taken(
    store: Store,
) -> None:
    await store.submit(
        [task("big", 600 * MIB), task("small", 100 * MIB), task("free", 0), task("mid", 200 * MIB)]
    )
    # 500 MiB free beside other charged work: the big one waits, those behind it that fit go.
    taken = await claim(store, MemoryRoom(500 * MIB))
    assert refs(taken) == ["small", "free", "mid"]
    # The big one stayed ready, in its place: it goes once the room is there.
    assert refs(await claim(store, MemoryRoom(100 * MIB))) == []
    assert refs(await claim(store, MemoryRoom(600 * MIB))) == ["big"]


async def test_the_sum_a_claim_takes_fits_the_room(store: Store) -> None:
    await store.submit([task(f"t{i}", 300 * MIB) for i in range(5)])
    assert refs(await claim(store, MemoryRoom(1000 * MIB))) == ["t0", "t1", "t2"]
    assert refs(await claim(store, MemoryRoom(1000 * MIB))) == ["t3", "t4"]


async def test_an_oversize_task_runs_alone_in_an_idle_worker(store: Store) -> None:
    await store.submit([task("huge", 2048 * MIB), task("small", 100 * MIB), task("free", 0)])
    # Something charged runs in the worker: the oversize task waits, the small one goes.
    assert refs(await claim(store, MemoryRoom(700 * MIB))) == ["small", "free"]
    await store.submit([task("small2", 100 * MIB)])
    # Nothing charged runs: the oversize task goes, and nothing charged beside it.
    assert refs(await claim(store, MemoryRoom(768 * MIB, idle=True))) == ["huge"]
    assert refs(await claim(store, MemoryRoom(768 * MIB, idle=True))) == ["small2"]


async def test_an_oversize_task_waits_for_the_charged_ones_taken_before_it(store: Store) -> None:
    await store.submit([task("small", 100 * MIB), task("huge", 2048 * MIB), task("free", 0)])
    # The claim charged the small one first: the huge one is no longer alone, so it waits.
    assert refs(await claim(store, MemoryRoom(768 * MIB, idle=True))) == ["small", "free"]
    assert refs(await claim(store, MemoryRoom(668 * MIB))) == []


async def test_large_tasks_take_only_their_share_and_small_ones_flow_beside_them(
    store: Store,
) -> None:
    # Large: past 96 MiB. Their share: 384 MiB, of which 150 are held by one running.
    room = MemoryRoom(600 * MIB, large=96 * MIB, large_free=234 * MIB)
    await store.submit(
        [task(f"png{i}", 150 * MIB) for i in range(3)]
        + [task(f"photo{i}", 70 * MIB) for i in range(4)]
    )
    assert refs(await claim(store, room)) == ["png0", "photo0", "photo1", "photo2", "photo3"]
    # The large ones left wait for the share, though the budget has room for one of them.
    room = MemoryRoom(170 * MIB, large=96 * MIB, large_free=84 * MIB)
    assert refs(await claim(store, room)) == []
    room = MemoryRoom(170 * MIB, large=96 * MIB, large_free=160 * MIB)
    assert refs(await claim(store, room)) == ["png1"]


async def test_no_room_still_takes_uncharged_tasks(store: Store) -> None:
    await store.submit([task("big", 10 * MIB), task("free", 0)])
    assert refs(await claim(store, MemoryRoom(0))) == ["free"]


async def test_the_memory_budget_and_the_kind_budget_hold_together(store: Store) -> None:
    await store.submit(
        [
            task("v0", 400 * MIB, kind="video"),
            task("v1", 100 * MIB, kind="video"),
            task("i0", 400 * MIB, kind="image"),
            task("i1", 50 * MIB, kind="image"),
        ]
    )
    one_video = KindLimit(frozenset({"video"}), 1)
    claimed = await store.claim(
        "w1", 10, lease_for=LEASE, within=[one_video], memory=MemoryRoom(500 * MIB)
    )
    assert refs(list(claimed.leases)) == ["v0", "i1"]


def test_memory_is_a_whole_number_of_bytes() -> None:
    for bad in (-1, 1.5, True, "1GiB", None):
        with pytest.raises(ConfigError, match=r"task\.memory"):
            task("a", bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="claim memory"):
        MemoryRoom(-1)


async def test_a_key_submitted_again_with_another_estimate_names_the_first_task(
    store: Store,
) -> None:
    """Memory is not part of the idempotency payload: a retried submit may estimate anew."""
    [first] = await store.submit([task("a", 300 * MIB, key="upload-1")])
    [again] = await store.submit([task("a", 310 * MIB, key="upload-1")])
    assert (again.id, again.created) == (first.id, False)
    assert (await store.get(first.id)).memory == 300 * MIB
