"""Checks over attempt histories shared by the multi-process store tests: a gate's cap and
sliding-window rate judged by brute force, and spawning processes that start together."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable, Sequence

from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import Attempt, ClaimResult, Succeeded, TaskState

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


async def claim_and_finish(store: Store, worker: str, hold: float) -> None:
    """One worker's loop inside a test process: claim one task, hold it `hold` seconds,
    succeed; until nothing is ready or running."""
    while True:
        result = await store.claim(worker, 1, lease_for=30.0)
        for lease in result.leases:
            await asyncio.sleep(hold)
            await store.finish(lease, Succeeded())
        if result.leases:
            # Step back before claiming again, as a worker between loops does: a worker that
            # reclaimed at once would win every race for the ticket it just released.
            await asyncio.sleep(hold / 3)
            continue
        counts = await store.counts()
        if not counts[TaskState.READY] and not counts[TaskState.RUNNING]:
            return
        await asyncio.sleep(pause(result))


def pause(result: ClaimResult) -> float:
    if result.wake_at is None:  # only a release can help: look again soon
        return 0.01
    return min(max(result.wake_at - result.now, 0.001), 0.05)
