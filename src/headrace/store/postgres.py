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
    AsyncGenerator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
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

from headrace.policy import fairness, poison
from headrace.policy import gate as gating
from headrace.policy.clock import Clock
from headrace.policy.errors import (
    ConfigError,
    ErrorClass,
    HeadraceError,
    LeaseLost,
    QueueFull,
    SchemaTooNew,
    StoreError,
    StoreUnavailable,
    UnknownGate,
    UnknownTask,
)
from headrace.policy.gate import GateConfig, GateState, GateStatistics
from headrace.policy.poison import Expiry
from headrace.policy.tiers import AGING_CEILING, Tier, aged_tier
from headrace.store import idempotency, sql
from headrace.store.dispatch import GateBook, earliest, fits_claim, gate_key
from headrace.store.types import (
    LEASE_EXPIRED,
    POISON,
    UPSTREAM_FAILED,
    Attempt,
    AttemptError,
    AttemptOutcome,
    AwaitRemote,
    ClaimResult,
    Dead,
    Failure,
    GroupReport,
    Lease,
    NewTask,
    Outcome,
    PollAgain,
    Retry,
    Settings,
    Sibling,
    StageStats,
    Submitted,
    Succeeded,
    TaskRecord,
    TaskState,
)

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
# Seconds of store time a store's claims go without reaping expired leases and aging low tasks
# after one that did: an expiry or an aging step is seen this much later at most, and a busy
# worker's claims skip two statements and a round trip.
SWEEP_EVERY = 0.1
# Seconds `now()` reuses the server's last answer, moved on by the host's monotonic clock.
CLOCK_REUSE = 1.0
# Tries of one verb that met a deadlock, a serialization failure or a racing idempotency key.
CONFLICT_TRIES = 5
URL_OPTIONS = ("schema", "pool_min", "pool_max", "durable_claims")
BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

log = logging.getLogger(__name__)


_CONFLICTS = (pgerrors.DeadlockDetected, pgerrors.SerializationFailure)
KEY_INDEX = "tasks_key"  # a unique violation on it: another writer took a key first


class PostgresStore:
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
        self._swept_at = -math.inf  # store time of this store's last claim that reaped and aged
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
            return await self._read(_Transaction.current_time)
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
            question = asyncio.create_task(self._read(_Transaction.clock_sample))
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
        _check_gates(batch, self._configs)
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
        wanted = _kinds(kinds)

        # Reap expired leases and age low tasks once SWEEP_EVERY of store time has passed (or
        # the clock went back), judged by the clock as this store last saw it.
        seen = self.clock.now() if self.clock is not None else await self.now()
        sweep = not self._swept_at <= seen < self._swept_at + SWEEP_EVERY

        async def verb(tx: _Transaction) -> _Claimed:
            return await tx.claim(
                worker, limit, lease_for, wanted, alone=alone, durable=self.durable_claims
            )

        if sweep:
            # Its own transaction: the tasks it makes ready or promotes are not held by a claim
            # that has yet to lock their gates (another claim would skip them, out of order).
            self._swept_at = await self._write(lambda tx: tx.sweep())
        claimed = await self._write(verb, clock_first=False)  # the claim reads it in passing
        return await claimed.result()

    async def claim_polls(
        self, worker: str, limit: int, *, lease_for: float, kinds: Collection[str] | None = None
    ) -> ClaimResult:
        wanted = _kinds(kinds)
        return await self._write(lambda tx: tx.claim_polls(worker, limit, lease_for, wanted))

    # -- lease holders

    async def renew(self, leases: Sequence[Lease], *, lease_for: float) -> list[Lease | None]:
        held = tuple(leases)
        return await self._write(lambda tx: tx.renew(held, lease_for))

    async def start(self, lease: Lease, gates: Collection[str] | None = None) -> None:
        chosen = None if gates is None else frozenset(gates)
        await self._write(lambda tx: tx.start(lease, chosen), clock_first=False)

    async def finish(self, lease: Lease, outcome: Outcome) -> None:
        await self._write(lambda tx: tx.finish(lease, outcome), clock_first=False)

    async def finish_many(
        self, outcomes: Sequence[tuple[Lease, Outcome]]
    ) -> list[HeadraceError | None]:
        batch = tuple(outcomes)
        return await self._write(lambda tx: tx.finish_many(batch), clock_first=False)

    # -- cancellation and reaping

    async def cancel(self, task_id: int) -> bool:
        return await self._write(lambda tx: tx.cancel(task_id))

    async def redrive(
        self,
        *,
        task_ids: Collection[int] | None = None,
        group: str | None = None,
        kind: str | None = None,
    ) -> list[int]:
        ids = None if task_ids is None else sorted(task_ids)
        return await self._write(lambda tx: tx.redrive(ids, group, kind))

    async def reap(self) -> int:
        return await self._write(lambda tx: tx.reap())

    # -- reading

    async def get(self, task_id: int) -> TaskRecord:
        return await self._read(lambda tx: tx.task(task_id))

    async def find(self, key: str) -> TaskRecord | None:
        return await self._read(lambda tx: tx.find(key))

    async def tasks(
        self,
        *,
        group: str | None = None,
        state: TaskState | None = None,
        kind: str | None = None,
        limit: int = 1000,
    ) -> list[TaskRecord]:
        return await self._read(lambda tx: tx.tasks(group, state, kind, limit))

    async def attempts(self, task_id: int) -> list[Attempt]:
        return await self._read(lambda tx: tx.attempts(task_id))

    async def counts(self, *, kinds: Collection[str] | None = None) -> dict[TaskState, int]:
        chosen = None if kinds is None else sorted(kinds)
        return await self._read(lambda tx: tx.counts(chosen))

    async def stages(self, *, kinds: Collection[str] | None = None) -> list[StageStats]:
        chosen = None if kinds is None else sorted(kinds)
        return await self._read(lambda tx: tx.stages(chosen))

    async def groups(self) -> list[str]:
        return await self._read(lambda tx: tx.groups())

    async def group_report(self, group: str) -> GroupReport:
        return await self._read(lambda tx: tx.group_report(group))

    async def gate_statistics(self) -> list[GateStatistics]:
        return await self._read(lambda tx: tx.gate_statistics())

    # -- transactions

    async def _write(
        self, verb: Callable[[_Transaction], Awaitable[T]], *, clock_first: bool = True
    ) -> T:
        """`clock_first=False`: the verb reads the clock itself, once it holds its rows."""
        return await self._transact(verb, read=False, clock_first=clock_first)

    async def _read(self, verb: Callable[[_Transaction], Awaitable[T]]) -> T:
        return await self._transact(verb, read=True, clock_first=True)

    async def _transact(
        self, verb: Callable[[_Transaction], Awaitable[T]], *, read: bool, clock_first: bool
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
        self, verb: Callable[[_Transaction], Awaitable[T]], read: bool, clock_first: bool
    ) -> T:
        async with self._require_pool().connection() as conn:
            committing = False
            try:
                # Pipeline mode: statements whose results are not read go with the next read.
                async with conn.pipeline(), conn.transaction():
                    tx = _Transaction(conn, self._queries, self._configs, self.settings, self.clock)
                    result = await self._run_verb(tx, verb, read, clock_first)
                    committing = True
            except psycopg.OperationalError as exc:
                if conn.broken and not committing:  # lost before the commit: nothing written
                    raise _Dropped from exc
                raise
        return result

    async def _run_verb(
        self,
        tx: _Transaction,
        verb: Callable[[_Transaction], Awaitable[T]],
        read: bool,
        clock_first: bool,
    ) -> T:
        if read:
            await tx.run("read_snapshot")
        if clock_first:
            await tx.read_clock()
        result = await verb(tx)
        await tx.conclude(self.channel)
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


@dataclass(frozen=True)
class _GateSnapshot:
    states: dict[str, GateState]
    changed: set[str]
    busy: set[str]


class _GateRows:
    """The gate rows one transaction holds, with their states. Rows are locked in name order,
    waiting for other writers; a claim that finds a gate out of that order takes it only if it
    is free (`busy` names the others), so two claims never wait on each other."""

    def __init__(self, tx: _Transaction) -> None:
        self._tx = tx
        self.states: dict[str, GateState] = {}
        self.changed: set[str] = set()
        self.busy: set[str] = set()

    async def lock(
        self, names: Iterable[str], *, or_skip: bool = False, clock: bool = False
    ) -> None:
        """Lock and load the gates among `names` not held yet. With `clock`, read the clock
        again once the locks that may have waited are held (in the same round trip)."""
        wanted = sorted(set(names) - self.states.keys() - self.busy)
        top = max(self.states, default="")
        waiting = [name for name in wanted if not or_skip or name > top]
        if waiting:
            await self._take("lock_gates", waiting, clock=clock)
        free_only = [name for name in wanted if name not in self.states]
        if free_only:
            await self._take("try_lock_gates", free_only, clock=False)
            self.busy.update(name for name in free_only if name not in self.states)

    async def _take(self, query: str, names: Sequence[str], *, clock: bool) -> None:
        await self._load(query, names, clock=clock)
        missing = [name for name in names if name not in self.states]
        if missing:  # first use: create the rows, then lock them
            await self._tx.run("add_gates", names=missing)
            await self._load(query, missing, clock=clock)

    async def _load(self, query: str, names: Sequence[str], *, clock: bool) -> None:
        locked = await self._tx.send(query, names=list(names))
        time = await self._tx.send_clock() if clock else None
        for found in await locked.fetchall():
            self.states[found["name"]] = _gate_state(found)
        if clock:
            await self._tx.read_clock(time)

    def take(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Gate rows this transaction has just locked."""
        for found in rows:
            self.states[found["name"]] = _gate_state(found)

    async def make(self, names: Sequence[str]) -> bool:
        """Rows for gates used for the first time (another writer may be making them too);
        whether any was missing."""
        found = await self._tx.rows("missing_gates", names=list(names))
        missing = [row["name"] for row in found]
        if missing:
            await self._tx.run("add_gates", names=missing)
        return bool(missing)

    def get(self, name: str) -> GateState:
        return self.states[name]

    def put(self, name: str, state: GateState) -> None:
        self.states[name] = state
        self.changed.add(name)

    def snapshot(self) -> _GateSnapshot:
        return _GateSnapshot(dict(self.states), set(self.changed), set(self.busy))

    def restore(self, snapshot: _GateSnapshot) -> None:
        """Back to `snapshot`, after a savepoint rollback (which also released newer locks)."""
        self.states = dict(snapshot.states)
        self.changed = set(snapshot.changed)
        self.busy = set(snapshot.busy)

    async def flush(self) -> None:
        if self.changed:
            params = [_gate_params(name, self.states[name]) for name in sorted(self.changed)]
            await self._tx.run_many("save_gate", params)
            self.changed.clear()


@dataclass(frozen=True)
class _Claimed:
    """A claim's outcome, its leases read once the transaction committed (`leased`: the rows
    `lease_tasks` returned, received with the commit)."""

    leased: psycopg.AsyncCursor[DictRow] | None
    ids: list[int]
    until: float
    now: float
    wake_at: float | None

    async def result(self) -> ClaimResult:
        if self.leased is None:
            return ClaimResult((), self.now, self.wake_at)
        rows = await self.leased.fetchall()  # no round trip: the commit's sync brought them
        held = {record.id: record for record in map(_record, rows)}
        leases = (Lease(held[i], held[i].lease_token, self.until) for i in self.ids)
        return ClaimResult(tuple(leases), self.now, self.wake_at)


@dataclass
class _Planned:
    """A task of a submitted batch that will be created."""

    id: int
    task: NewTask
    unmet: list[int]
    failed: bool  # a dependency is already dead or cancelled
    payload_digest: str | None  # kept with a keyed task (store/idempotency.py)
    tag: float = 0.0


class _Transaction:
    """One verb's transaction: the statements it runs and the state machine's steps, as in
    `MemoryStore` and `SQLiteStore` (the conformance suite holds the three to one semantics)."""

    def __init__(
        self,
        conn: Connection,
        queries: Queries,
        configs: Mapping[str, GateConfig],
        settings: Settings,
        clock: Clock | None,
    ) -> None:
        self.conn = conn
        self._queries = queries
        self.configs = configs
        self.settings = settings
        self._clock = clock
        self.now = -math.inf
        self.gates = _GateRows(self)
        self.wake = False  # notify listeners when this transaction commits
        self._virtual_time: float | None = None
        self._dispatches: int | None = None
        self._served: dict[str, int] = {}
        self._served_now: set[str] = set()
        self._tickets: dict[int, list[DictRow]] = {}  # ticket counts read, by task
        self._held: dict[int, TaskRecord] = {}  # tasks locked for outcomes, not yet written
        self._dependents = False  # `prepare` locked tasks waiting on those outcomes
        self._ledger: dict[tuple[str, str], float] = {}  # units to add, by (group, kind)
        self._counters: psycopg.AsyncCursor[DictRow] | None = None  # meta_values, sent early
        self._finishes: dict[str, float] = {}  # flows' finish tags after tagging new tasks

    # -- statements

    # Each runs the named query; `query` is positional-only so a parameter may be called `name`.

    async def send(self, query: str, /, **params: object) -> psycopg.AsyncCursor[DictRow]:
        """Send a statement and read its rows later: statements sent before a read share its
        round trip (pipeline mode)."""
        return await self.conn.execute(self._queries[query].text, {"now": self.now, **params})

    async def rows(self, query: str, /, **params: object) -> list[DictRow]:
        return await (await self.send(query, **params)).fetchall()

    async def row(self, query: str, /, **params: object) -> DictRow | None:
        found = await self.rows(query, **params)
        return found[0] if found else None

    async def one(self, query: str, /, **params: object) -> DictRow:
        found = await self.row(query, **params)
        if found is None:
            raise StoreError(f"postgres store: {query} found no row")
        return found

    async def run(self, query: str, /, **params: object) -> None:
        await self.conn.execute(self._queries[query].text, {"now": self.now, **params})

    async def run_many(self, query: str, rows: Iterable[Mapping[str, object]]) -> None:
        params = [{"now": self.now, **row} for row in rows]
        async with self.conn.cursor() as cursor:
            await cursor.executemany(self._queries[query].text, params)

    async def send_clock(self) -> psycopg.AsyncCursor[DictRow] | None:
        """Ask the server for its time (None when a clock was given): sent after a lock, it
        answers once the lock is held."""
        return None if self._clock is not None else await self.send("server_now")

    async def read_clock(self, sent: psycopg.AsyncCursor[DictRow] | None = None) -> None:
        """The store's time: the server's clock (the answer to `sent`, or asked now) unless a
        clock was given. It never goes back within a transaction."""
        if self._clock is not None:
            now = self._clock.now()
        else:
            found = await (sent or await self.send("server_now")).fetchone()
            now = float(found["now"]) if found is not None else -math.inf
        self.now = max(self.now, now)

    async def current_time(self) -> float:
        return self.now

    async def clock_sample(self) -> tuple[float, float]:
        """The server's time and this host's monotonic time at the middle of the round trip
        that asked for it."""
        sent = time.monotonic()
        await self.read_clock()
        return self.now, (sent + time.monotonic()) / 2

    async def conclude(self, channel: str) -> None:
        await self.gates.flush()
        if self._ledger:  # last, in key order: the ledger's rows are the hottest
            rows = sorted(self._ledger.items())
            params = [{"grp": grp, "kind": kind, "units": units} for (grp, kind), units in rows]
            await self.run_many("add_to_ledger", params)
        if self.wake:
            await self.run("notify", channel=channel)

    # -- submission

    async def submit(self, tasks: Sequence[NewTask], bounds: Mapping[str, int]) -> list[Submitted]:
        if not tasks or any(task.kind in bounds for task in tasks):
            await self.read_clock()
            states = await self.check_batch(tasks)
            planned = idempotency.plan(tasks, await self.known_keys(tasks))
            await self.check_bounds(tasks, planned, bounds)
            return await self.create(tasks, states, planned)
        return await self.submit_unbounded(tasks)

    async def submit_unbounded(self, tasks: Sequence[NewTask]) -> list[Submitted]:
        """A batch no bound counts, in one round trip before the insert: the tasks it depends on
        held (FOR SHARE), its keys looked up, then its flows made and locked, ids drawn (one per
        task, a few maybe unused), the virtual time read and the clock (once the flows are
        locked), in one statement.
        """
        named = self.named_dependencies(tasks)
        shared = await self.send("share_tasks", ids=sorted(set(named))) if named else None
        keys = sorted({task.key for task in tasks if task.key is not None})
        keyed = await self.send("task_ids_by_keys", keys=keys) if keys else None
        clock = None if self._clock is None else self._clock.now()
        flows = sorted({task.flow for task in tasks})
        start = await self.send("submit_start", flows=flows, n=len(tasks), clock=clock)
        rows = await shared.fetchall() if shared is not None else []
        states = {int(row["id"]): TaskState(row["state"]) for row in rows}
        for dep in named:
            if dep not in states:
                raise UnknownTask(dep)
        planned = idempotency.plan(
            tasks, _known(await keyed.fetchall() if keyed is not None else [])
        )
        found = await start.fetchone()
        if found is None:
            raise StoreError("postgres store: submit_start returned no row")
        self.now = max(self.now, float(found["now"]))
        self._virtual_time = float(found["virtual_time"])
        finish = dict(zip(found["flows"], map(float, found["finish_tags"]), strict=True))
        ids = [int(drawn) for drawn in found["ids"]]
        return await self.create(tasks, states, planned, ids=ids, finish=finish)

    async def check_batch(self, tasks: Sequence[NewTask]) -> dict[int, TaskState]:
        """Refuse a batch naming an unknown gate or task; hold the tasks it depends on still
        (FOR SHARE) and return their states."""
        named = self.named_dependencies(tasks)
        states = await self.dependency_states(named)
        for dep in named:
            if dep not in states:
                raise UnknownTask(dep)
        return states

    def named_dependencies(self, tasks: Sequence[NewTask]) -> list[int]:
        """The task ids a batch depends on; an unknown gate or a later sibling is refused."""
        _check_gates(tasks, self.configs)
        named: list[int] = []
        for index, task in enumerate(tasks):
            for dep in task.after:
                if not isinstance(dep, Sibling):
                    named.append(dep)
                elif not 0 <= dep.index < index:
                    raise ConfigError(f"task.after: sibling {dep.index} is not earlier")
        return named

    async def dependency_states(self, ids: Iterable[int]) -> dict[int, TaskState]:
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        found = await self.rows("share_tasks", ids=wanted)
        return {int(row["id"]): TaskState(row["state"]) for row in found}

    async def known_keys(self, tasks: Sequence[NewTask]) -> dict[str, idempotency.KnownKey]:
        """The tasks the batch's keys name already, with their payload digests."""
        keys = sorted({task.key for task in tasks if task.key is not None})
        if not keys:
            return {}
        return _known(await self.rows("task_ids_by_keys", keys=keys))

    async def check_bounds(
        self,
        tasks: Sequence[NewTask],
        planned: Sequence[idempotency.Planned],
        bounds: Mapping[str, int],
    ) -> None:
        for kind in sorted(bounds):
            new = idempotency.created_of_kind(tasks, planned, kind)
            if not new:
                continue
            # One submitter at a time counts a bounded kind, so two cannot both squeeze in.
            await self.run("advisory_lock", lock=f"headrace.bound:{kind}")
            queued = int((await self.one("count_queued", kind=kind))["n"])
            if queued + new > bounds[kind]:
                raise QueueFull(kind, bounds[kind])

    async def create(
        self,
        tasks: Sequence[NewTask],
        states: dict[int, TaskState],
        planned: Sequence[idempotency.Planned],
        *,
        ids: Sequence[int] | None = None,
        finish: dict[str, float] | None = None,
    ) -> list[Submitted]:
        """Create the batch's new tasks (`planned` None; the others name a task already) in one
        statement. `ids` drawn already (at least one per new task); `finish`: the flows locked
        already."""
        if not tasks:
            return []
        fresh = {index for index, step in enumerate(planned) if step is None}
        if ids is None:
            ids = [int(row["id"]) for row in await self.rows("next_task_ids", n=len(fresh))]
        fresh_ids = iter(ids)
        results: list[Submitted] = []
        for step in planned:
            if step is None:
                results.append(Submitted(next(fresh_ids), created=True))
            else:
                results.append(idempotency.reused(step, results))
        if fresh:
            await self.insert(tasks, results, states, fresh, finish)
        return results

    async def insert(
        self,
        tasks: Sequence[NewTask],
        results: Sequence[Submitted],
        states: dict[int, TaskState],
        fresh: Collection[int],
        finish: dict[str, float] | None = None,
    ) -> None:
        created = {results[index].id for index in fresh}
        afters = [_resolved(task, results) for task in tasks]
        others = {dep for after in afters for dep in after} - created - states.keys()
        states.update(await self.dependency_states(others))
        planned = [_plan(results[i].id, tasks[i], afters[i], states) for i in sorted(fresh)]
        await self.tag(planned, finish)
        # Not read before the commit: a key another writer took since `known_keys` fails the
        # transaction, and the next try finds that writer's task.
        await self.run(
            "insert_tasks",
            tasks=_insert_params(planned, self.now),
            flow_names=list(self._finishes),
            flow_finishes=list(self._finishes.values()),
        )
        deps = [(dep, p.id) for p in planned for dep in p.unmet]
        if deps:
            dep_ids, task_ids = zip(*deps, strict=True)
            await self.run("insert_dependencies", dep_ids=list(dep_ids), task_ids=list(task_ids))
        for failed in (p for p in planned if p.failed):
            await self.cancel_tree(failed.id, UPSTREAM_FAILED)
        self.wake = self.wake or any(not p.unmet for p in planned)

    async def tag(self, planned: Sequence[_Planned], locked: dict[str, float] | None) -> None:
        """Start tags for new tasks, in batch order; their flows' rows are locked in name order
        (`locked`: already, with their finish tags)."""
        flows = sorted({p.task.flow for p in planned})
        if locked is None:
            await self.run("add_flows", flows=flows)
            found = await self.send("lock_flows", flows=flows)  # held already after `prepare`
            if self._virtual_time is None:
                self._counters = await self.send("meta_values")
            locked = {row["flow"]: float(row["finish_tag"]) for row in await found.fetchall()}
        finish = {flow: locked[flow] for flow in flows}
        virtual_time = await self.virtual_time()
        for p in planned:
            tagged = fairness.tag(virtual_time, finish[p.task.flow], p.task.weight)
            finish[p.task.flow] = tagged.flow_finish
            p.tag = tagged.start
        self._finishes = {flow: finish[flow] for flow in flows}  # written with the insert

    async def virtual_time(self) -> float:
        if self._virtual_time is None:
            await self.load_counters()
        return self._virtual_time or 0.0

    # -- claiming

    async def claim(
        self,
        worker: str,
        limit: int,
        lease_for: float,
        kinds: list[str] | None,
        *,
        alone: bool = True,
        durable: bool = True,
    ) -> _Claimed:
        """The claim's time, counters and next run_at (`claim_start`) come back with the first
        batch's gates, in one round trip. Each batch's gates are locked before its tasks, so a
        task is only ever held by a claim that holds its gates: two claims never hand a gate's
        tickets out of (tier, tag) order. Not `durable`: the commit does not wait for the WAL
        flush."""
        clock = None if self._clock is None else self._clock.now()
        commit = "on" if durable else "off"
        start: psycopg.AsyncCursor[DictRow] | None = await self.send(
            "claim_start", clock=clock, commit=commit
        )
        next_at: float | None = None
        chosen: list[TaskRecord] = []
        excluded: set[str] = set()
        book: GateBook | None = None
        async with contextlib.aclosing(self.rounds(kinds, excluded, limit)) as rounds:
            async for candidates in rounds:
                if start is not None:
                    next_at, start = await self.read_claim_start(start), None
                book = book or GateBook(self.configs, self.gates.get, self.now)
                if self.admit(book, candidates, chosen, excluded, limit, alone):
                    break
        if start is not None:  # no candidate at all
            next_at = await self.read_claim_start(start)
        book = book or GateBook(self.configs, self.gates.get, self.now)
        for name in book.changed:
            self.gates.put(name, book.states[name])
        wake_at = earliest(book.wake_at(), next_at)
        return await self.lease(chosen, worker, lease_for, wake_at)

    async def sweep(self) -> float:
        """Reap expired leases and age low tasks; return the store time it ran at."""
        await self.read_clock()
        aging = await self.send_aging()
        if await self.reap():
            aging = await self.send_aging()  # tasks made ready again may age as well
        await self.age(aging)
        return self.now

    async def read_claim_start(self, sent: psycopg.AsyncCursor[DictRow]) -> float | None:
        """The time `claim_start` fixed for the claim's statements and the counters it read;
        return the earliest future run_at of a ready task (reaping and leasing cannot change
        it)."""
        found = await sent.fetchone()
        if found is None:
            raise StoreError("postgres store: claim_start returned no row")
        self.now = max(self.now, float(found["now"]))
        self._dispatches = int(found["dispatches"])
        self._virtual_time = float(found["virtual_time"])
        return None if found["next_at"] is None else float(found["next_at"])

    async def rounds(
        self, kinds: list[str] | None, excluded: set[str], limit: int
    ) -> AsyncGenerator[list[TaskRecord], None]:
        """Ready tasks due now in (tier, tag, id) order, a batch at a time (the first just big
        enough for `limit`, then growing): in one statement, each batch's gates are locked
        first, then its tasks whose gates this claim holds. Handed out whole rounds at a time:
        a run of equal (tier, tag) is never split, so `take_turns` sees each round entire. Gate
        keys in `excluded` (refused so far) are left out of later batches."""
        after: tuple[int, float, int] = (-1, 0.0, 0)
        size = min(CLAIM_BATCH, 2 * limit + 8)
        held: list[TaskRecord] = []
        while True:
            batch = {"tier": after[0], "tag": after[1], "id": after[2], "kinds": kinds}
            peeked, last, tasks = await self.claim_batch(batch, sorted(excluded), size)
            if peeked < size:
                if held or tasks:
                    yield held + tasks
                return
            assert last is not None
            after = last
            size = min(CLAIM_BATCH, size * 4)
            if not (held or tasks):  # every task of the batch held by others, or refused
                continue
            whole, held = _split_last_round([*held, *tasks])
            if whole:
                yield whole

    async def claim_batch(
        self, batch: Mapping[str, object], refused: list[str], size: int
    ) -> tuple[int, tuple[int, float, int] | None, list[TaskRecord]]:
        """The next batch of up to `size` candidates: its gates locked (the first time, the
        clock read once they are held), then those of its tasks whose gates are all held.
        Returns how many tasks the batch had, the last one's (tier, tag, id) and the tasks
        taken. A gate used for the first time has no row to lock yet: it is made, and the
        batch read again."""
        for _ in range(2):
            first = not self.gates.states and not self.gates.busy
            sent = await self.send(
                "claim_batch",
                **batch,
                refused=refused,
                batch=size,
                held=sorted(self.gates.states),
                top=max(self.gates.states, default=""),
            )
            time = await self.send_clock() if first else None
            rows = await sent.fetchall()
            if first:
                await self.read_clock(time)
            edge = rows[0]
            self.gates.take(edge["gate_rows"])
            others = [name for name in edge["wanted"] if name not in self.gates.states]
            if not others or not await self.gates.make(others):
                self.gates.busy.update(others)  # another claim holds them: its tasks are its
                break
        for row in rows:  # when each flow was last served, read with the candidates
            if row["id"] is not None:
                self._served.setdefault(row["flow"], int(row["flow_served"]))
        tasks = [_record(row) for row in rows if row["id"] is not None]
        if edge["last_id"] is None:
            return 0, None, tasks
        last = (int(edge["last_tier"]), float(edge["last_tag"]), int(edge["last_id"]))
        return int(edge["peeked"]), last, tasks

    def admit(
        self,
        book: GateBook,
        candidates: Sequence[TaskRecord],
        chosen: list[TaskRecord],
        excluded: set[str],
        limit: int,
        alone: bool,
    ) -> bool:
        """Choose among `candidates` in turn; True once the claim is complete."""
        ordered = fairness.take_turns(
            candidates,
            rank=lambda task: (task.tier, task.tag),
            flow=lambda task: task.flow,
            last_served=self.last_served,
        )
        for task in ordered:
            if len(chosen) >= limit:
                break
            key = gate_key(task.gates)
            if key in excluded or key in book.refused_keys:
                continue
            if not fits_claim(task, len(chosen), alone):
                continue
            if self.gates.busy.intersection(task.gates):
                excluded.add(key)  # another claim holds one of its gates: next claim
            elif book.admit(task.gates):
                chosen.append(task)
                self.dispatched(task)
                if task.solo:
                    return True
        excluded.update(book.refused_keys)
        return len(chosen) >= limit

    async def load_counters(self) -> None:
        if self._dispatches is None:
            sent = self._counters or await self.send("meta_values")
            found = {row["name"]: row["value"] for row in await sent.fetchall()}
            self._dispatches = int(found["dispatches"])
            self._virtual_time = float(found["virtual_time"])

    def last_served(self, flow: str) -> int:
        return self._served.get(flow, 0)

    def dispatched(self, task: TaskRecord) -> None:
        self._virtual_time = fairness.advance(self._virtual_time or 0.0, task.tag)
        self._dispatches = (self._dispatches or 0) + 1
        self._served[task.flow] = self._dispatches
        self._served_now.add(task.flow)

    async def lease(
        self, chosen: Sequence[TaskRecord], worker: str, lease_for: float, wake_at: float | None
    ) -> _Claimed:
        """Lease `chosen`; the leased rows are read once the transaction has committed (they
        come back with the commit: one round trip for both)."""
        until = self.now + lease_for
        if not chosen:
            return _Claimed(None, [], until, self.now, wake_at)
        ids = [task.id for task in chosen]
        flows = sorted(self._served_now)
        await self.run("lock_flows", flows=flows)  # before the counters
        rated = sorted({name for task in chosen for name in task.gates if self.rated(name)})
        leased = await self.send(
            "lease_tasks",
            ids=ids,
            rated=rated,
            worker=worker,
            until=until,
            virtual_time=self._virtual_time or 0.0,
            # turns numbered from this claim's count, renumbered after every dispatch counted
            base=self._dispatches or 0,
            flows=flows,
            served=[self._served[flow] for flow in flows],
        )
        return _Claimed(leased, ids, until, self.now, wake_at)

    async def send_aging(self) -> psycopg.AsyncCursor[DictRow] | None:
        """Ready tasks below the aging ceiling that may have waited an aging step."""
        step = self.settings.aging_step
        if step <= 0:
            return None
        cutoff = self.now - step + AGING_SLACK
        return await self.send("aging_candidates", ceiling=int(AGING_CEILING), cutoff=cutoff)

    async def age(self, candidates: psycopg.AsyncCursor[DictRow] | None) -> None:
        if candidates is None:
            return
        promoted: dict[int, int] = {}
        for found in await candidates.fetchall():
            tier = Tier(found["tier"])
            aged = aged_tier(tier, self.now - found["ready_since"], self.settings.aging_step)
            if aged != tier:
                promoted[int(found["id"])] = int(aged)
        if promoted:
            await self.run("promote", ids=list(promoted), tiers=list(promoted.values()))

    async def claim_polls(
        self, worker: str, limit: int, lease_for: float, kinds: list[str] | None
    ) -> ClaimResult:
        due = [
            int(row["id"]) for row in await self.rows("due_polls", kinds=kinds, limit=max(0, limit))
        ]
        leases: list[Lease] = []
        if due:
            until = self.now + lease_for
            found = await self.rows("lease_polls", ids=due, worker=worker, until=until)
            leased = {record.id: record for record in map(_record, found)}
            leases = [Lease(leased[i], leased[i].lease_token, until) for i in due]
        later = (await self.one("next_poll_at"))["at"]
        return ClaimResult(tuple(leases), self.now, later)

    # -- gates

    async def ticket_counts(self, task_id: int) -> list[DictRow]:
        if task_id not in self._tickets:
            self._tickets[task_id] = await self.rows("ticket_counts", task_id=task_id)
        return self._tickets[task_id]

    async def release(self, task_id: int, *, delete: bool = True) -> None:
        """Return a task's tickets to their gates (`delete=False`: the caller deletes the rows);
        a start never stamped is stamped now, at the outcome."""
        held = await self.ticket_counts(task_id)
        self._tickets[task_id] = []
        if not held:
            return
        await self.gates.lock(found["gate"] for found in held)
        for found in held:
            name = found["gate"]
            state = self.stamped(name, int(found["unstarted"]))
            self.gates.put(name, gating.release(state, int(found["n"])))
        if delete:
            await self.run("delete_tickets", task_id=task_id)
        self.wake = True

    def rated(self, name: str) -> bool:
        return gating.resolve(name, self.configs).rate is not None

    def stamped(self, name: str, count: int) -> GateState:
        """The state of gate `name` (locked) after `count` of its reserved starts are stamped."""
        state, config = self.gates.get(name), gating.find(name, self.configs)
        for _ in range(count):
            state = gating.start(config, state, self.now)
        return state

    async def start(self, lease: Lease, gates: Collection[str] | None) -> None:
        """Stamp the reserved starts of the task `lease` holds (on `gates`, or every one)."""
        found = await self.row("lock_task", id=lease.task_id)
        task = None if found is None else _record(found)
        await self.read_clock()
        if task is None or not _holds(task, lease.token, self.now):
            raise LeaseLost(lease.task_id)
        await self.stamp_starts(task.id, gates)

    async def stamp_starts(self, task_id: int, gates: Collection[str] | None = None) -> None:
        """Stamp a held task's reserved starts now; its tickets stay held."""
        held = await self.ticket_counts(task_id)
        chosen = [
            found
            for found in held
            if found["unstarted"] and (gates is None or found["gate"] in gates)
        ]
        if not chosen:
            return
        names = [found["gate"] for found in chosen]
        await self.gates.lock(names, clock=True)
        for found in chosen:
            self.gates.put(found["gate"], self.stamped(found["gate"], int(found["unstarted"])))
        await self.run("mark_started", task_id=task_id, gates=names)
        self._tickets.pop(task_id, None)  # read again if needed: the rows changed

    async def penalize(self, names: Sequence[str]) -> None:
        configs = {name: gating.resolve(name, self.configs) for name in names}
        await self.gates.lock(names)
        for name, config in configs.items():
            self.gates.put(name, gating.penalize(config, self.gates.get(name), self.now))

    # -- lease holders

    async def renew(self, leases: Sequence[Lease], lease_for: float) -> list[Lease | None]:
        if not leases:
            return []
        until = self.now + lease_for
        ids = [lease.task_id for lease in leases]
        tokens = [lease.token for lease in leases]
        found = await self.rows("renew_leases", ids=ids, tokens=tokens, until=until)
        renewed = {record.id: record for record in map(_record, found)}
        return [
            Lease(renewed[lease.task_id], lease.token, until)
            if lease.task_id in renewed and renewed[lease.task_id].lease_token == lease.token
            else None
            for lease in leases
        ]

    async def prepare(self, outcomes: Sequence[tuple[Lease, Outcome]]) -> None:
        """Lock, before any is written and in the order every writer follows, what the outcomes
        will touch: their tasks and the tasks waiting on those that succeed or die, the tasks
        their successors wait on, the gates, the successors' flows. Then no outcome of a batch
        waits for a lock while holding one a later outcome's order puts first."""
        ids = sorted({lease.task_id for lease, _ in outcomes})
        dead = [lease.task_id for lease, outcome in outcomes if isinstance(outcome, Dead)]
        done = [lease.task_id for lease, outcome in outcomes if isinstance(outcome, Succeeded)]
        locked = await self.send("lock_for_outcomes", ids=ids, dead=dead, succeeded=done)
        time = await self.send_clock()  # answered after the row locks: a wait must not stretch
        tickets = await self.send("ticket_counts_many", task_ids=ids)  # a lease
        held = {int(row["id"]): _record(row) for row in await locked.fetchall()}
        self._held = {task_id: held[task_id] for task_id in ids if task_id in held}
        self._dependents = len(held) > len(self._held)  # some outcome's dependents, locked
        await self.read_clock(time)
        self._tickets.update({task_id: [] for task_id in ids})
        for found in await tickets.fetchall():
            self._tickets[int(found["task_id"])].append(found)
        successors = [t for _, o in outcomes if isinstance(o, Succeeded) for t in o.successors]
        await self.dependency_states(d for t in successors for d in t.after if isinstance(d, int))
        gates = [row["gate"] for rows in self._tickets.values() for row in rows]
        await self.gates.lock([*gates, *_declared(outcomes, self.configs)], clock=True)
        await self.lock_flows(sorted({task.flow for task in successors}))

    async def lock_flows(self, flows: list[str]) -> None:
        if flows:
            await self.run("add_flows", flows=flows)
            await self.run("lock_flows", flows=flows)

    async def held(self, lease: Lease) -> TaskRecord:
        """The task `lease` still holds (locked by `prepare`), checked against the clock read
        once every lock was held."""
        task = self._held.pop(lease.task_id, None)
        if task is None:  # an earlier outcome of the batch was for this task too: read it again
            found = await self.row("lock_task", id=lease.task_id)
            task = None if found is None else _record(found)
        if task is None or not _holds(task, lease.token, self.now):
            raise LeaseLost(lease.task_id)
        return task

    async def finish(self, lease: Lease, outcome: Outcome) -> None:
        await self.prepare([(lease, outcome)])
        await self.apply(lease, outcome)

    async def apply(self, lease: Lease, outcome: Outcome) -> None:
        task = await self.held(lease)
        if isinstance(outcome, PollAgain):
            await self.poll_again(task, outcome)
        elif isinstance(outcome, Succeeded):
            await self.succeed(task, outcome)
        elif isinstance(outcome, Retry):
            await self.retry(task, outcome)
        elif isinstance(outcome, Dead):
            await self.die(task, outcome)
        else:
            await self.await_remote(task, outcome)

    async def finish_many(
        self, outcomes: Sequence[tuple[Lease, Outcome]]
    ) -> list[HeadraceError | None]:
        """Each outcome inside its own savepoint: one refused outcome leaves no trace and does
        not undo the others."""
        await self.prepare(outcomes)
        results: list[HeadraceError | None] = []
        plain: list[TaskRecord] = []  # plain successes not written yet, in batch order
        for lease, outcome in outcomes:
            if _plain_success(outcome) and lease.task_id in self._held:
                task = self._held.pop(lease.task_id)
                if _holds(task, lease.token, self.now):
                    await self.succeed_plain(task, outcome)
                    plain.append(task)
                    results.append(None)
                else:
                    results.append(LeaseLost(lease.task_id))
                continue
            await self.write_successes(plain)  # before this outcome, as in batch order
            before, ledger = self.gates.snapshot(), dict(self._ledger)
            try:
                async with self.conn.transaction():
                    await self.apply(lease, outcome)
            except HeadraceError as error:
                self.gates.restore(before)
                self._ledger = ledger
                self._tickets.clear()  # read again: the rollback may have restored some
                results.append(error)
            else:
                results.append(None)
        await self.write_successes(plain)
        return results

    async def succeed_plain(self, task: TaskRecord, outcome: Outcome) -> None:
        """A success without successors, held and checked: nothing in it can be refused, so it
        needs no savepoint; its rows are written with its neighbours' by `write_successes`."""
        assert isinstance(outcome, Succeeded)
        await self.lock_gates_for(task, ())
        await self.release(task.id, delete=False)
        units = outcome.cost if outcome.cost is not None else task.cost
        entry = (task.group or "", task.kind)
        self._ledger[entry] = self._ledger.get(entry, 0.0) + units
        # Listeners hear of it if tickets came back (`release`) or dependents may be ready.
        self.wake = self.wake or self._dependents

    async def write_successes(self, tasks: list[TaskRecord]) -> None:
        """The rows of a run of plain successes, in one statement (as `succeed_task` each)."""
        if tasks:
            ids = [task.id for task in tasks]
            numbers = [task.attempt for task in tasks]
            await self.run("succeed_tasks", ids=ids, numbers=numbers)
            tasks.clear()

    async def lock_gates_for(self, task: TaskRecord, penalized: Sequence[str]) -> None:
        """Lock the gates an outcome touches (the task's tickets and those it penalises) in
        name order, then read the clock again: gate times follow the order of the locks."""
        for name in penalized:
            gating.resolve(name, self.configs)
        held = await self.ticket_counts(task.id)
        await self.gates.lock([*(found["gate"] for found in held), *penalized], clock=True)

    async def poll_again(self, task: TaskRecord, outcome: PollAgain) -> None:
        if task.state is not TaskState.WAITING:
            raise ConfigError("PollAgain: only a waiting task can be polled again")
        run_at = self.now + outcome.delay
        await self.run("poll_again", id=task.id, run_at=run_at, code=outcome.code)

    async def succeed(self, task: TaskRecord, outcome: Succeeded) -> None:
        # Successors are checked like a submitted batch: a bad one fails the whole completion.
        states = await self.check_batch(outcome.successors)
        planned = idempotency.plan(outcome.successors, await self.known_keys(outcome.successors))
        await self.lock_gates_for(task, ())
        await self.release(task.id, delete=False)
        await self.run("succeed_task", id=task.id, number=task.attempt)
        units = outcome.cost if outcome.cost is not None else task.cost
        entry = (task.group or "", task.kind)
        self._ledger[entry] = self._ledger.get(entry, 0.0) + units
        states[task.id] = TaskState.SUCCEEDED  # successors that wait on it have nothing to wait for
        await self.create(outcome.successors, states, planned)
        self.wake = True

    async def retry(self, task: TaskRecord, outcome: Retry) -> None:
        await self.lock_gates_for(task, outcome.penalize)
        await self.penalize(outcome.penalize)
        await self.end_attempt(task, AttemptOutcome.RETRY, outcome.error)
        await self.release(task.id)
        run_at = self.now + outcome.delay
        await self.run("mark_retry", id=task.id, run_at=run_at, code=outcome.error.code)

    async def die(self, task: TaskRecord, outcome: Dead) -> None:
        await self.lock_gates_for(task, outcome.penalize)
        await self.penalize(outcome.penalize)
        await self.end_attempt(task, AttemptOutcome.DEAD, outcome.error)
        await self.bury(task.id, outcome.error.code)

    async def await_remote(self, task: TaskRecord, outcome: AwaitRemote) -> None:
        if task.state is TaskState.WAITING:
            raise ConfigError("AwaitRemote: the task is already waiting on a remote job")
        await self.end_attempt(task, AttemptOutcome.WAITING, None)
        await self.stamp_starts(task.id)  # the job was submitted: counted from now at latest
        deadline = self.now + outcome.timeout if outcome.timeout is not None else None
        await self.run(
            "mark_waiting",
            id=task.id,
            remote_id=outcome.remote_id,
            poll_every=outcome.poll_every,
            deadline=deadline,
            run_at=self.now + outcome.poll_every,
        )

    async def end_attempt(
        self, task: TaskRecord, outcome: AttemptOutcome, error: AttemptError | None
    ) -> None:
        await self.run(
            "end_attempt",
            task_id=task.id,
            number=task.attempt,
            outcome=outcome.value,
            error_class=error.error_class.value if error else None,
            code=error.code if error else None,
            message=error.message if error else None,
        )

    async def bury(self, task_id: int, code: str) -> None:
        await self.end_task(task_id, TaskState.DEAD, code)
        for dependent in await self.dependents(task_id):
            await self.cancel_tree(dependent, UPSTREAM_FAILED)

    async def end_task(self, task_id: int, state: TaskState, code: str) -> None:
        await self.release(task_id)
        await self.run("mark_ended", id=task_id, state=state.value, code=code)

    async def dependents(self, task_id: int) -> list[int]:
        return [int(found["task_id"]) for found in await self.rows("dependents", dep_id=task_id)]

    async def lock_tree(self, roots: Sequence[int]) -> list[int]:
        """Lock tasks and everything waiting on them, in id order (before any gate)."""
        found = await self.rows("lock_for_outcomes", ids=[], dead=list(roots), succeeded=[])
        return [int(row["id"]) for row in found]

    # -- dead letters

    async def redrive(
        self, ids: list[int] | None, group: str | None, kind: str | None
    ) -> list[int]:
        redriven: list[int] = []
        for found in await self.rows("dead_letters", ids=ids, grp=group, kind=kind):
            if await self.row("redrive_task", id=found["id"]) is not None:
                redriven.append(int(found["id"]))
                await self.restore_dependents(int(found["id"]))
        self.wake = self.wake or bool(redriven)
        return redriven

    async def restore_dependents(self, task_id: int) -> None:
        for dependent in await self.dependents(task_id):
            if (await self.one("failed_deps", id=dependent))["n"]:
                continue
            if await self.row("restore_dependent", id=dependent) is not None:
                await self.restore_dependents(dependent)

    # -- cancellation and reaping

    async def cancel(self, task_id: int) -> bool:
        await self.lock_tree([task_id])  # first: an outcome cannot land between look and act
        if (await self.task(task_id)).state.terminal:
            return False
        await self.cancel_tree(task_id, "cancelled")
        return True

    async def cancel_tree(self, root: int, code: str) -> None:
        tree = await self.lock_tree([root])
        held = await self.rows("ticket_gates", task_ids=tree)
        await self.gates.lock(found["gate"] for found in held)
        pending = [(root, code)]
        while pending:
            task_id, reason = pending.pop()
            task = await self.task(task_id)
            if task.state.terminal:
                continue
            if task.state in (TaskState.RUNNING, TaskState.WAITING):
                await self.end_attempt(task, AttemptOutcome.CANCELLED, None)
            await self.end_task(task_id, TaskState.CANCELLED, reason)
            dependents = reversed(await self.dependents(task_id))
            pending.extend((dependent, UPSTREAM_FAILED) for dependent in dependents)

    async def reap(self) -> int:
        expired = [_record(found) for found in await self.rows("expired_leases")]
        if not expired:
            return 0
        ids = [task.id for task in expired]
        await self.lock_tree(ids)
        held = await self.rows("ticket_gates", task_ids=ids)
        await self.gates.lock((found["gate"] for found in held), clock=True)
        for task in expired:
            await self.expire(task)
        self.wake = True
        return len(expired)

    async def expire(self, task: TaskRecord) -> None:
        error = AttemptError.of(ErrorClass.TRANSIENT, LEASE_EXPIRED, "worker lost its lease")
        await self.end_attempt(task, AttemptOutcome.LEASE_EXPIRED, error)
        beside = await self.one(
            "crash_companions", worker=task.worker or "", task_id=task.id, number=task.attempt
        )
        found = poison.verdict(
            alone=not beside["n"],
            expiries=task.expiries + 1,
            poison_expiries=self.settings.poison_expiries,
            attempts_used=task.attempts_used,
            max_attempts=task.max_attempts,
        )
        if found in (Expiry.POISON, Expiry.SPENT):
            await self.run("count_expiry", id=task.id)
            await self.bury(task.id, POISON if found is Expiry.POISON else LEASE_EXPIRED)
            return
        await self.release(task.id)
        solo = found is Expiry.SOLO
        await self.run("requeue_expired", id=task.id, code=LEASE_EXPIRED, solo=solo)

    # -- reading

    async def task(self, task_id: int) -> TaskRecord:
        found = await self.row("task_by_id", id=task_id)
        if found is None:
            raise UnknownTask(task_id)
        return _record(found)

    async def find(self, key: str) -> TaskRecord | None:
        found = await self.rows("task_ids_by_keys", keys=[key])
        return await self.task(int(found[0]["id"])) if found else None

    async def tasks(
        self, group: str | None, state: TaskState | None, kind: str | None, limit: int
    ) -> list[TaskRecord]:
        value = state.value if state is not None else None
        found = await self.rows("list_tasks", grp=group, state=value, kind=kind, limit=limit)
        return [_record(row) for row in found]

    async def attempts(self, task_id: int) -> list[Attempt]:
        await self.task(task_id)
        return [_attempt(found) for found in await self.rows("task_attempts", task_id=task_id)]

    async def counts(self, kinds: list[str] | None) -> dict[TaskState, int]:
        return _by_state(await self.rows("count_by_state", kinds=kinds))

    async def stages(self, kinds: list[str] | None) -> list[StageStats]:
        found = await self.rows("stage_stats", kinds=kinds)
        return [_stage(row, self.now) for row in found]

    async def groups(self) -> list[str]:
        return sorted(str(found["grp"]) for found in await self.rows("group_names"))

    async def group_report(self, group: str) -> GroupReport:
        by_state = _by_state(await self.rows("group_counts", grp=group))
        ledger = await self.rows("group_ledger", grp=group)
        cost = dict(sorted((str(r["kind"]), float(r["units"])) for r in ledger))
        failures = tuple(
            Failure(r["id"], r["kind"], r["ref"], r["error_code"], r["attempt"])
            for r in await self.rows("group_failures", grp=group)
        )
        total = sum(by_state.values())
        return GroupReport(group, total, by_state, cost, failures)

    async def gate_statistics(self) -> list[GateStatistics]:
        stats: list[GateStatistics] = []
        for found in await self.rows("all_gates"):
            try:
                config = gating.resolve(found["name"], self.configs)
            except UnknownGate:
                continue  # declared by another process sharing the store, not by this one
            stats.append(gating.statistics(config, _gate_state(found), self.now))
        return sorted(stats, key=lambda s: s.name)


def _declared(
    outcomes: Iterable[tuple[Lease, Outcome]], configs: Mapping[str, GateConfig]
) -> list[str]:
    """The gates the outcomes penalise that a spec declares (the others fail their outcome)."""
    names = {n for _, o in outcomes if isinstance(o, Retry | Dead) for n in o.penalize}
    declared = []
    for name in sorted(names):
        with contextlib.suppress(UnknownGate):
            gating.resolve(name, configs)
            declared.append(name)
    return declared


def _plain_success(outcome: Outcome) -> bool:
    return isinstance(outcome, Succeeded) and not outcome.successors


def _holds(task: TaskRecord, token: int, now: float) -> bool:
    return (
        task.state in (TaskState.RUNNING, TaskState.WAITING)
        and task.lease_token == token
        and task.lease_until is not None
        and task.lease_until > now
    )


def _kinds(kinds: Collection[str] | None) -> list[str] | None:
    return None if kinds is None else sorted(kinds)


def _split_last_round(
    candidates: list[TaskRecord],
) -> tuple[list[TaskRecord], list[TaskRecord]]:
    """`candidates` cut before the run of equal (tier, tag) that ends it (which may go on in
    the next batch)."""
    last = (candidates[-1].tier, candidates[-1].tag)
    cut = len(candidates)
    while cut and (candidates[cut - 1].tier, candidates[cut - 1].tag) == last:
        cut -= 1
    return candidates[:cut], candidates[cut:]


def _resolved(task: NewTask, results: Sequence[Submitted]) -> list[int]:
    return [results[d.index].id if isinstance(d, Sibling) else d for d in task.after]


def _plan(
    task_id: int, task: NewTask, after: Sequence[int], states: Mapping[int, TaskState]
) -> _Planned:
    unmet = sorted({dep for dep in after if states.get(dep) is not TaskState.SUCCEEDED})
    failed = any(states.get(dep) in (TaskState.DEAD, TaskState.CANCELLED) for dep in unmet)
    return _Planned(task_id, task, unmet, failed, idempotency.stored_digest(task, after))


def _known(rows: Iterable[DictRow]) -> dict[str, idempotency.KnownKey]:
    """`task_ids_by_keys` rows by key."""
    return {row["key"]: idempotency.KnownKey(int(row["id"]), row["payload_digest"]) for row in rows}


def _plain(batch: Sequence[NewTask], bounds: Mapping[str, int]) -> bool:
    """A batch `submit_plain` can take: no keys, no dependencies, no bounded kind, one task
    per flow (each task's tag is then its flow's first)."""
    flows = {task.flow for task in batch}
    return (
        bool(batch)
        and len(flows) == len(batch)
        and not any(task.key is not None or task.after or task.kind in bounds for task in batch)
    )


def _check_gates(tasks: Iterable[NewTask], configs: Mapping[str, GateConfig]) -> None:
    """Refuse a task naming an unknown gate."""
    for task in tasks:
        for name in task.gates:
            gating.resolve(name, configs)


def _task_row(task: NewTask) -> dict[str, Any]:
    """A new task's own columns, as `submit_plain` and `insert_tasks` read them."""
    return {
        "kind": task.kind,
        "ref": task.ref,
        "gates": list(task.gates),
        "gate_key": gate_key(task.gates),
        "flow": task.flow,
        "grp": task.group,
        "tier": int(task.tier),
        "cost": float(task.cost),
        "max_attempts": task.max_attempts,
    }


def _plain_rows(batch: Sequence[NewTask]) -> Jsonb:
    return Jsonb(
        [
            {
                **_task_row(task),
                "i": number,
                "delay": float(task.delay),
                "service": fairness.service(task.weight),
            }
            for number, task in enumerate(batch, start=1)
        ]
    )


def _insert_params(planned: Sequence[_Planned], now: float) -> Jsonb:
    """The rows `insert_tasks` creates, as one JSON array (one parameter to send, whatever the
    batch's size)."""
    return Jsonb(
        [
            {
                **_task_row(p.task),
                "id": p.id,
                "key": p.task.key,
                "payload_digest": p.payload_digest,
                "state": (TaskState.PENDING if p.unmet else TaskState.READY).value,
                "tag": p.tag,
                "run_at": now + p.task.delay,
                "ready_since": None if p.unmet else now,
                "unmet": len(p.unmet),
            }
            for p in planned
        ]
    )


def _by_state(rows: Iterable[DictRow]) -> dict[TaskState, int]:
    counts = dict.fromkeys(TaskState, 0)
    for found in rows:
        counts[TaskState(found["state"])] = int(found["n"])
    return counts


def _stage(row: DictRow, now: float) -> StageStats:
    oldest = row["oldest_ready"]
    return StageStats(
        row["kind"],
        pending=int(row["pending"]),
        ready=int(row["ready"]),
        running=int(row["running"]),
        waiting=int(row["waiting"]),
        oldest_ready_age=None if oldest is None else now - float(oldest),
    )


def _record(row: DictRow) -> TaskRecord:
    return TaskRecord(
        id=row["id"],
        kind=row["kind"],
        ref=row["ref"],
        gates=tuple(row["gates"]),
        flow=row["flow"],
        group=row["grp"],
        tier=Tier(row["tier"]),
        submitted_tier=Tier(row["submitted_tier"]),
        cost=row["cost"],
        key=row["key"],
        state=TaskState(row["state"]),
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        tag=row["tag"],
        created_at=row["created_at"],
        run_at=row["run_at"],
        ready_since=row["ready_since"],
        promoted_at=row["promoted_at"],
        finished_at=row["finished_at"],
        worker=row["worker"],
        lease_until=row["lease_until"],
        lease_token=row["lease_token"],
        remote_id=row["remote_id"],
        poll_every=row["poll_every"],
        remote_deadline=row["remote_deadline"],
        error_code=row["error_code"],
        expiries=row["expiries"],
        attempt_base=row["attempt_base"],
        solo=bool(row["solo"]),
        remote_jobs=row["remote_jobs"],
    )


def _attempt(row: DictRow) -> Attempt:
    error_class = row["error_class"]
    return Attempt(
        task_id=row["task_id"],
        number=row["number"],
        worker=row["worker"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        outcome=AttemptOutcome(row["outcome"]),
        error_class=ErrorClass(error_class) if error_class is not None else None,
        code=row["code"],
        message=row["message"],
    )


def _gate_state(row: Mapping[str, Any]) -> GateState:
    penalized_until = row["penalized_until"]
    return GateState(
        in_flight=row["in_flight"],
        starts=tuple(float(start) for start in row["starts"]),
        penalized_until=-math.inf if penalized_until is None else penalized_until,
        granted=row["granted"],
        blocked_by_token=row["blocked_by_token"],
        blocked_by_concurrency=row["blocked_by_concurrency"],
        rate_limited=row["rate_limited"],
        peak_in_flight=row["peak_in_flight"],
        first_blocked_at=row["first_blocked_at"],
        unstarted=row["unstarted"],
    )


def _gate_params(name: str, state: GateState) -> dict[str, object]:
    penalized = state.penalized_until
    return {
        "name": name,
        "in_flight": state.in_flight,
        "starts": list(state.starts),
        "penalized_until": None if penalized == -math.inf else penalized,
        "granted": state.granted,
        "blocked_by_token": state.blocked_by_token,
        "blocked_by_concurrency": state.blocked_by_concurrency,
        "rate_limited": state.rate_limited,
        "peak_in_flight": state.peak_in_flight,
        "first_blocked_at": state.first_blocked_at,
        "unstarted": state.unstarted,
    }


__all__ = ["PostgresStore", "migrate", "split_url"]
