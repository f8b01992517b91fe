"""The worker's progress line: the difference of its counters since the last line."""

from __future__ import annotations

import logging

import pytest

from headrace.runtime.progress import Ended, Progress, describe
from headrace.runtime.worker import WorkerStats


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_counts_what_ended_since_the_last_one(caplog: pytest.LogCaptureFixture) -> None:
    stats, clock = WorkerStats(), Clock()
    log = logging.getLogger("headrace.worker")
    progress = Progress("w1", stats, busy=lambda: (16, 40), log=log, clock=clock)
    stats.succeeded = 7  # before the worker started serving: not reported
    progress.start()
    caplog.set_level(logging.INFO, logger="headrace.worker")
    stats.succeeded, stats.retried, stats.dead = 41_207, 8, 2
    clock.now += 10
    line = progress.report()
    assert line == (
        "worker w1: 41,210 tasks in the last 10s (4,121/s): 41,200 succeeded, 8 retried, 2 dead;"
        " 16 running, 40 claimed ahead"
    )
    stats.succeeded += 5
    clock.now += 10
    later = progress.report()
    assert later == "worker w1: 5 tasks in the last 10s: 5 succeeded; 16 running, 40 claimed ahead"
    assert [r.getMessage() for r in caplog.records] == [line, later]


def test_nothing_ended_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    stats, clock = WorkerStats(), Clock()
    log = logging.getLogger("headrace.worker")
    progress = Progress("w1", stats, busy=lambda: (0, 0), log=log, clock=clock)
    progress.start()
    caplog.set_level(logging.INFO, logger="headrace.worker")
    clock.now += 10
    assert progress.report() is None
    stats.remote_waits, stats.leases_lost = 3, 1
    clock.now += 0.5
    assert progress.report(final=True) == (
        "worker w1: 4 tasks in its last 0.5s: 0 succeeded, 3 waiting on a remote job,"
        " 1 lost their lease; 0 running"
    )
    assert len(caplog.records) == 1


def test_below_info_nothing_is_built() -> None:
    stats, clock = WorkerStats(succeeded=3), Clock()
    log = logging.getLogger("headrace.test_progress_quiet")
    log.setLevel(logging.WARNING)
    progress = Progress("w1", stats, busy=lambda: (0, 0), log=log, clock=clock)
    progress.start()
    stats.succeeded = 9
    assert progress.report() is None


def test_the_counts_are_differences() -> None:
    before = Ended(1, 2, 3, 4, 5)
    after = Ended(11, 12, 13, 14, 15)
    assert after.since(before) == Ended(10, 10, 10, 10, 10)
    assert after.since(before).total == 50
    assert describe("w", Ended(0, 0, 1, 0, 0), 2.0, (1, 0)) == (
        "worker w: 1 task in the last 2s: 0 succeeded, 1 dead; 1 running"
    )
