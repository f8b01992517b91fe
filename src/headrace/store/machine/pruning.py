"""The pruner's steps (store/machine/plans.py): one batch of a plan, the group rollup it feeds,
the pruner's lease, and the named leases (`take_lease`).

A batch reads its candidates (the plan's statement says which rows nothing needs any more),
then, unless it is a dry run, locks those still final (a row another writer holds is skipped:
the mark moves past it, the next run takes it), folds tasks into their groups' rollup and
deletes them with their attempts and dependency rows, in plain DELETE statements.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from headrace.store.machine import records as record_steps
from headrace.store.machine.core import Transaction
from headrace.store.machine.plans import (
    AuditPlan,
    Batch,
    Mark,
    NoticePlan,
    Plan,
    RecordPlan,
    TaskPlan,
)
from headrace.store.machine.rows import Row
from headrace.store.protocol.pruning import ATTEMPTS, PrunerState
from headrace.store.protocol.types import TaskState


async def prune_batch(tx: Transaction, plan: Plan, after: Mark, limit: int, dry_run: bool) -> Batch:
    if isinstance(plan, TaskPlan):
        return await prune_tasks(tx, plan, after, limit, dry_run)
    if isinstance(plan, RecordPlan):
        found = await tx.rows(
            "prunable_records",
            kind=plan.kind,
            cutoff=tx.now - plan.age,
            after=after.number,
            limit=limit,
        )
        marks = [Mark(0.0, int(row["seq"])) for row in found]
        ids = [str(row["id"]) for row in found]
        gone = len(ids) if dry_run else await record_steps.delete_records(tx, plan.kind, ids, None)
        return _batch(plan.label, gone, marks, after, limit)
    query, delete = _ROWS[type(plan)]
    found = await tx.rows(
        query, cutoff=tx.now - plan.age, at=after.at, after_id=after.number, limit=limit
    )
    marks = [Mark(float(row["at"]), int(row["id"])) for row in found]
    numbers = [int(row["id"]) for row in found]
    gone = len(numbers) if dry_run or not numbers else len(await tx.rows(delete, ids=numbers))
    return _batch(plan.label, gone, marks, after, limit)


async def prune_tasks(
    tx: Transaction, plan: TaskPlan, after: Mark, limit: int, dry_run: bool
) -> Batch:
    found = await tx.rows(
        "prunable_tasks",
        state=plan.state.value,
        cutoff=tx.now - plan.age,
        at=after.at,
        after_id=after.number,
        limit=limit,
    )
    marks = [Mark(float(row["finished_at"]), int(row["id"])) for row in found]
    ids = [int(row["id"]) for row in found]
    if not ids:
        return _batch(plan.label, 0, marks, after, limit)
    if dry_run:
        attempts = int((await tx.one("count_attempts", ids=ids))["n"])
        return _batch(plan.label, len(ids), marks, after, limit, attempts)
    held = await tx.rows("lock_pruned_tasks", ids=ids)
    ids = [int(row["id"]) for row in held]
    await roll_up(tx, held)
    await tx.run("orphan_dependents", ids=ids)
    attempts = len(await tx.rows("delete_attempts", ids=ids))
    await tx.run("delete_task_deps", ids=ids)
    gone = len(await tx.rows("delete_tasks", ids=ids))
    return _batch(plan.label, gone, marks, after, limit, attempts)


async def roll_up(tx: Transaction, tasks: Sequence[Row]) -> None:
    """Fold tasks about to go into their groups' counts per state (`group_report` adds
    them to what the kept tasks count), so a group's report stays what it was."""
    counted = Counter((row["grp"], row["state"]) for row in tasks if row["grp"] is not None)
    params = [{"grp": g, "state": s, "n": n} for (g, s), n in sorted(counted.items())]
    if params:
        await tx.run_many("add_to_rollup", params)


async def rollup(tx: Transaction, group: str) -> dict[TaskState, int]:
    found = await tx.rows("group_rollup", grp=group)
    return {TaskState(row["state"]): int(row["n"]) for row in found}


async def take_pruner(tx: Transaction, holder: str, lease_for: float, every: float) -> bool:
    """Hold the pruner's lease for `lease_for` seconds: if `holder` holds it already, or
    nobody does and the last run ended `every` seconds ago or more."""
    found = await tx.rows(
        "take_pruner", holder=holder, until=tx.now + lease_for, due=tx.now - every
    )
    return bool(found)


async def release_pruner(tx: Transaction, holder: str, removed: int | None) -> None:
    """Give the lease back; `removed`: the run ended (None: it failed, try again soon)."""
    await tx.run("release_pruner", holder=holder, removed=removed)


async def pruner_state(tx: Transaction) -> PrunerState | None:
    found = await tx.row("pruner_state")
    if found is None:
        return None
    done_at = found["done_at"]
    return PrunerState(
        str(found["holder"]),
        float(found["until"]),
        None if done_at is None else float(done_at),
        int(found["removed"]),
    )


async def take_lease(tx: Transaction, name: str, holder: str, lease_for: float) -> bool:
    """Hold the lease `name` for `lease_for` seconds: if `holder` holds it already, or
    nobody does (never taken, or run out)."""
    until = tx.now + lease_for
    return bool(await tx.rows("take_lease", name=name, holder=holder, until=until))


_ROWS = {
    NoticePlan: ("prunable_notices", "delete_notices"),
    AuditPlan: ("prunable_audit", "delete_audit"),
}


def _batch(
    label: str, gone: int, marks: list[Mark], after: Mark, limit: int, attempts: int = 0
) -> Batch:
    removed = {label: gone, ATTEMPTS: attempts} if attempts else {label: gone}
    return Batch(removed, marks[-1] if marks else after, len(marks) < limit)
