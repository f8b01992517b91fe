"""Calling a handler, a poller or a cancel hook: async ones on the event loop, sync ones in a
thread of their own, each within the stage's time limit.

A sync call runs in a daemon thread, not a pool's: Python cannot stop a thread, so a sync
handler that never returns keeps its thread, but the attempt is failed when its time is up and
the process can still exit (the worker's grace period, or a second signal, ends it).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from headrace.policy.errors import Transient

P = ParamSpec("P")
T = TypeVar("T")

TIMEOUT = "timeout"


class DaemonThreads(Executor):
    """An executor that runs each call in a new daemon thread."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as error:  # handed to the awaiting coroutine
                future.set_exception(error)
            else:
                future.set_result(result)

        threading.Thread(target=run, name="headrace-sync", daemon=True).start()
        return future


_THREADS = DaemonThreads()


def timed_out(limit: float) -> Transient:
    return Transient(f"the attempt ran past its time limit of {limit:g}s", code=TIMEOUT)


async def call(
    fn: Callable[..., Any], *args: object, is_async: bool, limit: float | None
) -> object:
    """`fn(*args)`, awaited on the loop or run in a daemon thread, within `limit` seconds (a
    Transient `timeout` failure when it runs past them)."""
    if is_async:
        running: Awaitable[object] = fn(*args)
    else:
        context = contextvars.copy_context()
        work = functools.partial(context.run, fn, *args)
        running = asyncio.get_running_loop().run_in_executor(_THREADS, work)
    if limit is None:
        return await running
    try:
        async with asyncio.timeout(limit) as scope:
            return await running
    except TimeoutError:
        if scope.expired():
            raise timed_out(limit) from None
        raise


async def off_loop(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` in a daemon thread of its own, awaited: what an async handler uses
    for blocking or CPU work. Unlike `asyncio.to_thread` it waits for no pool's free thread, so
    a short call never queues behind another handler's long one."""
    context = contextvars.copy_context()
    work = functools.partial(context.run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_THREADS, work)
