"""Clocks. Policy never reads time itself: callers pass `now` from one of these."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this clock's scale; only differences and order matter."""
        ...


class WallClock:
    """Epoch seconds: shared by every process on a host, so it is the SQLite store's clock."""

    def now(self) -> float:
        return time.time()


class LoopClock:
    """The running event loop's clock: virtual under the simulator's loop, monotonic otherwise."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def now(self) -> float:
        return asyncio.get_running_loop().time() + self.offset


class ManualClock:
    """A clock that moves only when told to: for tests of stores and policy."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._now += seconds
