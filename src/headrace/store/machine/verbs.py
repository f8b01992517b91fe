"""The `Store` verbs of the SQL stores, each one transaction of the state machine
(`store/machine/`), or for pruning one transaction a batch: written once for SQLite and
PostgreSQL, which differ only in how they run a transaction (`_write`, `_read`) and in their
claims."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Protocol, TypeVar

from headrace.policy.errors import HeadraceError
from headrace.policy.gate import GateStatistics
from headrace.policy.retention import Retention
from headrace.store.machine import Transaction, plans, reads
from headrace.store.machine import claim as claim_steps
from headrace.store.machine import outcomes as outcome_steps
from headrace.store.machine import pruning as prune_steps
from headrace.store.machine import submit as submit_steps
from headrace.store.machine import tickets as ticket_steps
from headrace.store.machine.plans import Batch, Mark
from headrace.store.protocol.ages import AGE_SAMPLE, ReadyAges
from headrace.store.protocol.pruning import Pruned, PrunerState
from headrace.store.protocol.types import (
    Attempt,
    AttemptOutcome,
    ClaimResult,
    GroupReport,
    Lease,
    NewTask,
    Outcome,
    StageStats,
    Submitted,
    TaskRecord,
    TaskState,
)

T = TypeVar("T")
Verb = Callable[[Transaction], Awaitable[T]]


class Transacts(Protocol):
    """A store that runs a machine step as one transaction. `clock_first=False`: the step reads
    the store's clock itself, once it holds its rows (a store that serialises writers may read
    it first anyway)."""

    async def _write(self, verb: Verb[T], *, clock_first: bool = True) -> T: ...

    async def _read(self, verb: Verb[T]) -> T: ...


class TaskVerbs:
    """The `Store` verbs of a store that `Transacts`, each one transaction (a prune: one a
    batch); the store's class is built on it."""

    # -- submission

    async def submit(
        self: Transacts, tasks: Sequence[NewTask], *, bounds: Mapping[str, int] | None = None
    ) -> list[Submitted]:
        batch, limits = tuple(tasks), dict(bounds or {})
        return await self._write(
            lambda tx: submit_steps.submit(tx, batch, limits), clock_first=False
        )

    async def claim_polls(
        self: Transacts,
        worker: str,
        limit: int,
        *,
        lease_for: float,
        kinds: Collection[str] | None = None,
    ) -> ClaimResult:
        wanted = kinds_list(kinds)
        return await self._write(
            lambda tx: claim_steps.claim_polls(tx, worker, limit, lease_for, wanted)
        )

    # -- lease holders

    async def renew(
        self: Transacts, leases: Sequence[Lease], *, lease_for: float
    ) -> list[Lease | None]:
        held = tuple(leases)
        return await self._write(lambda tx: outcome_steps.renew(tx, held, lease_for))

    async def start(self: Transacts, lease: Lease, gates: Collection[str] | None = None) -> None:
        chosen = None if gates is None else frozenset(gates)
        await self._write(lambda tx: ticket_steps.start(tx, lease, chosen), clock_first=False)

    async def fence(self: Transacts, lease: Lease) -> None:
        await self._read(lambda tx: ticket_steps.fence(tx, lease))

    async def finish(self: Transacts, lease: Lease, outcome: Outcome) -> None:
        await self._write(lambda tx: outcome_steps.finish(tx, lease, outcome), clock_first=False)

    async def finish_many(
        self: Transacts, outcomes: Sequence[tuple[Lease, Outcome]]
    ) -> list[HeadraceError | None]:
        batch = tuple(outcomes)
        return await self._write(lambda tx: outcome_steps.finish_many(tx, batch), clock_first=False)

    # -- cancellation and reaping

    async def cancel(self: Transacts, task_id: int) -> bool:
        return await self._write(lambda tx: outcome_steps.cancel(tx, task_id))

    async def redrive(
        self: Transacts,
        *,
        task_ids: Collection[int] | None = None,
        group: str | None = None,
        kind: str | None = None,
    ) -> list[int]:
        ids = None if task_ids is None else sorted(task_ids)
        return await self._write(lambda tx: outcome_steps.redrive(tx, ids, group, kind))

    async def wake_remote(self: Transacts, remote_id: str) -> int:
        return await self._write(lambda tx: outcome_steps.wake_remote(tx, remote_id))

    async def reap(self: Transacts) -> int:
        return await self._write(lambda tx: outcome_steps.reap(tx))

    # -- reading

    async def get(self: Transacts, task_id: int) -> TaskRecord:
        return await self._read(lambda tx: tx.task(task_id))

    async def find(self: Transacts, key: str) -> TaskRecord | None:
        return await self._read(lambda tx: reads.find(tx, key))

    async def tasks(
        self: Transacts,
        *,
        group: str | None = None,
        state: TaskState | None = None,
        kind: str | None = None,
        limit: int = 1000,
    ) -> list[TaskRecord]:
        return await self._read(lambda tx: reads.tasks(tx, group, state, kind, limit))

    async def attempts(self: Transacts, task_id: int) -> list[Attempt]:
        return await self._read(lambda tx: reads.attempts(tx, task_id))

    async def counts(
        self: Transacts, *, kinds: Collection[str] | None = None
    ) -> dict[TaskState, int]:
        return await self._read(lambda tx: reads.counts(tx, kinds_list(kinds)))

    async def stages(self: Transacts, *, kinds: Collection[str] | None = None) -> list[StageStats]:
        return await self._read(lambda tx: reads.stages(tx, kinds_list(kinds)))

    async def ready_ages(
        self: Transacts, *, kinds: Collection[str] | None = None, sample: int = AGE_SAMPLE
    ) -> dict[str, ReadyAges]:
        return await self._read(lambda tx: reads.ready_ages(tx, kinds_list(kinds), sample))

    async def attempt_counts(self: Transacts) -> dict[AttemptOutcome, int]:
        return await self._read(lambda tx: reads.attempt_counts(tx))

    async def groups(self: Transacts) -> list[str]:
        return await self._read(lambda tx: reads.groups(tx))

    async def group_report(self: Transacts, group: str) -> GroupReport:
        return await self._read(lambda tx: reads.group_report(tx, group))

    async def gate_statistics(self: Transacts) -> list[GateStatistics]:
        return await self._read(lambda tx: reads.gate_statistics(tx))

    # -- retention (store/machine/plans.py): a run is a batch per transaction; a dry run reads
    # the same candidates and writes nothing

    async def prune(self: Transacts, retention: Retention, *, dry_run: bool = False) -> Pruned:
        batches: list[Batch] = []
        for plan in plans.plans(retention):
            mark, done = Mark(), False
            while not done:
                step = functools.partial(_prune_step, plan, mark, retention.batch, dry_run)
                batch = await (self._read(step) if dry_run else self._write(step))
                batches.append(batch)
                mark, done = batch.mark, batch.done
        return plans.tally(batches)

    async def take_pruner(
        self: Transacts, holder: str, *, lease_for: float, every: float = 0.0
    ) -> bool:
        return await self._write(lambda tx: prune_steps.take_pruner(tx, holder, lease_for, every))

    async def release_pruner(self: Transacts, holder: str, *, removed: int | None = None) -> None:
        await self._write(lambda tx: prune_steps.release_pruner(tx, holder, removed))

    async def pruner_state(self: Transacts) -> PrunerState | None:
        return await self._read(lambda tx: prune_steps.pruner_state(tx))

    async def take_lease(self: Transacts, name: str, holder: str, *, lease_for: float) -> bool:
        return await self._write(lambda tx: prune_steps.take_lease(tx, name, holder, lease_for))


async def _prune_step(
    plan: plans.Plan, after: Mark, limit: int, dry_run: bool, tx: Transaction
) -> Batch:
    return await prune_steps.prune_batch(tx, plan, after, limit, dry_run)


def kinds_list(kinds: Collection[str] | None) -> list[str] | None:
    return None if kinds is None else sorted(kinds)
