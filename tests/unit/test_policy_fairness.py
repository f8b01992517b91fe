"""Start-time fair queueing, simulated: flows submit batches, a dispatcher takes the smallest
`(tag, seq)` among ready tasks, except that within a round of equal tags the least recently
served flow goes first (`fairness.take_turns`), and moves the virtual time to the tag it took.

The guarantee of start-time fair queueing with one unit of service per task: over any stretch of
dispatches during which flows f and g both have ready work, the dispatch counts d satisfy
|d_f / w_f - d_g / w_g| <= 1 / w_f + 1 / w_g. Taking turns within a round tightens that for equal
weights to DESIGN's "within one", whenever each flow joins.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.policy import fairness
from headrace.policy.errors import ConfigError


@dataclass(frozen=True)
class Batch:
    step: int
    flow: int
    size: int


@dataclass(frozen=True)
class Dispatch:
    flow: int
    tag: float
    ready: frozenset[int]  # the flows that had ready work when this dispatch was chosen


@dataclass
class Dispatcher:
    weights: list[float]
    virtual_time: float = 0.0
    finish: list[float] = field(default_factory=list)
    queue: list[tuple[float, int, int]] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    seq: itertools.count[int] = field(default_factory=itertools.count)
    served: dict[str, int] = field(default_factory=dict)
    dispatches: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.finish = [0.0] * len(self.weights)
        self.waiting = [0] * len(self.weights)

    def submit(self, flow: int, size: int) -> None:
        for _ in range(size):
            tagged = fairness.tag(self.virtual_time, self.finish[flow], self.weights[flow])
            assert tagged.start >= self.virtual_time
            self.finish[flow] = tagged.flow_finish
            heapq.heappush(self.queue, (tagged.start, next(self.seq), flow))
            self.waiting[flow] += 1

    def dispatch(self) -> Dispatch | None:
        if not self.queue:
            return None
        ready = frozenset(flow for flow, count in enumerate(self.waiting) if count)
        ordered = fairness.take_turns(
            sorted(self.queue),
            rank=lambda queued: (queued[0],),
            flow=lambda queued: str(queued[2]),
            last_served=lambda flow: self.served.get(flow, 0),
        )
        chosen = next(ordered)
        self.queue.remove(chosen)
        heapq.heapify(self.queue)
        tag, _, flow = chosen
        self.served[str(flow)] = next(self.dispatches)
        self.waiting[flow] -= 1
        before = self.virtual_time
        self.virtual_time = fairness.advance(self.virtual_time, tag)
        assert self.virtual_time == max(before, tag)
        return Dispatch(flow, tag, ready)


def simulate(weights: list[float], batches: list[Batch], steps: int) -> list[Dispatch]:
    """At each step the batches due arrive (in the order given), then one task is dispatched."""
    dispatcher = Dispatcher(weights)
    due: dict[int, list[Batch]] = {}
    for batch in batches:
        due.setdefault(batch.step, []).append(batch)
    log: list[Dispatch] = []
    for step in range(steps):
        for batch in due.get(step, []):
            dispatcher.submit(batch.flow, batch.size)
        dispatched = dispatcher.dispatch()
        if dispatched is not None:
            log.append(dispatched)
    return log


def shared_runs(log: list[Dispatch], f: int, g: int) -> list[list[Dispatch]]:
    """The maximal stretches of consecutive dispatches during which f and g both had ready work."""
    runs: list[list[Dispatch]] = []
    current: list[Dispatch] = []
    for dispatched in log:
        if f in dispatched.ready and g in dispatched.ready:
            current.append(dispatched)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def widest_lag(run: list[Dispatch], f: int, g: int, weights: list[float]) -> float:
    """The largest |d_f / w_f - d_g / w_g| over the prefixes of a stretch."""
    served = {f: 0, g: 0}
    widest = 0.0
    for dispatched in run:
        if dispatched.flow in served:
            served[dispatched.flow] += 1
        widest = max(widest, abs(served[f] / weights[f] - served[g] / weights[g]))
    return widest


def widest_gap(run: list[Dispatch], f: int, g: int) -> int:
    return round(widest_lag(run, f, g, [1.0] * (max(f, g) + 1)))


def batches(flows: int, *, last_step: int = 60) -> st.SearchStrategy[list[Batch]]:
    batch = st.builds(
        Batch,
        step=st.integers(0, last_step),
        flow=st.integers(0, flows - 1),
        size=st.integers(1, 8),
    )
    return st.lists(batch, max_size=25)


weight_sets = st.lists(st.sampled_from([1.0, 2.0, 3.0, 0.5]), min_size=2, max_size=3)


@given(weight_sets, st.data())
@settings(max_examples=300, deadline=None)
def test_backlogged_flows_share_in_proportion_to_their_weights(
    weights: list[float], data: st.DataObject
) -> None:
    plan = data.draw(batches(len(weights)))
    log = simulate(weights, plan, steps=100)
    for f, g in itertools.combinations(range(len(weights)), 2):
        bound = 1 / weights[f] + 1 / weights[g]
        for run in shared_runs(log, f, g):
            assert widest_lag(run, f, g, weights) <= bound + 1e-9


@given(st.integers(2, 3), st.data())
@settings(max_examples=300, deadline=None)
def test_equal_flows_that_start_together_stay_within_one(flows: int, data: st.DataObject) -> None:
    """Every flow submits at step 0 (in any order) and more at random times after."""
    first = data.draw(st.permutations(range(flows)))
    sizes = data.draw(st.lists(st.integers(1, 8), min_size=flows, max_size=flows))
    plan = [Batch(0, flow, size) for flow, size in zip(first, sizes, strict=True)]
    plan += data.draw(batches(flows))
    log = simulate([1.0] * flows, plan, steps=100)
    for f, g in itertools.combinations(range(flows), 2):
        runs = shared_runs(log, f, g)
        assert runs[0][0] is log[0]  # the first stretch starts with the first dispatch
        assert widest_gap(runs[0], f, g) <= 1


@given(batches(2), st.integers(0, 1))
@settings(max_examples=300, deadline=None)
def test_a_returning_flow_gets_no_saved_up_credit(plan: list[Batch], steady: int) -> None:
    """Flow `steady` has work from the start to the end; the other comes and goes. Whenever both
    have work, neither gets more than one dispatch ahead: the one that was away does not catch up
    on what it missed, and is not made to wait for it either."""
    other = 1 - steady
    returning = [Batch(batch.step, other, batch.size) for batch in plan]
    log = simulate([1.0, 1.0], [Batch(0, steady, 200), *returning], steps=100)
    for run in shared_runs(log, 0, 1):
        assert widest_gap(run, 0, 1) <= 1


def test_a_flow_back_from_idle_starts_at_the_virtual_time() -> None:
    log = simulate([1.0, 1.0], [Batch(0, 0, 30), Batch(0, 1, 1), Batch(20, 1, 10)], steps=40)
    assert [d.flow for d in log[:2]] == [0, 1]
    assert all(d.flow == 0 for d in log[2:20])  # flow 1 was idle: flow 0 runs alone
    back = log[20:40]
    assert back[0].tag == log[19].tag  # flow 1 comes back at the virtual time, not at 1.0
    assert [d.flow for d in back] == [1, 0] * 10  # and alternates from there: no catch-up


def test_weight_two_gets_two_to_one() -> None:
    log = simulate([2.0, 1.0], [Batch(0, 0, 100), Batch(0, 1, 100)], steps=90)
    heavy = [sum(1 for d in log[:k] if d.flow == 0) for k in range(1, len(log) + 1)]
    for k, served in enumerate(heavy, start=1):
        light = k - served
        assert abs(served - 2 * light) <= 2
    assert (heavy[-1], len(log) - heavy[-1]) == (60, 30)


@given(st.lists(st.integers(1, 8), min_size=2, max_size=2), st.permutations([0, 1]))
@settings(max_examples=100, deadline=None)
def test_weight_two_stays_within_two_tasks_of_double(sizes: list[int], order: list[int]) -> None:
    weights = [2.0, 1.0]
    plan = [Batch(0, flow, 40 + sizes[flow]) for flow in order]
    log = simulate(weights, plan, steps=60)
    (run,) = shared_runs(log, 0, 1)
    heavy = light = 0
    for dispatched in run:
        heavy += dispatched.flow == 0
        light += dispatched.flow == 1
        assert abs(heavy - 2 * light) <= 2


def test_equal_flows_within_one_after_one_was_served_alone() -> None:
    # Flow 0 is served alone at tag 0. Then flow 1 submits two (tags 0 and 1) and flow 0 one
    # (tag 1). By tag and age alone the order would be 0 | 1, 1, 0; taking turns in the round
    # at tag 1 puts flow 0, served longer ago, first: 0 | 1, 0, 1.
    log = simulate([1.0, 1.0], [Batch(0, 0, 1), Batch(1, 1, 2), Batch(1, 0, 1)], steps=4)
    assert [d.flow for d in log] == [0, 1, 0, 1]
    assert widest_gap(shared_runs(log, 0, 1)[0], 0, 1) <= 1


@given(st.integers(2, 4), st.data())
@settings(max_examples=400, deadline=None)
def test_equal_flows_stay_within_one_whenever_they_join(flows: int, data: st.DataObject) -> None:
    plan = data.draw(batches(flows))
    log = simulate([1.0] * flows, plan, steps=150)
    for f, g in itertools.combinations(range(flows), 2):
        for run in shared_runs(log, f, g):
            assert widest_gap(run, f, g) <= 1


def test_tags_follow_the_flow_finish_and_the_virtual_time() -> None:
    first = fairness.tag(0.0, 0.0)
    assert (first.start, first.flow_finish) == (0.0, 1.0)
    second = fairness.tag(0.0, first.flow_finish, weight=1.0)
    assert (second.start, second.flow_finish) == (1.0, 2.0)
    heavy = fairness.tag(5.0, 2.0, weight=4.0)
    assert (heavy.start, heavy.flow_finish) == (5.0, 5.25)
    assert fairness.advance(5.0, 3.0) == 5.0
    assert fairness.advance(5.0, 7.0) == 7.0


@pytest.mark.parametrize("weight", [0, -1, math.inf, math.nan, True])
def test_a_weight_must_be_a_positive_number(weight: float) -> None:
    with pytest.raises(ConfigError, match="weight"):
        fairness.tag(0.0, 0.0, weight)
    with pytest.raises(ConfigError, match="weight"):
        fairness.check_weight(weight)


def test_a_weight_may_be_fractional() -> None:
    assert fairness.check_weight(0.5) == 0.5
    assert fairness.check_weight(3) == 3.0


def test_a_continuation_takes_its_turn_in_its_stage_lane() -> None:
    # Flow a has a backlog (its flow's finish 9) and carries an item on: the next stage is
    # tagged in a's lane for that stage (nothing there yet), at the virtual time.
    scan = fairness.lane("a", "scan", continues=1.0)
    assert scan != fairness.lane("a", "scan", None) == "a"
    carried = fairness.tag(virtual_time=3.0, flow_finish=0.0, continues=1.0)
    assert carried.start == 3.0
    # a's next item at that stage waits its turn there: one round later.
    second = fairness.tag(virtual_time=3.0, flow_finish=carried.flow_finish, continues=2.0)
    assert second.start == carried.flow_finish == 4.0
    # A continuation of a task tagged ahead of the virtual time keeps that tag's place.
    assert fairness.tag(virtual_time=3.0, flow_finish=0.0, continues=5.0).start == 5.0


def test_a_round_goes_to_new_lanes_first_then_the_least_recently_served() -> None:
    # A round at tag 3: a newcomer b (never served), a's item at a stage it has not reached
    # before (a served at dispatch 5), a's lane at a stage served at dispatch 7, c served at 6.
    served = {"a": 5, "a\x1fderive": 7, "c": 6}
    round_ = [("a", "a\x1fderive"), ("c", "c"), ("a", "a\x1fscan"), ("b", "b")]
    ordered = fairness.take_turns(
        round_,
        rank=lambda _: (3.0,),
        flow=lambda task: task[0],
        last_served=lambda name: served.get(name, 0),
        lane=lambda task: task[1],
    )
    assert [lane for _, lane in ordered] == ["b", "a\x1fscan", "c", "a\x1fderive"]
