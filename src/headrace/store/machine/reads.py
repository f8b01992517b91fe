"""The reads: tasks, attempts, counts and stages, ready ages, groups, gate statistics."""

from __future__ import annotations

from headrace.policy import gate as gating
from headrace.policy.gate import GateConfig, GateStatistics
from headrace.store.machine import pruning
from headrace.store.machine.core import Pending, Transaction
from headrace.store.machine.rows import (
    attempt_of,
    counts_by_state,
    gate_state_of,
    stage_of,
    task_of,
)
from headrace.store.protocol.ages import ReadyAges, age
from headrace.store.protocol.types import (
    Attempt,
    AttemptOutcome,
    Failure,
    GroupReport,
    StageStats,
    TaskRecord,
    TaskState,
)


async def find(tx: Transaction, key: str) -> TaskRecord | None:
    found = await tx.rows("task_ids_by_keys", keys=[key])
    return await tx.task(int(found[0]["id"])) if found else None


async def tasks(
    tx: Transaction, group: str | None, state: TaskState | None, kind: str | None, limit: int
) -> list[TaskRecord]:
    value = state.value if state is not None else None
    found = await tx.rows("list_tasks", grp=group, state=value, kind=kind, limit=limit)
    return [task_of(row) for row in found]


async def attempts(tx: Transaction, task_id: int) -> list[Attempt]:
    await tx.task(task_id)
    return [attempt_of(found) for found in await tx.rows("task_attempts", task_id=task_id)]


async def counts(tx: Transaction, kinds: list[str] | None) -> dict[TaskState, int]:
    return counts_by_state(await tx.rows("count_by_state", kinds=kinds))


async def stages(tx: Transaction, kinds: list[str] | None) -> list[StageStats]:
    found = await tx.rows("stage_stats", kinds=kinds)
    return [stage_of(row, tx.now) for row in found]


async def ready_ages(tx: Transaction, kinds: list[str] | None, sample: int) -> dict[str, ReadyAges]:
    """Each kind's ready count (its tally), then both ends of its ready queue from the
    index, each end one array, every kind's statements sent before any is read (one round
    trip). The two ends never overlap: the newest are taken only past the oldest."""
    sent: list[tuple[str, int, Pending, Pending]] = []
    for found in await tx.rows("ready_counts", kinds=kinds):
        kind, count = str(found["kind"]), int(found["n"])
        rest = max(0, min(sample, count - sample))
        oldest = await tx.send("oldest_ready", kind=kind, limit=sample)
        newest = await tx.send("newest_ready", kind=kind, limit=rest)
        sent.append((kind, count, oldest, newest))
    ages: dict[str, ReadyAges] = {}
    for kind, count, oldest, newest in sent:
        ages[kind] = ReadyAges(count, await waits(tx, oldest), await waits(tx, newest))
    return ages


async def waits(tx: Transaction, sent: Pending) -> tuple[float, ...]:
    """The ages of an array of times a task became ready, longest wait first."""
    found = await sent.fetchone()
    since = [] if found is None else found["since"]
    return tuple(sorted((age(tx.now, float(at)) for at in since), reverse=True))


async def attempt_counts(tx: Transaction) -> dict[AttemptOutcome, int]:
    found = await tx.rows("attempt_outcomes")
    return {AttemptOutcome(row["outcome"]): int(row["n"]) for row in found if int(row["n"])}


async def groups(tx: Transaction) -> list[str]:
    return sorted(str(found["grp"]) for found in await tx.rows("group_names"))


async def group_report(tx: Transaction, group: str) -> GroupReport:
    by_state = counts_by_state(await tx.rows("group_counts", grp=group))
    for state, pruned in (await pruning.rollup(tx, group)).items():  # its tasks pruned so far
        by_state[state] += pruned
    spent = await tx.rows("group_ledger", grp=group)
    cost = dict(sorted((str(r["kind"]), float(r["units"])) for r in spent))
    failures = tuple(
        Failure(r["id"], r["kind"], r["ref"], r["error_code"], r["attempt"])
        for r in await tx.rows("group_failures", grp=group)
    )
    total = sum(by_state.values())
    return GroupReport(group, total, by_state, cost, failures)


async def gate_statistics(tx: Transaction) -> list[GateStatistics]:
    """Every gate in the store, whichever process declared it: one this process does not
    declare is reported under the declaration its row names, with no cap or rate."""
    stats: list[GateStatistics] = []
    for found in await tx.rows("all_gates"):
        name = found["name"]
        config = gating.find(name, tx.configs) or GateConfig(name)
        declared = gating.declared_as(name, tx.configs) or found["spec"]
        stats.append(gating.statistics(config, gate_state_of(found), tx.now, declared))
    return sorted(stats, key=lambda s: s.name)
