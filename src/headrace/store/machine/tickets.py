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
from headrace.store.machine.core import Steps
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


class Tickets(Steps):
    # -- gates

    async def ticket_counts(self, task_id: int) -> list[Row]:
        if task_id not in self._tickets:
            self._tickets[task_id] = await self.rows("ticket_counts", task_id=task_id)
        return self._tickets[task_id]

    async def release(self, task_id: int, *, delete: bool = True) -> None:
        """Return a task's tickets to their gates (`delete=False`: the caller deletes the rows);
        a start never stamped is stamped now, at the outcome."""
        held = await self.ticket_counts(task_id)
        self._tickets[task_id] = []
        if not held:
            return
        await self.gates.lock(found["gate"] for found in held)
        for found in held:
            name = found["gate"]
            state = self.stamped(name, int(found["unstarted"]))
            self.gates.put(name, gating.release(state, int(found["n"])))
        if delete:
            await self.run("delete_tickets", task_id=task_id)
        self.wake = True

    def rated(self, name: str) -> bool:
        return gating.resolve(name, self.configs).rate is not None

    def stamped(self, name: str, count: int) -> GateState:
        """The state of gate `name` (locked) after `count` of its reserved starts are stamped."""
        state, config = self.gates.get(name), gating.find(name, self.configs)
        for _ in range(count):
            state = gating.start(config, state, self.now)
        return state

    async def start(self, lease: Lease, gates: Collection[str] | None) -> None:
        """Stamp the reserved starts of the task `lease` holds (on `gates`, or every one)."""
        found = await self.row("lock_task", id=lease.task_id)
        task = None if found is None else task_of(found)
        await self.read_clock()
        if task is None or not holds(task, lease.token, self.now):
            raise LeaseLost(lease.task_id)
        await self.stamp_starts(task.id, gates)

    async def fence(self, lease: Lease) -> None:
        """Raise LeaseLost unless `lease` still holds its task (a call about to leave)."""
        found = await self.row("task_by_id", id=lease.task_id)
        await self.read_clock()
        if found is None or not holds(task_of(found), lease.token, self.now):
            raise LeaseLost(lease.task_id)

    async def stamp_starts(self, task_id: int, gates: Collection[str] | None = None) -> None:
        """Stamp a held task's reserved starts now; its tickets stay held."""
        held = await self.ticket_counts(task_id)
        chosen = [
            found
            for found in held
            if found["unstarted"] and (gates is None or found["gate"] in gates)
        ]
        if not chosen:
            return
        names = [found["gate"] for found in chosen]
        await self.gates.lock(names, clock=True)
        for found in chosen:
            self.gates.put(found["gate"], self.stamped(found["gate"], int(found["unstarted"])))
        await self.run("mark_started", task_id=task_id, gates=names)
        self._tickets.pop(task_id, None)  # read again if needed: the rows changed

    async def penalize(self, names: Sequence[str]) -> None:
        configs = {name: gating.resolve(name, self.configs) for name in names}
        await self.gates.lock(names)
        for name, config in configs.items():
            self.gates.put(name, gating.penalize(config, self.gates.get(name), self.now))

    # -- dependency trees

    async def endattempt_of(
        self, task: TaskRecord, outcome: AttemptOutcome, error: AttemptError | None
    ) -> None:
        await self.run(
            "end_attempt",
            task_id=task.id,
            number=task.attempt,
            outcome=outcome.value,
            error_class=error.error_class.value if error else None,
            code=error.code if error else None,
            message=error.message if error else None,
        )

    async def end_task(self, task_id: int, state: TaskState, code: str) -> None:
        await self.release(task_id)
        await self.run("mark_ended", id=task_id, state=state.value, code=code)

    async def dependents(self, task_id: int) -> list[int]:
        return [int(found["task_id"]) for found in await self.rows("dependents", dep_id=task_id)]

    async def lock_tree(self, roots: Sequence[int]) -> list[int]:
        """Lock tasks and everything waiting on them, in id order (before any gate)."""
        found = await self.rows("lock_for_outcomes", ids=[], dead=list(roots), succeeded=[])
        return [int(row["id"]) for row in found]

    async def cancel_tree(self, root: int, code: str) -> None:
        tree = await self.lock_tree([root])
        held = await self.rows("ticket_gates", task_ids=tree)
        await self.gates.lock(found["gate"] for found in held)
        pending = [(root, code)]
        while pending:
            task_id, reason = pending.pop()
            task = await self.task(task_id)
            if task.state.terminal:
                continue
            if task.state in (TaskState.RUNNING, TaskState.WAITING):
                await self.endattempt_of(task, AttemptOutcome.CANCELLED, None)
            await self.end_task(task_id, TaskState.CANCELLED, reason)
            dependents = reversed(await self.dependents(task_id))
            pending.extend((dependent, UPSTREAM_FAILED) for dependent in dependents)
