"""`sqlite:///path`: the embedded default store, shared by the processes of one host.

One file holds everything dispatch decides with: tasks, gate states and tickets, leases, fair
queueing tags. Every verb is one transaction, and every writing verb takes the file's write lock
first (`BEGIN IMMEDIATE`), so claims from several processes are serialised and a gate's cap and
rate hold across all of them. Writers queue for that lock through the write turn
(store/sqlite/turn.py), which hands it on the moment it is let go. The store's clock defaults
to the wall clock (epoch seconds), which every process on the host shares.

The connection lives on one worker thread and each verb runs there whole, so the event loop never
waits on the database. `memory://` is the same store on an in-memory database
(`SQLiteStore.in_memory`): the same machine and statements, each verb run at once on the event
loop's thread (store/sqlite/running.py). The statements are named in
`store/sqlite/sql/queries.sql`; the schema is the versioned migrations in
`store/sqlite/sql/migrations/`, applied by `open()`.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import (
    Awaitable,
    Callable,
    Collection,
    Sequence,
)
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from headrace.policy.clock import Clock, LoopClock, WallClock
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
from headrace.store.sqlite.connection import (
    MIN_SQLITE_VERSION,
    QUERIES,
    Driver,
    Queries,
    connect,
    drive,
    in_transaction,
    migrate,
    migrate_in_memory,
    path_from_url,
    scripts,
    translated,
)
from headrace.store.sqlite.running import Inline, OnThread, Running

T = TypeVar("T")

# Seconds between looks for other processes' commits: the fallback when no wake-up comes.
DATA_VERSION_POLL = 0.02
IN_MEMORY = ":memory:"  # the path of a database that lives in its connection


class SQLiteStore(TaskVerbs):
    """The embedded store: one SQLite file, shared by the processes of one host; or, at
    `IN_MEMORY`, a database of one process (`memory://`)."""

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
        self._in_memory = str(path) == IN_MEMORY
        self.clock: Clock = clock or (LoopClock() if self._in_memory else WallClock())
        self.busy_timeout = busy_timeout
        self.data_version_poll = data_version_poll
        self.settings = Settings()
        self._configs: dict[str, GateConfig] = {}
        self._queries: Queries = sql.load_queries(QUERIES)
        self._scripts = scripts(self._queries)
        self._sweeps = Sweeps()
        self._running: Running = (
            Inline(repr(self))
            if self._in_memory
            else OnThread(
                repr(self),
                self.path,
                busy_timeout=busy_timeout,
                data_version_poll=data_version_poll,
                checkpoint=self._queries["checkpoint"].text,
                data_version=self._queries["data_version"].text,
            )
        )
        self.records = RecordVerbs(self)  # same database, same transactions

    @classmethod
    def in_memory(cls, *, clock: Clock | None = None) -> SQLiteStore:
        """`memory://`: the same store on an in-memory database, for one process (tests, the
        simulator). Its time is the running event loop's clock unless a clock is given. Its
        data lasts until it is closed."""
        return cls(IN_MEMORY, clock=clock)

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
        await self._running.start(self._connect)

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
        await self._running.stop()

    async def now(self) -> float:
        return self.clock.now()

    @property
    def wakes(self) -> int:
        return self._running.wakes

    @property
    def sees_every_write(self) -> bool:
        return self._running.sees_every_write

    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109
        """Return once a commit made work claimable since the last claim, or after `timeout`
        (on a file, a commit of another process too: store/sqlite/running.py)."""
        await self._running.wait_for_work(timeout)

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
        self._running.woken.clear()  # this claim sees everything written before it

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

    # -- running a transaction (store/sqlite/running.py: on the file's thread, or inline)

    async def _write(
        self, verb: Callable[[Transaction], Awaitable[T]], *, clock_first: bool = True
    ) -> T:
        """Every write reads the clock first: it holds the file's write lock from its start."""
        return await self._running.write(lambda conn: self._transact(conn, "begin_write", verb))

    async def _read(self, verb: Callable[[Transaction], Awaitable[T]]) -> T:
        """A reading verb: in a transaction of its own (one snapshot), unless nothing else can
        write between its statements (in memory: two statements fewer a read)."""
        begin = None if self._running.reads_alone else "begin_read"
        return await self._running.read(lambda conn: self._transact(conn, begin, verb))

    def _transact(
        self,
        connection: sqlite3.Connection,
        begin: str | None,
        verb: Callable[[Transaction], Awaitable[T]],
    ) -> T:
        async def steps(tx: Transaction) -> T:
            await tx.read_clock()  # once the lock is held, so times follow the commit order
            result = await verb(tx)
            await tx.conclude()
            return result

        def work(conn: sqlite3.Connection) -> T:
            tx = Transaction(Driver(conn, self._scripts), self._configs, self.settings, self.clock)
            result = drive(steps(tx))
            self._running.settle(conn, wake=tx.wake)
            return result

        return in_transaction(connection, self._queries, begin, work)

    def _connect(self) -> sqlite3.Connection:
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            raise StoreError(f"the sqlite store needs SQLite >= 3.35, not {sqlite3.sqlite_version}")
        connection = translated(lambda: connect(self.path, self.busy_timeout, self._queries))
        try:
            if self._in_memory:
                translated(lambda: migrate_in_memory(connection, self._queries))
            else:
                migrate(connection, self._queries)
        except BaseException:
            connection.close()
            raise
        return connection
