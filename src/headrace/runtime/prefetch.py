"""How many tasks a worker claims ahead of its slots (`Worker(prefetch=...)`).

A claim is a round trip to the store; a short task takes less. A worker whose slots free
faster than a claim comes back would wait for the store between tasks, so it claims a few
tasks more than its free slots and starts each the moment a slot frees. How many: what its
slots finish while one claim is on its way (slots x claim time / task time: the task time
averaged, the claim time the least of the latest claims, so that a claim slowed by an outage
or a lock does not make a worker hoard), grown from a slot's worth by doubling while claims
come back full, never past the configured most, and nothing as soon as a claim comes back
short of its free slots: an idle worker starts each task as it arrives, and a task that
becomes ready now (a retry, an urgent tier) waits behind at most about one claim's time of
work already claimed.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

# Weight of the newest measurement in the running averages.
SMOOTHING = 0.2
# Task times below this count as this: a no-op's few microseconds are noise.
SHORTEST_TASK = 1e-5
# Claims whose times are kept: the least of them is what a claim takes.
CLAIMS_KEPT = 16


@dataclass
class Prefetch:
    """`most`: the most tasks held ahead (0: none); `slots`: the worker's slots."""

    most: int
    slots: int
    ahead: int = 0  # how many to hold ahead now
    task_time: float | None = None  # seconds a handler takes, averaged
    claims: deque[float] = field(default_factory=lambda: deque(maxlen=CLAIMS_KEPT))

    def ran(self, seconds: float) -> None:
        """A handler took `seconds`."""
        self.task_time = _averaged(self.task_time, seconds)

    def claimed(self, seconds: float) -> None:
        """A claim took `seconds`, from the call to its answer."""
        self.claims.append(seconds)

    @property
    def claim_time(self) -> float | None:
        """Seconds a claim takes: the least of the latest ones."""
        return min(self.claims, default=None)

    def room(self, waiting: int) -> int:
        """How many the next claim may take past the free slots, with `waiting` held now."""
        return max(0, self.ahead - waiting)

    def low(self, waiting: int) -> bool:
        """Whether to claim before a slot frees: half or fewer of those held ahead still wait."""
        return self.ahead > 0 and waiting <= self.ahead // 2

    def pace(self, leased: int, free: int, asked: int) -> None:
        """After a claim for `free` slots and `asked` more ahead that leased `leased`."""
        if leased < free:  # no backlog
            self.ahead = 0
        elif leased >= free + asked:  # everything it asked for: there may be more
            self.ahead = min(self.worth(), max(self.slots, 2 * self.ahead))
        else:  # the slots filled, not all it asked for ahead: hold what there was
            self.ahead = min(self.worth(), leased - free)

    def worth(self) -> int:
        """What the slots finish while one claim is on its way, within `most`."""
        if not self.most or not self.claim_time or self.task_time is None:
            return 0
        finished = self.slots * self.claim_time / max(self.task_time, SHORTEST_TASK)
        return min(self.most, math.floor(finished))


def _averaged(mean: float | None, value: float) -> float:
    return value if mean is None else mean + SMOOTHING * (value - mean)
