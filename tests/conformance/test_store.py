"""The Store contract, run against every backend."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import pytest

from headrace.policy import (
    ConfigError,
    ErrorClass,
    KeyConflict,
    LeaseLost,
    ManualClock,
    QueueFull,
    Tier,
    UnknownGate,
)
from headrace.policy.errors import UnknownTask
from headrace.store.protocol.ages import ReadyAges
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import (
    MAX_DELAY,
    AttemptError,
    AttemptOutcome,
    AwaitRemote,
    Dead,
    KindLimit,
    Lease,
    NewTask,
    PollAgain,
    Retry,
    Settings,
    Sibling,
    Succeeded,
    TaskRecord,
    TaskState,
)

from .conftest import AGING_STEP, GATES

pytestmark = pytest.mark.anyio

LEASE = 30.0


def task(ref: str, **fields: object) -> NewTask:
    return NewTask(kind=str(fields.pop("kind", "work")), ref=ref, **fields)  # type: ignore[arg-type]


async def claim(store: Store, n: int = 10, lease_for: float = LEASE) -> list[Lease]:
    return list((await store.claim("w1", n, lease_for=lease_for)).leases)


def refs(leases: list[Lease]) -> list[str]:
    return [lease.task.ref for lease in leases]


def boom(error_class: ErrorClass = ErrorClass.TRANSIENT, message: str = "") -> AttemptError:
    return AttemptError.of(error_class, "boom", message)


# -- submission


async def test_submit_then_get(store: Store, clock: ManualClock) -> None:
    [sub] = await store.submit([task("a", group="ep1", flow="ep1", cost=2.5)])
    record = await store.get(sub.id)
    assert sub.created
    assert (record.ref, record.group, record.flow, record.cost) == ("a", "ep1", "ep1", 2.5)
    assert record.state is TaskState.READY
    assert record.created_at == clock.now()


async def test_same_key_and_payload_returns_the_existing_task(store: Store) -> None:
    [first] = await store.submit([task("a", key="k1", group="ep1")])
    [again, other] = await store.submit(
        [task("a", key="k1", group="ep1", delay=30.0), task("b", key="k2")]
    )
    assert again.id == first.id and not again.created  # delay counts from now: not compared
    assert other.created
    [dup_in_batch, dup] = await store.submit([task("c", key="k3"), task("c", key="k3")])
    assert dup.id == dup_in_batch.id and not dup.created
    assert len(await store.tasks()) == 3
    found = await store.find("k1")
    assert found is not None and found.ref == "a"


KEYED: dict[str, Any] = {
    "kind": "work",
    "gates": ("provider:image", "free"),
    "flow": "ep1",
    "group": "ep1",
    "tier": Tier.NORMAL,
    "cost": 2.0,
    "max_attempts": 3,
    "weight": 1.0,
}
CHANGED: list[tuple[str, Any]] = [
    ("kind", "other"),
    ("ref", "a2"),
    ("gates", ("provider:image",)),
    ("flow", "ep2"),
    ("group", "ep2"),
    ("group", None),
    ("tier", Tier.RUSH),
    ("cost", 2.5),
    ("max_attempts", 4),
    ("weight", 2.0),
]


@pytest.mark.parametrize(("field", "value"), CHANGED)
async def test_a_key_with_another_payload_is_refused_naming_the_field(
    store: Store, field: str, value: Any
) -> None:
    [first] = await store.submit([task("a", key="k1", **KEYED)])
    changed = {**KEYED, "ref": "a", field: value}
    with pytest.raises(KeyConflict, match=rf"'k1' already names task {first.id}, whose {field}"):
        await store.submit([task("b", key="k2"), NewTask(key="k1", **changed)])
    with pytest.raises(KeyConflict) as refused:
        await store.submit([NewTask(key="k1", **changed)], bounds={"work": 100, "other": 100})
    assert (refused.value.key, refused.value.field) == ("k1", field)
    assert refused.value.task_id == first.id
    assert [t.ref for t in await store.tasks()] == ["a"]  # the batch was refused whole
    reordered = {**KEYED, "ref": "a", "gates": ("free", "provider:image"), "cost": 2}
    [again] = await store.submit([NewTask(key="k1", **reordered)])  # the same payload
    assert again.id == first.id and not again.created


async def test_a_key_whose_dependencies_differ_is_refused(store: Store) -> None:
    dep_a, dep_b = await store.submit([task("dep-a"), task("dep-b")])
    [first] = await store.submit([task("a", key="k1", after=(dep_a.id,))])
    with pytest.raises(KeyConflict, match="whose after differs"):
        await store.submit([task("a", key="k1", after=(dep_b.id,))])
    with pytest.raises(KeyConflict, match="whose after differs"):
        await store.submit([task("a", key="k1")])
    [again] = await store.submit([task("a", key="k1", after=(dep_a.id, dep_a.id))])
    assert again.id == first.id and not again.created


async def test_a_key_given_twice_in_a_batch_with_two_payloads_refuses_the_batch(
    store: Store,
) -> None:
    with pytest.raises(KeyConflict, match="'k1' already names an earlier task of this batch"):
        await store.submit([task("a", key="k1"), task("b"), task("a", key="k1", cost=3.0)])
    assert await store.tasks() == []


async def test_a_batch_submitted_again_names_the_same_tasks_siblings_included(
    store: Store,
) -> None:
    def batch() -> list[NewTask]:
        return [
            task("s1", key="ep1/s1"),
            task("s2", key="ep1/s2"),
            task("assembly", key="ep1/assembly", after=(Sibling(0), Sibling(1))),
        ]

    first = await store.submit(batch())
    again = await store.submit(batch())
    assert [s.id for s in again] == [s.id for s in first]
    assert [s.created for s in first] == [True] * 3 and [s.created for s in again] == [False] * 3
    # A sibling without a key is a new task each time: a keyed task waiting on it is not the
    # task its key names, which waits on the first one.
    [_, keyed] = await store.submit(
        [task("s0"), task("joined", key="ep1/joined", after=(Sibling(0),))]
    )
    assert keyed.created
    with pytest.raises(KeyConflict, match="whose after differs"):
        await store.submit([task("s0"), task("joined", key="ep1/joined", after=(Sibling(0),))])
    assert len(await store.tasks()) == 5


async def test_successor_keys_name_their_task_only_with_the_same_payload(store: Store) -> None:
    [script] = await store.submit([task("script", group="ep1")])
    [other] = await store.submit([task("other script", group="ep1")])
    leases = await claim(store)
    successors = (
        task("s1", group="ep1", key="script>shot:s1"),
        task("assembly", group="ep1", key="script>assembly:ep1", after=(Sibling(0), script.id)),
    )
    mine = next(lease for lease in leases if lease.task_id == script.id)
    await store.finish(mine, Succeeded(successors=successors))
    # The same successors again (a parent re-run, a producer): the same tasks.
    again = await store.submit(list(successors))
    created = {t.key: t.id for t in await store.tasks(group="ep1") if t.key}
    assert [s.id for s in again] == [created["script>shot:s1"], created["script>assembly:ep1"]]
    assert not any(s.created for s in again)
    # A completion whose successor reuses a key with another payload is refused whole.
    theirs = next(lease for lease in leases if lease.task_id == other.id)
    clash = (task("s1", group="ep1", key="script>shot:s1", cost=5.0),)
    with pytest.raises(KeyConflict, match="whose cost differs"):
        await store.finish(theirs, Succeeded(successors=clash))
    assert (await store.get(other.id)).state is TaskState.RUNNING
    [error] = await store.finish_many([(theirs, Succeeded(successors=clash))])
    assert isinstance(error, KeyConflict) and error.field == "cost"
    assert len(await store.tasks()) == 4


async def test_unknown_gate_and_task_are_refused_whole(store: Store) -> None:
    with pytest.raises(UnknownGate, match="provider:vidoe"):
        await store.submit([task("ok"), task("bad", gates=("provider:vidoe",))])
    with pytest.raises(UnknownTask):
        await store.submit([task("x", after=(999,))])
    with pytest.raises(UnknownTask):
        await store.get(999)
    assert await store.tasks() == []


async def test_bound_refuses_when_the_stage_is_full(store: Store) -> None:
    await store.submit([task("a", kind="scan"), task("b", kind="scan")], bounds={"scan": 2})
    with pytest.raises(QueueFull) as info:
        await store.submit([task("c", kind="scan")], bounds={"scan": 2})
    assert info.value.kind == "scan"
    await store.submit([task("d", kind="other")], bounds={"scan": 2})
    leases = await claim(store, 1)
    await store.finish(leases[0], Succeeded())
    await store.submit([task("c", kind="scan")], bounds={"scan": 2})


async def test_a_bound_counts_only_the_tasks_a_batch_creates(store: Store) -> None:
    bounds = {"scan": 2}
    [a] = await store.submit([task("a", kind="scan", key="a")], bounds=bounds)
    # "a" again names its task and "b" twice is one task: two tasks waiting, not four.
    batch = [task(r, kind="scan", key=r) for r in ("a", "b", "b")]
    again, b, b_again = await store.submit(batch, bounds=bounds)
    assert again.id == a.id and b_again.id == b.id and b.created and not b_again.created
    with pytest.raises(QueueFull):
        await store.submit([task("c", kind="scan", key="c")], bounds=bounds)
    # A full stage does not hide a key reused with another payload.
    with pytest.raises(KeyConflict, match="whose cost differs"):
        await store.submit([task("a", kind="scan", key="a", cost=2.0)], bounds=bounds)
    assert len(await store.tasks()) == 2


# -- dependencies and successors


async def test_dependents_wait_for_success(store: Store) -> None:
    subs = await store.submit([task("script"), task("shot", after=(Sibling(0),))])
    assert (await store.get(subs[1].id)).state is TaskState.PENDING
    [lease] = await claim(store)
    assert lease.task.ref == "script"
    await store.finish(lease, Succeeded())
    assert (await store.get(subs[1].id)).state is TaskState.READY
    assert refs(await claim(store)) == ["shot"]


async def test_dependents_of_a_dead_task_are_cancelled(store: Store) -> None:
    subs = await store.submit(
        [task("a"), task("b", after=(Sibling(0),)), task("c", after=(Sibling(1),))]
    )
    [lease] = await claim(store)
    await store.finish(lease, Dead(boom(ErrorClass.FATAL)))
    states = [(await store.get(s.id)).state for s in subs]
    assert states == [TaskState.DEAD, TaskState.CANCELLED, TaskState.CANCELLED]
    [late] = await store.submit([task("d", after=(subs[0].id,))])
    assert (await store.get(late.id)).state is TaskState.CANCELLED


async def test_successors_are_created_with_the_completion_and_only_once(store: Store) -> None:
    [script] = await store.submit([task("script", group="ep1")])
    [lease] = await claim(store)
    successors = (
        task("s1", group="ep1", key="ep1/s1"),
        task("s2", group="ep1", key="ep1/s2"),
        task("assembly", group="ep1", after=(Sibling(0), Sibling(1))),
    )
    await store.finish(lease, Succeeded(successors=successors))
    with pytest.raises(LeaseLost):
        await store.finish(lease, Succeeded(successors=successors))
    records = await store.tasks(group="ep1")
    assert sorted(r.ref for r in records) == ["assembly", "s1", "s2", "script"]
    assembly = next(r for r in records if r.ref == "assembly")
    assert assembly.state is TaskState.PENDING
    for lease in await claim(store):
        await store.finish(lease, Succeeded())
    assert (await store.get(assembly.id)).state is TaskState.READY
    assert script.created


# -- ordering


async def test_tiers_order_dispatch(store: Store) -> None:
    await store.submit([task("low", tier=Tier.LOW), task("normal"), task("rush", tier=Tier.RUSH)])
    assert refs(await claim(store)) == ["rush", "normal", "low"]


async def test_flows_take_turns_whatever_each_submitted(store: Store) -> None:
    await store.submit([task(f"a{i}", flow="a") for i in range(6)])
    assert refs(await claim(store, 2)) == ["a0", "a1"]
    await store.submit([task(f"b{i}", flow="b") for i in range(3)])
    # b joins at the current virtual time: no catching up, no waiting behind a's backlog.
    assert refs(await claim(store)) == ["b0", "a2", "b1", "a3", "b2", "a4", "a5"]


async def test_weighted_flows_share_in_proportion(store: Store) -> None:
    await store.submit([task(f"a{i}", flow="a", weight=2.0) for i in range(8)])
    await store.submit([task(f"b{i}", flow="b") for i in range(8)])
    order = refs(await claim(store, 9))
    assert sum(1 for r in order if r.startswith("a")) == 6


async def test_aging_promotes_low_to_normal_never_rush(store: Store, clock: ManualClock) -> None:
    await store.submit([task("old-low", tier=Tier.LOW)])
    clock.advance(AGING_STEP * 5)
    await store.submit([task("new-normal"), task("rush", tier=Tier.RUSH)])
    assert refs(await claim(store)) == ["rush", "old-low", "new-normal"]
    promoted = (await store.tasks(kind="work"))[0]
    assert promoted.ref == "old-low"
    assert promoted.tier is Tier.NORMAL and promoted.submitted_tier is Tier.LOW
    assert promoted.promoted_at is not None


async def test_low_waiting_less_than_a_step_stays_low(store: Store, clock: ManualClock) -> None:
    await store.submit([task("low", tier=Tier.LOW)])
    clock.advance(AGING_STEP / 2)
    await store.submit([task("normal")])
    assert refs(await claim(store)) == ["normal", "low"]


# -- gates


async def test_concurrency_cap_holds_and_tickets_return(store: Store) -> None:
    await store.submit([task(f"v{i}", gates=("provider:video",)) for i in range(4)])
    first = await claim(store)
    assert len(first) == 2
    assert await claim(store) == []
    await store.finish(first[0], Succeeded())
    assert len(await claim(store)) == 1
    [stats] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert (stats.in_flight, stats.peak_in_flight, stats.granted) == (2, 2, 3)
    assert stats.blocked_by_concurrency >= 1


async def test_rate_keeps_the_burst_and_every_window(store: Store, clock: ManualClock) -> None:
    await store.submit([task(f"v{i}", gates=("provider:video",)) for i in range(8)])
    started = []
    for _ in range(4):
        leases = await claim(store)
        started += leases
        for lease in leases:
            await store.finish(lease, Succeeded())
    assert len(started) == 4  # rate 4 per 10 s, though the cap of 2 freed up twice
    result = await store.claim("w1", 10, lease_for=LEASE)
    assert result.leases == ()
    assert result.wake_at == pytest.approx(clock.now() + 10.0)
    clock.advance(9.9)
    assert await claim(store) == []
    clock.advance(0.1)
    assert len(await claim(store)) == 2
    [stats] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert stats.blocked_by_token >= 1 and stats.first_blocked_at is not None


async def test_a_stamp_that_makes_room_wakes_waiting_workers(
    store: Store, clock: ManualClock
) -> None:
    """Reserved starts as many as the rate's: only a stamp (or a release) makes room, so a
    refused claim is given no time of the gate's to come back (only its leases' end), and
    the stamp wakes the workers waiting."""
    await store.submit([task(f"s{i}", gates=("provider:speech",)) for i in range(3)])
    granted = await claim(store)
    assert len(granted) == 2
    refused = await store.claim("w1", 10, lease_for=LEASE)
    assert refused.leases == ()
    assert refused.wake_at == pytest.approx(clock.now() + LEASE)  # the grants' leases run out
    await store.wait_for_work(0.05)  # what came before is seen (and PostgreSQL listens)
    before = store.wakes
    waiting = asyncio.create_task(store.wait_for_work(30.0))
    await store.start(granted[0])
    await asyncio.wait_for(waiting, 10.0)  # woken, not at the end of its 30 s
    assert store.wakes > before
    later = await store.claim("w1", 10, lease_for=LEASE)
    assert later.leases == ()  # two in the window still, one of them stamped now
    assert later.wake_at == pytest.approx(clock.now() + 10.0)
    woken = store.wakes
    await store.start(granted[0])  # stamped already: nothing changes, nobody is woken
    await store.wait_for_work(0.05)
    assert store.wakes == woken


async def test_a_retry_wakes_the_other_workers_to_learn_its_time(
    store: Store, clock: ManualClock
) -> None:
    """A task ready again later is a time no other worker's standing answer names: the retry
    wakes them, and their next claim names it, though the task returned no ticket."""
    [submitted] = await store.submit([task("r")])
    [lease] = await claim(store)
    assert lease.task.id == submitted.id
    await store.wait_for_work(0.05)  # what came before is seen (and PostgreSQL listens)
    before = store.wakes
    await store.finish(lease, Retry(boom(), delay=5.0))
    await store.wait_for_work(10.0)
    assert store.wakes > before
    later = await store.claim("w2", 10, lease_for=LEASE)
    assert later.leases == ()
    assert later.wake_at == pytest.approx(clock.now() + 5.0)


async def test_a_start_counts_from_its_call_not_its_grant(store: Store, clock: ManualClock) -> None:
    """A grant reserves a start that counts in every window until the handler stamps it; from
    then it counts for one window from the stamp, however late after the grant that came."""
    await store.submit([task(f"v{i}", gates=("provider:video",)) for i in range(6)])
    granted = await claim(store, lease_for=1000.0)  # two, the cap; their starts reserved
    clock.advance(100.0)
    await store.start(granted[0])
    await store.start(granted[0])  # stamped once: a second call changes nothing
    await store.finish(granted[0], Succeeded())
    clock.advance(3.0)
    await store.start(granted[1])  # stamped 3 s after the first, 103 s after its grant
    await store.finish(granted[1], Succeeded())
    for lease in await claim(store):  # two more, stamped at 103 s too: four in the window
        await store.start(lease)
        await store.finish(lease, Succeeded())
    clock.advance(6.9)
    result = await store.claim("w1", 10, lease_for=LEASE)
    assert result.leases == ()  # counted from their grants, two would have left long ago
    assert result.wake_at == pytest.approx(clock.now() + 0.1)
    clock.advance(0.1)
    assert len(await claim(store)) == 1
    [stats] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert stats.blocked_by_token >= 1


async def test_a_start_never_stamped_counts_from_the_outcome(
    store: Store, clock: ManualClock
) -> None:
    await store.submit([task(f"v{i}", gates=("provider:video",)) for i in range(6)])
    first = await claim(store)
    clock.advance(1.0)
    for lease in first:
        await store.finish(lease, Succeeded())  # starts stamped at their outcomes, at 1 s
    second = await claim(store)
    assert len(second) == 2
    clock.advance(1.0)
    await store.finish(second[0], Retry(boom(), delay=1000.0))
    await store.finish(second[1], AwaitRemote("job-1", poll_every=5.0))  # submitted: stamped
    clock.advance(8.5)
    result = await store.claim("w1", 10, lease_for=LEASE)
    assert result.leases == ()  # four starts in the last 10 s, counted from 1 s and 2 s
    assert result.wake_at == pytest.approx(clock.now() + 0.5)
    clock.advance(0.5)
    assert len(await claim(store)) == 1  # the cap: the remote job still holds a ticket


async def test_a_stamp_is_fenced_by_the_lease(store: Store, clock: ManualClock) -> None:
    await store.submit([task("v", gates=("provider:video",))])
    [lease] = await claim(store, lease_for=5.0)
    clock.advance(5.0)
    with pytest.raises(LeaseLost):
        await store.start(lease)
    await store.cancel(lease.task_id)
    with pytest.raises(LeaseLost):
        await store.start(lease)


async def test_a_stamp_names_its_gates(store: Store, clock: ManualClock) -> None:
    """A handler calling two providers stamps each start just before its own call."""
    await store.submit([task("both", gates=("provider:image", "provider:video"))])
    await store.submit([task(f"v{i}", gates=("provider:video",)) for i in range(3)])
    [both] = await claim(store, 1)
    await store.start(both, ["provider:image"])
    clock.advance(8.0)
    await store.start(both, ["provider:video"])
    await store.finish(both, Succeeded())
    granted = await claim(store)
    for lease in granted:
        await store.start(lease)
        await store.finish(lease, Succeeded())
    assert len(granted) == 2
    assert len(await claim(store)) == 1  # the video start counts from 8 s, not from 0
    clock.advance(10.0)
    assert await claim(store) == []


async def test_a_process_without_the_gate_settles_its_starts(
    store: Store, clock: ManualClock, reopen: Callable[[], Store]
) -> None:
    """A command-line process that declares no gates can still end a task holding one."""
    await store.submit([task("v", gates=("provider:video",))])
    [lease] = await claim(store)
    other = reopen()
    await other.open(Settings())
    try:
        assert await other.cancel(lease.task_id)
    finally:
        await other.close()
    [stats] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert (stats.in_flight, stats.granted) == (0, 1)


async def test_a_refusing_gate_never_blocks_a_later_task(store: Store) -> None:
    await store.submit([task(f"v{i}", gates=("provider:video",)) for i in range(5)])
    await store.submit([task("img", gates=("provider:image",), tier=Tier.LOW)])
    assert refs(await claim(store, 3)) == ["v0", "v1", "img"]


async def test_template_gates_are_one_per_key(store: Store) -> None:
    await store.submit(
        [
            task("a1", gates=("session:a",)),
            task("a2", gates=("session:a",)),
            task("b1", gates=("session:b",)),
        ]
    )
    assert refs(await claim(store)) == ["a1", "b1"]
    names = {s.name for s in await store.gate_statistics()}
    assert {"session:a", "session:b"} <= names


async def test_a_task_is_granted_all_its_gates_or_none(store: Store) -> None:
    await store.submit([task("hold", gates=("session:a",))])
    await store.submit([task("both", gates=("provider:video", "session:a"))])
    await store.submit([task("video", gates=("provider:video",))])
    assert refs(await claim(store)) == ["hold", "video"]
    [video] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert video.in_flight == 1


async def test_rate_limited_retry_penalises_the_gate(store: Store, clock: ManualClock) -> None:
    await store.submit([task(f"v{i}", gates=("provider:video",)) for i in range(6)])
    [first, _] = await claim(store)
    error = AttemptError.of(ErrorClass.RATE_LIMITED, "minimax_1002", "slow down")
    await store.finish(first, Retry(error, delay=0.5, penalize=("provider:video",)))
    [stats] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert stats.rate_limited == 1
    assert stats.penalized_until == pytest.approx(clock.now() + 20.0)
    # Two starts already in this window: a penalised capacity of 2 admits nothing more.
    clock.advance(1.0)
    assert await claim(store) == []
    clock.advance(10.0)  # the first two starts left the window; capacity is still halved
    leases = await claim(store)
    assert len(leases) == 1  # one slot: the other start is still in flight


# -- retries, dead letters, leases


async def test_retry_waits_for_run_at_and_releases_the_ticket(
    store: Store, clock: ManualClock
) -> None:
    [sub] = await store.submit([task("v", gates=("provider:video",))])
    [lease] = await claim(store)
    await store.finish(lease, Retry(boom(), delay=5.0))
    record = await store.get(sub.id)
    assert record.state is TaskState.READY and record.run_at == clock.now() + 5.0
    [stats] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert stats.in_flight == 0
    result = await store.claim("w1", 1, lease_for=LEASE)
    assert result.leases == () and result.wake_at == pytest.approx(clock.now() + 5.0)
    clock.advance(5.0)
    [again] = await claim(store)
    assert again.task.attempt == 2


async def test_dead_keeps_the_attempt_history_without_secrets(
    store: Store, clock: ManualClock
) -> None:
    [sub] = await store.submit([task("a", max_attempts=2)])
    [lease] = await claim(store)
    clock.advance(1.0)
    await store.finish(lease, Retry(boom(message="GET https://cdn/x.mp4?sig=abc"), delay=0.0))
    [lease] = await claim(store)
    error = AttemptError.of(ErrorClass.FATAL, "minimax_1004", "token=sk-live-123456789 bad")
    await store.finish(lease, Dead(error))
    record = await store.get(sub.id)
    assert record.state is TaskState.DEAD and record.error_code == "minimax_1004"
    history = await store.attempts(sub.id)
    assert [a.number for a in history] == [1, 2]
    assert [a.outcome for a in history] == [AttemptOutcome.RETRY, AttemptOutcome.DEAD]
    assert history[0].worker == "w1" and history[0].ended_at == history[0].started_at + 1.0
    assert history[1].error_class is ErrorClass.FATAL
    text = " ".join(str(a.message) for a in history)
    assert "sig=abc" not in text and "sk-live" not in text


async def test_dead_letters_keep_no_percent_encoded_secret(store: Store) -> None:
    [sub] = await store.submit([task("a", max_attempts=1)])
    [lease] = await claim(store)
    leak = "src=https%3A%2F%2Fb%2Fclip.mp4%3FX-Amz-Signature%3DZq7T0pS3cr3t%26token%253DW9xK2sEcReT"
    await store.finish(lease, Dead(AttemptError.of(ErrorClass.FATAL, "http_403", leak)))
    [letter] = await store.tasks(state=TaskState.DEAD)
    [attempt] = await store.attempts(sub.id)
    assert letter.id == sub.id and attempt.message is not None
    assert "Zq7T0pS3cr3t" not in attempt.message and "W9xK2sEcReT" not in attempt.message
    assert attempt.message.startswith("src=https://b/clip.mp4?[redacted]")


async def test_an_expired_lease_makes_the_task_ready_again(
    store: Store, clock: ManualClock
) -> None:
    [sub] = await store.submit([task("v", gates=("provider:video",))])
    [stale] = await claim(store, lease_for=10.0)
    clock.advance(5.0)
    [renewed] = await store.renew([stale], lease_for=10.0)
    assert renewed is not None and renewed.until == clock.now() + 10.0
    clock.advance(10.0)
    [fresh] = await claim(store)
    assert fresh.task.id == sub.id and fresh.task.attempt == 2
    assert await store.renew([stale], lease_for=10.0) == [None]
    with pytest.raises(LeaseLost):
        await store.finish(stale, Succeeded())
    await store.finish(fresh, Succeeded())
    outcomes = [a.outcome for a in await store.attempts(sub.id)]
    assert outcomes == [AttemptOutcome.LEASE_EXPIRED, AttemptOutcome.SUCCEEDED]
    [stats] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert stats.in_flight == 0


async def test_a_renewal_of_a_lost_lease_and_a_new_one_on_one_task_renews_the_new_one(
    store: Store, clock: ManualClock
) -> None:
    """A worker whose lease ran out and that took the task again holds both leases: renewing
    them together renews the one that holds, whichever comes first."""
    [sub] = await store.submit([task("v")])
    [stale] = await claim(store, lease_for=10.0)
    clock.advance(10.0)
    [fresh] = await claim(store, lease_for=10.0)
    assert fresh.task.id == sub.id and fresh.token != stale.token
    clock.advance(1.0)
    lost, held = await store.renew([stale, fresh], lease_for=10.0)
    assert lost is None
    assert held is not None and held.token == fresh.token and held.until == clock.now() + 10.0
    clock.advance(1.0)
    held, lost = await store.renew([held, stale], lease_for=10.0)
    assert held is not None and held.until == clock.now() + 10.0 and lost is None


async def test_reap_releases_tickets(store: Store, clock: ManualClock) -> None:
    await store.submit([task("v", gates=("provider:video",))])
    await claim(store, lease_for=10.0)
    clock.advance(11.0)
    assert await store.reap() == 1
    [stats] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert stats.in_flight == 0


async def test_a_task_whose_worker_dies_three_times_is_poison(
    store: Store, clock: ManualClock
) -> None:
    [sub] = await store.submit([task("poison", max_attempts=10)])
    for _ in range(3):
        assert len(await claim(store, lease_for=1.0)) == 1
        clock.advance(2.0)
        await store.reap()
    record = await store.get(sub.id)
    assert record.state is TaskState.DEAD and record.error_code == "poison_lease_expired"


async def test_tasks_whose_worker_died_running_them_together_are_not_charged(
    store: Store, clock: ManualClock
) -> None:
    """Three tasks lost with one worker: none is charged a death or an attempt; each runs
    alone next, and only on a claim that takes nothing else."""
    subs = await store.submit([task(f"t{i}", max_attempts=1) for i in range(3)])
    assert len(await claim(store, 3, lease_for=1.0)) == 3
    clock.advance(2.0)
    await store.reap()
    for sub in subs:
        record = await store.get(sub.id)
        assert (record.state, record.solo, record.attempts_used) == (TaskState.READY, True, 0)
    await store.submit([task("other")])
    busy = await store.claim("w2", 3, lease_for=LEASE, alone=False)
    assert refs(list(busy.leases)) == ["other"]  # a worker running something gets no solo task
    assert busy.solo_waiting  # and hears that one waits for a worker running nothing
    first = await store.claim("w3", 3, lease_for=LEASE)
    [alone] = first.leases
    assert alone.task.ref == "t0" and alone.task.solo  # by itself, though three were asked for
    assert not first.solo_waiting
    await store.finish(alone, Succeeded())


async def test_a_poison_task_is_dead_after_three_deaths_its_neighbours_never(
    store: Store, clock: ManualClock
) -> None:
    [poison, healthy] = await store.submit([task("poison"), task("healthy")])
    await claim(store, 2, lease_for=1.0)  # the first death takes the neighbour down too
    clock.advance(2.0)
    await store.reap()
    for worker in ("w2", "w3"):  # then it dies alone, twice
        [lease] = (await store.claim(worker, 1, lease_for=1.0)).leases
        assert lease.task_id == poison.id
        clock.advance(2.0)
        await store.reap()
    record = await store.get(poison.id)
    assert (record.state, record.error_code, record.expiries) == (
        TaskState.DEAD,
        "poison_lease_expired",
        3,
    )
    [lease] = await claim(store)
    assert lease.task_id == healthy.id
    await store.finish(lease, Succeeded())
    assert (await store.get(healthy.id)).state is TaskState.SUCCEEDED


async def test_attempts_spent_on_lease_expiry_is_dead(store: Store, clock: ManualClock) -> None:
    [sub] = await store.submit([task("once", max_attempts=1)])
    await claim(store, lease_for=1.0)
    clock.advance(2.0)
    await store.reap()
    assert (await store.get(sub.id)).state is TaskState.DEAD


# -- remote waits


async def test_a_remote_wait_holds_the_ticket_not_the_lease(
    store: Store, clock: ManualClock
) -> None:
    [sub] = await store.submit([task("clip", gates=("provider:video",), group="ep1", cost=6.0)])
    [lease] = await claim(store)
    await store.finish(lease, AwaitRemote("job-1", poll_every=10.0, timeout=600.0))
    record = await store.get(sub.id)
    assert record.state is TaskState.WAITING and record.remote_id == "job-1"
    assert record.remote_deadline == clock.now() + 600.0
    [stats] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert stats.in_flight == 1
    early = await store.claim_polls("w1", 5, lease_for=5.0)
    assert early.leases == () and early.wake_at == clock.now() + 10.0
    clock.advance(10.0)
    [poll] = (await store.claim_polls("w1", 5, lease_for=5.0)).leases
    assert (await store.claim_polls("w2", 5, lease_for=5.0)).leases == ()
    await store.finish(poll, PollAgain(10.0))
    clock.advance(10.0)
    [poll] = (await store.claim_polls("w2", 5, lease_for=5.0)).leases
    await store.finish(poll, Succeeded())
    assert (await store.get(sub.id)).state is TaskState.SUCCEEDED
    [stats] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert stats.in_flight == 0
    [attempt] = await store.attempts(sub.id)
    assert attempt.outcome is AttemptOutcome.SUCCEEDED and attempt.ended_at == clock.now()


async def test_a_remote_job_known_to_have_failed_is_counted_and_an_unknown_one_is_not(
    store: Store, clock: ManualClock
) -> None:
    """`remote_jobs` counts jobs that ended without success (the next one is a new job, with a
    new idempotency key); a failed attempt that never got a job through counts nothing, and a
    check that failed leaves its reason on the waiting task."""
    [sub] = await store.submit([task("clip", max_attempts=5)])
    [lease] = await claim(store)
    await store.finish(lease, Retry(boom(), delay=0.0))  # the submission itself failed
    [lease] = await claim(store)
    await store.finish(lease, AwaitRemote("job-1", poll_every=1.0))
    clock.advance(1.0)
    [poll] = (await store.claim_polls("w1", 1, lease_for=LEASE)).leases
    await store.finish(poll, PollAgain(5.0, code="http_503"))
    record = await store.get(sub.id)
    assert (record.state, record.error_code, record.remote_jobs) == (
        TaskState.WAITING,
        "http_503",
        0,
    )
    clock.advance(5.0)
    [poll] = (await store.claim_polls("w1", 1, lease_for=LEASE)).leases
    await store.finish(poll, Retry(boom(), delay=0.0))  # the vendor failed the job
    assert (await store.get(sub.id)).remote_jobs == 1
    [lease] = await claim(store)
    await store.finish(lease, AwaitRemote("job-2", poll_every=1.0))
    clock.advance(1.0)
    [poll] = (await store.claim_polls("w1", 1, lease_for=LEASE)).leases
    await store.finish(poll, Dead(boom(ErrorClass.FATAL)))
    record = await store.get(sub.id)
    assert (record.state, record.remote_jobs) == (TaskState.DEAD, 2)


async def test_a_lost_poller_is_polled_again(store: Store, clock: ManualClock) -> None:
    await store.submit([task("clip", gates=("provider:video",))])
    [lease] = await claim(store)
    await store.finish(lease, AwaitRemote("job-1", poll_every=1.0))
    clock.advance(1.0)
    [stale] = (await store.claim_polls("w1", 5, lease_for=5.0)).leases
    clock.advance(6.0)
    [poll] = (await store.claim_polls("w2", 5, lease_for=5.0)).leases
    with pytest.raises(LeaseLost):
        await store.finish(stale, Succeeded())
    await store.finish(poll, Retry(boom(), delay=1.0))
    record = await store.get(poll.task_id)
    assert record.state is TaskState.READY and record.remote_id is None


async def test_waiting_tasks_are_reconciled_after_a_restart(
    store: Store, clock: ManualClock, reopen: Callable[[], Store]
) -> None:
    [sub] = await store.submit([task("clip", gates=("provider:video",))])
    [lease] = await claim(store)
    await store.finish(lease, AwaitRemote("job-9", poll_every=2.0))
    await store.close()
    restarted = reopen()
    await restarted.open(Settings(gates=GATES, aging_step=AGING_STEP))
    clock.advance(2.0)
    [poll] = (await restarted.claim_polls("w9", 5, lease_for=5.0)).leases
    assert poll.task.remote_id == "job-9" and poll.task.id == sub.id
    assert (await restarted.claim("w9", 5, lease_for=5.0)).leases == ()
    await restarted.close()


# -- cancellation and reports


async def test_cancel_cascades_and_fences_the_holder(store: Store) -> None:
    subs = await store.submit(
        [task("a", gates=("provider:video",)), task("b", after=(Sibling(0),))]
    )
    [lease] = await claim(store)
    assert await store.cancel(subs[0].id)
    assert not await store.cancel(subs[0].id)
    assert (await store.get(subs[1].id)).state is TaskState.CANCELLED
    with pytest.raises(LeaseLost):
        await store.finish(lease, Succeeded())
    [stats] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert stats.in_flight == 0


async def test_group_report(store: Store) -> None:
    await store.submit(
        [
            task("img", kind="image", group="ep1", cost=1.0),
            task("tts", kind="speech", group="ep1", cost=120.0),
            task("bad", kind="image", group="ep1", max_attempts=1),
            task("later", kind="image", group="ep1"),
            task("other", kind="image", group="ep2"),
        ]
    )
    leases = {lease.task.ref: lease for lease in await claim(store, 3)}
    await store.finish(leases["img"], Succeeded(cost=2.0))
    await store.finish(leases["tts"], Succeeded())
    await store.finish(leases["bad"], Dead(boom(ErrorClass.FATAL)))
    report = await store.group_report("ep1")
    assert report.total == 4 and report.succeeded == 2 and report.done == 3
    assert report.percent == 50.0  # the dead task reached an outcome but is not complete
    assert (report.dead, report.cancelled) == (1, 0)
    assert report.by_state[TaskState.READY] == 1
    assert report.cost == {"image": 2.0, "speech": 120.0}
    [failure] = report.failures
    assert failure.ref == "bad" and failure.code == "boom" and failure.attempts == 1
    assert await store.groups() == ["ep1", "ep2"]
    counts = await store.counts()
    assert counts[TaskState.SUCCEEDED] == 2 and counts[TaskState.READY] == 2


async def test_a_groups_cost_adds_up_what_every_worker_spent(store: Store) -> None:
    await store.submit([task(f"s{n}", kind="speech", group="ep1", cost=1.5) for n in range(4)])
    first = await store.claim("w1", 2, lease_for=30.0)
    second = await store.claim("w2", 2, lease_for=30.0)
    await store.finish_many([(lease, Succeeded()) for lease in first.leases])
    await store.finish_many([(lease, Succeeded(cost=2.0)) for lease in second.leases])
    report = await store.group_report("ep1")
    assert report.cost == {"speech": 7.0}  # 1.5 twice by w1, 2.0 twice by w2


async def test_claim_only_the_kinds_asked_for(store: Store) -> None:
    await store.submit([task("a", kind="image"), task("b", kind="speech")])
    result = await store.claim("w1", 5, lease_for=LEASE, kinds=["speech"])
    assert refs(list(result.leases)) == ["b"]


# -- long queues, restarts and edges


async def test_a_long_queue_dispatches_in_order_across_batches(store: Store) -> None:
    await store.submit([task(f"a{i}", flow="a") for i in range(300)])
    await store.submit([task(f"b{i}", flow="b") for i in range(300)])
    # Equal tags across the two flows: ties go to the older task, batch after batch.
    assert refs(await claim(store, 1000)) == [f"{flow}{i}" for i in range(300) for flow in "ab"]


async def test_a_refusing_gate_skips_a_long_run_of_its_tasks(store: Store) -> None:
    await store.submit([task(f"v{i}", gates=("provider:video",)) for i in range(600)])
    await store.submit([task(f"i{i}", gates=("provider:image",), tier=Tier.LOW) for i in range(5)])
    assert refs(await claim(store)) == ["v0", "v1", "i0", "i1", "i2"]
    stats = {s.name: s for s in await store.gate_statistics()}
    # A refusal is counted once per claim: the rest of that gate's tasks are skipped unasked.
    assert stats["provider:video"].blocked_by_concurrency == 1
    assert stats["provider:image"].blocked_by_concurrency == 1


async def test_a_claim_goes_on_after_the_tasks_it_took_not_past_its_batch(store: Store) -> None:
    # A claim for 5 reads 13 first (two video tasks fit); a later batch reads further but
    # takes only what the claim still needs, here session:x's first 11 (one fits): the next
    # batch must start after those, or the images between them and its end would be passed.
    await store.submit([task(f"v{i}", gates=("provider:video",)) for i in range(13)])
    await store.submit([task(f"s{i}", gates=("session:x",)) for i in range(15)])
    await store.submit([task(f"i{i}", gates=("provider:image",)) for i in range(60)])
    assert refs(await claim(store, 5)) == ["v0", "v1", "s0", "i0", "i1"]


async def test_tickets_and_gate_state_outlive_a_restart(
    store: Store, reopen: Callable[[], Store]
) -> None:
    await store.submit([task(f"v{i}", gates=("provider:video",)) for i in range(3)])
    [first, _] = await claim(store)
    await store.close()
    restarted = reopen()
    await restarted.open(Settings(gates=GATES, aging_step=AGING_STEP))
    try:
        assert await claim(restarted) == []
        await restarted.finish(first, Succeeded())
        assert refs(await claim(restarted)) == ["v2"]
        [video] = [s for s in await restarted.gate_statistics() if s.name == "provider:video"]
        assert (video.in_flight, video.granted, video.peak_in_flight) == (2, 3, 2)
    finally:
        await restarted.close()


async def test_fair_tags_outlive_a_restart(store: Store, reopen: Callable[[], Store]) -> None:
    await store.submit([task(f"a{i}", flow="a") for i in range(4)])
    assert refs(await claim(store, 2)) == ["a0", "a1"]
    await store.close()
    restarted = reopen()
    await restarted.open(Settings(gates=GATES, aging_step=AGING_STEP))
    try:
        await restarted.submit([task(f"b{i}", flow="b") for i in range(2)])
        assert refs(await claim(restarted)) == ["b0", "a2", "b1", "a3"]
    finally:
        await restarted.close()


async def test_cancelling_a_waiting_task_returns_its_ticket(
    store: Store, clock: ManualClock
) -> None:
    [sub] = await store.submit([task("clip", gates=("provider:video",))])
    [lease] = await claim(store)
    await store.finish(lease, AwaitRemote("job-1", poll_every=5.0))
    assert await store.cancel(sub.id)
    record = await store.get(sub.id)
    assert record.state is TaskState.CANCELLED and record.error_code == "cancelled"
    [attempt] = await store.attempts(sub.id)
    assert attempt.outcome is AttemptOutcome.CANCELLED and attempt.ended_at == clock.now()
    [video] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert video.in_flight == 0
    clock.advance(5.0)
    assert (await store.claim_polls("w1", 5, lease_for=5.0)).leases == ()


async def test_a_refused_outcome_changes_nothing(store: Store, clock: ManualClock) -> None:
    [sub] = await store.submit([task("clip", gates=("provider:video",))])
    [lease] = await claim(store)
    with pytest.raises(ConfigError, match="PollAgain"):
        await store.finish(lease, PollAgain(1.0))
    with pytest.raises(UnknownGate):
        await store.finish(lease, Retry(boom(), delay=1.0, penalize=("provider:nope",)))
    assert (await store.get(sub.id)).state is TaskState.RUNNING
    await store.finish(lease, AwaitRemote("job-1", poll_every=1.0))
    clock.advance(1.0)
    [poll] = (await store.claim_polls("w1", 5, lease_for=5.0)).leases
    with pytest.raises(ConfigError, match="AwaitRemote"):
        await store.finish(poll, AwaitRemote("job-2", poll_every=1.0))
    [renewed] = await store.renew([poll], lease_for=5.0)
    assert renewed is not None and renewed.task.remote_id == "job-1"
    await store.finish(renewed, Succeeded())
    assert (await store.get(sub.id)).state is TaskState.SUCCEEDED


async def test_a_dependency_that_already_succeeded_is_met(store: Store) -> None:
    [first] = await store.submit([task("a")])
    [lease] = await claim(store)
    await store.finish(lease, Succeeded())
    [later] = await store.submit([task("b", after=(first.id, first.id))])
    assert (await store.get(later.id)).state is TaskState.READY


async def test_listing_filters_and_limits(store: Store) -> None:
    await store.submit(
        [
            task("a", kind="image", group="ep1", key="k-a"),
            task("b", kind="speech", group="ep1"),
            task("c", kind="image", group="ep2"),
        ]
    )
    await claim(store, 1)
    assert refs_of(await store.tasks(group="ep1")) == ["a", "b"]
    assert refs_of(await store.tasks(kind="image")) == ["a", "c"]
    assert refs_of(await store.tasks(state=TaskState.READY)) == ["b", "c"]
    assert refs_of(await store.tasks(group="ep1", state=TaskState.RUNNING)) == ["a"]
    assert refs_of(await store.tasks(limit=2)) == ["a", "b"]
    assert await store.find("k-missing") is None
    with pytest.raises(UnknownTask):
        await store.attempts(999)
    with pytest.raises(UnknownTask):
        await store.cancel(999)


def refs_of(records: list[TaskRecord]) -> list[str]:
    return [record.ref for record in records]


async def test_a_flow_joining_mid_round_takes_turns(store: Store) -> None:
    await store.submit([task("a0", flow="a")])
    assert refs(await claim(store, 1)) == ["a0"]
    await store.submit([task("b0", flow="b"), task("b1", flow="b"), task("a1", flow="a")])
    # b0 shares a0's round; in the next round a, served longer ago, goes before b.
    assert refs(await claim(store)) == ["b0", "a1", "b1"]


async def test_bad_successors_refuse_the_outcome_and_change_nothing(store: Store) -> None:
    [sub] = await store.submit([task("script")])
    [lease] = await claim(store)
    with pytest.raises(UnknownGate):
        await store.finish(lease, Succeeded(successors=(task("s", gates=("nope",)),)))
    with pytest.raises(UnknownTask):
        await store.finish(lease, Succeeded(successors=(task("s", after=(999,)),)))
    assert (await store.get(sub.id)).state is TaskState.RUNNING
    assert len(await store.tasks()) == 1
    await store.finish(lease, Succeeded(successors=(task("s"),)))
    assert len(await store.tasks()) == 2


def test_an_empty_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"task\.key"):
        task("a", key="")


@pytest.mark.parametrize(
    ("field", "value"), [("cost", -1.0), ("cost", math.inf), ("delay", math.nan), ("delay", "1s")]
)
def test_a_cost_or_delay_that_is_not_a_finite_number_is_refused(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=rf"task\.{field}: expected a"):
        task("a", **{field: value})


async def test_the_longest_delay_is_kept_exactly(store: Store, clock: ManualClock) -> None:
    [sub] = await store.submit([task("later", delay=MAX_DELAY)])
    record = await store.get(sub.id)
    assert record.run_at == clock.now() + MAX_DELAY
    assert await claim(store) == []
    clock.advance(MAX_DELAY)
    assert refs(await claim(store)) == ["later"]


@pytest.mark.parametrize(
    ("field", "value"), [("delay", 1e300), ("delay", MAX_DELAY + 1), ("group", ""), ("group", 6)]
)
def test_a_delay_past_the_bound_or_a_bad_group_is_refused(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=rf"task\.{field}: "):
        task("a", **{field: value})


# -- dead letters


async def test_a_redrive_gives_a_dead_task_a_fresh_budget_once(
    store: Store, clock: ManualClock
) -> None:
    [sub] = await store.submit([task("a", max_attempts=2, group="ep1")])
    for _ in range(2):
        [lease] = await claim(store)
        await store.finish(lease, Retry(boom(), delay=0.0))
    assert (await store.get(sub.id)).state is TaskState.READY
    [lease] = await claim(store)
    await store.finish(lease, Dead(boom()))
    redrives = await asyncio.gather(store.redrive(), store.redrive(group="ep1"))
    assert sorted(redrives, key=len) == [[], [sub.id]]
    record = await store.get(sub.id)
    assert record.state is TaskState.READY
    assert record.attempts_used == 0
    assert record.error_code is None
    [lease] = await claim(store)
    assert lease.task.attempt == 4
    await store.finish(lease, Succeeded())
    numbers = [a.number for a in await store.attempts(sub.id)]
    assert numbers == [1, 2, 3, 4]


async def test_a_redrive_restores_the_tasks_that_waited_on_it(store: Store) -> None:
    subs = await store.submit(
        [
            task("shot", group="ep1"),
            task("other", group="ep1"),
            task("assembly", group="ep1", after=(Sibling(0), Sibling(1))),
            task("publish", group="ep1", after=(Sibling(2),)),
        ]
    )
    leases = {lease.task.ref: lease for lease in await claim(store)}
    await store.finish(leases["shot"], Dead(boom(ErrorClass.FATAL)))
    await store.finish(leases["other"], Succeeded())
    assert (await store.get(subs[3].id)).state is TaskState.CANCELLED
    assert await store.redrive(task_ids=[subs[0].id]) == [subs[0].id]
    assert (await store.get(subs[2].id)).state is TaskState.PENDING
    assert (await store.get(subs[3].id)).state is TaskState.PENDING
    for lease in await claim(store):
        await store.finish(lease, Succeeded())
    assert (await store.get(subs[2].id)).state is TaskState.READY


async def test_redrive_filters_by_group_kind_and_id(store: Store) -> None:
    subs = await store.submit(
        [
            task("a", kind="image", group="ep1", max_attempts=1),
            task("b", kind="video", group="ep1", max_attempts=1),
            task("c", kind="image", group="ep2", max_attempts=1),
        ]
    )
    for lease in await claim(store):
        await store.finish(lease, Dead(boom(ErrorClass.FATAL)))
    assert await store.redrive(kind="image", group="ep2") == [subs[2].id]
    assert await store.redrive(task_ids=[subs[0].id, subs[2].id]) == [subs[0].id]
    assert await store.redrive(group="ep1") == [subs[1].id]
    assert await store.redrive() == []


async def test_finish_many_records_each_outcome_alone(store: Store, clock: ManualClock) -> None:
    subs = await store.submit([task(f"t{i}", gates=("free",)) for i in range(4)])
    # one worker each: each dies alone, so none has to run alone after
    leases = [(await store.claim(f"w{i}", 1, lease_for=10.0)).leases[0] for i in range(4)]
    stale = leases[1]
    clock.advance(11.0)  # every lease expired...
    await store.reap()
    fresh = {lease.task.ref: lease for lease in await claim(store, 4, lease_for=10.0)}
    results = await store.finish_many(
        [
            (fresh["t0"], Succeeded(successors=(task("next"),))),
            (stale, Succeeded()),
            (fresh["t2"], Succeeded(successors=(task("bad", gates=("nope",)),))),
            (fresh["t3"], Retry(boom(), delay=1.0)),
        ]
    )
    assert [type(r).__name__ if r else None for r in results] == [
        None,
        "LeaseLost",
        "UnknownGate",
        None,
    ]
    states = [(await store.get(s.id)).state for s in subs]
    assert states == [TaskState.SUCCEEDED, TaskState.RUNNING, TaskState.RUNNING, TaskState.READY]
    assert sorted(r.ref for r in await store.tasks()) == ["next", "t0", "t1", "t2", "t3"]
    [free] = [s for s in await store.gate_statistics() if s.name == "free"]
    assert free.in_flight == 2


async def test_a_claim_records_the_outcomes_it_carries_first(
    store: Store, clock: ManualClock
) -> None:
    # session:* gates admit one at a time: "b" waits for the ticket "a" holds.
    await store.submit([task("a", gates=("session:x",)), task("b", gates=("session:x",))])
    await store.submit([task("c"), task("d")])
    [a, c] = await claim(store, 2)
    assert refs([a, c]) == ["a", "c"]
    [stale] = (await store.claim("w2", 1, lease_for=5.0)).leases  # "d", then lost
    clock.advance(6.0)
    claimed = await store.claim(
        "w1",
        2,
        lease_for=LEASE,
        finished=[
            (a, Succeeded(cost=2.0)),
            (stale, Succeeded()),
            (c, Retry(boom(), delay=100.0)),
        ],
    )
    assert [type(r).__name__ if r else None for r in claimed.finished] == [
        None,
        "LeaseLost",
        None,
    ]
    # The ticket "a" returned is "b"'s in the same claim; "d" (its lease expired) is reaped.
    assert sorted(refs(list(claimed.leases))) == ["b", "d"]
    states = {r.ref: r.state for r in await store.tasks()}
    assert states == {
        "a": TaskState.SUCCEEDED,
        "b": TaskState.RUNNING,
        "c": TaskState.READY,
        "d": TaskState.RUNNING,
    }
    [attempt] = await store.attempts(a.task_id)
    assert attempt.outcome is AttemptOutcome.SUCCEEDED


async def test_a_claim_records_outcomes_with_successors_in_their_order(store: Store) -> None:
    await store.submit([task("a"), task("b"), task("c")])
    [a, b, c] = await claim(store, 3)
    claimed = await store.claim(
        "w1",
        5,
        lease_for=LEASE,
        finished=[
            (a, Succeeded()),
            (b, Succeeded(successors=(task("next"),))),
            (b, Succeeded()),  # b again: already recorded
            (c, Retry(boom(), delay=100.0)),
        ],
    )
    assert [type(r).__name__ if r else None for r in claimed.finished] == [
        None,
        None,
        "LeaseLost",
        None,
    ]
    assert refs(list(claimed.leases)) == ["next"]  # made by an outcome before the claim


async def test_a_claim_takes_no_more_of_a_group_of_kinds_than_its_limit(store: Store) -> None:
    await store.submit([task(f"v{i}", kind="video") for i in range(4)])
    await store.submit([task(f"a{i}", kind="audio") for i in range(2)])
    await store.submit([task(f"i{i}", kind="image") for i in range(4)])
    heavy = KindLimit(frozenset({"video", "audio"}), 2)
    first = await store.claim("w1", 10, lease_for=LEASE, within=[heavy])
    # The two oldest heavy tasks, then the images behind the rest: none waits on a full group.
    assert refs(list(first.leases)) == ["v0", "v1", "i0", "i1", "i2", "i3"]
    # What was passed over stays ready, in its place.
    second = await store.claim("w1", 10, lease_for=LEASE, kinds=["video", "audio"], within=[heavy])
    assert refs(list(second.leases)) == ["v2", "v3"]
    none = await store.claim("w1", 10, lease_for=LEASE, within=[KindLimit(frozenset({"audio"}), 0)])
    assert refs(list(none.leases)) == []
    assert refs(await claim(store)) == ["a0", "a1"]


async def test_a_retry_that_ages_while_it_waits_is_claimed_once(
    store: Store, clock: ManualClock
) -> None:
    await store.submit([task("low", tier=Tier.LOW)])
    [lease] = await claim(store)
    await store.finish(lease, Retry(boom(), delay=AGING_STEP + 1))
    clock.advance(AGING_STEP + 1)
    assert refs(await claim(store, 5)) == ["low"]


def test_a_gate_named_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="session:a named more than once"):
        task("a", gates=("session:a", "provider:video", "session:a"))


async def test_counts_by_kind(store: Store) -> None:
    await store.submit([task("a", kind="image"), task("b", kind="image"), task("c", kind="scan")])
    assert (await store.counts(kinds=["image"]))[TaskState.READY] == 2
    assert (await store.counts(kinds=["scan", "none"]))[TaskState.READY] == 1
    assert (await store.counts())[TaskState.READY] == 3


async def test_ready_ages_sample_both_ends_of_a_stages_queue(
    store: Store, clock: ManualClock
) -> None:
    """The ages of a stage's oldest and newest ready tasks, `sample` of each, no task twice;
    the count is every ready task's."""
    for n in range(7):  # ready for 6, 5, ..., 0 seconds; two more at once at the end
        await store.submit([task(f"s{n}", kind="scan")])
        clock.advance(1.0)
    await store.submit([task("t1", kind="scan"), task("t2", kind="scan")])
    [lease] = await claim(store, 1)  # the oldest leaves the queue
    assert lease.task.ref == "s0"
    ages = [6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0, 0.0]
    found = (await store.ready_ages(sample=2))["scan"]
    assert found == ReadyAges(8, tuple(ages[:2]), tuple(ages[-2:]))
    assert found.unsampled == 4 and found.longest == 6.0
    assert (await store.ready_ages(sample=5))["scan"] == ReadyAges(
        8, tuple(ages[:5]), (1.0, 0.0, 0.0)
    )
    assert (await store.ready_ages(sample=8))["scan"] == ReadyAges(8, tuple(ages))
    assert await store.ready_ages(kinds=["none"]) == {}


async def test_stages_count_unfinished_work_per_kind(store: Store, clock: ManualClock) -> None:
    subs = await store.submit(
        [
            task("a", kind="image"),
            task("b", kind="image"),
            task("c", kind="video", after=(Sibling(0),)),
            task("d", kind="speech"),
        ]
    )
    clock.advance(5.0)
    [lease] = (await store.claim("w1", 1, lease_for=LEASE, kinds=["image"])).leases
    await store.finish(lease, AwaitRemote("job-a", poll_every=10.0))
    clock.advance(3.0)
    [late] = await store.submit([task("e", kind="speech")])
    [running] = (await store.claim("w1", 1, lease_for=LEASE, kinds=["speech"])).leases
    assert running.task.ref == "d"
    stages = {s.kind: s for s in await store.stages()}
    assert list(stages) == ["image", "speech", "video"]
    image, speech, video = stages["image"], stages["speech"], stages["video"]
    assert (image.pending, image.ready, image.running, image.waiting) == (0, 1, 0, 1)
    assert image.oldest_ready_age == pytest.approx(8.0)
    assert (speech.ready, speech.running) == (1, 1)
    assert speech.oldest_ready_age == pytest.approx(0.0)
    assert (video.pending, video.ready, video.oldest_ready_age) == (1, 0, None)
    assert [s.kind for s in await store.stages(kinds=["video", "none"])] == ["video"]
    ages = {kind: (a.count, a.oldest, a.newest) for kind, a in (await store.ready_ages()).items()}
    assert ages == {"image": (1, (pytest.approx(8.0),), ()), "speech": (1, (0.0,), ())}
    assert await store.ready_ages(kinds=["speech"]) == {"speech": ReadyAges(1, (0.0,))}
    await store.finish(running, Succeeded())
    await store.cancel(late.id)
    assert [s.kind for s in await store.stages()] == ["image", "video"]  # speech has finished
    await store.cancel(subs[0].id)  # cancels c too
    await store.cancel(subs[1].id)
    assert await store.stages() == []


async def test_a_continuation_goes_before_its_flows_backlog_and_after_a_newcomer(
    store: Store,
) -> None:
    await store.submit([task(f"a{i}", flow="a") for i in range(4)])
    [first] = await claim(store, 1)
    assert first.task.ref == "a0"
    # a0's item goes on to its next stage; b joins now.
    next_stage = task("a0-next", flow="a", continues=first.task.tag)
    await store.finish(first, Succeeded(successors=(next_stage,)))
    await store.submit([task("b0", flow="b")])
    assert refs(await claim(store, 3)) == ["b0", "a0-next", "a1"]


async def test_each_stage_takes_one_item_of_a_flow_per_round_a_newcomers_first(
    store: Store,
) -> None:
    await store.submit([task(f"a{i}", flow="a") for i in range(4)])
    a0, a1 = await claim(store, 2)
    for lease in (a0, a1):  # a's first two items go on to their scan
        scan = task(f"{lease.task.ref}-scan", kind="scan", flow="a", continues=lease.task.tag)
        await store.finish(lease, Succeeded(successors=(scan,)))
    await store.submit([task("b0", flow="b")])
    [b0] = await claim(store, 1)
    scan = task("b0-scan", kind="scan", flow="b", continues=b0.task.tag)
    await store.finish(b0, Succeeded(successors=(scan,)))
    # a's scans take one turn per round in a's scan lane: a1's waits a round, and b's item,
    # new to that stage, is in the first. a2 is a's next turn at validation, in a lane (a
    # itself) served longer ago than a's scan lane.
    assert refs(await claim(store)) == ["a0-scan", "b0-scan", "a2", "a1-scan", "a3"]


async def test_a_delivered_remote_outcome_makes_its_waiting_task_due_now(store: Store) -> None:
    await store.submit([task("a"), task("b")])
    leases = await claim(store, 2)
    for lease in leases:
        await store.finish(lease, AwaitRemote(f"job-{lease.task.ref}", poll_every=60.0))
    assert (await store.claim_polls("w1", 10, lease_for=LEASE)).leases == ()
    assert await store.wake_remote("job-a") == 1
    assert await store.wake_remote("job-unknown") == 0
    [polled] = (await store.claim_polls("w1", 10, lease_for=LEASE)).leases
    assert polled.task.ref == "a"
    assert await store.wake_remote("job-a") == 0  # its check is running: left to it


async def test_attempts_are_counted_by_outcome(store: Store) -> None:
    await store.submit([task("a"), task("b"), task("c")])
    a, b, c = await claim(store, 3)
    await store.finish(a, Succeeded())
    await store.finish(b, Retry(AttemptError.of(ErrorClass.TRANSIENT, "http_503", "busy"), 1.0))
    counts = await store.attempt_counts()
    assert counts == {
        AttemptOutcome.SUCCEEDED: 1,
        AttemptOutcome.RETRY: 1,
        AttemptOutcome.RUNNING: 1,
    }
    await store.finish(c, Dead(AttemptError.of(ErrorClass.FATAL, "bad", "no")))
    assert (await store.attempt_counts())[AttemptOutcome.DEAD] == 1


async def test_a_fence_refuses_a_lost_lease_and_changes_nothing(
    store: Store, clock: ManualClock
) -> None:
    """A call about to leave is checked (`fence`) and stamped only once it has left: until
    then its start stays reserved, counting in every window."""
    await store.submit([task(f"v{i}", gates=("provider:video",)) for i in range(5)])
    granted = await claim(store, lease_for=5.0)  # two, the cap
    for lease in granted:
        await store.fence(lease)  # held: no error, nothing stamped
    [stats] = [s for s in await store.gate_statistics() if s.name == "provider:video"]
    assert stats.in_flight == 2
    clock.advance(4.0)
    await store.start(granted[0])  # left: counts from 4 s
    await store.finish(granted[0], Succeeded())
    clock.advance(1.0)
    with pytest.raises(LeaseLost):
        await store.fence(granted[1])  # its lease ran out: the call must not go


# -- named leases


async def test_a_named_lease_has_one_holder_until_it_runs_out(
    store: Store, clock: ManualClock
) -> None:
    assert await store.take_lease("metrics", "a", lease_for=30.0)
    assert not await store.take_lease("metrics", "b", lease_for=30.0)
    assert await store.take_lease("other", "b", lease_for=30.0)  # each name its own
    clock.advance(20.0)
    assert await store.take_lease("metrics", "a", lease_for=30.0)  # renewed: until 50 s on
    clock.advance(29.0)
    assert not await store.take_lease("metrics", "b", lease_for=30.0)
    clock.advance(1.0)  # a was not heard from: its lease ran out
    assert await store.take_lease("metrics", "b", lease_for=30.0)
    assert not await store.take_lease("metrics", "a", lease_for=30.0)


async def test_two_store_instances_share_a_named_lease(
    store: Store, reopen: Callable[[], Store], clock: ManualClock
) -> None:
    other = reopen()
    await other.open(Settings(gates=GATES))
    try:
        assert await store.take_lease("metrics", "process-1", lease_for=30.0)
        assert not await other.take_lease("metrics", "process-2", lease_for=30.0)
        clock.advance(30.0)
        assert await other.take_lease("metrics", "process-2", lease_for=30.0)
        assert not await store.take_lease("metrics", "process-1", lease_for=30.0)
    finally:
        await other.close()


async def test_a_store_that_does_not_declare_a_gate_reports_it_under_its_declaration(
    store: Store, reopen: Callable[[], Store]
) -> None:
    """`headrace serve` beside workers of another app: their gates are in its statistics, a
    template's gates under the template's name, with no cap or rate it could not know."""
    await store.submit([task("a", gates=("session:s1",)), task("b", gates=("session:s1",))])
    assert refs(await claim(store, 2)) == ["a"]  # session:* holds one at a time
    [own] = await store.gate_statistics()
    other = reopen()
    await other.open(Settings())  # declares no gate
    try:
        [found] = await other.gate_statistics()
    finally:
        await other.close()
    assert (own.declared, own.concurrency) == ("session:*", 1)
    assert (found.name, found.declared, found.concurrency, found.rate) == (
        "session:s1",
        "session:*",
        None,
        None,
    )
    assert (found.granted, found.in_flight, found.blocked_by_concurrency) == (1, 1, 1)
