"""An asyncio event loop on a virtual clock.

When the loop has nothing ready to run it jumps its clock to the next timer instead of sleeping,
so `asyncio.sleep(60)` takes no real time and a run is deterministic. Work handed to a thread
(`run_in_executor`, `asyncio.to_thread`) is waited for in real time with the clock stopped: a
thread's work is instantaneous on the virtual clock. Real sockets do not mix with it: a timer
would fire before a remote peer could answer.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")


class _VirtualSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        loop = self.loop
        if ready or timeout == 0 or loop is None:
            return ready
        if loop.threads_running or timeout is None:
            # Only a real event can wake us: a thread finishing, or real I/O.
            return super().select(None if timeout is None else _REAL_WAIT)
        loop.advance(timeout)
        return []


_REAL_WAIT = 0.05


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 0.0) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = start
        self.threads_running = 0

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += max(0.0, seconds)

    def run_in_executor(  # type: ignore[override]
        self, executor: Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self.threads_running += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _: asyncio.Future[Any]) -> None:
        self.threads_running -= 1


def run(main: Coroutine[Any, Any, T], *, start: float = 0.0, debug: bool = True) -> T:
    """Run `main` to completion on a fresh virtual-time loop (like `asyncio.run`)."""
    with asyncio.Runner(debug=debug, loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(main)


async def elapsed(awaitable: Awaitable[T]) -> tuple[T, float]:
    """Await `awaitable` and return its result with the loop time it took."""
    loop = asyncio.get_running_loop()
    begin = loop.time()
    result = await awaitable
    return result, loop.time() - begin
