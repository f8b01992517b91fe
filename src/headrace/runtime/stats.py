"""What a worker counts while it runs (`Worker.stats`, `drain()`'s result)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

BACKOFFS_KEPT = 64  # never spin when the store's next event is "now"


@dataclass
class WorkerStats:
    """Counters since the worker started; `backoffs` holds the latest retry delays decided."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    remote_waits: int = 0
    polls: int = 0
    leases_lost: int = 0
    peak_busy: int = 0
    claimed_ahead: int = 0  # tasks claimed past the free slots, to wait in the worker for one
    borrowed: int = 0  # tasks claimed into slots another cost class left idle
    memory_budget: int | None = None  # bytes its running tasks may be charged (None: no budget)
    memory_charged: int = 0  # bytes its running tasks are charged now
    peak_memory_charged: int = 0
    backoffs: deque[float] = field(default_factory=lambda: deque(maxlen=BACKOFFS_KEPT))
