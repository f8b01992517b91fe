"""The age sample (store/protocol/ages.py) against every age: exact while every age is sampled, and
exact wherever the answer falls outside the span between the sampled ends; inside it, off by
no more than the unsampled tasks."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from headrace.store.protocol.ages import ReadyAges, quantile

AGES = st.lists(st.integers(0, 400).map(lambda n: n / 4), min_size=1, max_size=60)
BOUNDS = st.integers(-4, 404).map(lambda n: n / 4)
QUANTILES = st.sampled_from((0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0))


def sampled(ages: list[float], size: int) -> ReadyAges:
    """What a store reads: the `size` longest waits and the `size` shortest, no age twice."""
    ordered = sorted(ages, reverse=True)
    oldest, rest = ordered[:size], ordered[size:]
    return ReadyAges(len(ages), tuple(oldest), tuple(rest[-size:] if size else ()))


def nearest_rank(ages: list[float], q: float) -> float:
    ordered = sorted(ages)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@given(ages=AGES, bound=BOUNDS, q=QUANTILES)
def test_every_age_sampled_gives_exact_figures(ages: list[float], bound: float, q: float) -> None:
    whole = sampled(ages, len(ages))
    assert whole.unsampled == 0
    assert whole.at_most(bound) == sum(1 for age in ages if age <= bound)
    assert whole.total() == sum(ages)
    assert whole.longest == max(ages)
    assert quantile([whole], q) == nearest_rank(ages, q)


@given(ages=AGES, size=st.integers(1, 5), bound=BOUNDS, q=QUANTILES)
def test_a_sample_is_exact_outside_the_unsampled_middle(
    ages: list[float], size: int, bound: float, q: float
) -> None:
    ends = sampled(ages, size)
    middle = sorted(ages, reverse=True)[size : len(ages) - size]
    assert ends.unsampled == len(middle)
    assert ends.longest == max(ages)
    truth = sum(1 for age in ages if age <= bound)
    # The unsampled ages lie between the sampled ends, where they are taken as spread evenly.
    low, high = ends.newest[0] if ends.newest else 0.0, ends.oldest[-1]
    if not middle or bound < low or bound >= high:
        assert ends.at_most(bound) == truth
    else:
        assert abs(ends.at_most(bound) - truth) <= len(middle)
    answer = quantile([ends], q)
    assert answer is not None
    rank = max(1, math.ceil(q * len(ages)))
    if rank <= size or rank > len(ages) - size:
        assert answer == nearest_rank(ages, q)
    else:
        assert low <= answer <= high


@given(first=AGES, second=AGES, q=QUANTILES)
def test_a_quantile_over_stages_is_over_all_their_tasks(
    first: list[float], second: list[float], q: float
) -> None:
    stages = [sampled(first, len(first)), sampled(second, len(second))]
    assert quantile(stages, q) == nearest_rank(first + second, q)


def test_no_ready_task_has_no_figures() -> None:
    empty = ReadyAges(0)
    assert (empty.at_most(10.0), empty.total(), empty.longest) == (0.0, 0.0, None)
    assert quantile([empty], 0.95) is None
    assert quantile([], 0.95) is None


def test_a_million_ready_tasks_are_estimated_between_the_sampled_ends() -> None:
    """Ready for 0 to 999,999 seconds, one a second: the thousand at each end are read."""
    count = 1_000_000
    ends = ReadyAges(
        count,
        tuple(float(age) for age in range(count - 1, count - 1001, -1)),
        tuple(float(age) for age in range(999, -1, -1)),
    )
    assert ends.unsampled == count - 2000
    assert ends.at_most(600.0) == 601  # among the newest: exact
    assert math.isclose(ends.at_most(500_000.0), 500_001, rel_tol=1e-3)
    assert math.isclose(ends.total(), sum(range(count)), rel_tol=1e-9)
    p95 = quantile([ends], 0.95)
    assert p95 is not None and math.isclose(p95, 949_999, rel_tol=1e-3)
