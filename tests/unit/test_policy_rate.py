"""The sliding-window rate: exact in every window, the whole burst at once, a penalty that halves.

Times are drawn on a grid of quarter seconds so every sum and difference is exact in binary
floating point: the properties are about the admission rule, not about rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.policy import rate as rating
from headrace.policy.durations import Duration, seconds
from headrace.policy.errors import ConfigError
from headrace.policy.rate import PENALTY_WINDOWS, Rate

QUARTER = 0.25
NO_PENALTY = -math.inf


def grid(low: int, high: int) -> st.SearchStrategy[float]:
    return st.integers(low, high).map(lambda k: k * QUARTER)


def penalized_capacity(n: int) -> int:
    return max(1, n // 2)


@dataclass(frozen=True)
class Event:
    at: float
    penalize: bool


@st.composite
def timelines(draw: st.DrawFn) -> tuple[Rate, list[Event]]:
    n = draw(st.integers(1, 8))
    window = draw(grid(1, 40))
    # bursts at one instant, short gaps that fill a window, and long ones that let it drain
    gaps = st.one_of(st.just(0.0), grid(0, 4), grid(0, 4), grid(0, 80))
    size = draw(st.integers(1, 100))
    steps = draw(st.lists(gaps, min_size=size, max_size=size))
    events: list[Event] = []
    now = draw(grid(0, 40))
    for step in steps:
        now += step
        # penalties are rarer than attempts, so a run sees penalised and normal stretches
        events.append(Event(now, penalize=draw(st.integers(0, 9)) == 0))
    return Rate(n, per=window), events


def in_window(starts: list[float], low: float, high: float) -> int:
    """Starts in the half-open interval [low, high)."""
    return sum(1 for start in starts if low <= start < high)


@given(timelines())
@settings(max_examples=100, deadline=None)
def test_admission_matches_a_full_history_model(timeline: tuple[Rate, list[Event]]) -> None:
    """Keeping only the last n starts decides exactly like counting the whole history."""
    rate, events = timeline
    kept: tuple[float, ...] = ()
    history: list[float] = []
    penalized_until = NO_PENALTY
    for event in events:
        if event.penalize:
            penalized_until = rating.penalty_end(rate, event.at, penalized_until)
            continue
        capacity = penalized_capacity(rate.n) if event.at < penalized_until else rate.n
        expected = sum(1 for start in history if start > event.at - rate.window) < capacity
        assert rating.admits(rate, kept, event.at, penalized_until) is expected
        if expected:
            kept = rating.record(rate, kept, event.at)
            history.append(event.at)
        assert len(kept) <= rate.n
        assert list(kept) == sorted(history)[-rate.n :]


@given(timelines())
@settings(max_examples=100, deadline=None)
def test_no_sliding_window_holds_more_than_n_starts(timeline: tuple[Rate, list[Event]]) -> None:
    rate, events = timeline
    kept: tuple[float, ...] = ()
    granted: list[float] = []
    penalized_until = NO_PENALTY
    for event in events:
        if event.penalize:
            penalized_until = rating.penalty_end(rate, event.at, penalized_until)
        elif rating.admits(rate, kept, event.at, penalized_until):
            kept = rating.record(rate, kept, event.at)
            granted.append(event.at)
    for start in granted:
        assert in_window(granted, start, start + rate.window) <= rate.n


@pytest.mark.parametrize("n", [1, 2, 5, 20])
def test_the_whole_burst_starts_at_once(n: int) -> None:
    rate = Rate(n, per="1m")
    kept: tuple[float, ...] = ()
    for _ in range(n):
        assert rating.admits(rate, kept, 100.0, NO_PENALTY)
        kept = rating.record(rate, kept, 100.0)
    assert not rating.admits(rate, kept, 100.0, NO_PENALTY)
    assert rating.next_admission(rate, kept, 100.0, NO_PENALTY) == 160.0


class FixedWindowCounter:
    """The counter-example: a counter that resets when its window has passed."""

    def __init__(self, n: int, window: float, start: float) -> None:
        self.n = n
        self.window = window
        self.window_start = start
        self.used = 0

    def try_take(self, now: float) -> bool:
        if now - self.window_start >= self.window:
            self.window_start = now
            self.used = 0
        if self.used >= self.n:
            return False
        self.used += 1
        return True


def test_no_2n_burst_across_a_window_boundary() -> None:
    n, window = 10, 60.0
    end_of_first, start_of_second = 59.75, 60.0

    counter = FixedWindowCounter(n, window, start=0.0)
    fixed = [counter.try_take(end_of_first) for _ in range(n)]
    fixed += [counter.try_take(start_of_second) for _ in range(n)]
    assert sum(fixed) == 2 * n  # the reset lets 2n through within a quarter second

    rate = Rate(n, per=window)
    kept: tuple[float, ...] = ()
    sliding: list[bool] = []
    for now in [end_of_first] * n + [start_of_second] * n:
        allowed = rating.admits(rate, kept, now, NO_PENALTY)
        if allowed:
            kept = rating.record(rate, kept, now)
        sliding.append(allowed)
    assert sliding == [True] * n + [False] * n
    assert rating.next_admission(rate, kept, start_of_second, NO_PENALTY) == end_of_first + window


def test_a_start_exactly_one_window_later_is_allowed() -> None:
    rate = Rate(3, per=10)
    kept = (0.0, 0.0, 0.0)
    assert not rating.admits(rate, kept, 9.75, NO_PENALTY)
    assert rating.admits(rate, kept, 10.0, NO_PENALTY)
    assert rating.recent(kept, rate.window, 10.0) == 0


def test_capacity_is_halved_while_penalised_and_never_zero() -> None:
    assert Rate(20).capacity(5.0, penalized_until=10.0) == 10
    assert Rate(20).capacity(10.0, penalized_until=10.0) == 20
    assert Rate(5).capacity(0.0, penalized_until=1.0) == 2
    assert Rate(1).capacity(0.0, penalized_until=1.0) == 1


def test_penalty_lasts_two_windows_and_extends_but_never_shortens() -> None:
    rate = Rate(4, per=10)
    assert PENALTY_WINDOWS == 2
    until = rating.penalty_end(rate, 5.0, NO_PENALTY)
    assert until == 25.0
    assert rating.penalty_end(rate, 15.0, until) == 35.0
    assert rating.penalty_end(rate, 0.0, 100.0) == 100.0


@given(timelines(), grid(0, 2000))
@settings(max_examples=100, deadline=None)
def test_next_admission_is_exact(timeline: tuple[Rate, list[Event]], ask: float) -> None:
    rate, events = timeline
    kept: tuple[float, ...] = ()
    penalized_until = NO_PENALTY
    for event in events:
        if event.penalize:
            penalized_until = rating.penalty_end(rate, event.at, penalized_until)
        elif rating.admits(rate, kept, event.at, penalized_until):
            kept = rating.record(rate, kept, event.at)
    now = events[-1].at + ask
    when = rating.next_admission(rate, kept, now, penalized_until)
    assert when is not None  # nothing reserved: time alone makes room
    assert when >= now
    assert rating.admits(rate, kept, when, penalized_until)
    if when > now:
        for probe in (now, (now + when) / 2, when - 2**-10):
            assert not rating.admits(rate, kept, probe, penalized_until)


@given(timelines(), grid(0, 2000), st.integers(0, 9))
@settings(max_examples=100, deadline=None)
def test_next_admission_is_exact_with_reserved_starts(
    timeline: tuple[Rate, list[Event]], ask: float, reserved: int
) -> None:
    """Reserved starts (granted, not stamped) count in every window: the wake-up is exact while
    they stay unstamped, and None when only stamping them could make room."""
    rate, events = timeline
    kept: tuple[float, ...] = ()
    penalized_until = NO_PENALTY
    for event in events:
        if event.penalize:
            penalized_until = rating.penalty_end(rate, event.at, penalized_until)
        elif rating.admits(rate, kept, event.at, penalized_until):
            kept = rating.record(rate, kept, event.at)
    now = events[-1].at + ask
    when = rating.next_admission(rate, kept, now, penalized_until, reserved)
    if when is None:
        later = max([now, penalized_until, *kept]) + 10 * rate.window
        assert not rating.admits(rate, kept, later, penalized_until, reserved)
        assert reserved >= rate.capacity(later, penalized_until)
        return
    assert when >= now
    assert rating.admits(rate, kept, when, penalized_until, reserved)
    if when > now:
        for probe in (now, (now + when) / 2, when - 2**-10):
            assert not rating.admits(rate, kept, probe, penalized_until, reserved)


@given(st.integers(1, 12), grid(1, 40), grid(0, 400))
@settings(max_examples=100, deadline=None)
def test_penalty_restores_full_capacity_after_two_windows(
    n: int, window: float, penalized_at: float
) -> None:
    rate = Rate(n, per=window)
    kept: tuple[float, ...] = ()
    for _ in range(n):  # a full burst just before the rate-limit signal
        kept = rating.record(rate, kept, penalized_at)
    until = rating.penalty_end(rate, penalized_at, NO_PENALTY)
    assert until == penalized_at + 2 * window
    after = until
    for _ in range(n):
        assert rating.admits(rate, kept, after, until)
        kept = rating.record(rate, kept, after)
    assert not rating.admits(rate, kept, after, until)


@pytest.mark.parametrize(
    ("per", "window"),
    [
        ("1m", 60.0),
        ("250ms", 0.25),
        ("6s", 6.0),
        ("2h", 7200.0),
        (6, 6.0),
        (6.5, 6.5),
        ("1.5", 1.5),
    ],
)
def test_rate_reads_durations(per: Duration, window: float) -> None:
    assert Rate(3, per=per).window == window
    assert seconds(per) == window


def test_rate_defaults_to_per_minute() -> None:
    assert Rate(20) == Rate(20, per=60)


@pytest.mark.parametrize("n", [0, -1, True, False, "1x", 2.5, None])
def test_rate_refuses_a_bad_count(n: object) -> None:
    with pytest.raises(ConfigError, match=r"rate\.n"):
        Rate(n, per="1m")  # type: ignore[arg-type]


@pytest.mark.parametrize("per", ["1x", "", "fast", 0, 0.0, "0s", -1, -0.5, True, math.nan, "-1m"])
def test_rate_refuses_a_bad_window(per: object) -> None:
    with pytest.raises(ConfigError, match=r"rate\.per"):
        Rate(5, per=per)  # type: ignore[arg-type]


def test_config_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match=r"rate\.n"):
        Rate(0)


# -- the string form "N/DURATION"

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@pytest.mark.parametrize(
    ("text", "n", "window"),
    [
        ("30/6s", 30, 6.0),
        ("30/1m", 30, 60.0),
        ("5/500ms", 5, 0.5),
        ("100/1h", 100, 3600.0),
        ("10/s", 10, 1.0),  # a bare unit is one of it: ten per second
        ("20/m", 20, 60.0),
        ("3/1.5s", 3, 1.5),
        (" 30 / 6s ", 30, 6.0),
    ],
)
def test_a_rate_reads_its_string_form(text: str, n: int, window: float) -> None:
    assert Rate.parse(text) == Rate(n, per=window)
    assert rating.rate_of(text) == Rate(n, per=window)


@pytest.mark.parametrize(
    "text",
    [
        "10",
        "10/6",
        "30/6 s/x",
        "0/s",
        "5/0s",
        "5/0.0m",
        "2.5/s",
        "-3/s",
        "+3/s",
        "ten/s",
        "10 per s",
        "10/sec",
        "10/1d",
        "10/",
        "/s",
        "10//s",
        "10/1e3s",
        "",
        "٣/s",
        "10/s\n1",
    ],
)
def test_a_rate_string_in_another_shape_is_refused_naming_both_forms(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^rate: .*Rate\(30, per=\"6s\"\).*\"30/6s\""):
        Rate.parse(text)


@pytest.mark.parametrize("value", [10, 10.0, True, ("10", "s"), {"n": 10}, b"10/s", Rate])
def test_a_rate_of_another_type_is_refused_naming_both_forms(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^gate g: rate: expected a Rate.*\"30/6s\""):
        rating.rate_of(value, field="gate g: rate")


def test_a_rate_given_as_a_rate_or_none_is_kept() -> None:
    rate = Rate(3, per="6s")
    assert rating.rate_of(rate) is rate
    assert rating.rate_of(None) is None


@given(
    st.integers(1, 10**9 - 1),
    st.integers(1, 10**6).map(str)
    | st.integers(1, 10**7).map(lambda k: f"{k // 1000}.{k % 1000:03d}"),
    st.sampled_from(sorted(UNITS)),
)
@settings(max_examples=200, deadline=None)
def test_every_count_and_window_with_a_unit_reads_as_that_rate(
    n: int, amount: str, unit: str
) -> None:
    assert Rate.parse(f"{n}/{amount}{unit}") == Rate(n, per=f"{amount}{unit}")


@given(st.text(max_size=20))
@settings(max_examples=400, deadline=None)
def test_any_text_is_a_rate_or_a_config_error_naming_rate(text: str) -> None:
    result = parsed_or_refused(text)
    if isinstance(result, ConfigError):
        assert str(result).startswith("rate: ")
    else:
        assert result.n >= 1 and 0 < result.window < math.inf


def parsed_or_refused(text: str) -> Rate | ConfigError:
    try:
        return Rate.parse(text)
    except ConfigError as error:
        return error


@pytest.mark.parametrize("value", [None, [6], b"6s", 10**400, "9" * 400, math.inf])
def test_a_duration_that_is_not_a_finite_number_is_refused_by_name(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^worker\.lease: "):
        seconds(value, field="worker.lease")  # type: ignore[arg-type]
