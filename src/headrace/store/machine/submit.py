"""Submission: a batch checked, its keys and dependencies resolved, its tasks tagged and created."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from headrace.policy import fairness
from headrace.policy import gate as gating
from headrace.policy.errors import (
    ConfigError,
    StoreError,
    UnknownTask,
)
from headrace.policy.gate import GateConfig
from headrace.store.machine import bounds as stage_bounds
from headrace.store.machine import idempotency, tickets
from headrace.store.machine.core import Json, Transaction
from headrace.store.machine.dispatch import gate_key
from headrace.store.machine.rows import (
    Row,
)
from headrace.store.protocol.ages import ready_since
from headrace.store.protocol.types import (
    UPSTREAM_FAILED,
    NewTask,
    Sibling,
    StageLimits,
    Submitted,
    TaskState,
)


@dataclass
class Planned:
    """A task of a submitted batch that will be created."""

    id: int
    task: NewTask
    unmet: list[int]
    failed: bool  # a dependency is already dead or cancelled
    payload_digest: str | None  # kept with a keyed task (store/machine/idempotency.py)
    tag: float = 0.0


async def submit(
    tx: Transaction, tasks: Sequence[NewTask], bounds: Mapping[str, int]
) -> list[Submitted]:
    """`bounds`: whole-stage bounds of this submit's own, over the stages' limits."""
    limits = stage_bounds.by_kind(tx.settings.stages, bounds) if bounds else tx.limits
    if not tasks or any(task.kind in limits for task in tasks):
        await tx.read_clock()
        states = await check_batch(tx, tasks)
        planned = idempotency.plan(tasks, await known_keys(tx, tasks))
        await check_bounds(tx, tasks, planned, limits)
        return await create(tx, tasks, states, planned)
    return await submit_unbounded(tx, tasks)


async def submit_unbounded(tx: Transaction, tasks: Sequence[NewTask]) -> list[Submitted]:
    """A batch no bound counts, in one round trip before the insert: the tasks it depends on
    held (FOR SHARE), its keys locked and looked up (as `known_keys`), then its flows made
    and locked, ids drawn (one per task, a few maybe unused), the virtual time read and the
    clock (once the flows are locked), in one statement.
    """
    named = named_dependencies(tx, tasks)
    shared = await tx.send("share_tasks", ids=sorted(set(named))) if named else None
    keys = sorted({task.key for task in tasks if task.key is not None})
    if keys:
        await tx.run("lock_keys", keys=keys)
    keyed = await tx.send("task_ids_by_keys", keys=keys) if keys else None
    clock = None if tx.clock is None else tx.clock.now()
    flows = sorted({task.lane for task in tasks})
    start = await tx.send("submit_start", flows=flows, n=len(tasks), clock=clock)
    rows = await shared.fetchall() if shared is not None else []
    states = {int(row["id"]): TaskState(row["state"]) for row in rows}
    for dep in named:
        if dep not in states:
            raise UnknownTask(dep)
    planned = idempotency.plan(tasks, _known(await keyed.fetchall() if keyed is not None else []))
    found = await start.fetchone()
    if found is None:
        raise StoreError(f"{tx.driver.name} store: submit_start returned no row")
    tx.now = max(tx.now, float(found["now"]))
    tx.virtual_time = float(found["virtual_time"])
    finish = dict(zip(found["flows"], map(float, found["finish_tags"]), strict=True))
    ids = [int(drawn) for drawn in found["ids"]]
    return await create(tx, tasks, states, planned, ids=ids, finish=finish)


async def check_batch(tx: Transaction, tasks: Sequence[NewTask]) -> dict[int, TaskState]:
    """Refuse a batch naming an unknown gate or task; hold the tasks it depends on still
    (FOR SHARE) and return their states."""
    named = named_dependencies(tx, tasks)
    states = await dependency_states(tx, named)
    for dep in named:
        if dep not in states:
            raise UnknownTask(dep)
    return states


def named_dependencies(tx: Transaction, tasks: Sequence[NewTask]) -> list[int]:
    """The task ids a batch depends on; an unknown gate or a later sibling is refused."""
    check_gates(tasks, tx.configs)
    named: list[int] = []
    for index, task in enumerate(tasks):
        for dep in task.after:
            if not isinstance(dep, Sibling):
                named.append(dep)
            elif not 0 <= dep.index < index:
                raise ConfigError(f"task.after: sibling {dep.index} is not earlier")
    return named


async def dependency_states(tx: Transaction, ids: Iterable[int]) -> dict[int, TaskState]:
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    found = await tx.rows("share_tasks", ids=wanted)
    return {int(row["id"]): TaskState(row["state"]) for row in found}


async def known_keys(tx: Transaction, tasks: Sequence[NewTask]) -> dict[str, idempotency.KnownKey]:
    """The tasks the batch's keys name already, with their payload digests. The keys are
    locked first (`lock_keys`, in sorted order), so what is read stands until the commit:
    a writer with one of them waits, then finds this batch's task instead of racing it."""
    keys = sorted({task.key for task in tasks if task.key is not None})
    if not keys:
        return {}
    await tx.run("lock_keys", keys=keys)
    return _known(await tx.rows("task_ids_by_keys", keys=keys))


async def check_bounds(
    tx: Transaction,
    tasks: Sequence[NewTask],
    planned: Sequence[idempotency.Planned],
    limits: Mapping[str, StageLimits],
) -> None:
    """Raise QueueFull when the tasks the batch creates do not fit a limit of their stage."""
    locked: set[str] = set()
    for need in stage_bounds.needs(tasks, planned, limits):
        if need.kind not in locked:  # kinds in name order, as every writer takes them
            # One writer at a time counts a bounded kind, so two cannot both squeeze in.
            await tx.run("advisory_lock", lock=f"headrace.bound:{need.kind}")
            locked.add(need.kind)
        if need.scope == "flow":
            found = await tx.one("count_queued_of_flow", kind=need.kind, flow=need.label)
        elif need.scope == "group":
            found = await tx.one("count_queued_of_group", kind=need.kind, grp=need.label)
        else:
            found = await tx.one("count_queued", kind=need.kind)
        need.check(int(found["n"]))


async def create(
    tx: Transaction,
    tasks: Sequence[NewTask],
    states: dict[int, TaskState],
    planned: Sequence[idempotency.Planned],
    *,
    ids: Sequence[int] | None = None,
    finish: dict[str, float] | None = None,
) -> list[Submitted]:
    """Create the batch's new tasks (`planned` None; the others name a task already) in one
    statement. `ids` drawn already (at least one per new task); `finish`: the flows locked
    already."""
    if not tasks:
        return []
    fresh = {index for index, step in enumerate(planned) if step is None}
    if ids is None:
        ids = [int(row["id"]) for row in await tx.rows("next_task_ids", n=len(fresh))]
    fresh_ids = iter(ids)
    results: list[Submitted] = []
    for step in planned:
        if step is None:
            results.append(Submitted(next(fresh_ids), created=True))
        else:
            results.append(idempotency.reused(step, results))
    if fresh:
        await insert(tx, tasks, results, states, fresh, finish)
    return results


async def insert(
    tx: Transaction,
    tasks: Sequence[NewTask],
    results: Sequence[Submitted],
    states: dict[int, TaskState],
    fresh: Collection[int],
    finish: dict[str, float] | None = None,
) -> None:
    created = {results[index].id for index in fresh}
    afters = [_resolved(task, results) for task in tasks]
    others = {dep for after in afters for dep in after} - created - states.keys()
    states.update(await dependency_states(tx, others))
    planned = [_plan(results[i].id, tasks[i], afters[i], states) for i in sorted(fresh)]
    await tag(tx, planned, finish)
    # Keys are locked from `known_keys` to the commit, so none is taken meanwhile; a keyed
    # insert that skipped the lock would fail the transaction, and the next try finds it.
    await tx.run(
        "insert_tasks",
        tasks=_insert_params(planned, tx.now),
        flow_names=list(tx.finishes),
        flow_finishes=list(tx.finishes.values()),
    )
    deps = [(dep, p.id) for p in planned for dep in p.unmet]
    if deps:
        dep_ids, task_ids = zip(*deps, strict=True)
        await tx.run("insert_dependencies", dep_ids=list(dep_ids), task_ids=list(task_ids))
    for failed in (p for p in planned if p.failed):
        await tickets.cancel_tree(tx, failed.id, UPSTREAM_FAILED)
    tx.wake = tx.wake or any(not p.unmet for p in planned)


async def tag(tx: Transaction, planned: Sequence[Planned], locked: dict[str, float] | None) -> None:
    """Start tags for new tasks, in batch order; their flows' rows are locked in name order
    (`locked`: already, with their finish tags)."""
    flows = sorted({p.task.lane for p in planned})
    if locked is None:
        await tx.run("add_flows", flows=flows)
        found = await tx.send("lock_flows", flows=flows)  # held already after `prepare`
        if tx.virtual_time is None:
            tx.counters = await tx.send("meta_values")
        locked = {row["flow"]: float(row["finish_tag"]) for row in await found.fetchall()}
    finish = {flow: locked[flow] for flow in flows}
    now_virtual = await virtual_time(tx)
    for p in planned:
        tagged = fairness.tag(now_virtual, finish[p.task.lane], p.task.weight, p.task.continues)
        finish[p.task.lane] = tagged.flow_finish
        p.tag = tagged.start
    tx.finishes = {flow: finish[flow] for flow in flows}  # written with the insert


async def virtual_time(tx: Transaction) -> float:
    if tx.virtual_time is None:
        await tx.load_counters()
    return tx.virtual_time or 0.0


def _resolved(task: NewTask, results: Sequence[Submitted]) -> list[int]:
    return [results[d.index].id if isinstance(d, Sibling) else d for d in task.after]


def _plan(
    task_id: int, task: NewTask, after: Sequence[int], states: Mapping[int, TaskState]
) -> Planned:
    unmet = sorted({dep for dep in after if states.get(dep) is not TaskState.SUCCEEDED})
    failed = any(states.get(dep) in (TaskState.DEAD, TaskState.CANCELLED) for dep in unmet)
    return Planned(task_id, task, unmet, failed, idempotency.stored_digest(task, after))


def _known(rows: Iterable[Row]) -> dict[str, idempotency.KnownKey]:
    """`task_ids_by_keys` rows by key."""
    return {row["key"]: idempotency.KnownKey(int(row["id"]), row["payload_digest"]) for row in rows}


def check_gates(tasks: Iterable[NewTask], configs: Mapping[str, GateConfig]) -> None:
    """Refuse a task naming an unknown gate."""
    for task in tasks:
        for name in task.gates:
            gating.resolve(name, configs)


def task_row(task: NewTask) -> dict[str, Any]:
    """A new task's own columns, as `submit_plain` and `insert_tasks` read them."""
    return {
        "kind": task.kind,
        "ref": task.ref,
        "gates": list(task.gates),
        "gate_key": gate_key(task.gates),
        "flow": task.flow,
        "lane": task.lane if task.lane != task.flow else None,
        "grp": task.group,
        "tier": int(task.tier),
        "cost": float(task.cost),
        "max_attempts": task.max_attempts,
        "memory": task.memory,
    }


def _insert_params(planned: Sequence[Planned], now: float) -> Json:
    """The rows `insert_tasks` creates, as one JSON array (one parameter to send, whatever the
    batch's size)."""
    return Json(
        [
            {
                **task_row(p.task),
                "id": p.id,
                "key": p.task.key,
                "payload_digest": p.payload_digest,
                "state": (TaskState.PENDING if p.unmet else TaskState.READY).value,
                "tag": p.tag,
                "run_at": now + p.task.delay,
                "ready_since": None if p.unmet else ready_since(now, now + p.task.delay),
                "unmet": len(p.unmet),
            }
            for p in planned
        ]
    )
