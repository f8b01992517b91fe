"""The store against a model: Hypothesis drives one store through random sequences of verbs.

After every step the store is read back (every task, gate statistics, idempotency keys, counts
by state, attempt histories) and compared with a small pure-Python model. The model does not
re-implement fair ordering or aging: it takes each claim's choice as given and checks only what
it can know (the chosen tasks were claimable and their gates had room; a short claim left nothing
the gates would admit). Everything else it predicts exactly: states, attempt histories, leases
and their fencing, tickets, rate windows and penalties, dependencies, keys (a key submitted again
names its task with the same payload and is refused with another), successors, reaping,
cancellation and redrives.

The machine runs on every backend the conformance suite lists; each example gets a fresh store in
a fresh temporary directory, a ManualClock and a private event loop (Hypothesis rules are sync).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import shutil
import tempfile
from collections import Counter
from collections.abc import Collection, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from headrace.policy import (
    ConfigError,
    ErrorClass,
    GateConfig,
    KeyConflict,
    LeaseLost,
    ManualClock,
    Rate,
    Tier,
)
from headrace.policy.gate import GateStatistics
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import (
    CANCELLED,
    LEASE_EXPIRED,
    POISON,
    UPSTREAM_FAILED,
    Attempt,
    AttemptError,
    AttemptOutcome,
    AwaitRemote,
    ClaimResult,
    Dead,
    Lease,
    NewTask,
    Outcome,
    PollAgain,
    Retry,
    Settings,
    Sibling,
    Succeeded,
    TaskRecord,
    TaskState,
)

from .conftest import make_backend

T = TypeVar("T")

# -- the fixed world every example lives in

# The model's own copy of the gate limits: (concurrency cap) and (n starts, window seconds). No
# guard, so starts land exactly on window edges (policy tests cover the guard).
CAPS = {"provider:video": 2, "session:a": 1, "session:b": 1}
RATES = {"provider:video": (3, 10.0), "provider:image": (2, 6.0)}
GATES = (
    GateConfig("provider:video", concurrency=2, rate=Rate(3, per="10s"), guard=0),
    GateConfig("provider:image", rate=Rate(2, per="6s"), guard=0),  # rated, no cap
    GateConfig("session:*", concurrency=1),
    GateConfig("free"),
)
GATE_NAMES = ("free", "provider:image", "provider:video", "session:a", "session:b")
GATE_SETS: tuple[tuple[str, ...], ...] = (
    (),
    ("free",),
    ("session:a",),
    ("session:b",),
    ("provider:video",),
    ("provider:image",),
    ("provider:video", "session:a"),
    ("session:b", "provider:image"),
    ("provider:image", "provider:video"),
)
POISON_EXPIRIES = 2  # low, so examples reach it
AGING_STEP = 30.0
SETTINGS = Settings(gates=GATES, aging_step=AGING_STEP, poison_expiries=POISON_EXPIRIES)
WORKERS = ("w1", "w2", "w3")
KINDS = ("scan", "render")
KIND_FILTERS: tuple[tuple[str, ...] | None, ...] = (None, None, ("scan",), ("render",))
KEYS = ("k1", "k2", "k3")
HOLDING = (TaskState.RUNNING, TaskState.WAITING)  # states that hold gate tickets
WAITING_TO_RUN = (TaskState.READY, TaskState.WAITING)  # states with a run_at to come
OPEN = (AttemptOutcome.RUNNING, AttemptOutcome.WAITING)
ACTIONS = st.sampled_from(("done", "retry", "dead", "await", "again"))
HANDLER_ACTIONS = ("hold", "hold", "done", "retry", "dead", "await")
POLL_ACTIONS = ("hold", "again", "again", "done", "retry", "dead")
BOOM = AttemptError.of(ErrorClass.TRANSIENT, "boom")
FATAL = AttemptError.of(ErrorClass.FATAL, "bad_input")

# Times are multiples of half a second on a clock near 1e6: exact in binary floating point, and
# they often land exactly on a lease's end or a rate window's edge.
HALF_SECONDS = st.integers(0, 60).map(lambda n: n / 2)
LEASE_FOR = st.integers(5, 20).map(float)
DELAY = st.integers(0, 40).map(lambda n: n / 2)

FULL_READ_EVERY = 10  # checks between reads of every attempt history, changed or not
# Examples per backend, sized by what a step costs there (PostgreSQL: ~0.6 ms a round trip, and
# a step reads the whole store back), so the file stays well under a minute on two cores. The
# memory store is SQLite's machine on an in-memory database: more examples, not another copy.
EXAMPLES = {"memory": 150, "sqlite": 100, "postgres": 25}
MACHINE_SETTINGS = settings(
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # No `explain` phase: tracing every line of the stores to explain a failure takes minutes.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)


@dataclass(frozen=True)
class Spec:
    """What a generated task looks like, before the machine gives it a unique ref."""

    kind: str
    flow: str
    tier: Tier
    gates: tuple[str, ...]
    key: str | None
    max_attempts: int


SPECS = st.builds(
    Spec,
    kind=st.sampled_from(KINDS),
    flow=st.sampled_from(("ep1", "ep2", "ep3")),
    tier=st.sampled_from(Tier),
    gates=st.sampled_from(GATE_SETS),
    key=st.none() | st.sampled_from(KEYS),
    max_attempts=st.sampled_from((1, 3, 5)),
)


# -- the model


@dataclass
class ModelTask:
    id: int
    ref: str
    kind: str
    gates: tuple[str, ...]
    tier: Tier
    key: str | None
    deps: tuple[int, ...]
    max_attempts: int
    state: TaskState
    created_at: float
    run_at: float
    error_code: str | None = None
    attempt: int = 0
    attempt_base: int = 0
    expiries: int = 0
    solo: bool = False
    worker: str | None = None  # who runs (or last ran) its attempt
    token: int | None = None
    tokens: set[int] = field(default_factory=set)
    lease_until: float | None = None
    started: list[float] = field(default_factory=list)
    outcomes: list[AttemptOutcome] = field(default_factory=list)
    unstamped: set[str] = field(default_factory=set)  # rated gates whose start is reserved


class Model:
    """What the store should hold, as plain Python."""

    def __init__(self) -> None:
        self.tasks: dict[int, ModelTask] = {}
        self.keys: dict[str, int] = {}
        self.payloads: dict[str, NewTask] = {}  # by key: the task first submitted with it
        self.gate_starts: dict[str, list[float]] = {name: [] for name in RATES}
        self.lost: dict[int, tuple[str, float]] = {}  # by task: who last lost its lease, when
        self.penalized_until: dict[str, float] = dict.fromkeys(RATES, -math.inf)

    # -- reading the model

    def live(self) -> list[ModelTask]:
        return [t for t in self.tasks.values() if not t.state.terminal]

    def dependents(self, task_id: int) -> list[ModelTask]:
        return [t for _, t in sorted(self.tasks.items()) if task_id in t.deps]

    def in_flight(self, gate: str) -> int:
        return sum(t.gates.count(gate) for t in self.tasks.values() if t.state in HOLDING)

    def refuses(self, gate: str, now: float) -> bool:
        cap = CAPS.get(gate)
        if cap is not None and self.in_flight(gate) >= cap:
            return True
        if gate not in RATES:
            return False
        n, window = RATES[gate]
        capacity = max(1, n // 2) if now < self.penalized_until[gate] else n
        reserved = sum(1 for t in self.tasks.values() if gate in t.unstamped)
        recent = sum(1 for start in self.gate_starts[gate] if now < start + window)
        return recent + reserved >= capacity

    def admits(self, gates: Sequence[str], now: float) -> bool:
        return not any(self.refuses(gate, now) for gate in gates)

    def claimable(self, now: float, kinds: Collection[str] | None) -> list[ModelTask]:
        return [
            t
            for t in self.tasks.values()
            if t.state is TaskState.READY and t.run_at <= now and (kinds is None or t.kind in kinds)
        ]

    def due_polls(self, now: float) -> list[ModelTask]:
        return [
            t
            for t in self.tasks.values()
            if t.state is TaskState.WAITING
            and t.run_at <= now
            and (t.lease_until is None or t.lease_until <= now)
        ]

    def holds(self, lease: Lease, now: float) -> bool:
        task = self.tasks[lease.task_id]
        return (
            task.state in HOLDING
            and task.token == lease.token
            and task.lease_until is not None
            and task.lease_until > now
        )

    def finish_error(self, lease: Lease, outcome: Outcome, now: float) -> type[Exception] | None:
        """The error `Store.finish` must raise, or None when it must record the outcome."""
        if not self.holds(lease, now):
            return LeaseLost
        state = self.tasks[lease.task_id].state
        if isinstance(outcome, PollAgain) and state is not TaskState.WAITING:
            return ConfigError
        if isinstance(outcome, AwaitRemote) and state is TaskState.WAITING:
            return ConfigError
        if isinstance(outcome, Succeeded) and any(map(self.clashes, outcome.successors)):
            return KeyConflict
        return None

    def clashes(self, new: NewTask) -> bool:
        """Whether `new` reuses a stored key with another payload (successors name no
        siblings, so their dependencies are ids as stored)."""
        stored = self.payloads.get(new.key) if new.key is not None else None
        return stored is not None and payload(stored) != payload(new)

    def edges(self, now: float) -> list[float]:
        """Times after `now` at which a claim, poll or reap may find something new."""
        times = [t.lease_until for t in self.tasks.values() if t.lease_until is not None]
        times += [t.run_at for t in self.tasks.values() if t.state in WAITING_TO_RUN]
        times += [t.created_at + AGING_STEP for t in self.tasks.values() if t.tier is Tier.LOW]
        times += list(self.penalized_until.values())
        for gate, starts in self.gate_starts.items():
            times += [start + RATES[gate][1] for start in starts]
        return sorted({t for t in times if t > now})

    # -- submission

    def add(self, task_id: int, new: NewTask, deps: tuple[int, ...], now: float) -> None:
        assert task_id not in self.tasks, f"the store reused id {task_id} for {new.ref}"
        states = [self.tasks[d].state for d in deps]
        unmet = any(state is not TaskState.SUCCEEDED for state in states)
        self.tasks[task_id] = ModelTask(
            id=task_id,
            ref=new.ref,
            kind=new.kind,
            gates=new.gates,
            tier=new.tier,
            key=new.key,
            deps=deps,
            max_attempts=new.max_attempts,
            state=TaskState.PENDING if unmet else TaskState.READY,
            created_at=now,
            run_at=now,
        )
        if new.key is not None:
            self.keys[new.key] = task_id
            self.payloads[new.key] = replace(new, after=deps)
        if any(state in (TaskState.DEAD, TaskState.CANCELLED) for state in states):
            self.cancel_tree(task_id, UPSTREAM_FAILED, now)

    # -- claims

    def start(self, lease: Lease, now: float, lease_for: float, worker: str) -> None:
        task = self.tasks[lease.task_id]
        task.worker = worker
        assert lease.token not in task.tokens, f"task {task.id}: lease token {lease.token} reused"
        task.unstamped = {gate for gate in task.gates if gate in RATES}
        task.state = TaskState.RUNNING
        task.attempt += 1
        task.started.append(now)
        task.outcomes.append(AttemptOutcome.RUNNING)
        self.lease(task, lease, now + lease_for)

    def stamp(self, task: ModelTask, now: float, gates: Collection[str] | None = None) -> None:
        """The reserved starts (on `gates`, or all) are stamped: they count from `now`."""
        for gate in sorted(task.unstamped):
            if gates is None or gate in gates:
                self.gate_starts[gate].append(now)
                task.unstamped.discard(gate)

    def lease(self, task: ModelTask, lease: Lease, until: float) -> None:
        task.token = lease.token
        task.tokens.add(lease.token)
        task.lease_until = until

    def reap(self, now: float) -> int:
        expired = [
            t
            for _, t in sorted(self.tasks.items())
            if t.state is TaskState.RUNNING and t.lease_until is not None and t.lease_until <= now
        ]
        for task in expired:
            self.expire(task, now)
        return len(expired)

    def expire(self, task: ModelTask, now: float) -> None:
        self.stamp(task, now)
        task.outcomes[-1] = AttemptOutcome.LEASE_EXPIRED
        task.expiries += 1
        worker, began = task.worker or "", task.started[-1]
        beside = sum(
            1 for i, (by, at) in self.lost.items() if i != task.id and by == worker and at > began
        ) + sum(
            1
            for other in self.tasks.values()
            if other.id != task.id
            and other.state is TaskState.RUNNING
            and other.worker == task.worker
        )
        self.lost[task.id] = (worker, now)
        if beside:  # its worker died running others too: it runs alone next, uncharged
            task.solo, task.attempt_base = True, task.attempt_base + 1
            self.requeue(task, now, LEASE_EXPIRED)
        elif task.expiries >= POISON_EXPIRIES:
            self.bury(task, POISON, now)
        elif task.attempt - task.attempt_base >= task.max_attempts:
            self.bury(task, LEASE_EXPIRED, now)
        else:
            self.requeue(task, now, LEASE_EXPIRED)

    # -- outcomes

    def apply(self, task: ModelTask, outcome: Outcome, now: float) -> None:
        """Record an outcome the store accepted (successors are added by the caller)."""
        self.stamp(task, now)  # a start never stamped counts from the outcome
        if isinstance(outcome, PollAgain):
            task.run_at, task.lease_until = now + outcome.delay, None
        elif isinstance(outcome, AwaitRemote):
            task.outcomes[-1] = AttemptOutcome.WAITING
            task.state = TaskState.WAITING
            task.run_at, task.lease_until = now + outcome.poll_every, None
        elif isinstance(outcome, Retry):
            self.penalize(outcome.penalize, now)
            task.outcomes[-1] = AttemptOutcome.RETRY
            self.requeue(task, now + outcome.delay, outcome.error.code)
        elif isinstance(outcome, Dead):
            self.penalize(outcome.penalize, now)
            task.outcomes[-1] = AttemptOutcome.DEAD
            self.bury(task, outcome.error.code, now)
        else:
            self.succeed(task)

    def succeed(self, task: ModelTask) -> None:
        task.outcomes[-1] = AttemptOutcome.SUCCEEDED
        task.state, task.lease_until, task.error_code = TaskState.SUCCEEDED, None, None
        for dependent in self.dependents(task.id):
            met = all(self.tasks[d].state is TaskState.SUCCEEDED for d in dependent.deps)
            if dependent.state is TaskState.PENDING and met:
                dependent.state = TaskState.READY

    def requeue(self, task: ModelTask, run_at: float, code: str) -> None:
        task.state, task.error_code = TaskState.READY, code
        task.run_at, task.lease_until = run_at, None

    def penalize(self, gates: Sequence[str], now: float) -> None:
        for gate in gates:
            if gate in RATES:
                window = RATES[gate][1]
                self.penalized_until[gate] = max(self.penalized_until[gate], now + 2 * window)

    def bury(self, task: ModelTask, code: str, now: float) -> None:
        task.state, task.lease_until, task.error_code = TaskState.DEAD, None, code
        for dependent in self.dependents(task.id):
            self.cancel_tree(dependent.id, UPSTREAM_FAILED, now)

    def cancel_tree(self, task_id: int, code: str, now: float) -> None:
        task = self.tasks[task_id]
        if task.state.terminal:
            return
        if task.state in HOLDING:
            self.stamp(task, now)
            task.outcomes[-1] = AttemptOutcome.CANCELLED
        task.state, task.lease_until, task.error_code = TaskState.CANCELLED, None, code
        for dependent in self.dependents(task_id):
            self.cancel_tree(dependent.id, UPSTREAM_FAILED, now)

    # -- dead letters

    def redrive(self, chosen: Sequence[ModelTask], now: float) -> None:
        for task in chosen:
            task.state, task.run_at, task.error_code = TaskState.READY, now, None
            task.attempt_base, task.expiries, task.solo = task.attempt, 0, False
            self.restore(task.id)

    def restore(self, task_id: int) -> None:
        failed = (TaskState.DEAD, TaskState.CANCELLED)
        for dependent in self.dependents(task_id):
            if (
                dependent.state is not TaskState.CANCELLED
                or dependent.error_code != UPSTREAM_FAILED
            ):
                continue
            if any(self.tasks[d].state in failed for d in dependent.deps):
                continue
            dependent.state, dependent.error_code = TaskState.PENDING, None
            self.restore(dependent.id)


def payload(task: NewTask) -> tuple[Any, ...]:
    """What a key stands for: the task without its key and delay, gates and ids as sets."""
    after = frozenset(task.after)
    gates = frozenset(task.gates)
    return (
        *(task.kind, task.ref, gates, task.flow, task.group, task.tier, task.cost),
        *(task.max_attempts, task.weight, after),
    )


# -- what the store says, read whole


@dataclass(frozen=True)
class Snapshot:
    tasks: tuple[TaskRecord, ...]
    attempts: dict[int, list[Attempt]]
    gates: dict[str, GateStatistics]
    counts: dict[TaskState, int]
    keys: dict[str, int | None]


async def read_store(
    store: Store, known: dict[int, tuple[TaskRecord, list[Attempt]]] | None = None
) -> Snapshot:
    """Everything the store says. A task's attempt history is taken from `known` when its
    record has not changed since (each write to a history also writes the task's record), as
    round trips to PostgreSQL dominate the run otherwise."""
    tasks = tuple(sorted(await store.tasks(limit=1_000_000), key=lambda t: t.id))
    attempts: dict[int, list[Attempt]] = {}
    for task in tasks:
        cached = known.get(task.id) if known is not None else None
        unchanged = cached is not None and cached[0] == task
        attempts[task.id] = cached[1] if cached and unchanged else await store.attempts(task.id)
    gates = {stat.name: stat for stat in await store.gate_statistics()}
    keys = {}
    for key in KEYS:
        found = await store.find(key)
        keys[key] = None if found is None else found.id
    return Snapshot(tasks, attempts, gates, await store.counts(), keys)


# -- the machine


class StoreMachine(RuleBasedStateMachine):
    backend: ClassVar[str]  # set by `machine_for`

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.model = Model()
        self.held: dict[str, list[Lease]] = {worker: [] for worker in WORKERS}
        self.old: list[Lease] = []  # leases a worker let go of, lost, or forgot in a crash
        self.refs = itertools.count(1)
        self.known: dict[int, tuple[TaskRecord, list[Attempt]]] = {}  # histories last read
        self.checks = 0
        self.directory = Path(tempfile.mkdtemp(prefix="headrace-machine-"))
        # A loop of its own, run a verb at a time (rules are sync). Not asyncio.Runner: its
        # run() swaps the SIGINT handler on every call, a third of the time of a memory run.
        self.loop = asyncio.new_event_loop()
        self.store = make_backend(self.backend, self.clock, self.directory)
        self.opened = False
        try:
            self.run(self.store.open(SETTINGS))
        except BaseException:
            self.teardown()
            raise
        self.opened = True

    def teardown(self) -> None:
        try:
            if self.opened:
                self.run(self.store.close())
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(work)

    def now(self) -> float:
        return self.clock.now()

    def new_task(self, spec: Spec, after: tuple[int | Sibling, ...] = ()) -> NewTask:
        return NewTask(
            kind=spec.kind,
            ref=f"t{next(self.refs)}",
            gates=spec.gates,
            flow=spec.flow,
            tier=spec.tier,
            key=spec.key,
            after=after,
            max_attempts=spec.max_attempts,
        )

    def new_batch(
        self,
        specs: Sequence[Spec],
        afters: Sequence[tuple[int | Sibling, ...]] | None = None,
        pending: dict[str, NewTask] | None = None,
    ) -> list[NewTask]:
        """Tasks for `specs`, where a key already used (stored, earlier in the batch, or in
        `pending`, which this fills) comes again with the payload it was first used with."""
        reused = {**self.model.payloads, **(pending or {})}
        batch: list[NewTask] = []
        for index, spec in enumerate(specs):
            earlier = reused.get(spec.key) if spec.key is not None else None
            new = earlier or self.new_task(spec, afters[index] if afters else ())
            if new.key is not None:
                reused.setdefault(new.key, new)
                if pending is not None:
                    pending.setdefault(new.key, new)
            batch.append(new)
        return batch

    def held_leases(self) -> list[Lease]:
        return [lease for worker in WORKERS for lease in self.held[worker]]

    def let_go(self, lease: Lease) -> None:
        for leases in self.held.values():
            if lease in leases:
                leases.remove(lease)
        if lease not in self.old:
            self.old.append(lease)

    # -- submit

    @initialize(specs=st.lists(SPECS, min_size=2, max_size=6))
    def some_work(self, specs: list[Spec]) -> None:
        self.submit_batch(self.new_batch(specs))

    @rule(specs=st.lists(SPECS, min_size=1, max_size=3), data=st.data())
    def submit(self, specs: list[Spec], data: st.DataObject) -> None:
        afters = [self.draw_after(data, i) for i in range(len(specs))]
        self.submit_batch(self.new_batch(specs, afters))

    @precondition(lambda self: bool(self.model.payloads))
    @rule(data=st.data(), spec=SPECS)
    def reuse_a_key_with_another_payload(self, data: st.DataObject, spec: Spec) -> None:
        """A key submitted again with another payload is refused, and the whole batch with it."""
        key = data.draw(st.sampled_from(sorted(self.model.payloads)), label="key")
        changed = replace(self.model.payloads[key], ref=f"t{next(self.refs)}")
        batch = [self.new_task(replace(spec, key=None)), changed]
        before = self.run(read_store(self.store))
        with pytest.raises(KeyConflict) as refused:
            self.run(self.store.submit(batch))
        assert (refused.value.key, refused.value.field) == (key, "ref")
        assert refused.value.task_id == self.model.keys[key]
        assert self.run(read_store(self.store)) == before, "a refused submit changed the store"

    def submit_batch(self, batch: list[NewTask]) -> None:
        now = self.now()
        results = self.run(self.store.submit(batch))
        assert len(results) == len(batch)
        ids: list[int] = []
        for new, result in zip(batch, results, strict=True):
            existing = self.model.keys.get(new.key) if new.key is not None else None
            assert result.created == (existing is None), f"{new.ref} key {new.key}: {result}"
            if existing is not None:
                assert result.id == existing, f"key {new.key} names {existing}, not {result.id}"
            else:
                deps = tuple(ids[d.index] if isinstance(d, Sibling) else d for d in new.after)
                self.model.add(result.id, new, deps, now)
            ids.append(result.id)

    def draw_after(self, data: st.DataObject, index: int) -> tuple[int | Sibling, ...]:
        """No dependency (half the time), an existing task, or the batch's first task."""
        options: list[st.SearchStrategy[int | Sibling | None]] = [st.none()]
        if self.model.tasks:
            options.append(st.sampled_from(sorted(self.model.tasks)))
        if index > 0:
            options.append(st.just(Sibling(0)))
        choice = data.draw(st.none() | st.one_of(options), label=f"after, task {index}")
        return () if choice is None else (choice,)

    # -- claim

    @rule(
        worker=st.sampled_from(WORKERS),
        limit=st.integers(1, 3),
        lease_for=LEASE_FOR,
        kinds=st.sampled_from(KIND_FILTERS),
        data=st.data(),
    )
    def claim(
        self,
        worker: str,
        limit: int,
        lease_for: float,
        kinds: tuple[str, ...] | None,
        data: st.DataObject,
    ) -> None:
        """A worker claims, then runs some handlers to their outcome at once and holds the rest."""
        for lease in self.claim_now(worker, limit, lease_for, kinds):
            action = data.draw(st.sampled_from(HANDLER_ACTIONS), label=f"task {lease.task_id}")
            self.handle(lease, action, data)

    def claim_now(
        self, worker: str, limit: int, lease_for: float, kinds: tuple[str, ...] | None = None
    ) -> tuple[Lease, ...]:
        now = self.now()
        result = self.run(self.store.claim(worker, limit, lease_for=lease_for, kinds=kinds))
        self.model.reap(now)  # a claim reaps expired leases first
        self.check_claim(result, limit, lease_for, kinds)
        self.held[worker].extend(result.leases)
        return result.leases

    def check_claim(
        self, result: ClaimResult, limit: int, lease_for: float, kinds: tuple[str, ...] | None
    ) -> None:
        now = self.now()
        assert result.now == now
        assert len(result.leases) <= limit
        claimed = [lease.task_id for lease in result.leases]
        assert len(set(claimed)) == len(claimed), f"one claim leased a task twice: {claimed}"
        claimable = {t.id for t in self.model.claimable(now, kinds)}
        for lease in result.leases:
            task = self.model.tasks[lease.task_id]
            assert task.id in claimable, f"claimed {task.id}, {task.state.value}, not due and ready"
            claimable.discard(task.id)
            assert self.model.admits(task.gates, now), f"{task.id}: {task.gates} had no room"
            assert lease.task.state is TaskState.RUNNING
            assert lease.task.attempt == task.attempt + 1
            assert lease.until == now + lease_for
            self.model.start(lease, now, lease_for, lease.task.worker or "")
        solo = [lease.task_id for lease in result.leases if self.model.tasks[lease.task_id].solo]
        assert not solo or claimed == solo, f"a task that must run alone shared a claim: {claimed}"
        if len(result.leases) < limit and not solo:
            # A task that must run alone goes only to a claim that took nothing else.
            admitted = sorted(
                i
                for i in claimable
                if self.model.admits(self.model.tasks[i].gates, now)
                and not (result.leases and self.model.tasks[i].solo)
            )
            assert not admitted, f"a short claim left {admitted} whose gates have room"

    # -- remote polls

    @rule(
        worker=st.sampled_from(WORKERS),
        limit=st.integers(1, 3),
        lease_for=LEASE_FOR,
        data=st.data(),
    )
    def poll(self, worker: str, limit: int, lease_for: float, data: st.DataObject) -> None:
        now = self.now()
        due = {t.id for t in self.model.due_polls(now)}
        result = self.run(self.store.claim_polls(worker, limit, lease_for=lease_for))
        polled = [lease.task_id for lease in result.leases]
        assert len(polled) == min(limit, len(due)), f"polled {polled} of due {sorted(due)}"
        assert set(polled) <= due and len(set(polled)) == len(polled), f"{polled} vs {due}"
        for lease in result.leases:
            task = self.model.tasks[lease.task_id]
            assert lease.task.attempt == task.attempt and lease.until == now + lease_for
            self.model.lease(task, lease, now + lease_for)
            self.held[worker].append(lease)
            self.handle(lease, data.draw(st.sampled_from(POLL_ACTIONS), label="remote job"), data)

    # -- lease holders

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data(), lease_for=LEASE_FOR)
    def renew(self, data: st.DataObject, lease_for: float) -> None:
        """A worker renews every lease it holds, some perhaps already expired or taken."""
        worker = data.draw(st.sampled_from([w for w in WORKERS if self.held[w]]), label="worker")
        leases = list(self.held[worker])
        now = self.now()
        renewed = self.run(self.store.renew(leases, lease_for=lease_for))
        assert len(renewed) == len(leases)
        for lease, fresh in zip(leases, renewed, strict=True):
            holds = self.model.holds(lease, now)
            assert (fresh is not None) == holds, f"renew of task {lease.task_id}: {fresh}"
            self.let_go(lease)
            if fresh is not None:
                assert fresh.token == lease.token and fresh.until == now + lease_for
                self.model.tasks[lease.task_id].lease_until = fresh.until
                self.old.remove(lease)
                self.held[worker].append(fresh)

    @precondition(lambda self: any(self.held.values()) or bool(self.old))
    @rule(data=st.data())
    def start_call(self, data: st.DataObject) -> None:
        """A handler is about to call: it stamps the starts its lease reserved (all, or one
        gate's); a lost lease is refused and stamps nothing."""
        pool = [*self.held_leases(), *self.old]
        lease = pool[data.draw(st.integers(0, len(pool) - 1), label="lease")]
        gates = data.draw(st.none() | st.sampled_from(lease.task.gates or ("free",)), label="gate")
        chosen = None if gates is None else (gates,)
        now = self.now()
        if not self.model.holds(lease, now):
            before = self.run(read_store(self.store))
            with pytest.raises(LeaseLost):
                self.run(self.store.start(lease, chosen))
            assert self.run(read_store(self.store)) == before, "a refused start changed the store"
            return
        self.run(self.store.start(lease, chosen))
        self.model.stamp(self.model.tasks[lease.task_id], now, chosen)

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        self.handle(self.draw_held(data), "done", data)

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def fail_transient(self, data: st.DataObject) -> None:
        self.handle(self.draw_held(data), "retry", data)

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def fail_fatal(self, data: st.DataObject) -> None:
        self.handle(self.draw_held(data), "dead", data)

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def await_remote(self, data: st.DataObject) -> None:
        """Valid only for a running task: a waiting one (held by a poller) must refuse."""
        self.handle(self.draw_held(data), "await", data)

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def poll_again(self, data: st.DataObject) -> None:
        """Valid only for a waiting task: a running one must refuse."""
        self.handle(self.draw_held(data), "again", data)

    @precondition(lambda self: bool(self.stale_leases()))
    @rule(data=st.data(), action=ACTIONS)
    def finish_stale(self, data: st.DataObject, action: str) -> None:
        """A lease that was lost, spent or forgotten: its finish must change nothing, not even
        through a successor or a penalty."""
        stale = self.stale_leases()
        lease = stale[data.draw(st.integers(0, len(stale) - 1), label="stale lease")]
        self.handle(lease, action, data)

    @precondition(lambda self: any(self.held.values()) or bool(self.old))
    @rule(data=st.data())
    def finish_batch(self, data: st.DataObject) -> None:
        """Group commit: outcomes for a few leases (held or stale, maybe one lease twice) in one
        `finish_many`; each is recorded or refused on its own."""
        pool = [*self.held_leases(), *self.old]
        picks = st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=3)
        leases = [pool[i] for i in data.draw(picks, label="leases")]
        pending: dict[str, NewTask] = {}  # keys the batch's successors use for the first time
        batch = [
            (lease, self.draw_outcome(lease, data.draw(ACTIONS), data, pending)) for lease in leases
        ]
        now, before = self.now(), set(self.model.tasks)
        errors = self.run(self.store.finish_many(batch))
        assert len(errors) == len(batch)
        successors: list[NewTask] = []
        for (lease, outcome), error in zip(batch, errors, strict=True):
            if self.batched_outcome(lease, outcome, error, now) and isinstance(outcome, Succeeded):
                successors += outcome.successors
        self.learn_successors(successors, before, now)

    def batched_outcome(
        self, lease: Lease, outcome: Outcome, error: Exception | None, now: float
    ) -> bool:
        """Check one result of `finish_many` and follow it in the model; True if recorded."""
        expected = self.model.finish_error(lease, outcome, now)
        what = f"task {lease.task_id}, {type(outcome).__name__} in a batch"
        if expected is None:
            assert error is None, f"{what}: refused with {error!r}"
            self.model.apply(self.model.tasks[lease.task_id], outcome, now)
        else:
            assert isinstance(error, expected), f"{what}: {error!r}, not {expected.__name__}"
        if expected is None or expected is LeaseLost:
            self.let_go(lease)
        return expected is None

    def handle(self, lease: Lease, action: str, data: st.DataObject) -> None:
        """Report an outcome of kind `action` for `lease` ("hold": none yet)."""
        if action != "hold":
            self.finish(lease, self.draw_outcome(lease, action, data))

    def draw_outcome(
        self,
        lease: Lease,
        action: str,
        data: st.DataObject,
        pending: dict[str, NewTask] | None = None,
    ) -> Outcome:
        if action == "done":
            specs = data.draw(st.lists(SPECS, max_size=2), label="successors")
            successors = self.new_batch(specs, pending=pending)
            if self.model.payloads and data.draw(st.integers(0, 9), label="clash") == 0:
                key = data.draw(st.sampled_from(sorted(self.model.payloads)), label="key")
                clash = replace(self.model.payloads[key], ref=f"t{next(self.refs)}")
                successors.append(clash)  # a key reused with another payload: refused
            return Succeeded(successors=tuple(successors))
        if action == "retry":
            return Retry(BOOM, data.draw(DELAY, label="delay"), self.draw_penalty(lease, data))
        if action == "dead":
            return Dead(FATAL, self.draw_penalty(lease, data))
        if action == "await":
            every = data.draw(st.integers(1, 10), label="poll every")
            return AwaitRemote(f"job-{lease.task_id}", poll_every=float(every))
        return PollAgain(data.draw(DELAY, label="poll again in"))

    @staticmethod
    def draw_penalty(lease: Lease, data: st.DataObject) -> tuple[str, ...]:
        rate_limited = data.draw(st.booleans(), label="rate limited")
        return lease.task.gates if rate_limited else ()

    def stale_leases(self) -> list[Lease]:
        return [lease for lease in self.old if not self.model.holds(lease, self.now())]

    def draw_held(self, data: st.DataObject) -> Lease:
        leases = self.held_leases()
        return leases[data.draw(st.integers(0, len(leases) - 1), label="held lease")]

    def finish(self, lease: Lease, outcome: Outcome) -> None:
        now = self.now()
        expected = self.model.finish_error(lease, outcome, now)
        if expected is not None:
            self.refused_finish(lease, outcome, expected)
            return
        before = set(self.model.tasks)
        self.run(self.store.finish(lease, outcome))
        task = self.model.tasks[lease.task_id]
        self.model.apply(task, outcome, now)
        self.let_go(lease)
        if isinstance(outcome, Succeeded):
            self.learn_successors(outcome.successors, before, now)

    def refused_finish(self, lease: Lease, outcome: Outcome, expected: type[Exception]) -> None:
        before = self.run(read_store(self.store))
        with pytest.raises(expected):
            self.run(self.store.finish(lease, outcome))
        after = self.run(read_store(self.store))
        assert after == before, f"a refused {type(outcome).__name__} changed the store"
        if expected is LeaseLost:
            self.let_go(lease)

    def learn_successors(self, successors: Sequence[NewTask], before: set[int], now: float) -> None:
        records = self.run(self.store.tasks(limit=1_000_000))
        created = {r.ref: r.id for r in records if r.id not in before}
        for new in successors:
            if new.key is not None and new.key in self.model.keys:
                continue
            assert new.ref in created, f"successor {new.ref} was not created"
            self.model.add(created.pop(new.ref), new, (), now)
        assert not created, f"unexpected tasks created with the completion: {created}"

    # -- crashes, time, the reaper

    @rule(worker=st.sampled_from(WORKERS))
    def crash(self, worker: str) -> None:
        """The worker's process dies: its leases are forgotten, the store is not told."""
        self.old.extend(self.held[worker])
        self.held[worker] = []

    @rule(seconds=HALF_SECONDS)
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: bool(self.model.edges(self.now())))
    @rule(data=st.data(), offset=st.sampled_from((-0.5, 0.0, 0.5)))
    def advance_to_edge(self, data: st.DataObject, offset: float) -> None:
        """Move the clock to just before, at or just after the next time something changes:
        a lease's end, a retry or poll coming due, a start leaving its rate window, the end of
        a penalty, an aging step."""
        now = self.now()
        edges = self.model.edges(now)
        edge = data.draw(st.sampled_from(edges), label="edge")
        self.clock.advance(max(0.0, edge + offset - now))

    @rule()
    def reap(self) -> None:
        reaped = self.run(self.store.reap())
        assert reaped == self.model.reap(self.now())

    # -- cancel and redrive

    # Cancelling is a one-way door: only with plenty of live work, so examples keep some.
    @precondition(lambda self: len(self.model.live()) >= 4)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        task_id = data.draw(st.sampled_from(sorted(self.model.tasks)), label="task")
        expected = not self.model.tasks[task_id].state.terminal
        assert self.run(self.store.cancel(task_id)) is expected
        if expected:
            self.model.cancel_tree(task_id, CANCELLED, self.now())

    @precondition(lambda self: any(t.state is TaskState.DEAD for t in self.model.tasks.values()))
    @rule(data=st.data(), every=st.booleans(), kind=st.none() | st.sampled_from(KINDS))
    def redrive(self, data: st.DataObject, every: bool, kind: str | None) -> None:
        ids: set[int] | None = None
        if not every and self.model.tasks:
            ids = data.draw(st.sets(st.sampled_from(sorted(self.model.tasks))), label="ids")
        chosen = [
            t
            for _, t in sorted(self.model.tasks.items())
            if t.state is TaskState.DEAD
            and (ids is None or t.id in ids)
            and (kind is None or t.kind == kind)
        ]
        redriven = self.run(self.store.redrive(task_ids=ids, kind=kind))
        assert sorted(redriven) == [t.id for t in chosen]
        self.model.redrive(chosen, self.now())

    # -- invariants, read from the store after every step

    @invariant()
    def agrees_with_model(self) -> None:
        self.checks += 1
        known = self.known if self.checks % FULL_READ_EVERY else None
        snapshot = self.run(read_store(self.store, known))
        self.known = {t.id: (t, snapshot.attempts[t.id]) for t in snapshot.tasks}
        check_states(snapshot, self.model)
        for record in snapshot.tasks:
            check_task(record, self.model.tasks[record.id])
            check_attempts(record, snapshot.attempts[record.id], self.model.tasks[record.id])
        check_dependencies(snapshot, self.model)
        check_keys(snapshot, self.model)
        check_gates(snapshot)
        check_rate_windows(self.model)


# -- the checks


def check_states(snapshot: Snapshot, model: Model) -> None:
    ids = [t.id for t in snapshot.tasks]
    assert ids == sorted(model.tasks), f"store has {ids}, model {sorted(model.tasks)}"
    by_state = Counter(t.state for t in snapshot.tasks)
    assert snapshot.counts == {state: by_state[state] for state in TaskState}
    assert sum(snapshot.counts.values()) == len(ids), "a task is in no state or in two"


def check_task(record: TaskRecord, task: ModelTask) -> None:
    where = f"task {record.id}"
    assert record.state is task.state, f"{where}: store {record.state}, model {task.state}"
    assert (record.ref, record.gates, record.key) == (task.ref, task.gates, task.key), where
    assert (record.attempt, record.attempt_base) == (task.attempt, task.attempt_base), where
    assert record.expiries == task.expiries, f"{where}: expiries {record.expiries}"
    assert record.solo is task.solo, f"{where}: solo {record.solo}"
    assert record.submitted_tier is task.tier, where
    aged = {task.tier, Tier.NORMAL} if task.tier is Tier.LOW else {task.tier}
    assert record.tier in aged, f"{where}: {task.tier.name} became {record.tier.name}"
    if record.state in (TaskState.READY, TaskState.WAITING):
        assert record.run_at == task.run_at, f"{where}: run_at {record.run_at} != {task.run_at}"
    if record.state in (TaskState.DEAD, TaskState.CANCELLED):
        assert record.error_code == task.error_code, f"{where}: code {record.error_code}"
    check_lease(record, task)


def check_lease(record: TaskRecord, task: ModelTask) -> None:
    where = f"task {record.id}"
    if record.state is TaskState.RUNNING:
        assert record.lease_until is not None and record.worker is not None, f"{where}: no lease"
    if record.state in HOLDING:
        assert record.lease_until == task.lease_until, f"{where}: lease {record.lease_until}"
        if task.lease_until is not None:
            assert record.lease_token == task.token, f"{where}: token {record.lease_token}"
    else:
        assert record.lease_until is None, f"{where}: {record.state.value} with a lease"


def check_attempts(record: TaskRecord, attempts: list[Attempt], task: ModelTask) -> None:
    where = f"task {record.id}"
    numbers = [a.number for a in attempts]
    assert numbers == list(range(1, record.attempt + 1)), f"{where}: attempts {numbers}"
    assert [a.outcome for a in attempts] == task.outcomes, f"{where}: {attempts}"
    assert [a.started_at for a in attempts] == task.started, f"{where}: {attempts}"
    for attempt in attempts:
        assert (attempt.ended_at is None) == (attempt.outcome is AttemptOutcome.RUNNING), attempt
    still_open = [a.number for a in attempts if a.outcome in OPEN]
    expected_open = [record.attempt] if record.state in HOLDING else []
    assert still_open == expected_open, f"{where} ({record.state.value}): open {still_open}"


def check_dependencies(snapshot: Snapshot, model: Model) -> None:
    """A task waits (pending) exactly while one of its dependencies has not succeeded, and it
    runs only once all have; each ref (each submitted or successor task) exists once."""
    states = {t.id: t.state for t in snapshot.tasks}
    for record in snapshot.tasks:
        deps = [states[d] for d in model.tasks[record.id].deps]
        met = all(state is TaskState.SUCCEEDED for state in deps)
        if record.state is TaskState.PENDING:
            assert not met, f"task {record.id} pending on {deps}"
        elif not record.state.terminal:
            assert met, f"task {record.id} {record.state.value} before its dependencies: {deps}"
    refs = Counter(t.ref for t in snapshot.tasks)
    assert all(n == 1 for n in refs.values()), f"created twice: {refs.most_common(3)}"


def check_keys(snapshot: Snapshot, model: Model) -> None:
    for key in KEYS:
        assert snapshot.keys[key] == model.keys.get(key), f"key {key}"
        named = [t.id for t in snapshot.tasks if t.key == key]
        assert len(named) <= 1, f"key {key} names tasks {named}"


def check_gates(snapshot: Snapshot) -> None:
    for name in GATE_NAMES:
        holding = sum(t.gates.count(name) for t in snapshot.tasks if t.state in HOLDING)
        stat = snapshot.gates.get(name)
        in_flight = stat.in_flight if stat is not None else 0
        assert in_flight == holding, f"gate {name}: in_flight {in_flight}, tickets {holding}"
        cap = CAPS.get(name)
        if cap is not None and stat is not None:
            assert stat.in_flight <= cap and stat.peak_in_flight <= cap, stat


def check_rate_windows(model: Model) -> None:
    """No sliding window of a rated gate holds more than n starts, each counted from its stamp
    (the claims the store made were each checked against the model, reservations included)."""
    for name, (n, window) in RATES.items():
        starts = sorted(model.gate_starts[name])
        for first, last in zip(starts, starts[n:], strict=False):
            assert not last < first + window, f"gate {name}: {n + 1} starts in {window}s: {starts}"


# -- the test


def machine_for(name: str) -> type[StoreMachine]:
    class OnBackend(StoreMachine):
        backend = name

    OnBackend.__name__ = OnBackend.__qualname__ = f"StoreMachine[{name}]"
    return OnBackend


# A failing run shrinks its example, replaying it hundreds of times; on PostgreSQL that outlasts
# the suite's per-test timeout (Hypothesis itself gives up shrinking after five minutes).
@pytest.mark.timeout(420)
def test_the_store_agrees_with_its_model(backend: str, durable: None) -> None:
    examples = settings(MACHINE_SETTINGS, max_examples=EXAMPLES.get(backend, 25))
    run_state_machine_as_test(machine_for(backend), settings=examples)
