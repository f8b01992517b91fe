"""What lease holders write: renewals and outcomes (successes, retries, deaths, remote waits),
alone or in batches, each batch locking all it touches first; dead letters redriven;
cancellation and reaping."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from headrace.policy import gate as gating
from headrace.policy import ledger, poison
from headrace.policy.errors import (
    ConfigError,
    ErrorClass,
    HeadraceError,
    LeaseLost,
    QueueFull,
    UnknownGate,
)
from headrace.policy.gate import GateConfig
from headrace.policy.poison import Expiry
from headrace.store.machine import bounds as stage_bounds
from headrace.store.machine import idempotency, submit, tickets
from headrace.store.machine.core import Transaction
from headrace.store.machine.rows import (
    holds,
    task_of,
    tasks_of,
)
from headrace.store.protocol.ages import ready_since
from headrace.store.protocol.types import (
    DEFER_DELAY,
    LEASE_EXPIRED,
    POISON,
    STAGE_FULL,
    UPSTREAM_FAILED,
    AttemptError,
    AttemptOutcome,
    AwaitRemote,
    Dead,
    Lease,
    Outcome,
    PollAgain,
    Retry,
    Succeeded,
    TaskRecord,
    TaskState,
)


@dataclass
class Held:
    """What `prepare` locked for a batch of outcomes."""

    tasks: dict[int, TaskRecord]  # the outcomes' tasks, not yet written
    dependents: bool  # it locked tasks waiting on them too


async def renew(tx: Transaction, leases: Sequence[Lease], lease_for: float) -> list[Lease | None]:
    if not leases:
        return []
    until = tx.now + lease_for
    ids = [lease.task_id for lease in leases]
    tokens = [lease.token for lease in leases]
    found = await tx.rows("renew_leases", ids=ids, tokens=tokens, until=until)
    renewed = {record.id: record for record in map(task_of, found)}
    return [
        Lease(renewed[lease.task_id], lease.token, until)
        if lease.task_id in renewed and renewed[lease.task_id].lease_token == lease.token
        else None
        for lease in leases
    ]


async def prepare(tx: Transaction, outcomes: Sequence[tuple[Lease, Outcome]]) -> Held:
    """Lock, before any is written and in the order every writer follows, what the outcomes
    will touch: their tasks and the tasks waiting on those that succeed or die, the tasks
    their successors wait on, the gates, the successors' flows. Then no outcome of a batch
    waits for a lock while holding one a later outcome's order puts first."""
    ids = sorted({lease.task_id for lease, _ in outcomes})
    dead = [lease.task_id for lease, outcome in outcomes if isinstance(outcome, Dead)]
    done = [lease.task_id for lease, outcome in outcomes if isinstance(outcome, Succeeded)]
    sent = await tx.send("lock_for_outcomes", ids=ids, dead=dead, succeeded=done)
    time = await tx.send_clock()  # answered after the row locks: a wait must not stretch
    counts = await tx.send("ticket_counts_many", task_ids=ids)  # a lease
    held = {record.id: record for record in tasks_of(*await sent.table())}
    mine = {task_id: held[task_id] for task_id in ids if task_id in held}
    locked = Held(mine, dependents=len(held) > len(mine))
    await tx.read_clock(time)
    tx.tickets.update({task_id: [] for task_id in ids})
    for found in await counts.fetchall():
        tx.tickets[int(found["task_id"])].append(found)
    successors = [t for _, o in outcomes if isinstance(o, Succeeded) for t in o.successors]
    await submit.dependency_states(
        tx, (d for t in successors for d in t.after if isinstance(d, int))
    )
    gates = [row["gate"] for rows in tx.tickets.values() for row in rows]
    await tx.gates.lock([*gates, *_declared(outcomes, tx.configs)], clock=True)
    await lock_flows(tx, sorted({task.lane for task in successors}))
    return locked


async def lock_flows(tx: Transaction, flows: list[str]) -> None:
    if flows:
        await tx.run("add_flows", flows=flows)
        await tx.run("lock_flows", flows=flows)


async def held(tx: Transaction, locked: Held, lease: Lease) -> TaskRecord:
    """The task `lease` still holds (locked by `prepare`), checked against the clock read
    once every lock was held."""
    task = locked.tasks.pop(lease.task_id, None)
    if task is None:  # an earlier outcome of the batch was for this task too: read it again
        found = await tx.row("lock_task", id=lease.task_id)
        task = None if found is None else task_of(found)
    if task is None or not holds(task, lease.token, tx.now):
        raise LeaseLost(lease.task_id)
    return task


async def finish(tx: Transaction, lease: Lease, outcome: Outcome) -> None:
    locked = await prepare(tx, [(lease, outcome)])
    await apply(tx, locked, lease, outcome)


async def apply(tx: Transaction, locked: Held, lease: Lease, outcome: Outcome) -> None:
    task = await held(tx, locked, lease)
    if isinstance(outcome, PollAgain):
        await poll_again(tx, task, outcome)
    elif isinstance(outcome, Succeeded):
        await succeed(tx, task, outcome)
    elif isinstance(outcome, Retry):
        await retry(tx, task, outcome)
    elif isinstance(outcome, Dead):
        await die(tx, task, outcome)
    else:
        await await_remote(tx, task, outcome)


async def finish_many(
    tx: Transaction, outcomes: Sequence[tuple[Lease, Outcome]]
) -> list[HeadraceError | None]:
    """Each outcome inside its own savepoint: one refused outcome leaves no trace and does
    not undo the others."""
    locked = await prepare(tx, outcomes)
    results: list[HeadraceError | None] = []
    plain: list[TaskRecord] = []  # plain successes not written yet, in batch order
    for lease, outcome in outcomes:
        if _plain_success(outcome) and lease.task_id in locked.tasks:
            task = locked.tasks.pop(lease.task_id)
            if holds(task, lease.token, tx.now):
                await succeed_plain(tx, locked, task, outcome)
                plain.append(task)
                results.append(None)
            else:
                results.append(LeaseLost(lease.task_id))
            continue
        await write_successes(tx, plain)  # before this outcome, as in batch order
        before, charged = tx.gates.snapshot(), dict(tx.ledger)
        try:
            async with tx.driver.savepoint():
                await apply(tx, locked, lease, outcome)
        except HeadraceError as error:
            tx.gates.restore(before)
            tx.ledger = charged
            tx.tickets.clear()  # read again: the rollback may have restored some
            results.append(error)
        else:
            results.append(None)
    await write_successes(tx, plain)
    return results


async def succeed_plain(tx: Transaction, locked: Held, task: TaskRecord, outcome: Outcome) -> None:
    """A success without successors, held and checked: nothing in it can be refused, so it
    needs no savepoint; its rows are written with its neighbours' by `write_successes`."""
    assert isinstance(outcome, Succeeded)
    await lock_gates_for(tx, task, ())
    await tickets.release(tx, task.id, delete=False)
    charge(tx, task, outcome)
    # Listeners hear of it if tickets came back (`release`), dependents may be ready or its
    # stage's room grew.
    tx.wake = tx.wake or locked.dependents or frees_room(tx, task)


def frees_room(tx: Transaction, task: TaskRecord) -> bool:
    """Whether a task that ends may make room for others: it is of a bounded stage, or of one
    feeding it (store/machine/bounds.py), whose count the claims' backpressure reads."""
    return task.kind in stage_bounds.counted_kinds(tx.settings.stages)


def charge(tx: Transaction, task: TaskRecord, outcome: Succeeded) -> None:
    """Add a success's units to its group's ledger, written at the end of the transaction
    into the shard of the worker that ran it (no other writer waits on that row)."""
    entry = (task.group or "", task.kind, task.worker or "")
    units = ledger.units_spent(task.cost, outcome.cost)
    tx.ledger[entry] = tx.ledger.get(entry, 0.0) + units


async def write_successes(tx: Transaction, tasks: list[TaskRecord]) -> None:
    """The rows of a run of plain successes, in one statement (as `succeed_task` each)."""
    if tasks:
        ids = [task.id for task in tasks]
        numbers = [task.attempt for task in tasks]
        await tx.run("succeed_tasks", ids=ids, numbers=numbers)
        tasks.clear()


async def lock_gates_for(tx: Transaction, task: TaskRecord, penalized: Sequence[str]) -> None:
    """Lock the gates an outcome touches (the task's tickets and those it penalises) in
    name order, then read the clock again: gate times follow the order of the locks."""
    for name in penalized:
        gating.resolve(name, tx.configs)
    held = await tickets.ticket_counts(tx, task.id)
    await tx.gates.lock([*(found["gate"] for found in held), *penalized], clock=True)


async def poll_again(tx: Transaction, task: TaskRecord, outcome: PollAgain) -> None:
    if task.state is not TaskState.WAITING:
        raise ConfigError("PollAgain: only a waiting task can be polled again")
    run_at = tx.now + outcome.delay
    await tx.run("poll_again", id=task.id, run_at=run_at, code=outcome.code)


async def succeed(tx: Transaction, task: TaskRecord, outcome: Succeeded) -> None:
    # Successors are checked like a submitted batch: a bad one fails the whole completion,
    # and one its stage has no room for defers it.
    states = await submit.check_batch(tx, outcome.successors)
    planned = idempotency.plan(outcome.successors, await submit.known_keys(tx, outcome.successors))
    try:
        await submit.check_bounds(tx, outcome.successors, planned, tx.limits)
    except QueueFull as full:
        await defer(tx, task, full)
        return
    await lock_gates_for(tx, task, ())
    await tickets.release(tx, task.id, delete=False)
    await tx.run("succeed_task", id=task.id, number=task.attempt)
    charge(tx, task, outcome)
    states[task.id] = TaskState.SUCCEEDED  # successors that wait on it have nothing to wait for
    await submit.create(tx, outcome.successors, states, planned)
    tx.wake = True


async def defer(tx: Transaction, task: TaskRecord, full: QueueFull) -> None:
    """A success whose successors a stage has no room for: nothing of it is kept, and the
    task is ready again (after `DEFER_DELAY`), its attempt not counted and its tickets
    returned. Backpressure, not a failure: the work waits upstream, where it was. A task
    whose remote job ended is polled again instead: the job is not submitted twice."""
    if task.state is TaskState.WAITING:
        await poll_again(tx, task, PollAgain(DEFER_DELAY, STAGE_FULL))
        return
    await lock_gates_for(tx, task, ())
    error = AttemptError.of(ErrorClass.TRANSIENT, STAGE_FULL, str(full))
    await tickets.endattempt_of(tx, task, AttemptOutcome.DEFERRED, error)
    await tickets.release(tx, task.id)
    run_at = tx.now + DEFER_DELAY
    tx.wake = True  # ready again at `run_at`: a time the other workers' answers do not name
    await tx.run(
        "mark_deferred",
        id=task.id,
        run_at=run_at,
        ready_since=ready_since(tx.now, run_at),
        code=STAGE_FULL,
    )


async def retry(tx: Transaction, task: TaskRecord, outcome: Retry) -> None:
    await lock_gates_for(tx, task, outcome.penalize)
    await tickets.penalize(tx, outcome.penalize)
    await tickets.endattempt_of(tx, task, AttemptOutcome.RETRY, outcome.error)
    await tickets.release(tx, task.id)
    run_at = tx.now + outcome.delay
    tx.wake = True  # ready again at `run_at`: a time the other workers' answers do not name
    await tx.run(
        "mark_retry",
        id=task.id,
        run_at=run_at,
        ready_since=ready_since(tx.now, run_at),
        code=outcome.error.code,
        uncounted=not outcome.counted,
    )


async def die(tx: Transaction, task: TaskRecord, outcome: Dead) -> None:
    await lock_gates_for(tx, task, outcome.penalize)
    await tickets.penalize(tx, outcome.penalize)
    await tickets.endattempt_of(tx, task, AttemptOutcome.DEAD, outcome.error)
    await bury(tx, task.id, outcome.error.code)
    tx.wake = tx.wake or frees_room(tx, task)


async def await_remote(tx: Transaction, task: TaskRecord, outcome: AwaitRemote) -> None:
    if task.state is TaskState.WAITING:
        raise ConfigError("AwaitRemote: the task is already waiting on a remote job")
    await tickets.endattempt_of(tx, task, AttemptOutcome.WAITING, None)
    await tickets.stamp_starts(tx, task.id)  # the job was submitted: counted from now at latest
    deadline = tx.now + outcome.timeout if outcome.timeout is not None else None
    await tx.run(
        "mark_waiting",
        id=task.id,
        remote_id=outcome.remote_id,
        poll_every=outcome.poll_every,
        deadline=deadline,
        run_at=tx.now + outcome.poll_every,
    )


async def bury(tx: Transaction, task_id: int, code: str) -> None:
    await tickets.end_task(tx, task_id, TaskState.DEAD, code)
    for dependent in await tickets.dependents(tx, task_id):
        await tickets.cancel_tree(tx, dependent, UPSTREAM_FAILED)


async def redrive(
    tx: Transaction, ids: list[int] | None, group: str | None, kind: str | None
) -> list[int]:
    redriven: list[int] = []
    for found in await tx.rows("dead_letters", ids=ids, grp=group, kind=kind):
        since = ready_since(tx.now, tx.now)  # not a moment of its time dead counts
        if await tx.row("redrive_task", id=found["id"], ready_since=since) is not None:
            redriven.append(int(found["id"]))
            await restore_dependents(tx, int(found["id"]))
    tx.wake = tx.wake or bool(redriven)
    return redriven


async def restore_dependents(tx: Transaction, task_id: int) -> None:
    for dependent in await tickets.dependents(tx, task_id):
        if (await tx.one("failed_deps", id=dependent))["n"]:
            continue
        if await tx.row("restore_dependent", id=dependent) is not None:
            await restore_dependents(tx, dependent)


async def cancel(tx: Transaction, task_id: int) -> bool:
    await tickets.lock_tree(tx, [task_id])  # first: an outcome cannot land between look and act
    if (await tx.task(task_id)).state.terminal:
        return False
    await tickets.cancel_tree(tx, task_id, "cancelled")
    tx.wake = True  # its stage's room, and its tree's, may have grown
    return True


async def reap(tx: Transaction) -> int:
    expired = [task_of(found) for found in await tx.rows("expired_leases")]
    if not expired:
        return 0
    ids = [task.id for task in expired]
    await tickets.lock_tree(tx, ids)
    held = await tx.rows("ticket_gates", task_ids=ids)
    await tx.gates.lock((found["gate"] for found in held), clock=True)
    for task in expired:
        await expire(tx, task)
    tx.wake = True
    return len(expired)


async def expire(tx: Transaction, task: TaskRecord) -> None:
    error = AttemptError.of(ErrorClass.TRANSIENT, LEASE_EXPIRED, "worker lost its lease")
    await tickets.endattempt_of(tx, task, AttemptOutcome.LEASE_EXPIRED, error)
    beside = await tx.one(
        "crash_companions", worker=task.worker or "", task_id=task.id, number=task.attempt
    )
    found = poison.verdict(
        alone=not beside["n"],
        expiries=task.expiries + 1,
        poison_expiries=tx.settings.poison_expiries,
        attempts_used=task.attempts_used,
        max_attempts=task.max_attempts,
    )
    if found in (Expiry.POISON, Expiry.SPENT):
        await tx.run("count_expiry", id=task.id)
        await bury(tx, task.id, POISON if found is Expiry.POISON else LEASE_EXPIRED)
        return
    await tickets.release(tx, task.id)
    solo = found is Expiry.SOLO
    await tx.run(
        "requeue_expired",
        id=task.id,
        code=LEASE_EXPIRED,
        solo=solo,
        ready_since=ready_since(tx.now, tx.now),
    )


async def wake_remote(tx: Transaction, remote_id: str) -> int:
    woken = await tx.rows("wake_remote", remote_id=remote_id)
    tx.wake = tx.wake or bool(woken)
    return len(woken)


def _declared(
    outcomes: Iterable[tuple[Lease, Outcome]], configs: Mapping[str, GateConfig]
) -> list[str]:
    """The gates the outcomes penalise that a spec declares (the others fail their outcome)."""
    names = {n for _, o in outcomes if isinstance(o, Retry | Dead) for n in o.penalize}
    declared = []
    for name in sorted(names):
        with contextlib.suppress(UnknownGate):
            gating.resolve(name, configs)
            declared.append(name)
    return declared


def _plain_success(outcome: Outcome) -> bool:
    return isinstance(outcome, Succeeded) and not outcome.successors
