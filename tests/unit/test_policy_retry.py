"""Retry decisions: backoff 0.3 s * 2**(n-1) * U(0.7, 1.3), and which failures a retry can fix."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.policy.errors import ConfigError, ErrorClass
from headrace.policy.retry import Action, RetryPolicy

POLICY = RetryPolicy()
RETRYABLE = [ErrorClass.TRANSIENT, ErrorClass.RATE_LIMITED]

seeds = st.integers(0, 2**32 - 1)
error_classes = st.sampled_from(list(ErrorClass))


def test_the_defaults() -> None:
    assert POLICY.max_attempts == 5
    assert (POLICY.base, POLICY.factor, POLICY.jitter) == (0.3, 2.0, (0.7, 1.3))


@given(st.integers(1, 30), seeds)
@settings(max_examples=300, deadline=None)
def test_backoff_stays_within_the_jitter_bounds(failed_attempt: int, seed: int) -> None:
    nominal = 0.3 * 2 ** (failed_attempt - 1)
    delay = POLICY.backoff(failed_attempt, random.Random(seed))
    assert min(0.7 * nominal, POLICY.max_delay) <= delay <= min(1.3 * nominal, POLICY.max_delay)


@pytest.mark.parametrize(("failed_attempt", "low", "high"), [(1, 0.21, 0.39), (2, 0.42, 0.78)])
def test_backoff_first_values(failed_attempt: int, low: float, high: float) -> None:
    rng = random.Random(7)
    for _ in range(200):
        assert low <= POLICY.backoff(failed_attempt, rng) <= high


def test_backoff_is_capped() -> None:
    policy = RetryPolicy(max_delay=5.0)
    assert policy.backoff(40, random.Random(1)) == 5.0


@given(seeds)
@settings(max_examples=100, deadline=None)
def test_a_seeded_rng_gives_the_same_delays(seed: int) -> None:
    one, other = random.Random(seed), random.Random(seed)
    first = [POLICY.backoff(n, one) for n in range(1, 8)]
    second = [POLICY.backoff(n, other) for n in range(1, 8)]
    assert first == second
    decided = POLICY.decide(2, ErrorClass.TRANSIENT, random.Random(seed))
    assert decided == POLICY.decide(2, ErrorClass.TRANSIENT, random.Random(seed))


def test_jitter_spreads_the_delays_over_the_whole_range() -> None:
    rng = random.Random(2024)
    factors = [POLICY.backoff(3, rng) / (0.3 * 4) for _ in range(500)]
    assert len(set(factors)) == len(factors)
    assert min(factors) < 0.75
    assert max(factors) > 1.25
    assert any(0.95 < factor < 1.05 for factor in factors)


def test_no_jitter_is_exact() -> None:
    policy = RetryPolicy(jitter=(1.0, 1.0))
    assert [policy.backoff(n, random.Random(0)) for n in (1, 2, 3)] == [0.3, 0.6, 1.2]


@given(st.integers(1, 10), st.integers(1, 10), seeds)
@settings(max_examples=200, deadline=None)
def test_a_never_retry_error_is_tried_once(max_attempts: int, failed: int, seed: int) -> None:
    decision = RetryPolicy(max_attempts=max_attempts).decide(
        failed, ErrorClass.FATAL, random.Random(seed), retry_after=3.0
    )
    assert decision.action is Action.DEAD
    assert decision.reason == "never_retry"
    assert not decision.penalize


@given(st.integers(1, 10), error_classes, seeds)
@settings(max_examples=200, deadline=None)
def test_spent_attempts_are_dead(max_attempts: int, error_class: ErrorClass, seed: int) -> None:
    policy = RetryPolicy(max_attempts=max_attempts)
    rng = random.Random(seed)
    actions = [policy.decide(n, error_class, rng).action for n in range(1, max_attempts + 1)]
    if error_class is ErrorClass.FATAL:
        assert actions == [Action.DEAD] * max_attempts
    else:
        assert actions == [Action.RETRY] * (max_attempts - 1) + [Action.DEAD]
        last = policy.decide(max_attempts, error_class, rng)
        assert last.reason == "attempts_spent"
        assert last.penalize is (error_class is ErrorClass.RATE_LIMITED)


def test_one_attempt_means_no_retry() -> None:
    decision = RetryPolicy(max_attempts=1).decide(1, ErrorClass.TRANSIENT, random.Random(0))
    assert (decision.action, decision.reason) == (Action.DEAD, "attempts_spent")


@given(st.integers(1, 4), seeds)
@settings(max_examples=100, deadline=None)
def test_rate_limited_retries_and_penalises(failed_attempt: int, seed: int) -> None:
    decision = POLICY.decide(failed_attempt, ErrorClass.RATE_LIMITED, random.Random(seed))
    assert decision.action is Action.RETRY
    assert decision.penalize
    assert decision.reason == "rate_limited"
    assert decision.delay == POLICY.backoff(failed_attempt, random.Random(seed))


@given(st.integers(1, 4), seeds)
@settings(max_examples=100, deadline=None)
def test_transient_retries_without_penalty(failed_attempt: int, seed: int) -> None:
    decision = POLICY.decide(failed_attempt, ErrorClass.TRANSIENT, random.Random(seed))
    assert decision.action is Action.RETRY
    assert not decision.penalize
    assert decision.reason == "transient"
    assert decision.delay > 0


@given(
    st.integers(1, 4),
    st.sampled_from(RETRYABLE),
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    seeds,
)
@settings(max_examples=300, deadline=None)
def test_retry_after_is_a_lower_bound_on_the_delay(
    failed_attempt: int, error_class: ErrorClass, retry_after: float, seed: int
) -> None:
    decision = POLICY.decide(failed_attempt, error_class, random.Random(seed), retry_after)
    backoff = POLICY.backoff(failed_attempt, random.Random(seed))
    assert decision.action is Action.RETRY
    assert decision.delay >= retry_after
    assert decision.delay == max(backoff, retry_after)


def test_retry_after_beyond_the_cap_is_still_honoured() -> None:
    decision = POLICY.decide(1, ErrorClass.RATE_LIMITED, random.Random(0), retry_after=3600.0)
    assert decision.delay == 3600.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": -3}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"jitter": (0.0, 1.3)}, "jitter"),
        ({"jitter": (1.3, 0.7)}, "jitter"),
        ({"jitter": (-1.0, 1.0)}, "jitter"),
        ({"base": -0.3}, "base"),
        ({"factor": 0.5}, "factor"),
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


@given(st.integers(1, 200), seeds)
@settings(max_examples=300, deadline=None)
def test_an_outage_is_always_retried_on_the_curve_at_most_outage_max_delay_apart(
    outages: int, seed: int
) -> None:
    decision = POLICY.after_outage(outages, random.Random(seed))
    assert decision.action is Action.RETRY and decision.reason == "outage"
    assert decision.delay == min(POLICY.backoff(outages, random.Random(seed)), 30.0)


def test_outage_max_delay_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="outage_max_delay"):
        RetryPolicy(outage_max_delay=0)
