"""Gates: a concurrency cap and an exact sliding-window rate, asked, never waited on.

Times are drawn on a grid of quarter seconds so sums and differences are exact in floating point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.policy import gate as gating
from headrace.policy.errors import ConfigError, UnknownGate
from headrace.policy.gate import Gate, GateConfig, GateState, Refusal, resolve
from headrace.policy.rate import Rate

QUARTER = 0.25


def grid(low: int, high: int) -> st.SearchStrategy[float]:
    return st.integers(low, high).map(lambda k: k * QUARTER)


class Op(Enum):
    ACQUIRE = "acquire"
    RELEASE = "release"
    PENALIZE = "penalize"


@dataclass(frozen=True)
class Step:
    op: Op
    at: float


@dataclass(frozen=True)
class Scenario:
    config: GateConfig
    steps: list[Step]

    @property
    def window(self) -> float:
        """How long a start counts: the rate's window lengthened by the guard."""
        assert self.config.counted_rate is not None
        return self.config.counted_rate.window

    @property
    def n(self) -> int:
        assert self.config.rate is not None
        return self.config.rate.n


@st.composite
def scenarios(draw: st.DrawFn, *, concurrency: bool = True, releases: bool = True) -> Scenario:
    rate = Rate(draw(st.integers(1, 8)), per=draw(grid(1, 40)))
    cap = draw(st.none() | st.integers(1, 6)) if concurrency else None
    config = GateConfig("provider:video", concurrency=cap, rate=rate, guard=draw(grid(0, 8)))
    ops = st.sampled_from([Op.ACQUIRE] * 6 + [Op.RELEASE] * (5 if releases else 0) + [Op.PENALIZE])
    # bursts at one instant, short gaps that fill a window, and long ones that let it drain
    gaps = st.one_of(st.just(0.0), grid(0, 4), grid(0, 4), grid(0, 80))
    steps: list[Step] = []
    now = draw(grid(0, 40))
    size = draw(st.integers(1, 100))
    for op, gap in draw(st.lists(st.tuples(ops, gaps), min_size=size, max_size=size)):
        now += gap
        steps.append(Step(op, now))
    return Scenario(config, steps)


@dataclass
class Run:
    """What a scenario did to a `Gate`, with an independent record of penalties."""

    gate: Gate
    granted: list[float]
    granted_while_penalized: list[float]
    attempts: int


def play(scenario: Scenario) -> Run:
    gate = Gate(scenario.config)
    assert scenario.config.rate is not None
    run = Run(gate, [], [], 0)
    penalized_until = -math.inf
    for step in scenario.steps:
        if step.op is Op.PENALIZE:
            gate.penalize(step.at)
            penalized_until = max(penalized_until, step.at + 2 * scenario.config.rate.window)
        elif step.op is Op.RELEASE:
            gate.release()
        else:
            run.attempts += 1
            if gate.try_acquire(step.at):
                run.granted.append(step.at)
                if step.at < penalized_until:
                    run.granted_while_penalized.append(step.at)
    return run


@given(scenarios())
@settings(max_examples=150, deadline=None)
def test_no_sliding_window_holds_more_than_n_starts(scenario: Scenario) -> None:
    """For each granted start s, [s, s + window) holds at most n starts. And each start granted
    during a penalty sees at most max(1, n // 2) starts (itself included) in the window ending
    with it, so every window lying inside a penalty holds at most that many."""
    run = play(scenario)
    starts = run.granted
    for start in starts:
        in_window = sum(1 for other in starts if start <= other < start + scenario.window)
        assert in_window <= scenario.n
    halved = max(1, scenario.n // 2)
    for start in run.granted_while_penalized:
        counted = sum(1 for other in starts if start - scenario.window < other <= start)
        assert counted <= halved

    stats = run.gate.statistics(scenario.steps[-1].at)
    assert stats.granted == len(starts)
    assert stats.granted + stats.blocked_by_token + stats.blocked_by_concurrency == run.attempts
    assert stats.rate_limited == sum(1 for step in scenario.steps if step.op is Op.PENALIZE)
    blocked = stats.blocked_by_token + stats.blocked_by_concurrency
    assert (stats.first_blocked_at is None) is (blocked == 0)


@given(scenarios(concurrency=False, releases=False))
@settings(max_examples=120, deadline=None)
def test_a_refusal_is_always_justified(scenario: Scenario) -> None:
    """The gate never refuses a start the window and the penalty would allow (no lost capacity)."""
    gate = Gate(scenario.config)
    assert scenario.config.rate is not None
    granted: list[float] = []
    penalized_until = -math.inf
    for step in scenario.steps:
        if step.op is Op.PENALIZE:
            gate.penalize(step.at)
            penalized_until = max(penalized_until, step.at + 2 * scenario.config.rate.window)
            continue
        capacity = max(1, scenario.n // 2) if step.at < penalized_until else scenario.n
        recent = sum(1 for start in granted if start > step.at - scenario.window)
        assert gate.try_acquire(step.at) is (recent < capacity)
        if recent < capacity:
            granted.append(step.at)


@pytest.mark.parametrize("n", [1, 3, 20])
def test_the_whole_burst_is_available_on_a_fresh_gate(n: int) -> None:
    gate = Gate(GateConfig("provider:image", rate=Rate(n, per="1m")))
    assert all(gate.try_acquire(5.0) for _ in range(n))
    assert not gate.try_acquire(5.0)
    stats = gate.statistics(5.0)
    assert (stats.granted, stats.blocked_by_token, stats.in_flight) == (n, 1, n)


def test_a_second_burst_across_a_window_boundary_is_refused() -> None:
    """n at the end of one minute and n at the start of the next: a resetting bucket would let
    2n through in a quarter second; the sliding window refuses the second burst."""
    n = 10
    gate = Gate(GateConfig("provider:tts", rate=Rate(n, per="1m"), guard=0))
    assert [gate.try_acquire(59.75) for _ in range(n)] == [True] * n
    assert [gate.try_acquire(60.0) for _ in range(n)] == [False] * n
    assert gate.next_admission(60.0) == 119.75
    assert gate.try_acquire(119.75)


def test_guard_lengthens_how_long_a_start_counts() -> None:
    gate = Gate(GateConfig("provider:tts", rate=Rate(1, per=10), guard=0.5))
    assert gate.try_acquire(0.0)
    assert not gate.try_acquire(10.0)
    assert gate.next_admission(10.0) == 10.5
    assert gate.try_acquire(10.5)


@st.composite
def acquire_release(draw: st.DrawFn) -> tuple[int, list[bool]]:
    cap = draw(st.integers(1, 6))
    return cap, draw(st.lists(st.booleans(), max_size=200))


@given(acquire_release())
@settings(max_examples=300, deadline=None)
def test_concurrency_never_exceeds_the_cap(case: tuple[int, list[bool]]) -> None:
    """True acquires, False releases; the gate's in-flight and peak match a plain counter."""
    cap, ops = case
    gate = Gate(GateConfig("class:image", concurrency=cap))
    in_flight = peak = granted = refused = 0
    for now, acquire in enumerate(ops):
        if acquire:
            ok = gate.try_acquire(float(now))
            assert ok is (in_flight < cap)
            if ok:
                in_flight += 1
                granted += 1
                peak = max(peak, in_flight)
            else:
                refused += 1
                assert gate.next_admission(float(now)) is None
        else:
            gate.release()
            in_flight = max(0, in_flight - 1)
        assert gate.state.in_flight == in_flight <= cap
    stats = gate.statistics(float(len(ops)))
    assert stats.peak_in_flight == peak
    assert (stats.granted, stats.blocked_by_concurrency, stats.blocked_by_token) == (
        granted,
        refused,
        0,
    )


def test_release_on_an_idle_gate_stays_at_zero() -> None:
    gate = Gate(GateConfig("class:image", concurrency=1))
    gate.release()
    assert gate.state.in_flight == 0
    assert gate.try_acquire(0.0)
    assert not gate.try_acquire(0.0)
    assert gating.release(GateState(in_flight=3), count=2).in_flight == 1


@given(scenarios(), grid(0, 400), st.integers(1, 1023))
@settings(max_examples=120, deadline=None)
def test_next_admission_is_exact(scenario: Scenario, later: float, fraction: int) -> None:
    run = play(scenario)
    state, config = run.gate.state, scenario.config
    now = scenario.steps[-1].at + later
    when = gating.next_admission(config, state, now)
    if when is None:
        assert config.concurrency is not None
        assert state.in_flight >= config.concurrency
        assert gating.check(config, state, now) is Refusal.CONCURRENCY
        state = gating.release(state)  # what the next ticket released would give
        when = gating.next_admission(config, state, now)
        assert when is not None
    assert when >= now
    assert gating.check(config, state, when) is None
    if when > now:
        before = (now, now + (when - now) * fraction / 1024, when - 2**-10)
        for probe in before:
            assert gating.check(config, state, probe) is Refusal.TOKEN


def test_next_admission_without_a_rate_is_now() -> None:
    gate = Gate(GateConfig("session:abc", concurrency=2))
    assert gate.next_admission(3.0) == 3.0
    assert gate.try_acquire(3.0)
    assert gate.try_acquire(3.0)
    assert gate.next_admission(3.0) is None


def test_statistics_count_every_decision() -> None:
    gate = Gate(GateConfig("provider:image", concurrency=1, rate=Rate(2, per=10)))
    stats = gate.statistics(0.0)
    assert (stats.granted, stats.blocked_by_token, stats.blocked_by_concurrency) == (0, 0, 0)
    assert stats.first_blocked_at is None
    assert stats.penalized_until is None

    assert gate.try_acquire(1.0)
    assert not gate.try_acquire(2.0)  # the one ticket is out
    gate.release()
    assert gate.try_acquire(3.0)
    gate.release()
    assert not gate.try_acquire(4.0)  # two starts in the last ten seconds
    gate.penalize(5.0)
    gate.penalize(6.0)

    stats = gate.statistics(6.0)
    assert stats.name == "provider:image"
    assert stats.concurrency == 1
    assert stats.rate == Rate(2, per=10)
    assert stats.granted == 2
    assert stats.blocked_by_concurrency == 1
    assert stats.blocked_by_token == 1
    assert stats.rate_limited == 2
    assert stats.first_blocked_at == 2.0
    assert stats.in_flight == 0
    assert stats.peak_in_flight == 1
    assert stats.penalized_until == 26.0
    assert gate.statistics(26.0).penalized_until is None


def test_concurrency_is_reported_before_the_rate() -> None:
    gate = Gate(GateConfig("provider:video", concurrency=1, rate=Rate(1, per=60)))
    assert gate.try_acquire(0.0)
    assert gating.check(gate.config, gate.state, 1.0) is Refusal.CONCURRENCY
    gate.release()
    assert gating.check(gate.config, gate.state, 1.0) is Refusal.TOKEN


def test_a_penalty_halves_then_restores_full_capacity_after_two_windows() -> None:
    gate = Gate(GateConfig("provider:tts", rate=Rate(4, per=10), guard=0))
    gate.penalize(0.0)
    assert [gate.try_acquire(0.0) for _ in range(3)] == [True, True, False]
    assert gate.next_admission(0.0) == 10.0
    assert [gate.try_acquire(10.0) for _ in range(3)] == [True, True, False]
    assert gate.next_admission(10.0) == 20.0
    assert gate.statistics(19.75).penalized_until == 20.0
    assert [gate.try_acquire(20.0) for _ in range(5)] == [True] * 4 + [False]
    assert gate.statistics(20.0).penalized_until is None


@given(st.integers(1, 12), grid(1, 40), grid(0, 400))
@settings(max_examples=100, deadline=None)
def test_full_capacity_returns_when_the_penalty_ends(
    n: int, window: float, penalized_at: float
) -> None:
    gate = Gate(GateConfig("provider:tts", rate=Rate(n, per=window)))
    assert all(gate.try_acquire(penalized_at) for _ in range(n))
    gate.penalize(penalized_at)
    assert not gate.try_acquire(penalized_at + window - QUARTER)
    end = penalized_at + 2 * window
    assert all(gate.try_acquire(end) for _ in range(n))
    assert not gate.try_acquire(end)


def test_penalize_without_a_rate_only_counts() -> None:
    gate = Gate(GateConfig("session:abc", concurrency=1))
    gate.penalize(1.0)
    assert gate.state.penalized_until == -math.inf
    assert gate.statistics(1.0).rate_limited == 1


def test_pure_functions_leave_the_state_alone() -> None:
    config = GateConfig("provider:video", concurrency=2, rate=Rate(2, per=10))
    state = GateState()
    granted = gating.grant(config, state, 1.0)
    assert state == GateState()
    assert (granted.in_flight, granted.starts, granted.unstarted, granted.granted) == (1, (), 1, 1)
    started = gating.start(config, granted, 1.5)
    assert (started.starts, started.unstarted) == ((1.5,), 0)
    refused = gating.refuse(granted, Refusal.TOKEN, 2.0)
    assert granted.blocked_by_token == 0
    assert (refused.blocked_by_token, refused.first_blocked_at) == (1, 2.0)
    again = gating.refuse(refused, Refusal.CONCURRENCY, 3.0)
    assert (again.blocked_by_concurrency, again.first_blocked_at) == (1, 2.0)


CONFIGS = {
    config.name: config
    for config in (
        GateConfig("provider:video", concurrency=2, rate=Rate(20, per="1m")),
        GateConfig("session:*", concurrency=2),
        GateConfig("session:vip", concurrency=8),
        GateConfig("event:*", concurrency=50),
        GateConfig("event:gala:*", concurrency=5),
    )
}


def test_resolve_an_exact_name() -> None:
    assert resolve("provider:video", CONFIGS) is CONFIGS["provider:video"]
    assert resolve("session:vip", CONFIGS).concurrency == 8


@given(st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=20))
@settings(max_examples=50, deadline=None)
def test_a_template_makes_one_gate_per_key(key: str) -> None:
    if key == "vip":
        return
    config = resolve(f"session:{key}", CONFIGS)
    assert config == replace(CONFIGS["session:*"], name=f"session:{key}")
    assert not config.is_template


def test_the_longest_template_prefix_wins() -> None:
    assert resolve("event:gala:table7", CONFIGS).concurrency == 5
    assert resolve("event:picnic", CONFIGS).concurrency == 50
    assert resolve("event:picnic:table7", CONFIGS).concurrency == 50
    assert resolve("event:gala:table7", CONFIGS).name == "event:gala:table7"


@pytest.mark.parametrize("name", ["provider:image", "session:", "session", "sessions:abc", ""])
def test_an_unmatched_name_is_an_unknown_gate(name: str) -> None:
    with pytest.raises(UnknownGate) as caught:
        resolve(name, CONFIGS)
    assert caught.value.gate == name
    assert isinstance(caught.value, ConfigError)
    assert "gates" in str(caught.value)


def test_template_and_rated_names() -> None:
    assert CONFIGS["session:*"].is_template
    assert not CONFIGS["session:vip"].is_template
    assert gating.rated(CONFIGS.values()) == ["provider:video"]


@pytest.mark.parametrize("concurrency", [0, -1, True, False, "1x", 1.5])
def test_gate_config_refuses_a_bad_concurrency(concurrency: object) -> None:
    with pytest.raises(ConfigError, match="concurrency"):
        GateConfig("provider:video", concurrency=concurrency)  # type: ignore[arg-type]


@pytest.mark.parametrize("guard", [-1, -0.25, math.nan, math.inf, "1x", True])
def test_gate_config_refuses_a_bad_guard(guard: object) -> None:
    with pytest.raises(ConfigError, match="guard"):
        GateConfig("provider:video", rate=Rate(1), guard=guard)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "provider video", "provider:\tvideo", "session*", "a:*:b"])
def test_gate_config_refuses_a_bad_name(name: str) -> None:
    with pytest.raises(ConfigError, match=r"gate\.name"):
        GateConfig(name, concurrency=1)


def test_gate_config_accepts_good_values() -> None:
    config = GateConfig("provider:video", concurrency=2, rate=Rate(20, per="1m"), guard=0.5)
    assert config.counted_rate == Rate(20, per=60.5)
    assert GateConfig("provider:video", rate=Rate(20), guard=0).counted_rate == Rate(20)
    assert GateConfig("session:*").concurrency is None


@pytest.mark.parametrize(
    ("window", "guard"), [(6.0, 0.12), (60.0, gating.GUARD_MAX), (1.0, 0.02), (3600.0, 0.25)]
)
def test_the_default_guard_is_a_share_of_the_window_capped(window: float, guard: float) -> None:
    rate = Rate(10, per=window)
    assert gating.default_guard(rate) == pytest.approx(guard)
    assert GateConfig("provider:video", rate=rate).counted_rate == Rate(10, per=window + guard)


@st.composite
def float_timelines(draw: st.DrawFn) -> tuple[GateConfig, list[Step]]:
    """Arbitrary float times and windows: rounding must not open a window or delay a wake-up."""
    rate = Rate(draw(st.integers(1, 6)), per=draw(st.floats(1e-3, 1e3)))
    config = GateConfig("provider:video", rate=rate)
    ops = st.sampled_from([Op.ACQUIRE] * 8 + [Op.PENALIZE])
    size = draw(st.integers(1, 60))
    times = sorted(draw(st.lists(st.floats(0, 1e6), min_size=size, max_size=size)))
    return config, [Step(draw(ops), at) for at in times]


@given(float_timelines())
@settings(max_examples=150, deadline=None)
def test_float_times_keep_every_window_and_wake_up_exact(
    timeline: tuple[GateConfig, list[Step]],
) -> None:
    config, steps = timeline
    assert config.rate is not None
    window, n = config.rate.window, config.rate.n
    gate = Gate(config)
    granted: list[float] = []
    for step in steps:
        if step.op is Op.PENALIZE:
            gate.penalize(step.at)
            continue
        when = gate.next_admission(step.at)
        assert when is not None
        assert gate.try_acquire(step.at) is (when == step.at)
        if when == step.at:
            granted.append(step.at)
        else:  # the wake-up time admits, and the float just before it does not
            assert gating.check(config, gate.state, when) is None
            before = math.nextafter(when, -math.inf)
            assert gating.check(config, gate.state, before) is Refusal.TOKEN
    for start in granted:
        assert sum(1 for other in granted if start <= other < start + window) <= n


def test_a_reserved_start_counts_in_every_window_until_it_is_stamped() -> None:
    config = GateConfig("provider:video", rate=Rate(2, per=10), guard=0)
    state = gating.grant(config, gating.grant(config, GateState(), 0.0), 0.0)
    assert state.unstarted == 2
    for later in (0.0, 10.0, 1000.0):  # the calls may arrive at any time: nothing is admitted
        assert gating.check(config, state, later) is Refusal.TOKEN
        assert gating.next_admission(config, state, later) is None
    state = gating.start(config, state, 500.0)  # one call leaves at 500: it counts to 510
    assert gating.check(config, state, 509.75) is Refusal.TOKEN
    assert gating.next_admission(config, state, 509.0) == 510.0  # if the other stays unstamped
    state = gating.start(config, state, 505.0)
    assert gating.next_admission(config, state, 506.0) == 510.0
    assert gating.check(config, state, 510.0) is None


def test_a_start_on_a_gate_without_a_rate_changes_nothing() -> None:
    config = GateConfig("session:abc", concurrency=1)
    state = gating.grant(config, GateState(), 1.0)
    assert state.unstarted == 0
    assert gating.start(config, state, 2.0) == state


def test_a_start_on_an_undeclared_gate_is_kept_until_a_rate_trims_it() -> None:
    state = GateState(starts=(3.0, 1.0), unstarted=1)
    assert gating.start(None, state, 2.0) == GateState(starts=(1.0, 3.0, 2.0), unstarted=0)


@dataclass(frozen=True)
class Call:
    """A call a worker asks to make: when it asks, how long after its grant it stamps its
    start, and how long after the stamp the vendor sees it arrive."""

    asks: float
    stamp_lag: float
    arrival_lag: float


@st.composite
def call_runs(draw: st.DrawFn) -> tuple[GateConfig, list[Call]]:
    rate = Rate(draw(st.integers(1, 6)), per=draw(grid(1, 24)))
    guard = draw(grid(0, 4))
    config = GateConfig(
        "provider:video", concurrency=draw(st.integers(1, 8)), rate=rate, guard=guard
    )
    size = draw(st.integers(1, 60))
    asks = sorted(draw(st.lists(grid(0, 400), min_size=size, max_size=size)))
    lags = st.tuples(grid(0, 40), st.integers(0, int(guard / QUARTER)).map(lambda k: k * QUARTER))
    return config, [Call(at, *draw(lags)) for at in asks]


@given(call_runs())
@settings(max_examples=200, deadline=None)
def test_arrivals_keep_every_window_whatever_the_lag_between_grant_and_call(
    run: tuple[GateConfig, list[Call]],
) -> None:
    """Grants reserve starts, each call stamps its start some time after its grant and arrives
    at the vendor within the guard after the stamp: no window of the rate's length ever holds
    more than n arrivals, and never more than the cap run at once."""
    config, calls = run
    assert config.rate is not None and config.concurrency is not None
    state = GateState()
    stamps: list[tuple[float, int]] = []  # (when, call) stamps still to come, a heap
    arrivals: list[float] = []
    for index, call in enumerate(calls):
        while stamps and min(stamps)[0] <= call.asks:
            when, done = min(stamps)
            stamps.remove((when, done))
            state = gating.start(config, state, when)
            arrivals.append(when + calls[done].arrival_lag)
        if gating.check(config, state, call.asks) is None:
            state = gating.grant(config, state, call.asks)
            stamps.append((call.asks + call.stamp_lag, index))
    for when, done in sorted(stamps):
        state = gating.start(config, state, when)
        arrivals.append(when + calls[done].arrival_lag)
    window, n = config.rate.window, config.rate.n
    for first in arrivals:
        assert sum(1 for other in arrivals if first <= other < first + window) <= n


@pytest.mark.parametrize(
    ("rate", "expected"),
    [(Rate(30, per="6s"), Rate(30, per=6)), ("30/6s", Rate(30, per=6)), ("10/s", Rate(10, per=1))],
)
def test_gate_config_takes_a_rate_or_its_string_form(rate: Rate | str, expected: Rate) -> None:
    config = GateConfig("provider:video", concurrency=2, rate=rate)
    assert config.rate == expected
    assert config.for_key("provider:video").rate == expected
    assert replace(config, concurrency=3) == GateConfig("provider:video", 3, expected)


@pytest.mark.parametrize("rate", [10, 2.5, "10", "10/6", "ten a second", True, (10, "1s")])
def test_gate_config_refuses_another_rate_naming_rate_and_both_forms(rate: object) -> None:
    with pytest.raises(ConfigError, match=r"gate provider:video: rate: .*Rate\(30.*\"30/6s\""):
        GateConfig("provider:video", rate=rate)  # type: ignore[arg-type]


def test_a_stamp_opens_a_rate_sooner_only_when_reservations_filled_it() -> None:
    config = GateConfig("speech", rate=Rate(2, per="10s"), guard=0)
    full = gating.grant(config, gating.grant(config, GateState(), 0.0), 0.0)  # two reserved
    assert gating.next_admission(config, full, 5.0) is None  # only a stamp or release helps
    stamped = gating.start(config, full, 5.0)
    assert gating.next_admission(config, stamped, 5.0) == 15.0
    assert gating.opens_sooner(config, full, stamped, 5.0)
    # One reserved and one stamped: stamping the other keeps the same next admission.
    both = gating.start(config, stamped, 6.0)
    assert gating.next_admission(config, both, 6.0) == 15.0
    assert not gating.opens_sooner(config, stamped, both, 6.0)
    assert not gating.opens_sooner(None, full, stamped, 5.0)  # undeclared: cannot tell
