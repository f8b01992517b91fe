"""How long finished things are kept: `Retention`, the age after which the pruner removes each
kind of row (None: kept for ever), how often it runs and how many rows one of its transactions
takes. A value, checked field by field; `Retention.parse` reads the `NAME=AGE` words of the
command line (`--retention dead=14d`, `HEADRACE_RETENTION`).

Ages count from when a row was last final: a task's `finished_at`, a notice's delivery, a
record's last change, an audit row's writing. What is never pruned, whatever the ages, is the
store's business (store/machine/plans.py): a task that is not final, one a task still to finish
depends on, one a redrive could bring back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace

from headrace.policy.durations import seconds, spoken
from headrace.policy.errors import ConfigError

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0
# A page sign-in lasts 12 hours (service/api/auth.py LOGIN_TTL; a test pins that they agree):
# a shorter age would sign moderators out early.
SIGN_IN_LIFETIME = 12 * HOUR
# A webhook delivery is what makes the provider's retry of it a duplicate, and a remote job's
# outcome is read by the next check of the tasks waiting on it: both come well within a day.
DELIVERY_FLOOR = DAY
# An upload's bytes are kept a moment before its item's record is written: between them only
# its headers are read, in a decoding child that has at most its timeout (2 minutes by
# default). An original no item names is an upload in that moment, or one that never got its
# record (a process killed, an error): a floor well past that moment keeps the first safe.
ORPHAN_FLOOR = 10 * MINUTE
MAX_BATCH = 10_000
OFF = ("off", "never", "keep")  # an age that keeps for ever, or a pruner that never runs


@dataclass(frozen=True)
class Retention:
    """The ages, in seconds (None: keep for ever), after which the pruner removes:

    - `succeeded`, `cancelled`, `dead`: tasks in that state, with their attempts and dependency
      rows (a group's counts are kept in its rollup; its cost ledger is never pruned);
    - `delivered`: outbox notices, once delivered;
    - `audit`: audit rows;
    - `deliveries`: webhook deliveries and remote jobs' outcomes (at least a day);
    - `sign_ins`: page sign-ins, expired or signed out (at least `SIGN_IN_LIFETIME`);
    - `turned_away`: items rejected, quarantined or refused, with their media (pipelines);
    - `closed_events`: the settled items of an event closed that long ago, with their media;
    - `orphans`: originals no item names (an upload's bytes whose record was never written),
      by the media store's own clock (at least `ORPHAN_FLOOR`).

    `upload_grace`: an accepted upload no task names is queued once it is this old (a process
    died between its record and its submit). `every`: how often workers prune (None: they do
    not; `headrace prune` still does). `batch`: rows per transaction."""

    succeeded: float | None = DAY
    cancelled: float | None = DAY
    dead: float | None = 30 * DAY
    delivered: float | None = DAY
    audit: float | None = 365 * DAY
    deliveries: float | None = 7 * DAY
    sign_ins: float | None = DAY
    turned_away: float | None = 7 * DAY
    closed_events: float | None = 30 * DAY
    orphans: float | None = HOUR
    upload_grace: float = 2 * MINUTE
    every: float | None = 5 * MINUTE
    batch: int = 500

    def __post_init__(self) -> None:
        for name in AGES:
            _check_age(name, getattr(self, name))
        _check_floor("sign_ins", self.sign_ins, SIGN_IN_LIFETIME)
        _check_floor("deliveries", self.deliveries, DELIVERY_FLOOR)
        _check_floor("orphans", self.orphans, ORPHAN_FLOOR)
        _check_positive("upload_grace", self.upload_grace)
        if self.every is not None:
            _check_positive("every", self.every)
        batch = self.batch
        if isinstance(batch, bool) or not isinstance(batch, int) or not 0 < batch <= MAX_BATCH:
            raise ConfigError(f"retention.batch: expected 1 to {MAX_BATCH} rows, got {batch!r}")

    @classmethod
    def parse(cls, words: Iterable[str], base: Retention | None = None) -> Retention:
        """`base` (the defaults) with `NAME=AGE` words applied: an age like `14d`, `12h`,
        `90m`, or `off` (keep for ever; for `every`, workers never prune); `batch=N` rows."""
        changes: dict[str, float | int | None] = {}
        for word in words:
            name, equals, value = word.partition("=")
            name = name.strip().replace("-", "_")
            if not equals or name not in NAMES:
                raise ConfigError(
                    f"retention: expected NAME=AGE with NAME one of {', '.join(NAMES)}, "
                    f"got {word!r}"
                )
            changes[name] = _read(name, value.strip())
        return replace(base or cls(), **changes)  # type: ignore[arg-type]

    @property
    def sweep_horizon(self) -> float | None:
        """How far back the upload sweep looks (None: no limit). Within the shortest age at
        which a cancelled or dead task is pruned, an upload no task names never had one: older,
        its validation may have ended and been pruned, and must not be queued again."""
        ages = [age for age in (self.cancelled, self.dead) if age is not None]
        return min(ages) if ages else None

    def described(self) -> list[tuple[str, str]]:
        """Each setting and its value as `headrace status` shows it (`1d`, `off`)."""
        return [(name, shown(getattr(self, name))) for name in NAMES]


AGES = (
    "succeeded",
    "cancelled",
    "dead",
    "delivered",
    "audit",
    "deliveries",
    "sign_ins",
    "turned_away",
    "closed_events",
    "orphans",
)
NAMES = tuple(field.name for field in fields(Retention))


def shown(value: float | int | None) -> str:
    """A setting as written on the command line: `off`, `1d`, `500`."""
    if value is None:
        return "off"
    if isinstance(value, int):
        return str(value)
    return spoken(value)


def _read(name: str, value: str) -> float | int | None:
    if name == "batch":
        if not value.isdigit():
            raise ConfigError(f"retention.batch: expected a number of rows, got {value!r}")
        return int(value)
    if value.lower() in OFF:
        if name == "upload_grace":
            raise ConfigError("retention.upload_grace: expected a duration, not 'off'")
        return None
    return seconds(value, field=f"retention.{name}")


def _check_age(name: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"retention.{name}: expected seconds or None, got {value!r}")
    if not 0 <= value < math.inf:
        raise ConfigError(f"retention.{name}: expected a finite age >= 0, got {value!r}")


def _check_floor(name: str, value: float | None, floor: float) -> None:
    if value is not None and value < floor:
        raise ConfigError(
            f"retention.{name}: expected at least {spoken(floor)}, got {spoken(value)}"
        )


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"retention.{name}: expected seconds, got {value!r}")
    if not 0 < value < math.inf:
        raise ConfigError(f"retention.{name}: expected a duration longer than zero, got {value!r}")
