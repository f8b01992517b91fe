"""The tallies against a full count: Hypothesis drives one store through random sequences of
verbs and deletes, and after every step each read the tallies answer equals what a plain
query over every row says (`plain.py`).

The verbs cover every transition a task makes: submits (with keys, dependencies, bounded
stages, and on PostgreSQL the one-statement plain batch), claims, successes with successors,
deferrals when a stage is full, retries, deaths and the cancellation of what waited on them,
remote waits and their polls, expired leases, cancels and redrives, over folds of the tallies
(every FOLD_EVERY of store time). Deletes are retention's: finished tasks with their attempts,
by plain DELETEs. The reads checked: `counts` (all kinds, and each kind), `stages`,
`ready_ages` (a small sample, so both ends and the middle are exercised), `groups`,
`group_report` and `attempt_counts`, whose totals must not move when attempts are deleted.

No model of what the verbs should do: `test_state_machine.py` holds the store to one. Verbs
a lease holder may no longer call (a lease lost, an outcome refused) simply fail.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from collections.abc import Coroutine
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

from headrace.policy import ErrorClass, GateConfig, HeadraceError, ManualClock, Tier
from headrace.store.machine import FOLD_EVERY
from headrace.store.protocol.ages import ReadyAges
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import (
    ACTIVE,
    AttemptError,
    AttemptOutcome,
    AwaitRemote,
    Dead,
    Lease,
    NewTask,
    Outcome,
    PollAgain,
    Retry,
    Settings,
    Sibling,
    StageLimits,
    StageStats,
    Succeeded,
    TaskState,
)

from .conftest import make_backend
from .plain import Plain, Row, plain_for

T = TypeVar("T")

KINDS = ("scan", "render")
GROUPS = (None, "ev1", "ev2")
FLOWS = ("f1", "f2", "f3", "f4")
SETTINGS = Settings(
    gates=(GateConfig("free"), GateConfig("session:*", concurrency=1)),
    aging_step=20.0,  # promotions: updates that move no task from a state
    poison_expiries=2,
    stages=(StageLimits("render", bound=2),),  # a full stage defers its feeders' successes
)
SAMPLE = 2  # ready ages read at each end of a stage's queue
BOOM = AttemptError.of(ErrorClass.TRANSIENT, "boom")
FATAL = AttemptError.of(ErrorClass.FATAL, "bad_input")
OUTCOMES = ("done", "done", "spawn", "spawn", "retry", "dead", "await", "again")
HANDLED = ("hold", "now", "now")  # a claimed task's handler: still running, or its outcome now
EXAMPLES = {"memory": 150, "sqlite": 50, "postgres": 20}
MACHINE_SETTINGS = settings(
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)

# A task to submit: (kind, group, flow, gates, key, max attempts, tier).
TASK_FIELDS = (
    st.sampled_from(GROUPS),
    st.sampled_from(FLOWS),
    st.sampled_from(((), ("free",), ("session:a",))),
    st.none() | st.sampled_from(("k1", "k2")),
    st.sampled_from((1, 2, 3)),
    st.sampled_from(Tier),
)
NEW_TASKS = st.tuples(st.sampled_from(KINDS), *TASK_FIELDS)
SUCCESSORS = st.tuples(st.sampled_from(("render", "render", "scan")), *TASK_FIELDS)


class TallyMachine(RuleBasedStateMachine):
    backend: ClassVar[str]  # set by `machine_for`

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.refs = 0
        self.held: list[Lease] = []
        self.deleted: Counter[AttemptOutcome] = Counter()  # attempts retention took away
        self.directory = Path(tempfile.mkdtemp(prefix="headrace-tallies-"))
        self.loop = asyncio.new_event_loop()
        self.store: Store = make_backend(self.backend, self.clock, self.directory)
        self.plain: Plain | None = None
        try:
            self.run(self.store.open(SETTINGS))
            self.plain = plain_for(self.backend, self.directory, self.store)
        except BaseException:
            self.teardown()
            raise

    def teardown(self) -> None:
        try:
            if self.plain is not None:
                self.plain.close()
            self.run(self.store.close())
        finally:
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(work)

    def rows(self) -> list[Row]:
        assert self.plain is not None
        return self.plain.tasks()

    def new_task(self, drawn: tuple[Any, ...], after: tuple[int | Sibling, ...] = ()) -> NewTask:
        kind, group, flow, gates, key, attempts, tier = drawn
        self.refs += 1
        # A key stands for one payload: reused, it comes back with the task it first named.
        ref = f"{key}-ref" if key is not None else f"t{self.refs}"
        return NewTask(
            kind,
            ref,
            gates=gates,
            flow=flow,
            group=group,
            key=key,
            after=() if key is not None else after,
            max_attempts=attempts,
            tier=tier if key is None else Tier.NORMAL,
        )

    def draw_after(self, data: st.DataObject, index: int) -> tuple[int | Sibling, ...]:
        ids = [row.id for row in self.rows()]
        options: list[st.SearchStrategy[int | Sibling]] = []
        if ids:
            options.append(st.sampled_from(sorted(ids)))
        if index > 0:
            options.append(st.just(Sibling(0)))
        if not options:
            return ()
        choice = data.draw(st.none() | st.one_of(options), label=f"after, task {index}")
        return () if choice is None else (choice,)

    async def quietly(self, work: Coroutine[Any, Any, T]) -> T | None:
        """A verb that a lost lease, a refused key or a full stage may refuse."""
        try:
            return await work
        except HeadraceError:
            return None

    # -- submit and claim

    @initialize(drawn=st.lists(NEW_TASKS, min_size=2, max_size=5))
    def some_work(self, drawn: list[tuple[Any, ...]]) -> None:
        self.run(self.quietly(self.store.submit([self.new_task(d) for d in drawn])))

    @rule(drawn=st.lists(NEW_TASKS, min_size=1, max_size=3), data=st.data())
    def submit(self, drawn: list[tuple[Any, ...]], data: st.DataObject) -> None:
        batch = [self.new_task(d, self.draw_after(data, i)) for i, d in enumerate(drawn)]
        self.run(self.quietly(self.store.submit(batch)))

    @rule(
        worker=st.sampled_from(("w1", "w2")),
        limit=st.integers(1, 3),
        kinds=st.sampled_from((None, ("scan",), ("render",))),
        data=st.data(),
    )
    def claim(
        self, worker: str, limit: int, kinds: tuple[str, ...] | None, data: st.DataObject
    ) -> None:
        result = self.run(self.store.claim(worker, limit, lease_for=10.0, kinds=kinds))
        self.handle(result.leases, data)

    @rule(worker=st.sampled_from(("w1", "w2")), limit=st.integers(1, 2), data=st.data())
    def poll(self, worker: str, limit: int, data: st.DataObject) -> None:
        """Remote jobs whose check is due (after their poll interval) are checked."""
        self.clock.advance(5.0)
        result = self.run(self.store.claim_polls(worker, limit, lease_for=10.0))
        for lease in result.leases:
            self.run(self.quietly(self.store.finish(lease, self.draw_outcome(data, lease))))

    def handle(self, leases: tuple[Lease, ...], data: st.DataObject) -> None:
        for lease in leases:
            if data.draw(st.sampled_from(HANDLED), label=f"handler of {lease.task_id}") == "hold":
                self.held.append(lease)
            else:
                outcome = self.draw_outcome(data, lease)
                self.run(self.quietly(self.store.finish(lease, outcome)))

    # -- outcomes

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.held), label="lease")
        outcome = self.draw_outcome(data, lease)
        self.held.remove(lease)
        self.run(self.quietly(self.store.finish(lease, outcome)))

    @precondition(lambda self: len(self.held) >= 2)
    @rule(data=st.data())
    def finish_many(self, data: st.DataObject) -> None:
        chosen = data.draw(st.lists(st.sampled_from(self.held), min_size=2, unique=True))
        outcomes = [(lease, self.draw_outcome(data, lease)) for lease in chosen]
        for lease in chosen:
            self.held.remove(lease)
        self.run(self.store.finish_many(outcomes))

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data(), limit=st.integers(1, 3))
    def claim_with_outcomes(self, data: st.DataObject, limit: int) -> None:
        """A worker hands in its outcomes with its next claim (one transaction)."""
        chosen = data.draw(st.lists(st.sampled_from(self.held), min_size=1, unique=True))
        outcomes = [(lease, self.draw_outcome(data, lease)) for lease in chosen]
        for lease in chosen:
            self.held.remove(lease)
        result = self.run(self.store.claim("w1", limit, lease_for=10.0, finished=outcomes))
        self.held.extend(result.leases)

    def draw_outcome(self, data: st.DataObject, lease: Lease) -> Outcome:
        action = data.draw(st.sampled_from(OUTCOMES), label=f"outcome of {lease.task_id}")
        if action == "spawn":
            drawn = data.draw(st.lists(SUCCESSORS, min_size=1, max_size=2), label="successors")
            after = data.draw(st.sampled_from(((), (lease.task_id,))), label="successor after")
            successors = tuple(self.new_task(d, after) for d in drawn)
            return Succeeded(successors=successors)
        if action == "retry":
            return Retry(BOOM, delay=data.draw(st.sampled_from((0.0, 5.0)), label="delay"))
        if action == "dead":
            return Dead(FATAL)
        if action == "await":
            return AwaitRemote(f"job-{lease.task_id}", poll_every=5.0)
        if action == "again":
            return PollAgain(5.0)
        return Succeeded()

    # -- time, crashes, cancels and redrives

    @rule(seconds=st.sampled_from((0.5, 5.0, FOLD_EVERY + 1, 25.0)))
    def advance(self, seconds: float) -> None:
        """Leases (10 s) run out and the next claim folds the tallies; low tasks age (25 s)."""
        self.clock.advance(seconds)

    @rule()
    def crash(self) -> None:
        """A worker dies: the leases it held run out."""
        self.held.clear()

    @rule()
    def reap(self) -> None:
        self.run(self.store.reap())

    @precondition(lambda self: sum(not row.state.terminal for row in self.rows()) >= 4)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        live = sorted(row.id for row in self.rows() if not row.state.terminal)
        self.run(self.store.cancel(data.draw(st.sampled_from(live), label="cancelled")))

    @precondition(lambda self: any(row.state is TaskState.DEAD for row in self.rows()))
    @rule(every=st.booleans(), data=st.data())
    def redrive(self, every: bool, data: st.DataObject) -> None:
        dead = sorted(row.id for row in self.rows() if row.state is TaskState.DEAD)
        chosen = None if every else [data.draw(st.sampled_from(dead), label="redriven")]
        self.run(self.store.redrive(task_ids=chosen))

    # -- retention

    @precondition(lambda self: any(row.state.terminal for row in self.rows()))
    @rule(data=st.data())
    def delete_finished(self, data: st.DataObject) -> None:
        """Retention deletes finished tasks (those nothing unfinished waits on) with their
        attempts: the attempt totals stay as they were."""
        rows = {row.id: row for row in self.rows()}
        assert self.plain is not None
        done = sorted(task_id for task_id, row in rows.items() if row.state.terminal)
        chosen = data.draw(st.lists(st.sampled_from(done), min_size=1, unique=True), label="ids")
        totals = self.run(self.store.attempt_counts())
        before = self.plain.attempts()
        self.plain.delete(chosen)
        self.deleted += before - self.plain.attempts()
        assert self.run(self.store.attempt_counts()) == totals

    # -- the check

    @invariant()
    def tallies_equal_a_full_count(self) -> None:
        assert self.plain is not None
        rows, now = self.rows(), self.clock.now()
        store = self.store
        assert self.run(store.counts()) == counts(rows)
        for kind in KINDS:
            kinds = [row for row in rows if row.kind == kind]
            assert self.run(store.counts(kinds=[kind])) == counts(kinds)
        assert self.run(store.stages()) == stages(rows, now)
        assert self.run(store.ready_ages(sample=SAMPLE)) == ready_ages(rows, now)
        named = sorted({row.group for row in rows if row.group is not None})
        assert self.run(store.groups()) == named
        for group in GROUPS[1:]:
            report = self.run(store.group_report(group))
            members = [row for row in rows if row.group == group]
            assert report.by_state == counts(members)
            assert report.total == len(members)
            dead = sorted(row.id for row in members if row.state is TaskState.DEAD)
            assert [failure.task_id for failure in report.failures] == dead
        ever = self.plain.attempts() + self.deleted
        assert self.run(store.attempt_counts()) == {o: n for o, n in ever.items() if n}


def counts(rows: list[Row]) -> dict[TaskState, int]:
    found = dict.fromkeys(TaskState, 0)
    for row in rows:
        found[row.state] += 1
    return found


def stages(rows: list[Row], now: float) -> list[StageStats]:
    found = []
    for kind in sorted({row.kind for row in rows if row.state in ACTIVE}):
        of = Counter(row.state for row in rows if row.kind == kind)
        ready = [row.since for row in rows if row.kind == kind and row.state is TaskState.READY]
        oldest = max(0.0, now - min(ready)) if ready else None  # 0 until a retry's run_at
        waiting = (of[TaskState.PENDING], of[TaskState.READY])
        active = (of[TaskState.RUNNING], of[TaskState.WAITING])
        found.append(StageStats(kind, *waiting, *active, oldest_ready_age=oldest))
    return found


def ready_ages(rows: list[Row], now: float) -> dict[str, ReadyAges]:
    """Both ends of each kind's ready queue in (since, id) order, `SAMPLE` at each."""
    found = {}
    for kind in sorted({row.kind for row in rows if row.state is TaskState.READY}):
        queue = sorted(
            (row.since, row.id) for row in rows if row.kind == kind and row.state is TaskState.READY
        )
        oldest, rest = queue[:SAMPLE], queue[SAMPLE:]
        newest = rest[-SAMPLE:]
        found[kind] = ReadyAges(
            len(queue),
            tuple(max(0.0, now - since) for since, _ in oldest),
            tuple(max(0.0, now - since) for since, _ in newest),
        )
    return found


def machine_for(name: str) -> type[TallyMachine]:
    class OnBackend(TallyMachine):
        backend = name

    OnBackend.__name__ = f"TallyMachine_{name}"
    return OnBackend


@pytest.mark.timeout(300)
def test_tallies_equal_a_full_count_after_every_step(backend: str, durable: None) -> None:
    examples = settings(MACHINE_SETTINGS, max_examples=EXAMPLES.get(backend, 20))
    run_state_machine_as_test(machine_for(backend), settings=examples)
