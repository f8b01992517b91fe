"""consume_bounded: the checks from the backpressure guide, on the virtual clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from headrace import consume_bounded

pytestmark = pytest.mark.anyio


async def test_every_ref_is_handled_with_at_most_workers_at_once() -> None:
    active = peak = 0
    done: list[int] = []

    async def handle(ref: int) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(1.0)
        done.append(ref)
        active -= 1

    await consume_bounded(range(8), handle, workers=2, waiting=3)
    assert sorted(done) == list(range(8))
    assert peak == 2
    assert active == 0


async def test_empty_input_returns() -> None:
    async def handle(ref: int) -> None:
        raise AssertionError("no refs, no calls")

    await consume_bounded([], handle)


@pytest.mark.parametrize(
    ("workers", "waiting"), [(0, 1), (1, 0), (-1, 3), (1.5, 3), (True, 3), (2, "3")]
)
async def test_invalid_limits_are_value_errors(workers: object, waiting: object) -> None:
    async def handle(ref: int) -> None:
        return None

    with pytest.raises(ValueError, match="positive integer"):
        await consume_bounded([1], handle, workers=workers, waiting=waiting)  # type: ignore[arg-type]


async def test_a_handler_failure_propagates() -> None:
    async def handle(ref: int) -> None:
        if ref == 3:
            raise KeyError(ref)
        await asyncio.sleep(0.1)

    with pytest.raises(KeyError):
        await consume_bounded(range(10), handle, workers=2, waiting=2)


async def test_a_blocked_consumer_stops_the_producer() -> None:
    taken: list[int] = []
    release = asyncio.Event()

    def refs() -> Iterator[int]:
        for ref in range(100):
            taken.append(ref)
            yield ref

    async def handle(ref: int) -> None:
        await release.wait()

    run = asyncio.create_task(consume_bounded(refs(), handle, workers=2, waiting=3))
    await asyncio.sleep(60.0)
    assert len(taken) <= 2 + 3 + 1
    release.set()
    await run
    assert len(taken) == 100


async def test_cancellation_cancels_the_handlers() -> None:
    cancelled = 0

    async def handle(ref: int) -> None:
        nonlocal cancelled
        try:
            await asyncio.sleep(3600.0)
        except asyncio.CancelledError:
            cancelled += 1
            raise

    run = asyncio.create_task(consume_bounded(range(10), handle, workers=3, waiting=1))
    await asyncio.sleep(1.0)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert cancelled == 3


async def test_async_iterables_are_consumed_too() -> None:
    async def refs() -> AsyncIterator[int]:
        for ref in range(5):
            await asyncio.sleep(0.1)
            yield ref

    seen: list[int] = []

    async def handle(ref: int) -> None:
        seen.append(ref)

    await consume_bounded(refs(), handle)
    assert sorted(seen) == list(range(5))
