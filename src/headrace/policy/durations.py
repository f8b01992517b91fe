"""Durations as people write them: 6, 6.5, "6s", "250ms", "1m", "2h", "7d"."""

from __future__ import annotations

import math
import re

from headrace.policy.errors import ConfigError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")

Duration = float | int | str


def seconds(value: Duration, *, field: str = "duration") -> float:
    """Parse a duration to seconds; `field` names the setting in the error."""
    if isinstance(value, bool):
        raise ConfigError(f"{field}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        result = _as_float(value)
    elif not isinstance(value, str):
        raise ConfigError(f"{field}: expected a duration like 6, '6s' or '1m', got {value!r}")
    else:
        match = _PATTERN.match(value)
        if match is None:
            raise ConfigError(f"{field}: cannot read {value!r} as a duration (try '6s' or '1m')")
        result = float(match[1]) * _UNITS[match[2] or "s"]
    if not 0 <= result < math.inf:
        raise ConfigError(f"{field}: a duration must be a finite number >= 0, got {value!r}")
    return result


def positive_seconds(value: Duration, *, field: str) -> float:
    """A duration that must be longer than zero (a lease, a poll interval)."""
    result = seconds(value, field=field)
    if result <= 0:
        raise ConfigError(f"{field}: expected a duration longer than zero, got {value!r}")
    return result


def _as_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond any float: refused below as not finite
        return math.inf if value > 0 else -math.inf


def spoken(value: float) -> str:
    """Seconds as `seconds` reads them back, in the largest unit that divides them: `30d`,
    `12h`, `5m`, `90s`, `250ms`, `1.5s`."""
    for unit in ("d", "h", "m", "s"):
        size = _UNITS[unit]
        if value >= size and value % size == 0:
            return f"{value / size:g}{unit}"
    if 0 < value < 1:
        return f"{value * 1000:g}ms"
    return f"{value:g}s"
