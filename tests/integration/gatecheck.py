"""Checks over attempt histories shared by the multi-process store tests: a gate's cap and
sliding-window rate judged by brute force, and spawning processes that start together."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence

from headrace.store.types import Attempt

# Store times are floats; a start exactly one window after another may round either way.
EPSILON = 1e-6


def run_processes(target: Callable[..., None], args: Sequence[tuple[str, ...]]) -> list[int | None]:
    """Run `target(*args[i], barrier)` in one spawned process per entry; their exit codes."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(args))
    processes = [context.Process(target=target, args=(*each, barrier)) for each in args]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
        if process.is_alive():
            process.kill()
            process.join()
    codes = [process.exitcode for process in processes]
    for process in processes:
        process.close()
    return codes


def most_in_flight(history: list[Attempt]) -> int:
    """The most attempts holding a ticket at any grant time (a release at t frees t)."""
    return max(
        sum(1 for other in history if other.started_at <= a.started_at < ended(other))
        for a in history
    )


def most_starts_in_a_window(history: list[Attempt], window: float) -> int:
    """The most grants in any window of `window` seconds ending at a grant."""
    starts = [a.started_at for a in history]
    return max(sum(1 for s in starts if t - window + EPSILON < s <= t) for t in starts)


def ended(attempt: Attempt) -> float:
    assert attempt.ended_at is not None
    return attempt.ended_at
