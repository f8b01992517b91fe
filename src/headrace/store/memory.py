"""`memory://`: the whole state machine in one process's memory, for tests and the simulator.

It implements the same verbs with the same semantics as the SQL stores (the conformance suite
holds them to it); its time is the running event loop's clock unless a clock is given. Like
theirs, its reads behind `/metrics` and `headrace status` come from tallies kept as tasks and
attempts change (`_put`, `_start_attempt`, `_end_last_attempt`), and a task leaves through
`_forget`, which keeps them, attempt totals aside.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections import Counter, defaultdict
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import replace

from headrace.policy import fairness, ledger, poison
from headrace.policy import gate as gating
from headrace.policy.clock import Clock, LoopClock
from headrace.policy.errors import (
    ConfigError,
    ErrorClass,
    HeadraceError,
    LeaseLost,
    QueueFull,
    UnknownTask,
)
from headrace.policy.gate import GateConfig, GateState, GateStatistics
from headrace.policy.poison import Expiry
from headrace.policy.tiers import AGING_CEILING, aged_tier
from headrace.store.machine import bounds as stage_bounds
from headrace.store.machine import idempotency
from headrace.store.machine.dispatch import (
    GateBook,
    KindBudget,
    MemoryBudget,
    earliest,
    fits_claim,
    gate_key,
    takes,
    waits_for_alone,
)
from headrace.store.memory_pruning import MemoryPruning
from headrace.store.protocol.ages import AGE_SAMPLE, ReadyAges, age, ready_since
from headrace.store.protocol.records import RecordStore
from headrace.store.protocol.types import (
    ACTIVE,
    CANCELLED,
    DEFER_DELAY,
    LEASE_EXPIRED,
    POISON,
    STAGE_FULL,
    UPSTREAM_FAILED,
    Attempt,
    AttemptError,
    AttemptOutcome,
    AwaitRemote,
    ClaimResult,
    Dead,
    Failure,
    GroupReport,
    KindLimit,
    Lease,
    MemoryRoom,
    NewTask,
    Outcome,
    PollAgain,
    Retry,
    Settings,
    Sibling,
    StageStats,
    Submitted,
    Succeeded,
    TaskRecord,
    TaskState,
)


class MemoryStore(MemoryPruning):
    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__()
        self.clock = clock or LoopClock()
        self.settings = Settings()
        self.records: RecordStore = self  # its record verbs are its own
        self._configs: dict[str, GateConfig] = {}
        self._tasks: dict[int, TaskRecord] = {}
        self._ids = itertools.count(1)
        self._keys: dict[str, int] = {}
        self._digests: dict[str, str] = {}  # by key: the payload digest of the task it names
        self._dependents: dict[int, set[int]] = defaultdict(set)
        self._deps: dict[int, set[int]] = defaultdict(set)
        self._unmet: dict[int, int] = {}
        self._tickets: dict[int, dict[str, bool]] = {}  # by task: gate -> start stamped
        self._gates: dict[str, GateState] = {}
        self._flow_finish: dict[str, float] = {}  # by lane (`fairness.lane`)
        self._lanes: dict[int, str] = {}  # by task, where its lane is not its flow
        self._virtual_time = 0.0
        self._dispatches = 0
        self._served: dict[str, int] = {}
        self._attempts: dict[int, list[Attempt]] = defaultdict(list)
        # Indexes over _tasks, kept by _put. Heap entries go stale rather than being removed:
        # an entry counts only while it still describes its task.
        # Ready queues by (kind, gate key): a claim leaves out a whole queue whose gates refused
        # or whose kind has no room left in the claim.
        self._ready: dict[tuple[str, str], list[tuple[int, float, int]]] = defaultdict(list)
        self._by_state: Counter[tuple[str, TaskState]] = Counter()  # tasks by (kind, state)
        self._by_group: Counter[tuple[str, TaskState]] = Counter()  # by (group, state)
        self._dead: dict[str, set[int]] = defaultdict(set)  # dead tasks by group
        self._ready_since: dict[str, dict[int, float]] = defaultdict(dict)  # by kind, then id
        self._outcomes: Counter[AttemptOutcome] = Counter()  # attempts: never lowered by _forget
        # Waiting tasks by (kind, "stage", None), (kind, "flow", flow), (kind, "group", group).
        self._queued: Counter[tuple[str, str, str | None]] = Counter()
        self._delayed: list[tuple[float, int]] = []  # ready, but not before run_at
        self._aging: list[tuple[float, int]] = []  # ready below the aging ceiling
        self._running: set[int] = set()
        # (lease end, task) as each running lease was taken or renewed; stale ones passed over.
        self._lease_ends: list[tuple[float, int]] = []
        self._waiting: set[int] = set()
        self._ledger: dict[tuple[str, str], float] = defaultdict(float)
        self._woken = asyncio.Event()  # set when work may have become claimable
        self._lost: dict[int, tuple[str, float]] = {}  # by task: who last lost its lease, when

    # -- lifecycle

    async def open(self, settings: Settings) -> None:
        self.settings = settings
        self._configs = {config.name: config for config in settings.gates}

    async def close(self) -> None:
        return None

    async def now(self) -> float:
        return self.clock.now()

    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109
        """Return once a write made a task ready or returned a ticket since the last claim or
        wait, or after `timeout`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._woken.wait(), timeout)
        self._woken.clear()  # seen: the next wait waits for something newer

    # -- submission

    async def submit(
        self, tasks: Sequence[NewTask], *, bounds: Mapping[str, int] | None = None
    ) -> list[Submitted]:
        now = self.clock.now()
        self._check_batch(tasks, bounds or {})
        return self._create(tasks, now)

    def _check_batch(
        self, tasks: Sequence[NewTask], bounds: Mapping[str, int] | None = None
    ) -> None:
        """Refuse the batch whole (before anything changes) for an unknown gate or task, a later
        sibling, a key submitted with another payload, or a full stage (its limits, and
        `bounds` over them)."""
        for index, task in enumerate(tasks):
            for name in task.gates:
                gating.resolve(name, self._configs)
            for dep in task.after:
                if isinstance(dep, Sibling):
                    if not 0 <= dep.index < index:
                        raise ConfigError(f"task.after: sibling {dep.index} is not earlier")
                elif dep not in self._tasks:
                    raise UnknownTask(dep)
        planned = self._plan(tasks)
        limits = stage_bounds.by_kind(self.settings.stages, bounds)
        for need in stage_bounds.needs(tasks, planned, limits):
            need.check(self._queued[(need.kind, need.scope, need.label)])

    def _plan(self, tasks: Sequence[NewTask]) -> list[idempotency.Planned]:
        known = {
            task.key: idempotency.KnownKey(self._keys[task.key], self._digests.get(task.key))
            for task in tasks
            if task.key is not None and task.key in self._keys
        }
        return idempotency.plan(tasks, known)

    def _create(self, tasks: Sequence[NewTask], now: float) -> list[Submitted]:
        results: list[Submitted] = []
        for task, step in zip(tasks, self._plan(tasks), strict=True):
            if step is not None:
                results.append(idempotency.reused(step, results))
                continue
            after = [results[d.index].id if isinstance(d, Sibling) else d for d in task.after]
            results.append(Submitted(self._insert(task, after, now), created=True))
        return results

    def _insert(self, task: NewTask, after: list[int], now: float) -> int:
        task_id = next(self._ids)
        tagged = fairness.tag(
            self._virtual_time, self._flow_finish.get(task.lane, 0.0), task.weight, task.continues
        )
        self._flow_finish[task.lane] = tagged.flow_finish
        if task.lane != task.flow:
            self._lanes[task_id] = task.lane
        unmet = {d for d in after if self._tasks[d].state is not TaskState.SUCCEEDED}
        failed = any(self._tasks[d].state in (TaskState.DEAD, TaskState.CANCELLED) for d in unmet)
        state = TaskState.PENDING if unmet else TaskState.READY
        record = TaskRecord(
            id=task_id,
            kind=task.kind,
            ref=task.ref,
            gates=tuple(task.gates),
            flow=task.flow,
            group=task.group,
            tier=task.tier,
            submitted_tier=task.tier,
            cost=task.cost,
            key=task.key,
            state=state,
            attempt=0,
            max_attempts=task.max_attempts,
            tag=tagged.start,
            created_at=now,
            run_at=now + task.delay,
            ready_since=None if unmet else ready_since(now, now + task.delay),
            memory=task.memory,
        )
        self._put(record)
        if task.key:
            self._keys[task.key] = task_id
            self._digests[task.key] = idempotency.payload_digest(task, after)
        for dep in unmet:
            self._dependents[dep].add(task_id)
            self._deps[task_id].add(dep)
        self._unmet[task_id] = len(unmet)
        if failed:
            self._cancel_tree(task_id, now, UPSTREAM_FAILED)
        return task_id

    # -- the task table and its indexes

    def _put(self, record: TaskRecord) -> None:
        old = self._tasks.get(record.id)
        self._tasks[record.id] = record
        if old is not None:
            self._tally(old, -1)
        self._tally(record, 1)
        for index, state in (
            (self._running, TaskState.RUNNING),
            (self._waiting, TaskState.WAITING),
        ):
            if record.state is state:
                index.add(record.id)
            else:
                index.discard(record.id)
        leased = record.state is TaskState.RUNNING and record.lease_until is not None
        if leased and (old is None or old.lease_until != record.lease_until):
            heapq.heappush(self._lease_ends, (record.lease_until or 0.0, record.id))
        if record.state is TaskState.READY and (
            old is None
            or old.state is not TaskState.READY
            or (old.tier, old.run_at) != (record.tier, record.run_at)
        ):
            self._enqueue(record)
            self._woken.set()

    def _tally(self, task: TaskRecord, step: int) -> None:
        """Count a task in (1) or out of (-1) the tallies and the indexes the reads use."""
        self._by_state[(task.kind, task.state)] += step
        self._count_waiting(task, step)
        if task.group is not None:
            self._by_group[(task.group, task.state)] += step
        if task.group is not None and task.state is TaskState.DEAD:
            _index(self._dead[task.group], task.id, step)
        if task.state is TaskState.READY:
            since = task.ready_since if task.ready_since is not None else task.created_at
            ready = self._ready_since[task.kind]
            if step > 0:
                ready[task.id] = since
            else:
                ready.pop(task.id, None)

    def _forget(self, task_ids: Collection[int]) -> None:
        """Delete finished tasks with their attempts, dependency edges and keys (retention), as
        the SQL stores' triggers see a DELETE: out of every tally but the attempt totals."""
        for task_id in task_ids:
            task = self._tasks[task_id]
            if not task.state.terminal:
                raise ConfigError(f"task {task_id} has no outcome yet: it cannot be forgotten")
        for task_id in task_ids:
            task = self._tasks.pop(task_id)
            self._tally(task, -1)
            self._attempts.pop(task_id, None)
            for dep in self._deps.pop(task_id, set()):
                self._dependents[dep].discard(task_id)
            for dependent in self._dependents.pop(task_id, set()):
                self._deps[dependent].discard(task_id)
            if task.key is not None and self._keys.get(task.key) == task_id:
                del self._keys[task.key]
                self._digests.pop(task.key, None)
            for index in (self._lanes, self._unmet, self._lost, self._tickets):
                index.pop(task_id, None)

    def _count_waiting(self, task: TaskRecord, step: int) -> None:
        """Keep what stage limits count: waiting tasks by kind, and by kind and flow or group."""
        if task.state in (TaskState.PENDING, TaskState.READY):
            self._queued[(task.kind, "stage", None)] += step
            self._queued[(task.kind, "flow", task.flow)] += step
            self._queued[(task.kind, "group", task.group)] += step

    def _enqueue(self, task: TaskRecord) -> None:
        if task.run_at > self.clock.now():
            heapq.heappush(self._delayed, (task.run_at, task.id))
        else:
            heapq.heappush(self._ready[_queue_of(task)], _entry(task))
        if task.tier > AGING_CEILING and task.ready_since is not None:
            heapq.heappush(self._aging, (task.ready_since, task.id))

    def _ready_task(self, task_id: int) -> TaskRecord | None:
        """The task, if it is ready (a heap entry may name one since gone: `_forget`)."""
        task = self._tasks.get(task_id)
        return task if task is not None and task.state is TaskState.READY else None

    def _is_queued(self, entry: tuple[int, float, int]) -> bool:
        task = self._ready_task(entry[2])
        return task is not None and _entry(task) == entry

    def _due(self, now: float) -> None:
        """Move retries whose run_at has come into the ready queues."""
        while self._delayed and self._delayed[0][0] <= now:
            _, task_id = heapq.heappop(self._delayed)
            task = self._ready_task(task_id)
            if task is not None and task.run_at <= now:
                heapq.heappush(self._ready[_queue_of(task)], _entry(task))

    # -- claiming

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
        results = tuple(await self.finish_many(finished)) if finished else ()
        self._woken.clear()  # this claim sees everything written before it
        now = self.clock.now()
        self._reap(now)
        self._age(now)
        self._due(now)
        book = GateBook(self._configs, self._gate_state, now)
        held = self._backpressure()
        budget = KindBudget([*within, *held.values()])
        charge = MemoryBudget(memory)
        held_back = stage_bounds.holding_back(held)
        leases: list[Lease] = []
        solo_waiting = False
        popped: list[tuple[tuple[str, str], tuple[int, float, int]]] = []
        ordered = fairness.take_turns(
            self._candidates(kinds, book.refused_keys, popped, budget),
            rank=lambda t: (t.tier, t.tag),
            flow=lambda t: t.flow,
            last_served=lambda name: self._served.get(name, 0),
            lane=self._lane,
        )
        for task in ordered:
            if len(leases) >= limit + ahead:
                break
            taken = len(leases)
            wanted = takes(task, taken, limit, ahead)
            solo_waiting = solo_waiting or (wanted and waits_for_alone(task, taken, alone))
            if not wanted or not fits_claim(task, taken, alone):
                continue
            if not budget.fits(task.kind) or not charge.fits(task.memory):
                continue
            if gate_key(task.gates) in book.refused_keys or not book.admit(task.gates):
                continue
            budget.take(task.kind)
            charge.take(task.memory)
            leases.append(self._lease(task, worker, now, lease_for))
            if task.kind in held_back:
                self._woken.set()  # room downstream: claims backpressure held back may go on
            if task.solo:
                break
        for key, entry in popped:  # what was looked at but not leased goes back in line
            if self._is_queued(entry):
                heapq.heappush(self._ready[key], entry)
        self._gates.update({name: book.states[name] for name in book.changed})
        wake_at = earliest(book.wake_at(), self._next_run_at())
        return ClaimResult(tuple(leases), now, wake_at, finished=results, solo_waiting=solo_waiting)

    def _backpressure(self) -> dict[str, KindLimit]:
        counted = set(stage_bounds.counted_kinds(self.settings.stages))
        if not counted:
            return {}
        queued: Counter[str] = Counter()
        active: Counter[str] = Counter()
        for kind in counted:
            for state in (TaskState.PENDING, TaskState.READY):
                queued[kind] += self._by_state[(kind, state)]
            for state in (TaskState.RUNNING, TaskState.WAITING):
                active[kind] += self._by_state[(kind, state)]
        return stage_bounds.backpressure(self.settings.stages, queued, active)

    def _gate_state(self, name: str) -> GateState:
        return self._gates.get(name, GateState())

    def _candidates(
        self,
        kinds: Collection[str] | None,
        refused: set[str],
        popped: list[tuple[tuple[str, str], tuple[int, float, int]]],
        budget: KindBudget,
    ) -> Iterator[TaskRecord]:
        """Ready tasks in (tier, tag, id) order: a merge of the per-(kind, gate key) queues that
        stops drawing from a queue once its gates refused (every task in it would be refused
        too) or its kind has no room left in the claim, and leaves out kinds not asked for."""
        heads = [
            (queue[0], key)
            for key, queue in self._ready.items()
            if queue and (kinds is None or key[0] in kinds)
        ]
        heapq.heapify(heads)
        seen: set[int] = set()  # a task can be queued twice (a retry that also aged): once here
        while heads:
            entry, key = heapq.heappop(heads)
            queue = self._ready[key]
            heapq.heappop(queue)
            if not self._is_queued(entry) or entry[2] in seen:
                if queue:
                    heapq.heappush(heads, (queue[0], key))
                continue
            seen.add(entry[2])
            popped.append((key, entry))
            yield self._tasks[entry[2]]
            if queue and key[1] not in refused and budget.fits(key[0]):
                heapq.heappush(heads, (queue[0], key))

    def _next_run_at(self) -> float | None:
        while self._delayed and self._ready_task(self._delayed[0][1]) is None:
            heapq.heappop(self._delayed)
        return self._delayed[0][0] if self._delayed else None

    def _is_ready(self, task_id: int) -> bool:
        task = self._tasks.get(task_id)
        return task is not None and task.state is TaskState.READY

    def _lane(self, task: TaskRecord) -> str:
        return self._lanes.get(task.id, task.flow)

    def _lease(self, task: TaskRecord, worker: str, now: float, lease_for: float) -> Lease:
        self._virtual_time = fairness.advance(self._virtual_time, task.tag)
        self._dispatches += 1
        self._served[self._lane(task)] = self._dispatches
        self._tickets[task.id] = {name: not self._rated(name) for name in task.gates}
        number = task.attempt + 1
        record = replace(
            task,
            state=TaskState.RUNNING,
            attempt=number,
            worker=worker,
            lease_until=now + lease_for,
            lease_token=task.lease_token + 1,
        )
        self._put(record)
        self._start_attempt(Attempt(task.id, number, worker, now))
        return Lease(record, record.lease_token, now + lease_for)

    def _start_attempt(self, attempt: Attempt) -> None:
        self._attempts[attempt.task_id].append(attempt)
        self._outcomes[attempt.outcome] += 1

    def _end_last_attempt(
        self, task_id: int, now: float, outcome: AttemptOutcome, error: AttemptError | None
    ) -> None:
        history = self._attempts[task_id]
        self._outcomes[history[-1].outcome] -= 1
        history[-1] = _ended(history[-1], now, outcome, error)
        self._outcomes[outcome] += 1

    def _age(self, now: float) -> None:
        step = self.settings.aging_step
        while self._aging and step > 0 and self._aging[0][0] <= now - step:
            _, task_id = heapq.heappop(self._aging)
            task = self._ready_task(task_id)
            if task is None or task.ready_since is None:
                continue
            tier = aged_tier(task.tier, now - task.ready_since, step)
            if tier != task.tier:
                self._put(replace(task, tier=tier, promoted_at=now))

    async def claim_polls(
        self, worker: str, limit: int, *, lease_for: float, kinds: Collection[str] | None = None
    ) -> ClaimResult:
        now = self.clock.now()
        waiting = [self._tasks[task_id] for task_id in self._waiting]
        due = sorted(
            (
                t
                for t in waiting
                if t.run_at <= now
                and (t.lease_until is None or t.lease_until <= now)
                and (kinds is None or t.kind in kinds)
            ),
            key=lambda t: (t.run_at, t.id),
        )[:limit]
        leases = []
        for task in due:
            record = replace(
                task, worker=worker, lease_until=now + lease_for, lease_token=task.lease_token + 1
            )
            self._put(record)
            leases.append(Lease(record, record.lease_token, now + lease_for))
        later = [t.run_at for t in waiting if t.run_at > now]
        return ClaimResult(tuple(leases), now, min(later, default=None))

    async def wake_remote(self, remote_id: str) -> int:
        now, woken = self.clock.now(), 0
        for task_id in list(self._waiting):
            task = self._tasks[task_id]
            held = task.lease_until is not None and task.lease_until > now
            if task.remote_id == remote_id and task.run_at > now and not held:
                self._put(replace(task, run_at=now))
                woken += 1
        if woken:
            self._woken.set()
        return woken

    # -- lease holders

    async def renew(self, leases: Sequence[Lease], *, lease_for: float) -> list[Lease | None]:
        now = self.clock.now()
        renewed: list[Lease | None] = []
        for lease in leases:
            task = self._tasks.get(lease.task_id)
            if task is None or not self._holds(task, lease, now):
                renewed.append(None)
                continue
            record = replace(task, lease_until=now + lease_for)
            self._put(record)
            renewed.append(Lease(record, lease.token, now + lease_for))
        return renewed

    @staticmethod
    def _holds(task: TaskRecord, lease: Lease, now: float) -> bool:
        return (
            task.state in (TaskState.RUNNING, TaskState.WAITING)
            and task.lease_token == lease.token
            and task.lease_until is not None
            and task.lease_until > now
        )

    async def start(self, lease: Lease, gates: Collection[str] | None = None) -> None:
        now = self.clock.now()
        task = self._tasks.get(lease.task_id)
        if task is None or not self._holds(task, lease, now):
            raise LeaseLost(lease.task_id)
        self._stamp_starts(task.id, now, gates)

    async def fence(self, lease: Lease) -> None:
        task = self._tasks.get(lease.task_id)
        if task is None or not self._holds(task, lease, self.clock.now()):
            raise LeaseLost(lease.task_id)

    async def finish(self, lease: Lease, outcome: Outcome) -> None:
        now = self.clock.now()
        task = self._tasks.get(lease.task_id)
        if task is None or not self._holds(task, lease, now):
            raise LeaseLost(lease.task_id)
        if isinstance(outcome, PollAgain):
            if task.state is not TaskState.WAITING:
                raise ConfigError("PollAgain: only a waiting task can be polled again")
            code = outcome.code or task.error_code
            self._put(
                replace(
                    task, run_at=now + outcome.delay, lease_until=None, worker=None, error_code=code
                )
            )
            return
        if task.state is TaskState.WAITING and isinstance(outcome, AwaitRemote):
            raise ConfigError("AwaitRemote: the task is already waiting on a remote job")
        if isinstance(outcome, Succeeded):
            try:  # refused whole, before anything changes
                self._check_batch(outcome.successors)
            except QueueFull as full:
                self._defer(task, full, now)
                return
        self._apply(task, outcome, now)

    def _defer(self, task: TaskRecord, full: QueueFull, now: float) -> None:
        """Successors a full stage has no room for: the task is ready again, its attempt not
        counted (a waiting one is polled again: its remote job is not submitted twice)."""
        if task.state is TaskState.WAITING:
            self._put(
                replace(
                    task,
                    run_at=now + DEFER_DELAY,
                    lease_until=None,
                    worker=None,
                    error_code=STAGE_FULL,
                )
            )
            return
        error = AttemptError.of(ErrorClass.TRANSIENT, STAGE_FULL, str(full))
        self._end_attempt(task, now, AttemptOutcome.DEFERRED, error)
        self._release(task.id, now)
        self._put(
            replace(
                task,
                state=TaskState.READY,
                run_at=now + DEFER_DELAY,
                ready_since=ready_since(now, now + DEFER_DELAY),
                worker=None,
                lease_until=None,
                error_code=STAGE_FULL,
                attempt_base=task.attempt_base + 1,
            )
        )

    async def finish_many(
        self, outcomes: Sequence[tuple[Lease, Outcome]]
    ) -> list[HeadraceError | None]:
        results: list[HeadraceError | None] = []
        for lease, outcome in outcomes:
            try:
                await self.finish(lease, outcome)
            except HeadraceError as error:
                results.append(error)
            else:
                results.append(None)
        return results

    def _apply(self, task: TaskRecord, outcome: Outcome, now: float) -> None:
        if isinstance(outcome, Succeeded):
            self._succeed(task, outcome, now)
        elif isinstance(outcome, Retry):
            task = _settled(task)
            self._penalize(outcome.penalize, now)
            self._end_attempt(task, now, AttemptOutcome.RETRY, outcome.error)
            self._release(task.id, now)
            self._put(
                replace(
                    task,
                    state=TaskState.READY,
                    run_at=now + outcome.delay,
                    ready_since=ready_since(now, now + outcome.delay),
                    worker=None,
                    lease_until=None,
                    remote_id=None,
                    poll_every=None,
                    remote_deadline=None,
                    error_code=outcome.error.code,
                    attempt_base=task.attempt_base + (not outcome.counted),
                )
            )
        elif isinstance(outcome, Dead):
            task = _settled(task)
            self._penalize(outcome.penalize, now)
            self._end_attempt(task, now, AttemptOutcome.DEAD, outcome.error)
            self._bury(task, now, outcome.error.code)
        elif isinstance(outcome, AwaitRemote):
            self._end_attempt(task, now, AttemptOutcome.WAITING, None)
            self._stamp_starts(task.id, now)  # the job was submitted: counted from now at latest
            deadline = now + outcome.timeout if outcome.timeout is not None else None
            self._put(
                replace(
                    task,
                    state=TaskState.WAITING,
                    remote_id=outcome.remote_id,
                    poll_every=outcome.poll_every,
                    remote_deadline=deadline,
                    run_at=now + outcome.poll_every,
                    worker=None,
                    lease_until=None,
                )
            )

    def _succeed(self, task: TaskRecord, outcome: Succeeded, now: float) -> None:
        if task.state is TaskState.RUNNING:
            self._end_attempt(task, now, AttemptOutcome.SUCCEEDED, None)
        else:
            self._close_remote_attempt(task, now, AttemptOutcome.SUCCEEDED, None)
        self._release(task.id, now)
        self._put(
            replace(
                task, state=TaskState.SUCCEEDED, finished_at=now, lease_until=None, error_code=None
            )
        )
        self._ledger[(task.group or "", task.kind)] += ledger.units_spent(task.cost, outcome.cost)
        self._create(outcome.successors, now)
        for dependent in sorted(self._dependents.pop(task.id, set())):
            self._unmet[dependent] -= 1
            record = self._tasks[dependent]
            if self._unmet[dependent] == 0 and record.state is TaskState.PENDING:
                since = ready_since(now, record.run_at)
                self._put(replace(record, state=TaskState.READY, ready_since=since))

    def _bury(self, task: TaskRecord, now: float, code: str) -> None:
        self._release(task.id, now)
        self._put(
            replace(
                task,
                state=TaskState.DEAD,
                finished_at=now,
                worker=None,
                lease_until=None,
                error_code=code,
            )
        )
        for dependent in sorted(self._dependents.get(task.id, set())):
            self._cancel_tree(dependent, now, UPSTREAM_FAILED)

    def _end_attempt(
        self, task: TaskRecord, now: float, outcome: AttemptOutcome, error: AttemptError | None
    ) -> None:
        if task.state is TaskState.WAITING:
            self._close_remote_attempt(task, now, outcome, error)
            return
        self._end_last_attempt(task.id, now, outcome, error)

    def _close_remote_attempt(
        self, task: TaskRecord, now: float, outcome: AttemptOutcome, error: AttemptError | None
    ) -> None:
        history = self._attempts[task.id]
        if history and history[-1].outcome is AttemptOutcome.WAITING:
            self._end_last_attempt(task.id, now, outcome, error)

    def _rated(self, name: str) -> bool:
        return gating.resolve(name, self._configs).rate is not None

    def _stamp_starts(self, task_id: int, now: float, gates: Collection[str] | None = None) -> None:
        tickets = self._tickets.get(task_id, {})
        for name, started in sorted(tickets.items()):
            if started or (gates is not None and name not in gates):
                continue
            config = gating.find(name, self._configs)
            self._gates[name] = gating.start(config, self._gate_state(name), now)
            tickets[name] = True

    def _release(self, task_id: int, now: float) -> None:
        self._stamp_starts(task_id, now)  # never stamped: counts from the outcome
        for name in self._tickets.pop(task_id, {}):
            self._gates[name] = gating.release(self._gate_state(name))
            self._woken.set()  # a ticket back: a task its gate refused may go now

    def _penalize(self, names: Sequence[str], now: float) -> None:
        for name in names:
            config = gating.resolve(name, self._configs)
            self._gates[name] = gating.penalize(config, self._gate_state(name), now)

    # -- cancellation and reaping

    async def cancel(self, task_id: int) -> bool:
        task = self._tasks.get(task_id)
        if task is None:
            raise UnknownTask(task_id)
        if task.state.terminal:
            return False
        self._cancel_tree(task_id, self.clock.now(), CANCELLED)
        return True

    def _cancel_tree(self, task_id: int, now: float, code: str) -> None:
        task = self._tasks[task_id]
        if task.state.terminal:
            return
        if task.state in (TaskState.RUNNING, TaskState.WAITING):
            self._close_remote_attempt(task, now, AttemptOutcome.CANCELLED, None)
            if task.state is TaskState.RUNNING:
                self._end_last_attempt(task_id, now, AttemptOutcome.CANCELLED, None)
        self._release(task_id, now)
        self._put(
            replace(
                task,
                state=TaskState.CANCELLED,
                finished_at=now,
                worker=None,
                lease_until=None,
                error_code=code,
            )
        )
        for dependent in sorted(self._dependents.get(task_id, set())):
            self._cancel_tree(dependent, now, UPSTREAM_FAILED)

    async def redrive(
        self,
        *,
        task_ids: Collection[int] | None = None,
        group: str | None = None,
        kind: str | None = None,
    ) -> list[int]:
        now = self.clock.now()
        wanted = set(task_ids) if task_ids is not None else None
        chosen = [
            t
            for t in self._tasks.values()
            if t.state is TaskState.DEAD
            and (wanted is None or t.id in wanted)
            and (group is None or t.group == group)
            and (kind is None or t.kind == kind)
        ]
        for task in chosen:
            self._put(
                replace(
                    task,
                    state=TaskState.READY,
                    run_at=now,
                    ready_since=ready_since(now, now),
                    attempt_base=task.attempt,
                    expiries=0,
                    solo=False,
                    error_code=None,
                    finished_at=None,
                )
            )
            self._restore_dependents(task.id)
        return [t.id for t in chosen]

    def _restore_dependents(self, task_id: int) -> None:
        """Tasks cancelled only because they waited on `task_id` wait again."""
        for dependent in sorted(self._dependents.get(task_id, set())):
            record = self._tasks[dependent]
            cancelled_for_it = (
                record.state is TaskState.CANCELLED and record.error_code == UPSTREAM_FAILED
            )
            failed = (TaskState.DEAD, TaskState.CANCELLED)
            if cancelled_for_it and all(
                self._tasks[dep].state not in failed for dep in self._deps[dependent]
            ):
                self._put(
                    replace(record, state=TaskState.PENDING, finished_at=None, error_code=None)
                )
                self._restore_dependents(dependent)

    async def reap(self) -> int:
        return self._reap(self.clock.now())

    def _reap(self, now: float) -> int:
        found: dict[int, TaskRecord] = {}
        ends = self._lease_ends
        while ends and ends[0][0] <= now:
            until, task_id = heapq.heappop(ends)
            # An entry outlived by a renewal or by the attempt's end is passed over.
            if task_id in self._running and self._tasks[task_id].lease_until == until:
                found[task_id] = self._tasks[task_id]
        expired = [found[task_id] for task_id in sorted(found)]
        for task in expired:
            self._expire(task, now)
        return len(expired)

    def _expire(self, task: TaskRecord, now: float) -> None:
        error = AttemptError.of(ErrorClass.TRANSIENT, LEASE_EXPIRED, "worker lost its lease")
        self._end_last_attempt(task.id, now, AttemptOutcome.LEASE_EXPIRED, error)
        history = self._attempts[task.id]
        # Its worker's other tasks still running, or lost after this attempt began: it died
        # beside them (a worker's name may be reused by a later process: older losses do not
        # count).
        worker, began = task.worker or "", history[-1].started_at
        beside = sum(
            1 for i, (by, at) in self._lost.items() if i != task.id and by == worker and at > began
        ) + sum(1 for i in self._running if i != task.id and self._tasks[i].worker == worker)
        self._lost[task.id] = (worker, now)
        task = replace(task, expiries=task.expiries + 1)
        found = poison.verdict(
            alone=not beside,
            expiries=task.expiries,
            poison_expiries=self.settings.poison_expiries,
            attempts_used=task.attempts_used,
            max_attempts=task.max_attempts,
        )
        if found in (Expiry.POISON, Expiry.SPENT):
            self._bury(task, now, POISON if found is Expiry.POISON else LEASE_EXPIRED)
            return
        if found is Expiry.SOLO:  # the lost attempt does not count against the budget
            task = replace(task, solo=True, attempt_base=task.attempt_base + 1)
        self._release(task.id, now)
        self._put(
            replace(
                task,
                state=TaskState.READY,
                run_at=now,
                ready_since=ready_since(now, now),
                worker=None,
                lease_until=None,
                error_code=LEASE_EXPIRED,
            )
        )

    # -- reading

    async def get(self, task_id: int) -> TaskRecord:
        task = self._tasks.get(task_id)
        if task is None:
            raise UnknownTask(task_id)
        return task

    async def find(self, key: str) -> TaskRecord | None:
        task_id = self._keys.get(key)
        return self._tasks[task_id] if task_id is not None else None

    async def tasks(
        self,
        *,
        group: str | None = None,
        state: TaskState | None = None,
        kind: str | None = None,
        limit: int = 1000,
    ) -> list[TaskRecord]:
        found = (
            t
            for t in self._tasks.values()
            if (group is None or t.group == group)
            and (state is None or t.state is state)
            and (kind is None or t.kind == kind)
        )
        return list(itertools.islice(found, limit))

    async def attempts(self, task_id: int) -> list[Attempt]:
        if task_id not in self._tasks:
            raise UnknownTask(task_id)
        return list(self._attempts.get(task_id, ()))

    async def counts(self, *, kinds: Collection[str] | None = None) -> dict[TaskState, int]:
        counts = dict.fromkeys(TaskState, 0)
        for (kind, state), n in self._by_state.items():
            if kinds is None or kind in kinds:
                counts[state] += n
        return counts

    async def stages(self, *, kinds: Collection[str] | None = None) -> list[StageStats]:
        now = self.clock.now()
        counts: dict[str, dict[TaskState, int]] = {}
        for (kind, state), n in self._by_state.items():
            if n and state in ACTIVE and (kinds is None or kind in kinds):
                counts.setdefault(kind, dict.fromkeys(ACTIVE, 0))[state] = n
        return [
            StageStats(
                kind,
                pending=by_state[TaskState.PENDING],
                ready=by_state[TaskState.READY],
                running=by_state[TaskState.RUNNING],
                waiting=by_state[TaskState.WAITING],
                oldest_ready_age=self._oldest_ready_age(kind, now),
            )
            for kind, by_state in sorted(counts.items())
        ]

    def _oldest_ready_age(self, kind: str, now: float) -> float | None:
        ready = self._ready_since.get(kind)
        return age(now, min(ready.values())) if ready else None

    async def ready_ages(
        self, *, kinds: Collection[str] | None = None, sample: int = AGE_SAMPLE
    ) -> dict[str, ReadyAges]:
        now = self.clock.now()
        ages: dict[str, ReadyAges] = {}
        for kind, ready in sorted(self._ready_since.items()):
            if not ready or (kinds is not None and kind not in kinds):
                continue
            queue = [(since, task_id) for task_id, since in ready.items()]
            oldest = heapq.nsmallest(sample, queue)
            newest = heapq.nlargest(max(0, min(sample, len(queue) - sample)), queue)
            ages[kind] = ReadyAges(
                len(queue),
                tuple(age(now, since) for since, _ in oldest),
                tuple(age(now, since) for since, _ in reversed(newest)),
            )
        return ages

    async def attempt_counts(self) -> dict[AttemptOutcome, int]:
        return {outcome: n for outcome, n in self._outcomes.items() if n}

    async def groups(self) -> list[str]:
        tallied = {group for (group, _), n in self._by_group.items() if n}
        return sorted(tallied | {group for (group, _), n in self._rollup.items() if n})

    async def group_report(self, group: str) -> GroupReport:
        by_state = {state: self._by_group[(group, state)] for state in TaskState}
        for state, pruned in self._rolled_up(group).items():
            by_state[state] += pruned
        cost = {kind: units for (g, kind), units in self._ledger.items() if g == group}
        failures = tuple(
            Failure(t.id, t.kind, t.ref, t.error_code, t.attempt)
            for t in (self._tasks[task_id] for task_id in sorted(self._dead.get(group, ())))
        )
        total = sum(by_state.values())
        return GroupReport(group, total, by_state, dict(sorted(cost.items())), failures)

    async def gate_statistics(self) -> list[GateStatistics]:
        now = self.clock.now()
        stats = []
        for name, state in sorted(self._gates.items()):
            config = gating.find(name, self._configs) or GateConfig(name)
            declared = gating.declared_as(name, self._configs)
            stats.append(gating.statistics(config, state, now, declared))
        return stats

    def active(self) -> int:
        return sum(n for (_, state), n in self._by_state.items() if state in ACTIVE)


def _settled(task: TaskRecord) -> TaskRecord:
    """A waiting task whose remote job ended in failure: a new job will be a new one."""
    if task.state is not TaskState.WAITING:
        return task
    return replace(task, remote_jobs=task.remote_jobs + 1)


def _index(members: set[int], task_id: int, step: int) -> None:
    if step > 0:
        members.add(task_id)
    else:
        members.discard(task_id)


def _queue_of(task: TaskRecord) -> tuple[str, str]:
    return (task.kind, gate_key(task.gates))


def _entry(task: TaskRecord) -> tuple[int, float, int]:
    return (int(task.tier), task.tag, task.id)


def _ended(
    attempt: Attempt, now: float, outcome: AttemptOutcome, error: AttemptError | None
) -> Attempt:
    return replace(
        attempt,
        ended_at=now,
        outcome=outcome,
        error_class=error.error_class if error else None,
        code=error.code if error else None,
        message=error.message if error else None,
    )


__all__ = ["MemoryStore"]
