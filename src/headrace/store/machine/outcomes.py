"""What lease holders write: renewals and outcomes (successes, retries, deaths, remote waits),
alone or in batches, each batch locking all it touches first; dead letters redriven;
cancellation and reaping."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence

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
from headrace.store.machine import idempotency
from headrace.store.machine.rows import (
    holds,
    task_of,
    tasks_of,
)
from headrace.store.machine.submit import Submission
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


class Outcomes(Submission):
    # -- lease holders

    async def renew(self, leases: Sequence[Lease], lease_for: float) -> list[Lease | None]:
        if not leases:
            return []
        until = self.now + lease_for
        ids = [lease.task_id for lease in leases]
        tokens = [lease.token for lease in leases]
        found = await self.rows("renew_leases", ids=ids, tokens=tokens, until=until)
        renewed = {record.id: record for record in map(task_of, found)}
        return [
            Lease(renewed[lease.task_id], lease.token, until)
            if lease.task_id in renewed and renewed[lease.task_id].lease_token == lease.token
            else None
            for lease in leases
        ]

    async def prepare(self, outcomes: Sequence[tuple[Lease, Outcome]]) -> None:
        """Lock, before any is written and in the order every writer follows, what the outcomes
        will touch: their tasks and the tasks waiting on those that succeed or die, the tasks
        their successors wait on, the gates, the successors' flows. Then no outcome of a batch
        waits for a lock while holding one a later outcome's order puts first."""
        ids = sorted({lease.task_id for lease, _ in outcomes})
        dead = [lease.task_id for lease, outcome in outcomes if isinstance(outcome, Dead)]
        done = [lease.task_id for lease, outcome in outcomes if isinstance(outcome, Succeeded)]
        locked = await self.send("lock_for_outcomes", ids=ids, dead=dead, succeeded=done)
        time = await self.send_clock()  # answered after the row locks: a wait must not stretch
        tickets = await self.send("ticket_counts_many", task_ids=ids)  # a lease
        held = {record.id: record for record in tasks_of(*await locked.table())}
        self._held = {task_id: held[task_id] for task_id in ids if task_id in held}
        self._dependents = len(held) > len(self._held)  # some outcome's dependents, locked
        await self.read_clock(time)
        self._tickets.update({task_id: [] for task_id in ids})
        for found in await tickets.fetchall():
            self._tickets[int(found["task_id"])].append(found)
        successors = [t for _, o in outcomes if isinstance(o, Succeeded) for t in o.successors]
        await self.dependency_states(d for t in successors for d in t.after if isinstance(d, int))
        gates = [row["gate"] for rows in self._tickets.values() for row in rows]
        await self.gates.lock([*gates, *_declared(outcomes, self.configs)], clock=True)
        await self.lock_flows(sorted({task.lane for task in successors}))

    async def lock_flows(self, flows: list[str]) -> None:
        if flows:
            await self.run("add_flows", flows=flows)
            await self.run("lock_flows", flows=flows)

    async def held(self, lease: Lease) -> TaskRecord:
        """The task `lease` still holds (locked by `prepare`), checked against the clock read
        once every lock was held."""
        task = self._held.pop(lease.task_id, None)
        if task is None:  # an earlier outcome of the batch was for this task too: read it again
            found = await self.row("lock_task", id=lease.task_id)
            task = None if found is None else task_of(found)
        if task is None or not holds(task, lease.token, self.now):
            raise LeaseLost(lease.task_id)
        return task

    async def finish(self, lease: Lease, outcome: Outcome) -> None:
        await self.prepare([(lease, outcome)])
        await self.apply(lease, outcome)

    async def apply(self, lease: Lease, outcome: Outcome) -> None:
        task = await self.held(lease)
        if isinstance(outcome, PollAgain):
            await self.poll_again(task, outcome)
        elif isinstance(outcome, Succeeded):
            await self.succeed(task, outcome)
        elif isinstance(outcome, Retry):
            await self.retry(task, outcome)
        elif isinstance(outcome, Dead):
            await self.die(task, outcome)
        else:
            await self.await_remote(task, outcome)

    async def finish_many(
        self, outcomes: Sequence[tuple[Lease, Outcome]]
    ) -> list[HeadraceError | None]:
        """Each outcome inside its own savepoint: one refused outcome leaves no trace and does
        not undo the others."""
        await self.prepare(outcomes)
        results: list[HeadraceError | None] = []
        plain: list[TaskRecord] = []  # plain successes not written yet, in batch order
        for lease, outcome in outcomes:
            if _plain_success(outcome) and lease.task_id in self._held:
                task = self._held.pop(lease.task_id)
                if holds(task, lease.token, self.now):
                    await self.succeed_plain(task, outcome)
                    plain.append(task)
                    results.append(None)
                else:
                    results.append(LeaseLost(lease.task_id))
                continue
            await self.write_successes(plain)  # before this outcome, as in batch order
            before, charged = self.gates.snapshot(), dict(self._ledger)
            try:
                async with self.driver.savepoint():
                    await self.apply(lease, outcome)
            except HeadraceError as error:
                self.gates.restore(before)
                self._ledger = charged
                self._tickets.clear()  # read again: the rollback may have restored some
                results.append(error)
            else:
                results.append(None)
        await self.write_successes(plain)
        return results

    async def succeed_plain(self, task: TaskRecord, outcome: Outcome) -> None:
        """A success without successors, held and checked: nothing in it can be refused, so it
        needs no savepoint; its rows are written with its neighbours' by `write_successes`."""
        assert isinstance(outcome, Succeeded)
        await self.lock_gates_for(task, ())
        await self.release(task.id, delete=False)
        self.charge(task, outcome)
        # Listeners hear of it if tickets came back (`release`) or dependents may be ready.
        self.wake = self.wake or self._dependents

    def charge(self, task: TaskRecord, outcome: Succeeded) -> None:
        """Add a success's units to its group's ledger, written at the end of the transaction
        into the shard of the worker that ran it (no other writer waits on that row)."""
        entry = (task.group or "", task.kind, task.worker or "")
        units = ledger.units_spent(task.cost, outcome.cost)
        self._ledger[entry] = self._ledger.get(entry, 0.0) + units

    async def write_successes(self, tasks: list[TaskRecord]) -> None:
        """The rows of a run of plain successes, in one statement (as `succeed_task` each)."""
        if tasks:
            ids = [task.id for task in tasks]
            numbers = [task.attempt for task in tasks]
            await self.run("succeed_tasks", ids=ids, numbers=numbers)
            tasks.clear()

    async def lock_gates_for(self, task: TaskRecord, penalized: Sequence[str]) -> None:
        """Lock the gates an outcome touches (the task's tickets and those it penalises) in
        name order, then read the clock again: gate times follow the order of the locks."""
        for name in penalized:
            gating.resolve(name, self.configs)
        held = await self.ticket_counts(task.id)
        await self.gates.lock([*(found["gate"] for found in held), *penalized], clock=True)

    async def poll_again(self, task: TaskRecord, outcome: PollAgain) -> None:
        if task.state is not TaskState.WAITING:
            raise ConfigError("PollAgain: only a waiting task can be polled again")
        run_at = self.now + outcome.delay
        await self.run("poll_again", id=task.id, run_at=run_at, code=outcome.code)

    async def succeed(self, task: TaskRecord, outcome: Succeeded) -> None:
        # Successors are checked like a submitted batch: a bad one fails the whole completion,
        # and one its stage has no room for defers it.
        states = await self.check_batch(outcome.successors)
        planned = idempotency.plan(outcome.successors, await self.known_keys(outcome.successors))
        try:
            await self.check_bounds(outcome.successors, planned, self.limits)
        except QueueFull as full:
            await self.defer(task, full)
            return
        await self.lock_gates_for(task, ())
        await self.release(task.id, delete=False)
        await self.run("succeed_task", id=task.id, number=task.attempt)
        self.charge(task, outcome)
        states[task.id] = TaskState.SUCCEEDED  # successors that wait on it have nothing to wait for
        await self.create(outcome.successors, states, planned)
        self.wake = True

    async def defer(self, task: TaskRecord, full: QueueFull) -> None:
        """A success whose successors a stage has no room for: nothing of it is kept, and the
        task is ready again (after `DEFER_DELAY`), its attempt not counted and its tickets
        returned. Backpressure, not a failure: the work waits upstream, where it was. A task
        whose remote job ended is polled again instead: the job is not submitted twice."""
        if task.state is TaskState.WAITING:
            await self.poll_again(task, PollAgain(DEFER_DELAY, STAGE_FULL))
            return
        await self.lock_gates_for(task, ())
        error = AttemptError.of(ErrorClass.TRANSIENT, STAGE_FULL, str(full))
        await self.endattempt_of(task, AttemptOutcome.DEFERRED, error)
        await self.release(task.id)
        run_at = self.now + DEFER_DELAY
        await self.run(
            "mark_deferred",
            id=task.id,
            run_at=run_at,
            ready_since=ready_since(self.now, run_at),
            code=STAGE_FULL,
        )

    async def retry(self, task: TaskRecord, outcome: Retry) -> None:
        await self.lock_gates_for(task, outcome.penalize)
        await self.penalize(outcome.penalize)
        await self.endattempt_of(task, AttemptOutcome.RETRY, outcome.error)
        await self.release(task.id)
        run_at = self.now + outcome.delay
        await self.run(
            "mark_retry",
            id=task.id,
            run_at=run_at,
            ready_since=ready_since(self.now, run_at),
            code=outcome.error.code,
            uncounted=not outcome.counted,
        )

    async def die(self, task: TaskRecord, outcome: Dead) -> None:
        await self.lock_gates_for(task, outcome.penalize)
        await self.penalize(outcome.penalize)
        await self.endattempt_of(task, AttemptOutcome.DEAD, outcome.error)
        await self.bury(task.id, outcome.error.code)

    async def await_remote(self, task: TaskRecord, outcome: AwaitRemote) -> None:
        if task.state is TaskState.WAITING:
            raise ConfigError("AwaitRemote: the task is already waiting on a remote job")
        await self.endattempt_of(task, AttemptOutcome.WAITING, None)
        await self.stamp_starts(task.id)  # the job was submitted: counted from now at latest
        deadline = self.now + outcome.timeout if outcome.timeout is not None else None
        await self.run(
            "mark_waiting",
            id=task.id,
            remote_id=outcome.remote_id,
            poll_every=outcome.poll_every,
            deadline=deadline,
            run_at=self.now + outcome.poll_every,
        )

    async def bury(self, task_id: int, code: str) -> None:
        await self.end_task(task_id, TaskState.DEAD, code)
        for dependent in await self.dependents(task_id):
            await self.cancel_tree(dependent, UPSTREAM_FAILED)

    # -- dead letters

    async def redrive(
        self, ids: list[int] | None, group: str | None, kind: str | None
    ) -> list[int]:
        redriven: list[int] = []
        for found in await self.rows("dead_letters", ids=ids, grp=group, kind=kind):
            since = ready_since(self.now, self.now)  # not a moment of its time dead counts
            if await self.row("redrive_task", id=found["id"], ready_since=since) is not None:
                redriven.append(int(found["id"]))
                await self.restore_dependents(int(found["id"]))
        self.wake = self.wake or bool(redriven)
        return redriven

    async def restore_dependents(self, task_id: int) -> None:
        for dependent in await self.dependents(task_id):
            if (await self.one("failed_deps", id=dependent))["n"]:
                continue
            if await self.row("restore_dependent", id=dependent) is not None:
                await self.restore_dependents(dependent)

    # -- cancellation and reaping

    async def cancel(self, task_id: int) -> bool:
        await self.lock_tree([task_id])  # first: an outcome cannot land between look and act
        if (await self.task(task_id)).state.terminal:
            return False
        await self.cancel_tree(task_id, "cancelled")
        return True

    async def reap(self) -> int:
        expired = [task_of(found) for found in await self.rows("expired_leases")]
        if not expired:
            return 0
        ids = [task.id for task in expired]
        await self.lock_tree(ids)
        held = await self.rows("ticket_gates", task_ids=ids)
        await self.gates.lock((found["gate"] for found in held), clock=True)
        for task in expired:
            await self.expire(task)
        self.wake = True
        return len(expired)

    async def expire(self, task: TaskRecord) -> None:
        error = AttemptError.of(ErrorClass.TRANSIENT, LEASE_EXPIRED, "worker lost its lease")
        await self.endattempt_of(task, AttemptOutcome.LEASE_EXPIRED, error)
        beside = await self.one(
            "crash_companions", worker=task.worker or "", task_id=task.id, number=task.attempt
        )
        found = poison.verdict(
            alone=not beside["n"],
            expiries=task.expiries + 1,
            poison_expiries=self.settings.poison_expiries,
            attempts_used=task.attempts_used,
            max_attempts=task.max_attempts,
        )
        if found in (Expiry.POISON, Expiry.SPENT):
            await self.run("count_expiry", id=task.id)
            await self.bury(task.id, POISON if found is Expiry.POISON else LEASE_EXPIRED)
            return
        await self.release(task.id)
        solo = found is Expiry.SOLO
        await self.run(
            "requeue_expired",
            id=task.id,
            code=LEASE_EXPIRED,
            solo=solo,
            ready_since=ready_since(self.now, self.now),
        )


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
