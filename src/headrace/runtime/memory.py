"""A worker's memory budget: the bytes its running tasks may be charged at once.

A task says what its attempt may use at its peak (`NewTask.memory`, an estimate known before it
runs; 0: not charged). A worker keeps a budget (`Worker(memory=...)`, `headrace worker
--memory 768MiB`) and hands each claim what is free of it (`MemoryRoom`); the store takes the
tasks that fit and passes over the others, so big items wait for room while small ones keep
flowing. A task's charge is freed as soon as its handler is done, however it ended. A task
larger than the whole budget runs only when nothing else charged runs, and alone among them.
Tasks charged more than an eighth of the budget take at most half of it together, so a burst
of them (at-limit PNGs, long videos) leaves room for the photos behind it.

The default fits a 1 GiB worker process: 768 MiB for the tasks, the rest for the process
itself (a `headrace worker` running the moderation app measures about 83 MiB of RSS idle, see
docs/how-to.md) and for what the allocator keeps after a decode.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from headrace.policy.errors import ConfigError
from headrace.store.protocol.types import Lease, MemoryRoom

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
DEFAULT_MEMORY = 768 * MIB
LARGE_PART = 8  # a task charged more than this part of the budget is large
LARGE_SHARE = 2  # and the large ones together may be charged this part of it

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "ki": KIB,
    "kib": KIB,
    "m": 1000**2,
    "mb": 1000**2,
    "mi": MIB,
    "mib": MIB,
    "g": 1000**3,
    "gb": 1000**3,
    "gi": GIB,
    "gib": GIB,
    "t": 1000**4,
    "tb": 1000**4,
    "ti": 1024 * GIB,
    "tib": 1024 * GIB,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_size(value: object, *, field: str) -> int:
    """Bytes from a whole number of bytes or a size: `1GiB`, `512MiB`, `1.5Gi` (powers of
    1024), `800M`, `2GB` (powers of 1000), `65536`. Raises ConfigError naming `field`."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (found := _SIZE.fullmatch(value)) is not None:
        unit = _UNITS.get(found[2].lower())
        if unit is None:
            raise ConfigError(
                f"{field}: unknown unit {found[2]!r} in {value!r} (use MiB, GiB, M, G)"
            )
        size = int(float(found[1]) * unit)
    else:
        raise ConfigError(f"{field}: expected a size like 768MiB, 1GiB or 800M, got {value!r}")
    if size < 1:
        raise ConfigError(f"{field}: expected a size of at least one byte, got {value!r}")
    return size


class WorkerMemory:
    """What a worker's running tasks may be charged (`budget` bytes; None: no budget, nothing
    is counted). A task charged more than an eighth of the budget is large (`large`), and the
    large ones together may be charged half of it (`large_share`): the other half stays for the
    small ones, which a burst of large items would otherwise hold back until it is done."""

    def __init__(self, budget: object | None, *, field: str = "worker.memory") -> None:
        self.budget = None if budget is None else parse_size(budget, field=field)
        self.large = None if self.budget is None else self.budget // LARGE_PART
        self.large_share = 0 if self.budget is None else self.budget // LARGE_SHARE

    def room(self, charges: Iterable[int]) -> MemoryRoom | None:
        """What a claim may charge while the running tasks are charged `charges` bytes each."""
        if self.budget is None:
            return None
        running = list(charges)
        return MemoryRoom(
            max(0, self.budget - sum(running)),
            idle=not any(running),
            large=self.large,
            large_free=max(0, self.large_share - self._large_sum(running)),
        )

    def after(self, room: MemoryRoom | None, leases: Iterable[Lease]) -> MemoryRoom | None:
        """`room` less what `leases` (just claimed with it) charge: for a second claim."""
        if room is None:
            return None
        taken = [lease.task.memory for lease in leases]
        return replace(
            room,
            free=max(0, room.free - sum(taken)),
            idle=room.idle and not any(taken),
            large_free=max(0, room.large_free - self._large_sum(taken)),
        )

    def _large_sum(self, charges: Iterable[int]) -> int:
        large = self.large
        return 0 if large is None else sum(charge for charge in charges if charge > large)
