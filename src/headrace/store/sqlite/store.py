"""`sqlite:///path`: the embedded default store, shared by the processes of one host.

One file holds everything dispatch decides with: tasks, gate states and tickets, leases, fair
queueing tags. Every verb is one transaction, and every writing verb takes the file's write lock
first (`BEGIN IMMEDIATE`), so claims from several processes are serialised and a gate's cap and
rate hold across all of them. Writers queue for that lock through the write turn
(store/sqlite/turn.py), which hands it on the moment it is let go. The store's clock defaults
to the wall clock (epoch seconds), which every process on the host shares.

The connection lives on one worker thread and each verb runs there whole, so the event loop never
waits on the database. The statements are named in `store/sqlite/sql/queries.sql`; the schema is
the versioned migrations in `store/sqlite/sql/migrations/`, applied by `open()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import (
    Awaitable,
    Callable,
    Collection,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from headrace.policy.clock import Clock, WallClock
from headrace.policy.errors import ConfigError, HeadraceError, StoreError
from headrace.policy.gate import GateConfig
from headrace.store.machine import Claimed, LeasedRows, Sweeps, Transaction, sql
from headrace.store.machine import claim as claim_steps
from headrace.store.machine import outcomes as outcome_steps
from headrace.store.machine.record_verbs import RecordVerbs
from headrace.store.machine.verbs import TaskVerbs, kinds_list
from headrace.store.protocol.types import (
    ClaimResult,
    KindLimit,
    Lease,
    MemoryRoom,
    Outcome,
    Settings,
)
from headrace.store.sqlite import handoff
from headrace.store.sqlite.checkpoint import Checkpointer
from headrace.store.sqlite.connection import (
    MIN_SQLITE_VERSION,
    QUERIES,
    Driver,
    Queries,
    connect,
    drive,
    in_transaction,
    migrate,
    path_from_url,
    scripts,
    translated,
)
from headrace.store.sqlite.turn import WriteTurn
from headrace.store.sqlite.wake import WakeChannel

T = TypeVar("T")

# Seconds between looks for other processes' commits: the fallback when no wake-up comes.
DATA_VERSION_POLL = 0.02


class SQLiteStore(TaskVerbs):
    """The embedded store: one SQLite file, shared by the processes of one host."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Clock | None = None,
        busy_timeout: float = 10.0,
        data_version_poll: float = DATA_VERSION_POLL,
    ) -> None:
        if not busy_timeout >= 0:
            raise ConfigError(f"sqlite busy_timeout: expected seconds >= 0, got {busy_timeout!r}")
        if not data_version_poll > 0:
            raise ConfigError(
                f"sqlite data_version_poll: expected seconds > 0, got {data_version_poll!r}"
            )
        self.path = Path(path)
        self.clock: Clock = clock or WallClock()
        self.busy_timeout = busy_timeout
        self.data_version_poll = data_version_poll
        self.settings = Settings()
        self._configs: dict[str, GateConfig] = {}
        self._queries: Queries = sql.load_queries(QUERIES)
        self._scripts = scripts(self._queries)
        self._sweeps = Sweeps()
        self._executor: ThreadPoolExecutor | None = None
        self._connection: sqlite3.Connection | None = None
        self._data_version = 0
        self._woke = False  # set on the store's thread by a write that may free work
        self._woken = asyncio.Event()  # ... and passed on to waiters by the event loop
        self._channel = WakeChannel(self.path, self._woken.set)  # ... to and from other processes
        self._checkpointer: Checkpointer | None = None
        self._turn = WriteTurn(self.path, busy_timeout)  # writers of every process queue here
        self.records = RecordVerbs(self)  # same database, same transactions

    @classmethod
    def from_url(
        cls, url: str, *, clock: Clock | None = None, busy_timeout: float = 10.0
    ) -> SQLiteStore:
        """A store for `sqlite:///relative/path.db` or `sqlite:////absolute/path.db`."""
        return cls(path_from_url(url), clock=clock, busy_timeout=busy_timeout)

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    # -- lifecycle

    async def open(self, settings: Settings) -> None:
        self.settings = settings
        self._configs = {config.name: config for config in settings.gates}
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="headrace-sqlite")
            handoff.shorten()  # the thread takes the interpreter back soon after each statement
        try:
            await self._in_thread(self._connect)
        except BaseException:
            await self.close()
            raise
        if self._checkpointer is None:
            self._checkpointer = Checkpointer(self.path, self._queries["checkpoint"].text)
            self._checkpointer.start()

    async def upgrade(self) -> tuple[int, int]:
        """Apply the migrations the file lacks, on a connection of its own; return the schema
        version before and after."""
        return await asyncio.to_thread(self._upgrade)

    def _upgrade(self) -> tuple[int, int]:
        connection = translated(lambda: connect(self.path, self.busy_timeout, self._queries))
        try:
            before = int(connection.execute(self._queries["user_version"].text).fetchone()[0])
            return before, migrate(connection, self._queries)
        finally:
            connection.close()

    async def close(self) -> None:
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

    async def now(self) -> float:
        return self.clock.now()

    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109
        """Return once a write of this store made work claimable since the last claim, or one
        of another process did (its wake-up comes through store/sqlite/wake.py), or another
        connection committed (the file's data version, looked at every `data_version_poll`
        seconds: the fallback for a lost wake-up), or after `timeout`."""
        self._channel.listen()  # before the data version is read: no commit slips between
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (left := deadline - loop.time()) > 0:
            if self._woken.is_set():
                self._woken.clear()  # seen: the next wait waits for something newer
                return
            if await self._in_thread(self._changed_elsewhere):
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), min(self.data_version_poll, left))

    # -- claiming (the other verbs: TaskVerbs)

    async def claim(
        self,
        worker: str,
        limit: int,
        *,
        lease_for: float,
        kinds: Collection[str] | None = None,
        alone: bool = True,
        finished: Sequence[tuple[Lease, Outcome]] = (),
        within: Sequence[KindLimit] = (),
        memory: MemoryRoom | None = None,
        ahead: int = 0,
    ) -> ClaimResult:
        wanted, batch = kinds_list(kinds), tuple(finished)
        self._woken.clear()  # this claim sees everything written before it

        async def verb(
            tx: Transaction,
        ) -> tuple[list[HeadraceError | None], Claimed, LeasedRows | None]:
            results = await outcome_steps.finish_many(tx, batch) if batch else []
            if self._sweeps.due(tx.now):  # under the same write lock as the claim
                fold = self._sweeps.fold_due(tx.now)
                self._sweeps.swept(await claim_steps.sweep(tx, fold=fold), folded=fold)
            claimed = await claim_steps.claim(
                tx,
                worker,
                limit,
                lease_for,
                wanted,
                alone=alone,
                within=tuple(within),
                memory=memory,
                ahead=ahead,
            )
            return results, claimed, await claimed.rows()

        results, claimed, rows = await self._write(verb)
        return replace(claimed.result(rows), finished=tuple(results))  # records out of the lock

    # -- the worker thread

    async def _write(
        self, verb: Callable[[Transaction], Awaitable[T]], *, clock_first: bool = True
    ) -> T:
        """Every write reads the clock first: it holds the file's write lock from its start."""
        result = await self._in_thread(lambda: self._transact_write(verb))
        if self._woke:  # committed: idle workers may claim, in this process and others
            self._woke = False
            self._woken.set()
            self._channel.notify()
        return result

    async def _read(self, verb: Callable[[Transaction], Awaitable[T]]) -> T:
        return await self._in_thread(lambda: self._transact("begin_read", verb))

    def _read_data_version(self, conn: sqlite3.Connection) -> int:
        return int(conn.execute(self._queries["data_version"].text).fetchone()[0])

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
            raise StoreError(f"{self!r} is not open: await store.open(settings) first")
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def _transact_write(self, verb: Callable[[Transaction], Awaitable[T]]) -> T:
        with self._turn:  # before BEGIN IMMEDIATE: no busy wait between this host's writers
            return self._transact("begin_write", verb)

    def _transact(self, begin: str, verb: Callable[[Transaction], Awaitable[T]]) -> T:
        connection = self._connection
        if connection is None:
            raise StoreError(f"{self!r} is not open: await store.open(settings) first")

        async def steps(tx: Transaction) -> T:
            await tx.read_clock()  # once the lock is held, so times follow the commit order
            result = await verb(tx)
            await tx.conclude()
            return result

        def work(conn: sqlite3.Connection) -> T:
            tx = Transaction(Driver(conn, self._scripts), self._configs, self.settings, self.clock)
            result = drive(steps(tx))
            self._data_version = self._read_data_version(conn)
            self._woke = self._woke or tx.wake
            return result

        return in_transaction(connection, self._queries, begin, work)

    def _connect(self) -> None:
        if self._connection is not None:
            return
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            raise StoreError(f"the sqlite store needs SQLite >= 3.35, not {sqlite3.sqlite_version}")
        connection = translated(lambda: connect(self.path, self.busy_timeout, self._queries))
        try:
            migrate(connection, self._queries)
        except BaseException:
            connection.close()
            raise
        self._connection = connection

    def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
