"""`postgresql://…`: the store for many worker processes on many hosts, on PostgreSQL.

Every verb is one transaction on a connection from an async pool (psycopg 3). Dispatch state
lives in tables, so a gate's cap and rate, fair tags and leases hold across every process:

- A claim reaps expired leases and ages low tasks (a store's claims do so once per
  SWEEP_EVERY of store time, not each one), then reads ready candidates in `(tier, tag, id)`
  order a batch at a time with `FOR UPDATE SKIP LOCKED` (claims never wait on each other's
  tasks), locks the rows of the gates those candidates need in name order, and feeds
  `GateBook` through `take_turns`, as the other stores do. It then writes the gate states,
  tickets, leases, attempt rows, dispatch count and virtual time before it commits.
- Writers lock rows in one order: tasks (by id), then gates (by name), then flows (by name),
  then the store-wide counters, and the cost ledger last, at the commit. An outcome (or a batch
  of them) locks all it will touch before it writes anything. Where a claim discovers a gate
  out of that order it takes the row only if it is free; a transaction that still meets a
  deadlock or serialization failure runs again.
- Time: with no clock given, every lease, run_at and gate time is the server's
  `clock_timestamp()` read in the transaction (again after waiting for gate rows), so hosts with
  skewed clocks agree. A test passes a clock and its value is used instead, in the same SQL.
  `now()` asks the server at most once per CLOCK_REUSE and moves that answer on by the host's
  monotonic clock in between (a worker asks for every task it starts).
- Outcomes: a batch's plain successes (no successors) are written by one set-based statement;
  any other outcome runs in a savepoint of its own.
- Every write by a lease holder checks its token and `lease_until > now` on the locked task row;
  a stale holder gets `LeaseLost`.
- `submit`, and outcomes that make tasks ready or return tickets, `NOTIFY` the store's channel
  (its schema's name) when they commit; `wait_for_work` listens on a connection of its own.

A connection lost before the commit runs the verb again on another connection; a server that
cannot be reached, or a loss during the commit, comes out as `StoreUnavailable`; other driver
errors as `StoreError`. The statements are named in `store/sql/postgres_queries.sql`; the schema
is the versioned migrations in `store/sql/postgres/migrations/`, applied by `open()` (or
`headrace db upgrade`) under an advisory lock, in the store's own PostgreSQL schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import (
    Awaitable,
    Callable,
    Collection,
    Mapping,
    Sequence,
)
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import ConnStatus
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from headrace.policy import fairness
from headrace.policy.clock import Clock
from headrace.policy.errors import (
    ConfigError,
    SchemaTooNew,
    StoreError,
    StoreUnavailable,
)
from headrace.policy.gate import GateConfig
from headrace.store import sql
from headrace.store.machine import Claimed, Json, Sweeps, Transaction, check_gates, task_row
from headrace.store.types import (
    ClaimResult,
    NewTask,
    Settings,
    Submitted,
    TaskRecord,
    TaskState,
)
from headrace.store.verbs import TransactionVerbs, kinds_list

T = TypeVar("T")
Connection = psycopg.AsyncConnection[DictRow]
Queries = Mapping[str, sql.Query]

SCHEMES = ("postgresql", "postgres")
QUERIES = "postgres_queries.sql"
MIGRATIONS = "postgres/migrations"
DEFAULT_SCHEMA = "headrace"
# Candidates read per statement while a claim walks the ready queue in (tier, tag, id) order.
CLAIM_BATCH = 256
# Widens the aging range past any float rounding of `now - step`; aged_tier decides.
AGING_SLACK = 1e-3
# Seconds a verb waits for a pooled connection before the store counts as unavailable, and
# seconds the pool retries a failed connection (backing off) before it gives up on it. Equal, so
# a verb retried after an outage starts a fresh connection at once rather than waiting behind
# a long back-off: the server is used again within about a second of coming back.
POOL_TIMEOUT = 5.0
RECONNECT_TIMEOUT = POOL_TIMEOUT
# Seconds between attempts to reopen a dropped LISTEN connection: the first, and the most.
LISTEN_RETRY = (0.1, 5.0)
# Seconds `now()` reuses the server's last answer, moved on by the host's monotonic clock.
CLOCK_REUSE = 1.0
# Tries of one verb that met a deadlock, a serialization failure or a racing idempotency key.
CONFLICT_TRIES = 5
URL_OPTIONS = ("schema", "pool_min", "pool_max", "durable_claims")
BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

log = logging.getLogger(__name__)


_CONFLICTS = (pgerrors.DeadlockDetected, pgerrors.SerializationFailure)
KEY_INDEX = "tasks_key"  # a unique violation on it: another writer took a key first


class PostgresStore(TransactionVerbs):
    """The store many processes on many hosts share: one PostgreSQL schema."""

    def __init__(
        self,
        dsn: str,
        *,
        clock: Clock | None = None,
        pool_min: int = 1,
        pool_max: int = 10,
        schema: str = DEFAULT_SCHEMA,
        durable_claims: bool = False,
    ) -> None:
        """`durable_claims`: a claim's commit waits for the WAL flush, as every other write's
        does. Off, a claim commits without waiting (`synchronous_commit = off` for it alone):
        the task starts sooner, and a server crash in the flush's few hundred milliseconds
        forgets the claim as if its worker had died (the task runs again, the holder's writes
        are refused); its gate tickets and tokens are forgotten with it."""
        _check_pool_sizes(pool_min, pool_max)
        if not schema or len(schema) > 63:
            raise ConfigError(f"postgres schema: expected 1 to 63 characters, got {schema!r}")
        self.dsn = dsn
        self.clock = clock
        self.schema = schema
        self.channel = schema  # one schema, one store: its wake-ups are its own
        self.pool_min = pool_min
        self.pool_max = pool_max
        self.durable_claims = durable_claims
        self.settings = Settings()
        self._configs: dict[str, GateConfig] = {}
        self._queries: Queries = sql.load_queries(QUERIES)
        self._pool: AsyncConnectionPool[Connection] | None = None
        self._server_clock: tuple[float, float] | None = None  # (server time, monotonic then)
        self._last_now = -math.inf
        self._clock_question: asyncio.Task[tuple[float, float]] | None = None
        self._sweeps = Sweeps()
        self._listener = _Listener(
            _named(dsn, f"headrace-listen/{schema}"), self._compose("listen")
        )

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> PostgresStore:
        """A store for `postgresql://user@host:port/db` (or `postgres://`). The query may add
        `schema`, `pool_min`, `pool_max` and `durable_claims` (true or false); the rest of the
        URL goes to libpq as it is."""
        dsn, options = split_url(url)
        return cls(
            dsn,
            clock=clock,
            schema=options.get("schema", DEFAULT_SCHEMA),
            pool_min=_int_option(options, "pool_min", 1),
            pool_max=_int_option(options, "pool_max", 10),
            durable_claims=_bool_option(options, "durable_claims", False),
        )

    def __repr__(self) -> str:
        return f"PostgresStore({_without_password(self.dsn)!r}, schema={self.schema!r})"

    # -- lifecycle

    async def open(self, settings: Settings) -> None:
        self.settings = settings
        self._configs = {config.name: config for config in settings.gates}
        if self._pool is not None:
            return
        await self.upgrade()  # on a connection of its own: an unreachable server fails fast
        pool = self._new_pool()
        try:
            await _translated(pool.open(wait=True, timeout=POOL_TIMEOUT))
        except BaseException:
            await pool.close()
            raise
        self._pool = pool

    async def close(self) -> None:
        await self._listener.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def upgrade(self) -> tuple[int, int]:
        """Apply the migrations the schema lacks, on a connection of its own; return the schema
        version before and after."""
        connect = psycopg.AsyncConnection.connect(
            _named(self.dsn, f"headrace/{self.schema}"), autocommit=True, row_factory=dict_row
        )
        conn = await _translated(connect)
        async with conn:
            return await _translated(migrate(conn, self._queries, self.schema))

    async def now(self) -> float:
        """The server's clock, asked at most every CLOCK_REUSE seconds: in between, the last
        answer moved on by this host's monotonic clock (off by at most half that round trip
        plus the drift of two clocks over a second; never going back)."""
        if self.clock is not None:
            return await self._read(Transaction.current_time)
        local = time.monotonic()
        if self._server_clock is None or local - self._server_clock[1] >= CLOCK_REUSE:
            self._server_clock = await self._sample_clock()
            local = time.monotonic()
        server, at = self._server_clock
        self._last_now = max(self._last_now, server + (local - at))
        return self._last_now

    async def _sample_clock(self) -> tuple[float, float]:
        """One question to the server at a time: callers meanwhile share its answer."""
        question = self._clock_question
        if question is None or question.done():
            question = asyncio.create_task(self._read(Transaction.clock_sample))
            question.add_done_callback(_retrieve)  # even when every caller was cancelled
            self._clock_question = question
        return await asyncio.shield(question)

    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109
        self._require_pool()
        await self._listener.wait(timeout)

    # -- submission

    async def submit(
        self, tasks: Sequence[NewTask], *, bounds: Mapping[str, int] | None = None
    ) -> list[Submitted]:
        batch, limits = tuple(tasks), dict(bounds or {})
        if _plain(batch, limits):
            submitted = await self._submit_plain(batch)
            if submitted is not None:
                return submitted
        return await self._write(lambda tx: tx.submit(batch, limits), clock_first=False)

    async def _submit_plain(self, batch: Sequence[NewTask]) -> list[Submitted] | None:
        """A plain batch (`_plain`) in one statement, committed on its own: no round trip to
        begin or to commit. None when one of its flows is new (nothing was written): the
        general path makes the flow."""
        check_gates(batch, self._configs)
        params = {
            "tasks": _plain_rows(batch),
            "clock": None if self.clock is None else self.clock.now(),
            "channel": self.channel,
        }

        async def once() -> DictRow | None:
            async with self._require_pool().connection() as conn:
                try:
                    cursor = await conn.execute(self._queries["submit_plain"].text, params)
                    return await cursor.fetchone()
                except pgerrors.AdminShutdown as exc:
                    # The server ended the session (a restart, pg_terminate_backend) before
                    # the statement's commit: it wrote nothing, and runs again on another
                    # connection. Any other lost connection leaves it unknown: unavailable.
                    raise _Dropped from exc

        found = await self._retried(once)
        if found is None:
            raise StoreError("postgres store: submit_plain returned no row")
        if not found["complete"]:
            return None
        return [Submitted(int(drawn), created=True) for drawn in found["ids"]]

    # -- claiming

    async def claim(
        self,
        worker: str,
        limit: int,
        *,
        lease_for: float,
        kinds: Collection[str] | None = None,
        alone: bool = True,
    ) -> ClaimResult:
        wanted = kinds_list(kinds)

        # Reap expired leases and age low tasks once SWEEP_EVERY of store time has passed (or
        # the clock went back), judged by the clock as this store last saw it.
        seen = self.clock.now() if self.clock is not None else await self.now()
        sweep = self._sweeps.due(seen)

        async def verb(tx: Transaction) -> Claimed:
            return await tx.claim(
                worker, limit, lease_for, wanted, alone=alone, durable=self.durable_claims
            )

        if sweep:
            # Its own transaction: the tasks it makes ready or promotes are not held by a claim
            # that has yet to lock their gates (another claim would skip them, out of order).
            self._sweeps.at = await self._write(lambda tx: tx.sweep())
        claimed = await self._write(verb, clock_first=False)  # the claim reads it in passing
        return await claimed.result()

    # -- transactions

    async def _write(
        self, verb: Callable[[Transaction], Awaitable[T]], *, clock_first: bool = True
    ) -> T:
        """`clock_first=False`: the verb reads the clock itself, once it holds its rows."""
        return await self._transact(verb, read=False, clock_first=clock_first)

    async def _read(self, verb: Callable[[Transaction], Awaitable[T]]) -> T:
        return await self._transact(verb, read=True, clock_first=True)

    async def _transact(
        self, verb: Callable[[Transaction], Awaitable[T]], *, read: bool, clock_first: bool
    ) -> T:
        """Run `verb` in one transaction, again when it met a conflict; driver errors come out
        as StoreError (StoreUnavailable for a lost or unreachable server)."""
        return await self._retried(lambda: self._once(verb, read, clock_first))

    async def _retried(self, once: Callable[[], Awaitable[T]]) -> T:
        """`once()`, again when it met a conflict (it then wrote nothing)."""
        tries = 0
        while True:
            tries += 1
            try:
                return await _translated(once())
            except _Again as again:
                if tries >= CONFLICT_TRIES:
                    raise again.give_up(tries) from again.__cause__

    async def _once(
        self, verb: Callable[[Transaction], Awaitable[T]], read: bool, clock_first: bool
    ) -> T:
        async with self._require_pool().connection() as conn:
            committing = False
            try:
                # Pipeline mode: statements whose results are not read go with the next read.
                async with conn.pipeline(), conn.transaction():
                    driver = _Driver(conn, self._queries)
                    tx = Transaction(driver, self._configs, self.settings, self.clock)
                    result = await self._run_verb(tx, verb, read, clock_first)
                    committing = True
            except psycopg.OperationalError as exc:
                if conn.broken and not committing:  # lost before the commit: nothing written
                    raise _Dropped from exc
                raise
        return result

    async def _run_verb(
        self,
        tx: Transaction,
        verb: Callable[[Transaction], Awaitable[T]],
        read: bool,
        clock_first: bool,
    ) -> T:
        if read:
            await tx.run("read_snapshot")
        if clock_first:
            await tx.read_clock()
        result = await verb(tx)
        await tx.conclude()
        if tx.wake:  # heard by listeners once the transaction commits
            await tx.run("notify", channel=self.channel)
        return result

    def _require_pool(self) -> AsyncConnectionPool[Connection]:
        if self._pool is None:
            raise StoreError(f"{self!r} is not open: await store.open(settings) first")
        return self._pool

    def _new_pool(self) -> AsyncConnectionPool[Connection]:
        return AsyncConnectionPool(
            _named(self.dsn, f"headrace/{self.schema}"),
            connection_class=Connection,
            kwargs={"autocommit": True, "row_factory": dict_row},
            min_size=self.pool_min,
            max_size=self.pool_max,
            open=False,
            configure=self._configure,
            check=_check_connection,
            timeout=POOL_TIMEOUT,
            reconnect_timeout=RECONNECT_TIMEOUT,
            name=f"headrace-{self.schema}",
        )

    async def _configure(self, conn: Connection) -> None:
        await conn.execute(self._queries["set_search_path"].text, {"schema": self.schema})

    def _compose(self, query: str) -> pgsql.Composed:
        """A statement that names the schema or channel, which parameters cannot."""
        template = pgsql.SQL(self._queries[query].text)
        return template.format(
            schema=pgsql.Identifier(self.schema), channel=pgsql.Identifier(self.channel)
        )


class _Driver:
    """Named statements on a connection in pipeline mode: a statement's rows are read only
    when wanted, so those sent before share its round trip."""

    name = "postgres"

    def __init__(self, conn: Connection, queries: Queries) -> None:
        self._conn = conn
        self._queries = queries

    async def send(self, query: str, params: Mapping[str, object]) -> psycopg.AsyncCursor[DictRow]:
        return await self._conn.execute(self._queries[query].text, _adapted(params))

    async def run_many(self, query: str, params: Sequence[Mapping[str, object]]) -> None:
        async with self._conn.cursor() as cursor:
            await cursor.executemany(self._queries[query].text, [_adapted(p) for p in params])

    def savepoint(self) -> contextlib.AbstractAsyncContextManager[object]:
        return self._conn.transaction()


def _adapted(params: Mapping[str, object]) -> Mapping[str, object]:
    if not any(isinstance(value, Json) for value in params.values()):
        return params
    return {k: Jsonb(v.value) if isinstance(v, Json) else v for k, v in params.items()}


class _Again(Exception):
    """A transaction that wrote nothing and may simply run again."""

    def give_up(self, tries: int) -> StoreError:
        raise NotImplementedError


class _Conflict(_Again):
    """A transaction lost to another writer (deadlock, serialization, key race)."""

    def give_up(self, tries: int) -> StoreError:
        return StoreError(
            f"postgres store: gave up after {tries} tries that conflicted with other writers "
            f"({_first_line(self.__cause__ or self)})"
        )


class _Dropped(_Again):
    """The connection broke before the commit: run again on another (the pool replaces it)."""

    def give_up(self, tries: int) -> StoreError:
        return StoreUnavailable(
            f"postgres store unavailable: {tries} connections lost "
            f"({_first_line(self.__cause__ or self)})"
        )


async def _translated(work: Awaitable[T]) -> T:
    try:
        return await work
    except _Again:
        raise
    except _CONFLICTS as exc:
        raise _Conflict from exc
    except pgerrors.UniqueViolation as exc:
        if exc.diag.constraint_name == KEY_INDEX:
            raise _Conflict from exc
        raise StoreError(f"postgres store: {_first_line(exc)}") from exc
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"postgres store unavailable: {_first_line(exc)}") from exc
    except psycopg.Error as exc:
        raise StoreError(f"postgres store: {_first_line(exc)}") from exc


async def migrate(conn: Connection, queries: Queries, schema: str) -> tuple[int, int]:
    """Create the schema if needed and apply the migrations it lacks, in one transaction under
    an advisory lock (two processes starting at once do not race); return the schema version
    before and after."""
    migrations = sql.load_migrations(MIGRATIONS)
    latest = migrations[-1].version
    create = pgsql.SQL(queries["create_schema"].text).format(schema=pgsql.Identifier(schema))
    async with conn.transaction():
        await conn.execute(queries["advisory_lock"].text, {"lock": f"headrace.migrate:{schema}"})
        await conn.execute(create)
        await conn.execute(queries["set_search_path"].text, {"schema": schema})
        await conn.execute(queries["create_migrations_table"].text)
        cursor = await conn.execute(queries["schema_version"].text)
        found = await cursor.fetchone()
        before = int(found["version"]) if found is not None else 0
        if before > latest:
            raise SchemaTooNew(f"schema {schema!r}", before, latest)
        for migration in migrations[before:]:
            for statement in migration.statements:
                await conn.execute(statement)
            await conn.execute(queries["record_migration"].text, {"version": migration.version})
    return before, latest


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """The libpq URL and headrace's own options (`URL_OPTIONS`) of a `postgresql://` URL."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"store url: expected postgresql://user@host:port/db, got {url!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = {name: value for name, value in query if name in URL_OPTIONS}
    rest = [(name, value) for name, value in query if name not in URL_OPTIONS]
    return urlunsplit(parts._replace(query=urlencode(rest))), options


def _int_option(options: Mapping[str, str], name: str, default: int) -> int:
    value = options.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"store url: {name} must be an integer, got {value!r}") from None


def _bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    try:
        return BOOLEANS[value.lower()]
    except KeyError:
        raise ConfigError(f"store url: {name} must be true or false, got {value!r}") from None


def _check_pool_sizes(pool_min: int, pool_max: int) -> None:
    if isinstance(pool_min, bool) or not isinstance(pool_min, int) or pool_min < 0:
        raise ConfigError(f"postgres pool_min: expected an integer >= 0, got {pool_min!r}")
    if isinstance(pool_max, bool) or not isinstance(pool_max, int) or pool_max < max(1, pool_min):
        raise ConfigError(
            f"postgres pool_max: expected an integer >= max(1, pool_min), got {pool_max!r}"
        )


def _without_password(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))


async def _check_connection(conn: Connection) -> None:
    """The pool's check of a connection before lending it, without a round trip: reading what
    the server sent meanwhile shows a connection it closed (a restart) as broken, and the pool
    replaces it. (A connection lost without a word fails its verb as StoreUnavailable.)"""
    pgconn = conn.pgconn
    if pgconn.status == ConnStatus.OK:
        with contextlib.suppress(psycopg.OperationalError):
            pgconn.consume_input()
    if conn.closed or pgconn.status != ConnStatus.OK:
        raise psycopg.OperationalError("the server closed the connection")


def _named(dsn: str, application_name: str) -> str:
    """`dsn` naming its connections in pg_stat_activity (`headrace/<schema>`), unless it names
    them already."""
    if "application_name" in conninfo_to_dict(dsn):
        return dsn
    return make_conninfo(dsn, application_name=application_name[:63])


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class _Listener:
    """A connection of its own LISTENing on the store's channel: opened on first use, and again
    after it drops (then it wakes every waiter: notices may have been missed meanwhile). `wait`
    returns at the first wake-up since the previous wait, or at its timeout (the poll fallback,
    also while the server cannot be reached)."""

    def __init__(self, dsn: str, listen: pgsql.Composed) -> None:
        self._dsn = dsn
        self._listen = listen
        self._woken: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    async def wait(self, timeout: float) -> None:  # noqa: ASYNC109
        if self._woken is None:
            self._woken = asyncio.Event()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(self._woken), name="headrace-listen")
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
                log.info("headrace listener: %s", _first_line(exc))
            failures += 1
            first, most = LISTEN_RETRY
            await asyncio.sleep(min(first * 2 ** min(failures - 1, 10), most))

    async def _listen_once(self, woken: asyncio.Event, *, missed: bool) -> None:
        conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
        async with conn:
            await conn.execute(self._listen)
            if missed:
                woken.set()
            async for _ in conn.notifies():
                woken.set()


def _holds(task: TaskRecord, token: int, now: float) -> bool:
    return (
        task.state in (TaskState.RUNNING, TaskState.WAITING)
        and task.lease_token == token
        and task.lease_until is not None
        and task.lease_until > now
    )


def _plain(batch: Sequence[NewTask], bounds: Mapping[str, int]) -> bool:
    """A batch `submit_plain` can take: no keys, no dependencies, no bounded kind, one task
    per flow (each task's tag is then its flow's first)."""
    flows = {task.flow for task in batch}
    return (
        bool(batch)
        and len(flows) == len(batch)
        and not any(task.key is not None or task.after or task.kind in bounds for task in batch)
    )


def _plain_rows(batch: Sequence[NewTask]) -> Jsonb:
    return Jsonb(
        [
            {
                **task_row(task),
                "i": number,
                "delay": float(task.delay),
                "service": fairness.service(task.weight),
            }
            for number, task in enumerate(batch, start=1)
        ]
    )


__all__ = ["PostgresStore", "migrate", "split_url"]
