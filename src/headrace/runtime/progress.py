"""The worker's progress line: what its tasks came to over the last `every` seconds, in one INFO
line, instead of a line per success.

A success is logged at DEBUG (`headrace -v worker`); retries, dead tasks and remote waits keep
their INFO line each (runtime/outcomes.py). At thousands of tasks a second a line per success
was a sixth of a worker's CPU and a log nobody reads line by line; the store keeps every
attempt (`headrace status`, the task's history), and this line says the worker is alive and
how fast it goes. Nothing is counted per task here: the line is the difference of the worker's
counters (`WorkerStats`) since the last one, and a worker with nothing done says nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import astuple, dataclass

from headrace.runtime.stats import WorkerStats

DEFAULT_EVERY = 10.0  # seconds


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


@dataclass(frozen=True)
class Ended:
    """Outcomes counted by a worker so far (a snapshot of its stats)."""

    succeeded: int
    retried: int
    dead: int
    remote_waits: int
    leases_lost: int

    @classmethod
    def of(cls, stats: WorkerStats) -> Ended:
        return cls(
            stats.succeeded, stats.retried, stats.dead, stats.remote_waits, stats.leases_lost
        )

    def since(self, before: Ended) -> Ended:
        return Ended(
            *(now - then for now, then in zip(astuple(self), astuple(before), strict=True))
        )

    @property
    def total(self) -> int:
        return sum(astuple(self))


class Progress:
    """Reports `stats` when the worker's timer says (`report()`) and once more at the end
    (`report(final=True)`); `busy()` says what runs now. `clock`: the event loop's (virtual
    under headrace.sim), read from `start()` on."""

    def __init__(
        self,
        worker: str,
        stats: WorkerStats,
        busy: Callable[[], tuple[int, int]],
        log: logging.Logger,
        clock: Callable[[], float] = _loop_time,
    ) -> None:
        self.worker = worker
        self._stats = stats
        self._busy = busy
        self._log = log
        self._clock = clock
        self._last = Ended.of(stats)
        self._since: float | None = None

    def start(self) -> None:
        """Count from now: what ended before is not reported."""
        self._last, self._since = Ended.of(self._stats), self._clock()

    def report(self, *, final: bool = False) -> str | None:
        """Log what ended since the last report, if anything did; return the line."""
        now = self._clock()
        current = Ended.of(self._stats)
        ended = current.since(self._last)
        took = now - (now if self._since is None else self._since)
        self._last, self._since = current, now
        if not ended.total or not self._log.isEnabledFor(logging.INFO):
            return None
        line = describe(self.worker, ended, took, self._busy(), final=final)
        self._log.info("%s", line)
        return line


def describe(
    worker: str, ended: Ended, took: float, busy: tuple[int, int], *, final: bool = False
) -> str:
    """`worker w1: 41,210 tasks in the last 10s (4,121/s): 41,200 succeeded, 8 retried, 2 dead;
    16 running, 40 claimed ahead`."""
    parts = [f"{ended.succeeded:,} succeeded"]
    for count, what in (
        (ended.retried, "retried"),
        (ended.dead, "dead"),
        (ended.remote_waits, "waiting on a remote job"),
        (ended.leases_lost, "lost their lease"),
    ):
        if count:
            parts.append(f"{count:,} {what}")
    running, ahead = busy
    now = f"{running} running" + (f", {ahead} claimed ahead" if ahead else "")
    span = f"the last {took:.0f}s" if not final else f"its last {took:.1f}s"
    per_second = ended.total / took if took >= 1 else 0.0
    rate = f" ({per_second:,.0f}/s)" if per_second >= 1 else ""
    tasks = f"{ended.total:,} task{'s' if ended.total != 1 else ''}"
    return f"worker {worker}: {tasks} in {span}{rate}: {', '.join(parts)}; {now}"
