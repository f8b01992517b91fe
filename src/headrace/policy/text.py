"""Text that every store keeps alike, and JSON that every store can hold.

PostgreSQL refuses a NUL in `text` and in `jsonb` (`\\u0000`), and neither it nor UTF-8 can
hold a lone surrogate (`"\\ud800"`, which Python's JSON decoder makes from an escape); SQLite
keeps both. So a string that crosses into the store is checked here first, and refused the
same way on every backend, with the field named, instead of failing only on one of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from headrace.policy.errors import ConfigError

MAX_DEPTH = 32  # nesting of a JSON document taken from outside: arrays and objects


def text_problem(value: str) -> str | None:
    """Why `value` cannot be kept as text on every store, or None when it can."""
    if "\x00" in value:
        return "holds a NUL character"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid Unicode (a lone surrogate)"
    return None


def check_text(value: str, field: str) -> str:
    """`value`, if every store can keep it; else ConfigError naming `field`."""
    problem = text_problem(value)
    if problem is not None:
        raise ConfigError(f"{field}: {problem}")
    return value


def check_document(value: Any, field: str, *, depth: int = MAX_DEPTH) -> None:
    """Refuse a JSON value nested deeper than `depth`, or holding a string or key that not
    every store can keep (ConfigError naming `field`)."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:  # by hand, not by recursion: the depth is the input's to choose
        found, level = pending.pop()
        if isinstance(found, str):
            check_text(found, field)
        elif isinstance(found, Mapping | Sequence):
            if level >= depth:
                raise ConfigError(f"{field}: nested deeper than {depth} levels")
            if isinstance(found, Mapping):
                for key in found:
                    check_text(str(key), field)
                pending.extend((item, level + 1) for item in found.values())
            else:
                pending.extend((item, level + 1) for item in found)
