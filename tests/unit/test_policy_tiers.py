"""Tiers and aging: a waiting task rises a tier per step, never past normal, never down."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.policy.errors import ConfigError
from headrace.policy.tiers import AGING_CEILING, Tier, aged_tier, promotion_time

QUARTER = 0.25

tiers = st.sampled_from(list(Tier))
# quarter-second grid: sums and differences of these are exact, so the comparisons are too
instants = st.integers(-4000, 40_000).map(lambda k: k * QUARTER)
steps = st.integers(1, 4000).map(lambda k: k * QUARTER)
waits = st.one_of(
    st.integers(-400, 400_000).map(lambda k: k * QUARTER),
    st.floats(min_value=-1e9, max_value=1e12, allow_nan=False),
)


def test_lower_value_dispatches_first() -> None:
    assert sorted([Tier.LOW, Tier.RUSH, Tier.NORMAL]) == [Tier.RUSH, Tier.NORMAL, Tier.LOW]
    assert AGING_CEILING is Tier.NORMAL


@given(tiers, waits, steps)
@settings(max_examples=300, deadline=None)
def test_aging_never_passes_normal_and_never_lowers(tier: Tier, waited: float, step: float) -> None:
    aged = aged_tier(tier, waited, step)
    assert aged <= tier  # never lowered (a lower value is a higher tier)
    if tier is Tier.RUSH:
        assert aged is Tier.RUSH
    else:
        assert aged >= Tier.NORMAL  # never promoted to rush


@given(tiers, waits, waits, steps)
@settings(max_examples=300, deadline=None)
def test_waiting_longer_never_demotes(tier: Tier, one: float, other: float, step: float) -> None:
    shorter, longer = sorted((one, other))
    assert aged_tier(tier, longer, step) <= aged_tier(tier, shorter, step)


@given(tiers, instants, steps, instants)
@settings(max_examples=300, deadline=None)
def test_promotion_time_agrees_with_aged_tier(
    tier: Tier, ready_since: float, step: float, now: float
) -> None:
    promoted_at = promotion_time(tier, ready_since, step)
    aged = aged_tier(tier, now - ready_since, step)
    if promoted_at is None:
        assert tier <= Tier.NORMAL
        assert aged is tier
        return
    assert tier is Tier.LOW
    assert promoted_at == ready_since + step
    assert aged is (Tier.NORMAL if now >= promoted_at else Tier.LOW)
    assert aged_tier(tier, promoted_at - ready_since, step) is Tier.NORMAL
    assert aged_tier(tier, promoted_at - ready_since - QUARTER / 4, step) is Tier.LOW


def test_a_low_task_reaches_normal_after_one_step_and_stays_there() -> None:
    assert aged_tier(Tier.LOW, 0.0, 60.0) is Tier.LOW
    assert aged_tier(Tier.LOW, 59.9, 60.0) is Tier.LOW
    assert aged_tier(Tier.LOW, 60.0, 60.0) is Tier.NORMAL
    assert aged_tier(Tier.LOW, 6_000.0, 60.0) is Tier.NORMAL
    assert aged_tier(Tier.NORMAL, 6_000.0, 60.0) is Tier.NORMAL
    assert aged_tier(Tier.RUSH, 6_000.0, 60.0) is Tier.RUSH
    assert promotion_time(Tier.LOW, 100.0, 60.0) == 160.0


@pytest.mark.parametrize("step", [0.0, -1.0])
def test_aging_is_off_without_a_positive_step(step: float) -> None:
    assert aged_tier(Tier.LOW, 1e9, step) is Tier.LOW
    assert promotion_time(Tier.LOW, 0.0, step) is None


def test_a_ceiling_can_only_be_set_explicitly() -> None:
    assert aged_tier(Tier.LOW, 120.0, 60.0, ceiling=Tier.RUSH) is Tier.RUSH
    assert aged_tier(Tier.LOW, 60.0, 60.0, ceiling=Tier.RUSH) is Tier.NORMAL
    assert promotion_time(Tier.LOW, 0.0, 60.0, ceiling=Tier.RUSH) == 120.0
    assert aged_tier(Tier.LOW, 1e9, 60.0, ceiling=Tier.LOW) is Tier.LOW


@pytest.mark.parametrize(
    ("text", "tier"),
    [
        ("rush", Tier.RUSH),
        ("RUSH", Tier.RUSH),
        ("Normal", Tier.NORMAL),
        ("low", Tier.LOW),
        (Tier.LOW, Tier.LOW),
    ],
)
def test_parse_a_tier(text: Tier | str, tier: Tier) -> None:
    assert Tier.parse(text) is tier


@pytest.mark.parametrize("text", ["urgent", "", " rush", "high", "0", 1, None, "rush!"])
def test_parse_refuses_anything_else(text: object) -> None:
    with pytest.raises(ConfigError, match="tier") as caught:
        Tier.parse(text)  # type: ignore[arg-type]
    assert "rush, normal, low" in str(caught.value)
