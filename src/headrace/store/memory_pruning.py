"""The memory store's retention (store/protocol/pruning.py), with the semantics of the SQL stores'
named statements (`prunable_tasks` and the rest): the conformance suite holds them to one. Mixed
into `MemoryStore`, whose task table and indexes it reads and trims."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection
from dataclasses import replace

from headrace.policy.retention import Retention
from headrace.store.machine import plans
from headrace.store.machine.plans import Batch, Mark, Plan, RecordPlan, TaskPlan
from headrace.store.memory_records import MemoryRecords
from headrace.store.protocol.pruning import ATTEMPTS, UPSTREAM_PRUNED, Pruned, PrunerState
from headrace.store.protocol.types import (
    ACTIVE,
    UPSTREAM_FAILED,
    Attempt,
    TaskRecord,
    TaskState,
)

FAILED = (TaskState.DEAD, TaskState.CANCELLED)


class MemoryPruning(MemoryRecords):
    # What `MemoryStore` keeps, as far as pruning reads and trims it.
    _tasks: dict[int, TaskRecord]
    _attempts: dict[int, list[Attempt]]
    _deps: dict[int, set[int]]  # by task: what it waits (or waited) on
    _dependents: dict[int, set[int]]  # by task: who waits on it, until it succeeds
    _keys: dict[str, int]
    _digests: dict[str, str]
    _unmet: dict[int, int]
    _lanes: dict[int, str]
    _lost: dict[int, tuple[str, float]]
    _tickets: dict[int, dict[str, bool]]

    def _forget(self, task_ids: Collection[int]) -> None: ...  # MemoryStore's: every trace

    def __init__(self) -> None:
        super().__init__()
        self._rollup: Counter[tuple[str, TaskState]] = Counter()  # pruned tasks per group
        self._pruner: PrunerState | None = None
        self._leases: dict[str, tuple[str, float]] = {}  # by name: holder, until

    async def prune(self, retention: Retention, *, dry_run: bool = False) -> Pruned:
        batches: list[Batch] = []
        for plan in plans.plans(retention):
            mark, done = Mark(), False
            while not done:
                batch = self._prune_batch(plan, mark, retention.batch, dry_run)
                batches.append(batch)
                mark, done = batch.mark, batch.done
        return plans.tally(batches)

    def _prune_batch(self, plan: Plan, after: Mark, limit: int, dry_run: bool) -> Batch:
        now = self.clock.now()
        if isinstance(plan, TaskPlan):
            tasks = self._prunable_tasks(plan, now, after, limit)
            marks = [Mark(task.finished_at or 0.0, task.id) for task in tasks]
            attempts = sum(len(self._attempts.get(task.id, ())) for task in tasks)
            if not dry_run:
                self._remove_tasks(tasks)
            removed = {plan.label: len(tasks), ATTEMPTS: attempts}
            return _batch(removed, marks, after, limit)
        if isinstance(plan, RecordPlan):
            records = self._prunable_records(plan, now, after, limit)
            marks = [Mark(0.0, record.seq) for record in records]
            if not dry_run:
                for record in records:
                    del self._records[record.kind, record.id]
            return _batch({plan.label: len(records)}, marks, after, limit)
        marks = self._prune_rows(plan, now, after, limit)
        gone = len(marks)
        if not dry_run:
            gone = self._delete_rows(plan, {mark.number for mark in marks})
        return _batch({plan.label: gone}, marks, after, limit)

    def _prunable_tasks(
        self, plan: TaskPlan, now: float, after: Mark, limit: int
    ) -> list[TaskRecord]:
        newest = max(self._tasks, default=0)
        waiting_on = self._waiting_on()
        found = sorted(
            (
                task
                for task in self._tasks.values()
                if task.state is plan.state
                and task.finished_at is not None
                and task.finished_at < now - plan.age
                and (task.finished_at, task.id) > (after.at, after.number)
                and task.id < newest
                and not self._still_needed(task, waiting_on)
            ),
            key=lambda task: (task.finished_at or 0.0, task.id),
        )
        return found[:limit]

    def _waiting_on(self) -> dict[int, set[int]]:
        """Who waits (or waited) on each task: the dependency rows, from the other side."""
        found: dict[int, set[int]] = defaultdict(set)
        for task_id, deps in self._deps.items():
            for dep in deps:
                found[dep].add(task_id)
        return found

    def _still_needed(self, task: TaskRecord, waiting_on: dict[int, set[int]]) -> bool:
        """A task still to finish waits on it, or it waits on one a redrive could bring back."""
        if any(self._tasks[other].state in ACTIVE for other in waiting_on.get(task.id, ())):
            return True
        return any(_revivable(self._tasks[dep]) for dep in self._deps.get(task.id, ()))

    def _remove_tasks(self, tasks: list[TaskRecord]) -> None:
        gone = {task.id for task in tasks}
        waiting_on = self._waiting_on()
        for task in tasks:
            if task.group is not None:
                self._rollup[(task.group, task.state)] += 1
            if task.state in FAILED:
                self._orphan(waiting_on.get(task.id, set()) - gone)
        self._forget([task.id for task in tasks])

    def _orphan(self, dependents: set[int]) -> None:
        """Tasks cancelled for a task being pruned can no longer be restored by a redrive."""
        for dependent in dependents:
            found = self._tasks[dependent]
            if found.state is TaskState.CANCELLED and found.error_code == UPSTREAM_FAILED:
                self._tasks[dependent] = replace(found, error_code=UPSTREAM_PRUNED)

    def _rolled_up(self, group: str) -> dict[TaskState, int]:
        return {state: n for (g, state), n in self._rollup.items() if g == group}

    # -- the lease

    async def take_pruner(self, holder: str, *, lease_for: float, every: float = 0.0) -> bool:
        now, held = self.clock.now(), self._pruner
        renewing = held is not None and held.holder == holder and held.until > now
        free = held is None or (
            held.until <= now and (held.done_at is None or held.done_at <= now - every)
        )
        if not (renewing or free):
            return False
        done_at, removed = (None, 0) if held is None else (held.done_at, held.removed)
        self._pruner = PrunerState(holder, now + lease_for, done_at, removed)
        return True

    async def release_pruner(self, holder: str, *, removed: int | None = None) -> None:
        held, now = self._pruner, self.clock.now()
        if held is None or held.holder != holder:
            return
        done_at = held.done_at if removed is None else now
        self._pruner = PrunerState(
            holder, now, done_at, held.removed if removed is None else removed
        )

    async def pruner_state(self) -> PrunerState | None:
        return self._pruner

    # -- named leases

    async def take_lease(self, name: str, holder: str, *, lease_for: float) -> bool:
        now = self.clock.now()
        held_by, until = self._leases.get(name, (holder, now))
        if held_by != holder and until > now:
            return False
        self._leases[name] = (holder, now + lease_for)
        return True


def _revivable(task: TaskRecord) -> bool:
    """Dead, or cancelled because one it waited on failed: a redrive would bring it back."""
    return task.state is TaskState.DEAD or (
        task.state is TaskState.CANCELLED and task.error_code == UPSTREAM_FAILED
    )


def _batch(removed: dict[str, int], marks: list[Mark], after: Mark, limit: int) -> Batch:
    counted = {label: n for label, n in removed.items() if n or label not in (ATTEMPTS,)}
    return Batch(counted, marks[-1] if marks else after, len(marks) < limit)
