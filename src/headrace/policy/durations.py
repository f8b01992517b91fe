"""Durations as people write them: 6, 6.5, "6s", "250ms", "1m", "2h"."""

from __future__ import annotations

import re

from headrace.policy.errors import ConfigError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")

Duration = float | int | str


def seconds(value: Duration, *, field: str = "duration") -> float:
    """Parse a duration to seconds; `field` names the setting in the error."""
    if isinstance(value, bool):
        raise ConfigError(f"{field}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        result = float(value)
    else:
        match = _PATTERN.match(value)
        if match is None:
            raise ConfigError(f"{field}: cannot read {value!r} as a duration (try '6s' or '1m')")
        result = float(match[1]) * _UNITS[match[2] or "s"]
    if result < 0 or result != result:
        raise ConfigError(f"{field}: a duration must be a non-negative number, got {value!r}")
    return result
