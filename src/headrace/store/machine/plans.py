"""What the pruner removes from a store (`Store.prune`) and in what order; what a run reports
(`Pruned`) is the protocol's (store/protocol/pruning.py).

A run walks `plans(retention)` in order, each in batches of `retention.batch` rows, one
transaction a batch (so no lock is held for long): succeeded, cancelled and dead tasks (with
their attempts and dependency rows; a group's counts go to its rollup first, its cost ledger is
never touched), delivered notices, audit rows, and the records of `RECORD_PLANS`. A batch takes
the rows past its cutoff after a mark (the last row the batch before looked at), oldest first.

A final task past its age stays while (the statements `prunable_tasks` say it once per SQL
dialect):

- a task that depends on it is not final yet;
- it waits on a task that is dead, or cancelled because one it waited on failed: a redrive
  would bring it back (it goes once that task has gone);
- it is the newest task. SQLite numbers a new row after the largest kept, so the newest task,
  record, audit row and notice always stay: a number never names two things.

When a dead or cancelled task goes, the tasks still cancelled for it (`upstream_failed`) are
marked `upstream_pruned`: a redrive of another task they wait on no longer restores them,
since what they waited on is not there to be counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from headrace.policy.retention import Retention
from headrace.store.protocol.pruning import (
    AUDIT_ROWS,
    CANCELLED_TASKS,
    DEAD_TASKS,
    DELIVERIES,
    DELIVERY,
    LABELS,
    LOGIN,
    NOTICES,
    REMOTE,
    SIGN_INS,
    SUCCEEDED_TASKS,
    Pruned,
)
from headrace.store.protocol.types import TaskState


@dataclass(frozen=True)
class TaskPlan:
    """Tasks in `state` that finished more than `age` seconds ago."""

    label: str
    state: TaskState
    age: float


@dataclass(frozen=True)
class NoticePlan:
    """Outbox notices delivered more than `age` seconds ago."""

    label: str
    age: float


@dataclass(frozen=True)
class AuditPlan:
    """Audit rows written more than `age` seconds ago."""

    label: str
    age: float


@dataclass(frozen=True)
class RecordPlan:
    """Records of `kind` whose last change is more than `age` seconds old."""

    label: str
    kind: str
    age: float


Plan = TaskPlan | NoticePlan | AuditPlan | RecordPlan


def plans(retention: Retention) -> list[Plan]:
    """What a run prunes, in order: each kind whose age is set."""
    found: list[Plan] = []
    for label, state, age in (
        (SUCCEEDED_TASKS, TaskState.SUCCEEDED, retention.succeeded),
        (CANCELLED_TASKS, TaskState.CANCELLED, retention.cancelled),
        (DEAD_TASKS, TaskState.DEAD, retention.dead),
    ):
        if age is not None:
            found.append(TaskPlan(label, state, age))
    if retention.delivered is not None:
        found.append(NoticePlan(NOTICES, retention.delivered))
    if retention.audit is not None:
        found.append(AuditPlan(AUDIT_ROWS, retention.audit))
    for label, kind, age in (
        (SIGN_INS, LOGIN, retention.sign_ins),
        (DELIVERIES, DELIVERY, retention.deliveries),
        (DELIVERIES, REMOTE, retention.deliveries),
    ):
        if age is not None:
            found.append(RecordPlan(label, kind, age))
    return found


@dataclass(frozen=True)
class Mark:
    """Where the next batch of a plan starts: after the row at (`at`, `number`) in the plan's
    order (a time, then an id or a record's seq)."""

    at: float = float("-inf")
    number: int = 0


@dataclass(frozen=True)
class Batch:
    """One transaction's work: how many rows of each kind it removed (or would), where the
    next batch starts, and whether the plan is done."""

    removed: Mapping[str, int]
    mark: Mark
    done: bool


def tally(batches: Iterable[Batch]) -> Pruned:
    """The result of a run's batches: every store kind named, removed or not."""
    result = Pruned(dict.fromkeys(LABELS, 0))
    for batch in batches:
        result = result.plus(batch.removed, 1 if any(batch.removed.values()) else 0)
    return result
