"""Gate tickets and dependency trees, below every verb that returns tickets or ends tasks:
tickets returned and their starts stamped, penalties, attempts closed, a task ended, a tree
of dependents cancelled."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from headrace.policy import gate as gating
from headrace.policy.errors import (
    LeaseLost,
)
from headrace.policy.gate import GateState
from headrace.store.machine.core import Transaction
from headrace.store.machine.rows import (
    Row,
    holds,
    task_of,
)
from headrace.store.protocol.types import (
    UPSTREAM_FAILED,
    AttemptError,
    AttemptOutcome,
    Lease,
    TaskRecord,
    TaskState,
)


async def ticket_counts(tx: Transaction, task_id: int) -> list[Row]:
    if task_id not in tx.tickets:
        tx.tickets[task_id] = await tx.rows("ticket_counts", task_id=task_id)
    return tx.tickets[task_id]


async def release(tx: Transaction, task_id: int, *, delete: bool = True) -> None:
    """Return a task's tickets to their gates (`delete=False`: the caller deletes the rows);
    a start never stamped is stamped now, at the outcome."""
    held = await ticket_counts(tx, task_id)
    tx.tickets[task_id] = []
    if not held:
        return
    await tx.gates.lock(found["gate"] for found in held)
    for found in held:
        name = found["gate"]
        state = stamped(tx, name, int(found["unstarted"]))
        tx.gates.put(name, gating.release(state, int(found["n"])))
    if delete:
        await tx.run("delete_tickets", task_id=task_id)
    tx.wake = True


def rated(tx: Transaction, name: str) -> bool:
    return gating.resolve(name, tx.configs).rate is not None


def stamped(tx: Transaction, name: str, count: int) -> GateState:
    """The state of gate `name` (locked) after `count` of its reserved starts are stamped."""
    state, config = tx.gates.get(name), gating.find(name, tx.configs)
    for _ in range(count):
        state = gating.start(config, state, tx.now)
    return state


async def start(tx: Transaction, lease: Lease, gates: Collection[str] | None) -> None:
    """Stamp the reserved starts of the task `lease` holds (on `gates`, or every one)."""
    found = await tx.row("lock_task", id=lease.task_id)
    task = None if found is None else task_of(found)
    await tx.read_clock()
    if task is None or not holds(task, lease.token, tx.now):
        raise LeaseLost(lease.task_id)
    await stamp_starts(tx, task.id, gates)


async def fence(tx: Transaction, lease: Lease) -> None:
    """Raise LeaseLost unless `lease` still holds its task (a call about to leave)."""
    found = await tx.row("task_by_id", id=lease.task_id)
    await tx.read_clock()
    if found is None or not holds(task_of(found), lease.token, tx.now):
        raise LeaseLost(lease.task_id)


async def stamp_starts(tx: Transaction, task_id: int, gates: Collection[str] | None = None) -> None:
    """Stamp a held task's reserved starts now; its tickets stay held."""
    held = await ticket_counts(tx, task_id)
    chosen = [
        found for found in held if found["unstarted"] and (gates is None or found["gate"] in gates)
    ]
    if not chosen:
        return
    names = [found["gate"] for found in chosen]
    await tx.gates.lock(names, clock=True)
    for found in chosen:
        name = found["gate"]
        before = tx.gates.get(name)
        after = stamped(tx, name, int(found["unstarted"]))
        tx.gates.put(name, after)
        config = gating.find(name, tx.configs)
        tx.wake = tx.wake or gating.opens_sooner(config, before, after, tx.now)
    await tx.run("mark_started", task_id=task_id, gates=names)
    tx.tickets.pop(task_id, None)  # read again if needed: the rows changed


async def penalize(tx: Transaction, names: Sequence[str]) -> None:
    configs = {name: gating.resolve(name, tx.configs) for name in names}
    await tx.gates.lock(names)
    for name, config in configs.items():
        tx.gates.put(name, gating.penalize(config, tx.gates.get(name), tx.now))


async def endattempt_of(
    tx: Transaction, task: TaskRecord, outcome: AttemptOutcome, error: AttemptError | None
) -> None:
    await tx.run(
        "end_attempt",
        task_id=task.id,
        number=task.attempt,
        outcome=outcome.value,
        error_class=error.error_class.value if error else None,
        code=error.code if error else None,
        message=error.message if error else None,
    )


async def end_task(tx: Transaction, task_id: int, state: TaskState, code: str) -> None:
    await release(tx, task_id)
    await tx.run("mark_ended", id=task_id, state=state.value, code=code)


async def dependents(tx: Transaction, task_id: int) -> list[int]:
    return [int(found["task_id"]) for found in await tx.rows("dependents", dep_id=task_id)]


async def lock_tree(tx: Transaction, roots: Sequence[int]) -> list[int]:
    """Lock tasks and everything waiting on them, in id order (before any gate)."""
    found = await tx.rows("lock_for_outcomes", ids=[], dead=list(roots), succeeded=[])
    return [int(row["id"]) for row in found]


async def cancel_tree(tx: Transaction, root: int, code: str) -> None:
    tree = await lock_tree(tx, [root])
    held = await tx.rows("ticket_gates", task_ids=tree)
    await tx.gates.lock(found["gate"] for found in held)
    pending = [(root, code)]
    while pending:
        task_id, reason = pending.pop()
        task = await tx.task(task_id)
        if task.state.terminal:
            continue
        if task.state in (TaskState.RUNNING, TaskState.WAITING):
            await endattempt_of(tx, task, AttemptOutcome.CANCELLED, None)
        await end_task(tx, task_id, TaskState.CANCELLED, reason)
        waiting = reversed(await dependents(tx, task_id))
        pending.extend((dependent, UPSTREAM_FAILED) for dependent in waiting)
