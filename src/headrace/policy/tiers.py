"""Tiers and aging: rush jumps the line; a waiting task rises a tier per step, never to rush."""

from __future__ import annotations

import enum
import math

from headrace.policy.errors import ConfigError


class Tier(enum.IntEnum):
    """Lower value dispatches first."""

    RUSH = 0
    NORMAL = 1
    LOW = 2

    @classmethod
    def parse(cls, value: Tier | str) -> Tier:
        if isinstance(value, Tier):
            return value
        try:
            return cls[value.upper()]
        except (KeyError, AttributeError):
            names = ", ".join(t.name.lower() for t in cls)
            raise ConfigError(f"tier: expected one of {names}, got {value!r}") from None


AGING_CEILING = Tier.NORMAL


def aged_tier(tier: Tier, waited: float, aging_step: float, ceiling: Tier = AGING_CEILING) -> Tier:
    """The tier of a task that has waited `waited` seconds: up one tier per step, never past the
    ceiling, and never down. Rush stays reserved for people."""
    if tier <= ceiling or aging_step <= 0 or waited < aging_step:
        return tier
    steps = math.floor(waited / aging_step)
    return Tier(max(int(ceiling), int(tier) - steps))


def promotion_time(
    tier: Tier, ready_since: float, aging_step: float, ceiling: Tier = AGING_CEILING
) -> float | None:
    """When a task ready since `ready_since` reaches the ceiling; None if it never rises."""
    if tier <= ceiling or aging_step <= 0:
        return None
    return ready_since + (int(tier) - int(ceiling)) * aging_step
