"""How the SQLite store runs a transaction and whom its commits wake: on a file, or in memory.

A file (`OnThread`) is shared by the processes of one host. Its connection lives on one worker
thread and each transaction runs there whole, so the event loop never waits on the database;
writers of every process queue for the write lock (turn.py); a commit that frees work wakes the
other processes (wake.py), and the file's data version covers a lost wake-up; WAL checkpoints run
beside (checkpoint.py).

An in-memory database (`Inline`, `memory://`) belongs to one connection in one process: each
transaction runs at once on the event loop's thread, and a commit wakes this process's waiters
only. Nothing else can write to it, so there is nothing to queue for or look out for; and with
no thread between the loop and the database, a virtual-time loop (sim/loop.py) runs it as
deterministically as it runs its tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar

from headrace.policy.errors import StoreError
from headrace.store.sqlite import handoff
from headrace.store.sqlite.checkpoint import Checkpointer
from headrace.store.sqlite.turn import WriteTurn
from headrace.store.sqlite.wake import WakeChannel

T = TypeVar("T")

Connect = Callable[[], sqlite3.Connection]
Work = Callable[[sqlite3.Connection], T]


class Running(Protocol):
    """What the store asks of the way its transactions run."""

    woken: asyncio.Event  # set when a commit may have made work claimable
    wakes: int  # how many times it was set (`Store.wakes`)
    sees_every_write: bool  # `Store.sees_every_write`
    # A reading verb needs no transaction of its own: no other writer can come between its
    # statements (each transaction runs to its end before anything else does).
    reads_alone: bool

    async def start(self, connect: Connect) -> None: ...

    async def stop(self) -> None: ...

    async def read(self, work: Work[T]) -> T: ...

    async def write(self, work: Work[T]) -> T: ...

    def settle(self, connection: sqlite3.Connection, *, wake: bool) -> None:
        """Inside a transaction, at its end: whether it may free work."""
        ...

    async def wait_for_work(self, timeout: float) -> None: ...  # noqa: ASYNC109


class Inline:
    """An in-memory database: each transaction at once on the event loop's thread."""

    sees_every_write = True  # every write is its own
    reads_alone = True  # each transaction runs to its end on the loop's thread, one at a time

    def __init__(self, name: str) -> None:
        self.woken = asyncio.Event()
        self.wakes = 0
        self._name = name
        self.connection: sqlite3.Connection | None = None
        self._woke = False

    async def start(self, connect: Connect) -> None:
        if self.connection is None:
            self.connection = connect()

    async def stop(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.close()

    async def read(self, work: Work[T]) -> T:
        if self.connection is None:
            raise StoreError(f"{self._name} is not open: await store.open(settings) first")
        return work(self.connection)

    async def write(self, work: Work[T]) -> T:
        result = await self.read(work)
        if self._woke:
            self._woke = False
            self.wakes += 1
            self.woken.set()
        return result

    def settle(self, connection: sqlite3.Connection, *, wake: bool) -> None:
        self._woke = self._woke or wake

    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109
        """Return once a write made work claimable since the last claim or wait, or after
        `timeout`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.woken.wait(), timeout)
        self.woken.clear()  # seen: the next wait waits for something newer


class OnThread:
    """A file shared by the processes of one host: each transaction on the store's thread."""

    sees_every_write = False  # another process's notice may be lost (the data version covers it)
    reads_alone = False  # other processes write to the file between a reader's statements

    def __init__(
        self,
        name: str,
        path: Path,
        *,
        busy_timeout: float,
        data_version_poll: float,
        checkpoint: str,
        data_version: str,
    ) -> None:
        self.woken = asyncio.Event()
        self.wakes = 0
        self._name = name
        self._path = path
        self._poll = data_version_poll
        self._checkpoint_statement = checkpoint
        self._data_version_statement = data_version
        self._executor: ThreadPoolExecutor | None = None
        self._connection: sqlite3.Connection | None = None
        self._data_version = 0
        self._woke = False  # set on the store's thread by a write that may free work
        self._channel = WakeChannel(path, self._woken)  # ... to and from other processes
        self._checkpointer: Checkpointer | None = None
        self._turn = WriteTurn(path, busy_timeout)  # writers of every process queue here

    async def start(self, connect: Connect) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="headrace-sqlite")
            handoff.shorten()  # the thread takes the interpreter back soon after each statement
        try:
            await self._in_thread(lambda: self._connect(connect))
        except BaseException:
            await self.stop()
            raise
        if self._checkpointer is None:
            self._checkpointer = Checkpointer(self._path, self._checkpoint_statement)
            self._checkpointer.start()

    async def stop(self) -> None:
        self._channel.close()
        checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None:
            await asyncio.to_thread(checkpointer.stop)
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._disconnect)
        finally:
            executor.shutdown(wait=True)
            self._turn.close()
            handoff.restore()

    async def read(self, work: Work[T]) -> T:
        return await self._in_thread(lambda: work(self._open()))

    async def write(self, work: Work[T]) -> T:
        result = await self._in_thread(lambda: self._in_turn(work))
        if self._woke:  # committed: idle workers may claim, in this process and others
            self._woke = False
            self._woken()
            self._channel.notify()
        return result

    def settle(self, connection: sqlite3.Connection, *, wake: bool) -> None:
        self._data_version = self._read_data_version(connection)
        self._woke = self._woke or wake

    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109
        """Return once a write of this store made work claimable since the last claim, or one
        of another process did (its wake-up comes through store/sqlite/wake.py), or another
        connection committed (the file's data version, looked at every `data_version_poll`
        seconds: the fallback for a lost wake-up), or after `timeout`."""
        self._channel.listen()  # before the data version is read: no commit slips between
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (left := deadline - loop.time()) > 0:
            if self.woken.is_set():
                self.woken.clear()  # seen: the next wait waits for something newer
                return
            if await self._in_thread(self._changed_elsewhere):
                self.wakes += 1
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.woken.wait(), min(self._poll, left))

    def _woken(self) -> None:
        self.wakes += 1
        self.woken.set()

    def _in_turn(self, work: Work[T]) -> T:
        with self._turn:  # before BEGIN IMMEDIATE: no busy wait between this host's writers
            return work(self._open())

    def _open(self) -> sqlite3.Connection:
        if self._connection is None:
            raise StoreError(f"{self._name} is not open: await store.open(settings) first")
        return self._connection

    def _read_data_version(self, connection: sqlite3.Connection) -> int:
        return int(connection.execute(self._data_version_statement).fetchone()[0])

    def _changed_elsewhere(self) -> bool:
        """Whether another connection committed since this one last looked (store thread)."""
        if self._connection is None:
            return False
        version = self._read_data_version(self._connection)
        changed = version != self._data_version
        self._data_version = version
        return changed

    async def _in_thread(self, work: Callable[[], T]) -> T:
        if self._executor is None:
            raise StoreError(f"{self._name} is not open: await store.open(settings) first")
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def _connect(self, connect: Connect) -> None:
        if self._connection is None:
            self._connection = connect()

    def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
