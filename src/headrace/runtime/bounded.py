"""`consume_bounded`: a fixed pool of in-process workers fed through a bounded waiting queue.

The producer waits for room instead of creating a task per item, so at most
`workers + waiting + 1` items are ever taken from `refs` ahead of their handling. The first
handler error stops the pool and propagates; cancelling the call cancels the workers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def _check_limit(name: str, value: object) -> int:
    if type(value) is not int or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return value


async def _items(refs: Iterable[T] | AsyncIterable[T]) -> AsyncIterable[T]:
    if isinstance(refs, AsyncIterable):
        async for ref in refs:
            yield ref
    else:
        for ref in refs:
            yield ref


async def consume_bounded(
    refs: Iterable[T] | AsyncIterable[T],
    handle: Callable[[T], Awaitable[object]],
    *,
    workers: int = 2,
    waiting: int = 3,
) -> None:
    """Run `handle(ref)` for every ref with at most `workers` at once and `waiting` queued."""
    _check_limit("workers", workers)
    _check_limit("waiting", waiting)
    queue: asyncio.Queue[tuple[bool, T | None]] = asyncio.Queue(maxsize=waiting)

    async def work() -> None:
        while True:
            more, ref = await queue.get()
            try:
                if not more:
                    return
                await handle(ref)  # type: ignore[arg-type]
            finally:
                queue.task_done()

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(workers):
                group.create_task(work())
            async for ref in _items(refs):
                await queue.put((True, ref))
            for _ in range(workers):
                await queue.put((False, None))
    except* Exception as failures:
        # The first handler error is the caller's error; the rest were cancelled with it.
        raise failures.exceptions[0] from None
