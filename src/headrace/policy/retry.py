"""Retry decisions: exponential backoff with jitter, and which failures a retry can fix."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from headrace.policy.errors import ConfigError, ErrorClass


class Action(enum.Enum):
    RETRY = "retry"
    DEAD = "dead"


@dataclass(frozen=True)
class RetryDecision:
    action: Action
    delay: float = 0.0
    penalize: bool = False
    reason: str = ""


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff `base * factor**(n-1) * U(jitter)` after the n-th failure, at most `max_delay`.
    An outage (a service the task needs is down) is retried on the same curve, by the attempts
    it has lost to outages, at most `outage_max_delay` apart and never counted: the task runs
    again within that long of the service's return, however long it was down."""

    max_attempts: int = 5
    base: float = 0.3
    factor: float = 2.0
    jitter: tuple[float, float] = (0.7, 1.3)
    max_delay: float = 600.0
    outage_max_delay: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise ConfigError(f"max_attempts: expected >= 1, got {self.max_attempts!r}")
        low, high = self.jitter
        if not 0 < low <= high:
            raise ConfigError(f"jitter: expected 0 < low <= high, got {self.jitter!r}")
        if self.base < 0 or self.factor < 1:
            raise ConfigError("backoff: base must be >= 0 and factor >= 1")
        if not self.outage_max_delay > 0:
            raise ConfigError(f"outage_max_delay: expected > 0, got {self.outage_max_delay!r}")

    def backoff(self, failed_attempt: int, rng: random.Random) -> float:
        low, high = self.jitter
        delay = self.base * self.factor ** (failed_attempt - 1) * rng.uniform(low, high)
        return min(delay, self.max_delay)

    def decide(
        self,
        failed_attempt: int,
        error_class: ErrorClass,
        rng: random.Random,
        retry_after: float | None = None,
    ) -> RetryDecision:
        """What to do after attempt number `failed_attempt` (1-based) failed with `error_class`."""
        penalize = error_class is ErrorClass.RATE_LIMITED
        if error_class is ErrorClass.FATAL:
            return RetryDecision(Action.DEAD, reason="never_retry")
        if failed_attempt >= self.max_attempts:
            return RetryDecision(Action.DEAD, penalize=penalize, reason="attempts_spent")
        delay = max(self.backoff(failed_attempt, rng), retry_after or 0.0)
        return RetryDecision(Action.RETRY, delay=delay, penalize=penalize, reason=error_class.value)

    def after_outage(self, outages: int, rng: random.Random) -> RetryDecision:
        """What to do after the `outages`-th attempt (1-based) that met a service down: retry,
        whatever the attempts spent."""
        delay = min(self.backoff(outages, rng), self.outage_max_delay)
        return RetryDecision(Action.RETRY, delay=delay, reason="outage")
