"""The `Store` protocol: the durable state machine every backend implements.

Every verb is one transaction. Time for leases, run_at and gate windows is the store's own clock
(the database server's on PostgreSQL), so processes with skewed clocks agree.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from headrace.policy.errors import HeadraceError
from headrace.policy.gate import GateStatistics
from headrace.policy.retention import Retention
from headrace.store.protocol.ages import AGE_SAMPLE, ReadyAges
from headrace.store.protocol.pruning import Pruned, PrunerState
from headrace.store.protocol.records import RecordStore
from headrace.store.protocol.types import (
    Attempt,
    AttemptOutcome,
    ClaimResult,
    GroupReport,
    KindLimit,
    Lease,
    MemoryRoom,
    NewTask,
    Outcome,
    Settings,
    StageStats,
    Submitted,
    TaskRecord,
    TaskState,
)


class Store(Protocol):
    async def open(self, settings: Settings) -> None:
        """Migrate the schema if needed and record the gate specs and settings."""
        ...

    async def close(self) -> None: ...

    async def now(self) -> float:
        """The store's clock."""
        ...

    @property
    def wakes(self) -> int:
        """How many wake-ups this store has seen: its own writes that may have made work
        claimable, and the notices of other processes' (what ends `wait_for_work`). A worker's
        claim that left slots free stands while the count is unchanged (runtime/claiming.py)."""
        ...

    @property
    def sees_every_write(self) -> bool:
        """Whether `wakes` counts every write that may make work claimable, none lost: an
        in-memory store, which nothing else writes to. A claim's answer then stands until the
        time it named, with no look every `idle` for a notice lost or another process's."""
        ...

    # `timeout` is the poll fallback, not a failure: the wait ends quietly when it is spent.
    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109
        """Return once new work may be claimable, or after `timeout`: a write by any process,
        this one included, that made a task ready or returned a ticket since this store's last
        claim or wait (an outcome that freed nothing wakes no one)."""
        ...

    async def submit(
        self, tasks: Sequence[NewTask], *, bounds: Mapping[str, int] | None = None
    ) -> list[Submitted]:
        """Create tasks (all or none). A known `key` returns the existing task when the payload
        is the same (store/machine/idempotency.py), and refuses the batch with KeyConflict when it
        is not. With `bounds`, raise QueueFull when a kind would have more than its bound of tasks
        pending or ready."""
        ...

    async def claim(
        self,
        worker: str,
        limit: int,
        *,
        lease_for: float,
        kinds: Collection[str] | None = None,
        alone: bool = True,
        finished: Sequence[tuple[Lease, Outcome]] = (),
        within: Sequence[KindLimit] = (),
        memory: MemoryRoom | None = None,
        ahead: int = 0,
    ) -> ClaimResult:
        """Lease up to `limit` ready tasks in (tier, tag) order whose gates all admit them;
        a refusing gate skips only its task. A task that must run alone (`solo`) is leased only
        when `alone` (the worker runs no other task) and then by itself. Expired leases are
        reaped before candidates are read (a store may do it at most every 100 ms of its
        clock): a task whose worker ran others beside it is made solo, not charged.

        `finished`: outcomes recorded first, in the same transaction, as by `finish_many` (a
        worker hands in the outcomes of the slots it fills again); their results come back
        in `ClaimResult.finished`. An error that fails the whole claim records none of them.

        `within`: at most `limit` tasks of each `KindLimit`'s kinds (a worker's free slots of
        one cost class): a task of a full group is passed over and stays ready, in its place.

        `memory`: the claiming worker's free memory (`MemoryRoom`; None: not counted). The
        tasks leased charge their `memory` against it: a task that does not fit in what is left
        is passed over and stays ready, in its place, and later ones that fit are taken; a task
        larger than the room is leased only when the room says the worker runs nothing charged,
        and then with nothing charged beside it.

        `ahead`: past `limit`, up to so many more tasks that may wait in the worker until a
        slot frees (claimed ahead, as a prefetch): only tasks that pass no gate, charge no
        memory and need not run alone (`dispatch.may_wait`); others are passed over and stay
        ready, in their place. Each counts in `within` as any task does."""
        ...

    async def claim_polls(
        self, worker: str, limit: int, *, lease_for: float, kinds: Collection[str] | None = None
    ) -> ClaimResult:
        """Lease up to `limit` waiting tasks whose next remote poll is due."""
        ...

    async def renew(self, leases: Sequence[Lease], *, lease_for: float) -> list[Lease | None]:
        """Extend leases still held; None for each one lost."""
        ...

    async def start(self, lease: Lease, gates: Collection[str] | None = None) -> None:
        """Stamp the call start the task's tickets reserved on rated gates (those among `gates`,
        or all) at the store's time: from now the start counts in its gates' windows. A start
        never stamped is stamped at the attempt's outcome. Raise LeaseLost if the lease is no
        longer held (the caller must then not make the call)."""
        ...

    async def fence(self, lease: Lease) -> None:
        """Raise LeaseLost if the lease is no longer held; change nothing. What a call checks
        just before it leaves when it is stamped (`start`) only once it has left: until then
        its start stays reserved, counting in every window of its gates."""
        ...

    async def finish(self, lease: Lease, outcome: Outcome) -> None:
        """Record an attempt's outcome; raise LeaseLost if the lease is no longer held."""
        ...

    async def finish_many(
        self, outcomes: Sequence[tuple[Lease, Outcome]]
    ) -> list[HeadraceError | None]:
        """`finish` for many leases in one transaction (group commit): for each, None when it
        was recorded or the error `finish` would have raised (then nothing of it was written)."""
        ...

    async def cancel(self, task_id: int) -> bool:
        """Cancel a task that has no outcome yet, and the tasks that depend on it."""
        ...

    async def redrive(
        self,
        *,
        task_ids: Collection[int] | None = None,
        group: str | None = None,
        kind: str | None = None,
    ) -> list[int]:
        """Re-enqueue dead tasks (those matching every filter given) with a fresh attempt
        budget, and restore the tasks cancelled because they waited on them; return the ids
        re-enqueued. Each dead task is re-enqueued once, however many redrives race."""
        ...

    async def wake_remote(self, remote_id: str) -> int:
        """Make the waiting tasks whose remote job is `remote_id` due for a check now (a
        webhook said how the job ended); return how many. A task whose check is running is
        left to it."""
        ...

    async def reap(self) -> int:
        """Make tasks whose lease expired ready again (or dead when spent); return how many."""
        ...

    async def get(self, task_id: int) -> TaskRecord: ...

    async def find(self, key: str) -> TaskRecord | None: ...

    async def tasks(
        self,
        *,
        group: str | None = None,
        state: TaskState | None = None,
        kind: str | None = None,
        limit: int = 1000,
    ) -> list[TaskRecord]: ...

    async def attempts(self, task_id: int) -> list[Attempt]: ...

    # The reads behind `/metrics` and `headrace status` come from tallies the store keeps in
    # the transactions that change tasks and attempts (docs/explanation.md): their cost does
    # not grow with the backlog or the history.

    async def counts(self, *, kinds: Collection[str] | None = None) -> dict[TaskState, int]:
        """Tasks per state, of these kinds only when `kinds` is given."""
        ...

    async def stages(self, *, kinds: Collection[str] | None = None) -> list[StageStats]:
        """Per kind with unfinished tasks (of these kinds only when `kinds` is given), in kind
        order: its pending, ready, running and waiting tasks, and the age of its oldest ready
        task (since its `ready_since`, or its `created_at` when that is unset)."""
        ...

    async def ready_ages(
        self, *, kinds: Collection[str] | None = None, sample: int = AGE_SAMPLE
    ) -> dict[str, ReadyAges]:
        """Per kind with ready tasks (of these kinds only when `kinds` is given): how many, and
        the ages (as `stages` reckons them) of its `sample` oldest and `sample` newest ready
        tasks (store/protocol/ages.py)."""
        ...

    async def attempt_counts(self) -> dict[AttemptOutcome, int]:
        """Attempts ever made, by outcome (a running one is `running`). Deleting attempts (the
        history kept shorter) leaves these totals as they were."""
        ...

    async def groups(self) -> list[str]:
        """Every group that names at least one task, in name order."""
        ...

    async def group_report(self, group: str) -> GroupReport:
        """A group's tasks per state (its pruned tasks counted too, from its rollup), its cost
        ledger and its dead tasks still kept."""
        ...

    async def gate_statistics(self) -> list[GateStatistics]: ...

    @property
    def records(self) -> RecordStore:
        """The records, audit rows and outbox kept beside the tasks, in the same database."""
        ...

    # -- retention (store/protocol/pruning.py)

    async def prune(self, retention: Retention, *, dry_run: bool = False) -> Pruned:
        """Remove what `retention` says is old enough and nothing needs, in batches of
        `retention.batch` rows, one transaction each; with `dry_run`, count what would go and
        write nothing. The caller holds the pruner's lease (`take_pruner`)."""
        ...

    async def take_pruner(self, holder: str, *, lease_for: float, every: float = 0.0) -> bool:
        """Hold the pruner's lease for `lease_for` seconds of the store's clock: renewed when
        `holder` holds it, taken when nobody does and the last run ended `every` seconds ago or
        more; False when another holds it, or a run is not due yet."""
        ...

    async def release_pruner(self, holder: str, *, removed: int | None = None) -> None:
        """Give the lease back; `removed`: the rows a finished run removed (None: it failed)."""
        ...

    async def pruner_state(self) -> PrunerState | None:
        """The pruner's lease row, or None before the first run."""
        ...

    # -- named leases

    async def take_lease(self, name: str, holder: str, *, lease_for: float) -> bool:
        """Hold the lease `name` for `lease_for` seconds of the store's clock: renewed when
        `holder` holds it, taken when nobody does (never taken, or run out); False when another
        holds it. One process at a time does what the name says (`metrics`: the store-wide
        figures of /metrics)."""
        ...
