"""Waiting for work on PostgreSQL: a connection of its own LISTENing on the store's channel."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
from psycopg import sql as pgsql

from headrace.store.postgres.connection import first_line

# Seconds between attempts to reopen a dropped LISTEN connection: the first, and the most.
LISTEN_RETRY = (0.1, 5.0)

log = logging.getLogger(__name__)


class Listener:
    """A connection of its own LISTENing on the store's channel: opened on first use, and again
    after it drops (then it wakes every waiter: notices may have been missed meanwhile). `wait`
    returns at the first wake-up since the previous wait, or at its timeout (the poll fallback,
    also while the server cannot be reached)."""

    def __init__(self, dsn: str, listen: pgsql.Composed) -> None:
        self._dsn = dsn
        self._listen = listen
        self._woken: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.wakes = 0  # notices heard, and connections made again (`Store.wakes`)

    async def wait(self, timeout: float) -> None:  # noqa: ASYNC109
        if self._woken is None:
            self._woken = asyncio.Event()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(self._woken), name="headrace-listen")
        # wait_for, whose cancellation takes the worker's loop one turn more than
        # asyncio.timeout's: in that turn a draining worker's short tasks end and their outcomes
        # ride its next claim (with asyncio.timeout, a 10,000-task drain wrote 209 outcome
        # batches of their own instead of 95, and its server spent 30% more CPU a task)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._woken.wait(), timeout)
        self._woken.clear()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, woken: asyncio.Event) -> None:
        failures = 0
        while True:
            try:
                await self._listen_once(woken, missed=failures > 0)
            except psycopg.Error as exc:
                # Until the connection is back, waits are plain polls.
                log.info("headrace listener: %s", first_line(exc))
            failures += 1
            first, most = LISTEN_RETRY
            await asyncio.sleep(min(first * 2 ** min(failures - 1, 10), most))

    async def _listen_once(self, woken: asyncio.Event, *, missed: bool) -> None:
        conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
        async with conn:
            await conn.execute(self._listen)
            if missed:
                self.wakes += 1
                woken.set()
            async for _ in conn.notifies():
                self.wakes += 1
                woken.set()
