"""A rate limit that keeps the whole burst and is exact in every sliding window.

A rate is written `Rate(30, per="6s")` or, wherever a gate takes one, as the string `"30/6s"`:
`N/DURATION`, a positive whole number of starts and a window with its unit (`"5/500ms"`,
`"30/1m"`, `"100/1h"`); a bare unit is one of it (`"10/s"` is 10 per second). Anything else is
refused where it is declared, never at the first claim.

The state is the times of the last `n` starts. A start at `now` is allowed when fewer than the
current capacity of them satisfy `now < start + window`; the capacity is `n`, or half of it
(at least one) while a penalty runs. A reset-per-window bucket would let up to 2n through across
a window boundary; counting the recent starts never does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from headrace.policy.durations import Duration, seconds
from headrace.policy.errors import ConfigError

PENALTY_WINDOWS = 2
FORMS = 'a Rate, e.g. Rate(30, per="6s"), or a string "N/DURATION", e.g. "30/6s" or "10/s"'
# N/DURATION: the count is digits only; the window needs its unit, so "30/6" (a fraction?) is
# refused. A bare unit ("10/s") means one of it.
_TEXT = re.compile(r"\s*(\d{1,9})\s*/\s*(\d{1,9}(?:\.\d{1,9})?)?\s*(ms|s|m|h)\s*", re.ASCII)


@dataclass(frozen=True, init=False)
class Rate:
    """`n` starts per `window` seconds: `Rate(20, per="1m")`, `Rate(10, per=6)`."""

    n: int
    window: float

    def __init__(self, n: int, per: Duration = "1m") -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"rate.n: expected a positive integer, got {n!r}")
        window = seconds(per, field="rate.per")
        if window <= 0:
            raise ConfigError(f"rate.per: the window must be longer than zero, got {per!r}")
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "window", window)

    @classmethod
    def parse(cls, text: str, *, field: str = "rate") -> Rate:
        """`"30/6s"` as `Rate(30, per="6s")`; `field` names the setting in the error."""
        match = _TEXT.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise ConfigError(f"{field}: expected {FORMS}; got {text!r}")
        count, amount, unit = match.groups()
        if int(count) < 1 or (amount is not None and float(amount) == 0):
            raise ConfigError(
                f"{field}: {text!r} needs at least one start in a window longer than zero; "
                f"expected {FORMS}"
            )
        return cls(int(count), per=f"{amount or 1}{unit}")

    def capacity(self, now: float, penalized_until: float) -> int:
        """Starts allowed per window at `now`: half (at least one) while penalised."""
        if now < penalized_until:
            return max(1, self.n // 2)
        return self.n


def rate_of(value: object, *, field: str = "rate") -> Rate | None:
    """A gate's `rate` as given: None, a `Rate`, or its string form; anything else is refused
    with an error naming `field` and showing both accepted forms."""
    if value is None or isinstance(value, Rate):
        return value
    if isinstance(value, str):
        return Rate.parse(value, field=field)
    raise ConfigError(f"{field}: expected {FORMS}; got {value!r}")


def recent(starts: Sequence[float], window: float, now: float) -> int:
    """How many of `starts` still count at `now`: a start counts until `start + window`.

    The comparison uses the very expression `next_admission` returns, so waking at that time
    always admits (`now - window` would differ from it in the last floating-point bit)."""
    return sum(1 for start in starts if now < start + window)


def admits(
    rate: Rate, starts: Sequence[float], now: float, penalized_until: float, reserved: int = 0
) -> bool:
    """Whether a start at `now` keeps every window within capacity. `reserved` starts were
    granted but not stamped yet: each may arrive at any moment, so each counts in every window
    until it is stamped."""
    return recent(starts, rate.window, now) + reserved < rate.capacity(now, penalized_until)


def record(rate: Rate, starts: Sequence[float], now: float) -> tuple[float, ...]:
    """The start list after a start at `now`: only the newest `n` are ever needed."""
    return (*sorted(starts), now)[-rate.n :]


def next_admission(
    rate: Rate, starts: Sequence[float], now: float, penalized_until: float, reserved: int = 0
) -> float | None:
    """The earliest time at or after `now` when a start would be admitted, if the `reserved`
    starts stayed unstamped; None when only stamping or releasing them can make room."""
    if admits(rate, starts, now, penalized_until, reserved):
        return now
    ordered = sorted(starts)

    def once_room_for(capacity: int) -> float | None:
        # The newest `capacity - reserved - 1` starts may still count: the one before them
        # must have left the window.
        room = capacity - reserved
        if room < 1:
            return None
        return ordered[-room] + rate.window if len(ordered) >= room else now

    if now < penalized_until:
        during = once_room_for(rate.capacity(now, penalized_until))
        full = once_room_for(rate.n)
        after = None if full is None else max(penalized_until, full)
        return min((t for t in (during, after) if t is not None), default=None)
    return once_room_for(rate.n)


def penalty_end(rate: Rate, now: float, penalized_until: float) -> float:
    """A rate-limit signal halves the capacity for the next two windows (or extends the penalty)."""
    return max(penalized_until, now + PENALTY_WINDOWS * rate.window)
