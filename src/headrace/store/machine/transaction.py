"""The store's state machine, written once: every verb's transaction (submit, claim, the
outcomes, start stamps, renewals, cancel, redrive, reaping, the reads) as steps over named
statements. A backend is a `Driver`: it runs a named statement of its own dialect and hands back
its rows. `memory://` runs it too, on SQLite's in-memory database: there is no other copy.

Writers lock rows in one order: tasks (by id), then gates (by name), then flows (by name), then
the store-wide counters, and the cost ledger (a row per group, kind and worker) last. An outcome
(or a batch of them) locks all it will touch before it writes anything. Where a claim discovers
a gate out of that order it takes the row only if it is free. On a database with row locks
(PostgreSQL) the `lock_*` statements take them; on one that serialises writers (SQLite) they
only read.

Time: with no clock given, every lease, run_at and gate time is the server's clock read in the
transaction (again after waiting for gate rows), so hosts with skewed clocks agree; with a
clock (a test's, or SQLite's) its value is used in the same statements.

Statements whose rows are not read are sent without waiting (`run`); a driver in pipeline mode
sends them with the next statement whose rows are read."""

from __future__ import annotations

from headrace.policy import gate as gating
from headrace.policy.gate import GateConfig, GateStatistics
from headrace.store.ages import ReadyAges, age
from headrace.store.machine.claim import Claiming
from headrace.store.machine.core import Pending
from headrace.store.machine.pruning import PruneSteps
from headrace.store.machine.records import RecordSteps
from headrace.store.rows import (
    attempt_of,
    counts_by_state,
    gate_state_of,
    stage_of,
    task_of,
)
from headrace.store.types import (
    Attempt,
    AttemptOutcome,
    Failure,
    GroupReport,
    StageStats,
    TaskRecord,
    TaskState,
)


class Transaction(Claiming, RecordSteps, PruneSteps):
    """One verb's transaction: the statements it runs and the state machine's steps, as in
    SQLite's and PostgreSQL's, held to one semantics by the conformance suite."""

    # -- remote jobs

    async def wake_remote(self, remote_id: str) -> int:
        woken = await self.rows("wake_remote", remote_id=remote_id)
        self.wake = self.wake or bool(woken)
        return len(woken)

    # -- reading

    async def find(self, key: str) -> TaskRecord | None:
        found = await self.rows("task_ids_by_keys", keys=[key])
        return await self.task(int(found[0]["id"])) if found else None

    async def tasks(
        self, group: str | None, state: TaskState | None, kind: str | None, limit: int
    ) -> list[TaskRecord]:
        value = state.value if state is not None else None
        found = await self.rows("list_tasks", grp=group, state=value, kind=kind, limit=limit)
        return [task_of(row) for row in found]

    async def attempts(self, task_id: int) -> list[Attempt]:
        await self.task(task_id)
        return [attempt_of(found) for found in await self.rows("task_attempts", task_id=task_id)]

    async def counts(self, kinds: list[str] | None) -> dict[TaskState, int]:
        return counts_by_state(await self.rows("count_by_state", kinds=kinds))

    async def stages(self, kinds: list[str] | None) -> list[StageStats]:
        found = await self.rows("stage_stats", kinds=kinds)
        return [stage_of(row, self.now) for row in found]

    async def ready_ages(self, kinds: list[str] | None, sample: int) -> dict[str, ReadyAges]:
        """Each kind's ready count (its tally), then both ends of its ready queue from the
        index, each end one array, every kind's statements sent before any is read (one round
        trip). The two ends never overlap: the newest are taken only past the oldest."""
        sent: list[tuple[str, int, Pending, Pending]] = []
        for found in await self.rows("ready_counts", kinds=kinds):
            kind, count = str(found["kind"]), int(found["n"])
            rest = max(0, min(sample, count - sample))
            oldest = await self.send("oldest_ready", kind=kind, limit=sample)
            newest = await self.send("newest_ready", kind=kind, limit=rest)
            sent.append((kind, count, oldest, newest))
        ages: dict[str, ReadyAges] = {}
        for kind, count, oldest, newest in sent:
            ages[kind] = ReadyAges(count, await self.waits(oldest), await self.waits(newest))
        return ages

    async def waits(self, sent: Pending) -> tuple[float, ...]:
        """The ages of an array of times a task became ready, longest wait first."""
        found = await sent.fetchone()
        since = [] if found is None else found["since"]
        return tuple(sorted((age(self.now, float(at)) for at in since), reverse=True))

    async def attempt_counts(self) -> dict[AttemptOutcome, int]:
        found = await self.rows("attempt_outcomes")
        return {AttemptOutcome(row["outcome"]): int(row["n"]) for row in found if int(row["n"])}

    async def groups(self) -> list[str]:
        return sorted(str(found["grp"]) for found in await self.rows("group_names"))

    async def group_report(self, group: str) -> GroupReport:
        by_state = counts_by_state(await self.rows("group_counts", grp=group))
        for state, pruned in (await self.rollup(group)).items():  # its tasks pruned so far
            by_state[state] += pruned
        spent = await self.rows("group_ledger", grp=group)
        cost = dict(sorted((str(r["kind"]), float(r["units"])) for r in spent))
        failures = tuple(
            Failure(r["id"], r["kind"], r["ref"], r["error_code"], r["attempt"])
            for r in await self.rows("group_failures", grp=group)
        )
        total = sum(by_state.values())
        return GroupReport(group, total, by_state, cost, failures)

    # -- named leases

    async def take_lease(self, name: str, holder: str, lease_for: float) -> bool:
        """Hold the lease `name` for `lease_for` seconds: if `holder` holds it already, or
        nobody does (never taken, or run out)."""
        until = self.now + lease_for
        return bool(await self.rows("take_lease", name=name, holder=holder, until=until))

    async def gate_statistics(self) -> list[GateStatistics]:
        """Every gate in the store, whichever process declared it: one this process does not
        declare is reported under the declaration its row names, with no cap or rate."""
        stats: list[GateStatistics] = []
        for found in await self.rows("all_gates"):
            name = found["name"]
            config = gating.find(name, self.configs) or GateConfig(name)
            declared = gating.declared_as(name, self.configs) or found["spec"]
            stats.append(gating.statistics(config, gate_state_of(found), self.now, declared))
        return sorted(stats, key=lambda s: s.name)
