"""How long a stage's ready tasks have waited, from a bounded sample (`ReadyAges`).

A task's ready age counts from when it last became ready to run: submitted ready, its last
dependency done, a lost lease, a redrive, or a retry's or a deferral's `run_at` once it comes
(a task backing off is not ready to run before it: its age is 0 until then). Time spent pending,
running, waiting on a remote job, dead or backing off is never part of it. Every transition
into `ready` sets the task's `ready_since` by `ready_since` below (in SQL, for dependents made
ready by a success: the same rule, `max(now, run_at)`).

A scrape cannot read the age of every one of a million ready tasks. A store reads a stage's
ready count from its tally and, from its (kind, state, ready since) index, the ages of its
`AGE_SAMPLE` oldest and `AGE_SAMPLE` newest ready tasks. Every other ready task of the stage
became ready between those two ends, so its age lies between theirs: they are taken as spread
evenly over that span. So the count, the oldest age and the ages at both ends are exact, and a
figure that falls among the unsampled middle (a histogram bucket's bound, a percentile) is
interpolated there. A stage with at most `2 * AGE_SAMPLE` ready tasks has every age read, and
nothing is estimated.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

AGE_SAMPLE = 250  # ready tasks read at each end of a stage's queue, at most


def ready_since(now: float, run_at: float) -> float:
    """When a task made ready at `now` to run at `run_at` counts as ready from."""
    return max(now, run_at)


def age(now: float, since: float) -> float:
    """A ready task's age at `now`: 0 while its `run_at` has not come."""
    return max(0.0, now - since)


@dataclass(frozen=True)
class ReadyAges:
    """A stage's `count` ready tasks: the ages (seconds) of its `oldest` and of its `newest`,
    each longest wait first, no task in both. The `unsampled` others waited between the
    shortest of `oldest` and the longest of `newest`."""

    count: int
    oldest: tuple[float, ...] = ()
    newest: tuple[float, ...] = ()

    @property
    def unsampled(self) -> int:
        return max(0, self.count - len(self.oldest) - len(self.newest))

    @property
    def longest(self) -> float | None:
        """The longest wait (exact), None when no task is ready."""
        ends = self.oldest or self.newest
        return ends[0] if ends else None

    def _span(self) -> tuple[float, float]:
        """Where the unsampled ages lie: from the newest's longest to the oldest's shortest."""
        low = self.newest[0] if self.newest else (self.oldest[-1] if self.oldest else 0.0)
        high = self.oldest[-1] if self.oldest else low
        return low, max(low, high)

    @functools.cached_property
    def _sampled(self) -> list[float]:
        return sorted((*self.oldest, *self.newest))

    def at_most(self, bound: float) -> float:
        """How many waited `bound` seconds or less: exact for the sampled ages, the unsampled
        ones counted as spread evenly over their span."""
        sampled = bisect.bisect_right(self._sampled, bound)
        if not self.unsampled:
            return float(sampled)
        low, high = self._span()
        share = 1.0 if bound >= high else 0.0 if bound < low else (bound - low) / (high - low)
        return sampled + self.unsampled * share

    def total(self) -> float:
        """The sum of every ready task's wait (the unsampled ones at the middle of their span)."""
        low, high = self._span()
        return sum(self.oldest) + sum(self.newest) + self.unsampled * (low + high) / 2


def quantile(stages: Sequence[ReadyAges], q: float) -> float | None:
    """The nearest-rank `q` quantile (0 < q <= 1) of the ready tasks of all `stages`: exact
    when it falls on a sampled age, interpolated among the unsampled ones. None when no task
    is ready."""
    count = sum(stage.count for stage in stages)
    if not count:
        return None
    rank = max(1, math.ceil(q * count))
    sampled = [stage for stage in stages if stage._sampled]
    if not sampled:
        return None
    low = min(min(stage._sampled[0], stage._span()[0]) for stage in sampled)
    high = max(max(stage._sampled[-1], stage._span()[1]) for stage in sampled)
    if sum(stage.at_most(low) for stage in stages) >= rank:
        return low
    # The smallest age with `rank` tasks at or below it: halve [low, high] down to adjacent
    # floats (a sampled age is then found exactly).
    while True:
        middle = (low + high) / 2
        if middle in (low, high):
            return high
        if sum(stage.at_most(middle) for stage in stages) >= rank:
            high = middle
        else:
            low = middle
