"""The PostgreSQL store's connections: its URL and options, the driver that runs the machine's
named statements on a pooled connection, driver errors translated, and migrations."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import ConnStatus
from psycopg.pq.abc import PGresult
from psycopg.rows import DictRow, TupleRow, tuple_row
from psycopg.types.json import Jsonb

from headrace.policy.errors import (
    ConfigError,
    SchemaTooNew,
    StoreError,
    StoreUnavailable,
)
from headrace.store.machine import Json, sql
from headrace.store.schemes import POSTGRES_SCHEMES

T = TypeVar("T")
Connection = psycopg.AsyncConnection[DictRow]
Queries = Mapping[str, sql.Query]

QUERIES = "postgres/sql/queries.sql"
MIGRATIONS = "postgres/sql/migrations"
URL_OPTIONS = ("schema", "pool_min", "pool_max", "durable_claims", "idle_in_transaction")
BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
CONFLICTS = (pgerrors.DeadlockDetected, pgerrors.SerializationFailure)
KEY_INDEX = "tasks_key"  # a unique violation on it: another writer took a key first
# A session lost: the link or the server went (OperationalError), or the server ended a
# session that sat too long inside a transaction (this process stalled).
SESSION_LOST = (psycopg.OperationalError, pgerrors.IdleInTransactionSessionTimeout)
# What the client asks of its own side of each connection (libpq's parameters), unless the URL
# names them: without them a connection attempt made while a link is down waits for the
# system's SYN retries (about two minutes, their last a minute apart, so a worker may stay
# cut off a minute after its link returns), and a connection that went quiet is trusted for
# hours. With them an attempt gives up after CONNECT_TIMEOUT seconds and the next one starts
# fresh, and a connection whose server stopped answering is found in the time the server
# takes to find a client gone (its keepalives, store.py): `PROBE_IDLE` quiet seconds, then
# `PROBES` probes `PROBE_INTERVAL` apart, or as long with data unacknowledged.
CONNECT_TIMEOUT = 5
PROBE_IDLE = 10
PROBE_INTERVAL = 5
PROBES = 3
GONE_AFTER = PROBE_IDLE + PROBE_INTERVAL * PROBES
CLIENT_SIDE = {
    "connect_timeout": str(CONNECT_TIMEOUT),
    "keepalives": "1",
    "keepalives_idle": str(PROBE_IDLE),
    "keepalives_interval": str(PROBE_INTERVAL),
    "keepalives_count": str(PROBES),
    "tcp_user_timeout": str(GONE_AFTER * 1000),
}


class PipelineDriver:
    """Named statements on a connection in pipeline mode: a statement's rows are read only
    when wanted, so those sent before share its round trip.

    A read ends with a Sync rather than a bare flush: the session then waits for the rest of
    the transaction as `idle in transaction`, which the server's
    `idle_in_transaction_session_timeout` applies to (mid-pipeline it would wait as `active`,
    with no limit, holding its locks for as long as its client is gone)."""

    name = "postgres"

    def __init__(self, conn: Connection, queries: Queries, pipeline: psycopg.AsyncPipeline) -> None:
        self._conn = conn
        self._queries = queries
        self._pipeline = pipeline

    async def send(self, query: str, params: Mapping[str, object]) -> Synced:
        # Rows come in binary: numbers, arrays and jsonb are read without parsing their text
        # (a claim and the outcomes of 128 tasks, in-process: about a tenth less of the
        # client's CPU a task)
        text = self._queries[query].text
        cursor = await self._conn.execute(text, adapted(params), binary=True)
        return Synced(cursor, self._pipeline)

    async def run_many(self, query: str, params: Sequence[Mapping[str, object]]) -> None:
        async with self._conn.cursor() as cursor:
            await cursor.executemany(self._queries[query].text, [adapted(p) for p in params])

    def savepoint(self) -> contextlib.AbstractAsyncContextManager[object]:
        return self._conn.transaction()


class Synced:
    """A statement sent in a pipeline; reading it syncs the pipeline first unless its result
    has come already."""

    __slots__ = ("_cursor", "_pipeline")

    def __init__(self, cursor: psycopg.AsyncCursor[DictRow], pipeline: psycopg.AsyncPipeline):
        self._cursor = cursor
        self._pipeline = pipeline

    async def fetchone(self) -> DictRow | None:
        await self._arrived()
        return await self._cursor.fetchone()

    async def fetchall(self) -> list[DictRow]:
        await self._arrived()
        return await self._cursor.fetchall()

    async def table(self) -> tuple[list[str], list[TupleRow]]:
        await self._arrived()
        cursor = cast("psycopg.AsyncCursor[TupleRow]", self._cursor)
        cursor.row_factory = tuple_row
        rows = await cursor.fetchall()
        return _names(cursor.pgresult), rows

    async def _arrived(self) -> None:
        if self._cursor.pgresult is None:
            await self._pipeline.sync()


def _names(result: PGresult | None) -> list[str]:
    """A result's column names, read from it as they are: `cursor.description` would make a
    `Column` of each, to be read once (a claim's batch has 18)."""
    if result is None:
        return []
    names = (result.fname(n) for n in range(result.nfields))
    return [name.decode() for name in names if name is not None]


def adapted(params: Mapping[str, object]) -> Mapping[str, object]:
    """Parameters as the driver sends them: a `Json` value as jsonb, a list of integers or of
    strings as an array literal (`{1,2,3}`, `{"a","b"}`), which the statement casts (every
    parameter of the store's statements is cast, as in `%(ids)s::bigint[]`). psycopg dumps a
    list element by element, each through a regular expression that decides its quoting, and
    looks up the list's dumper anew for each statement: 5.7 us a task of an in-process drain,
    for the ids, attempt numbers and tokens of its lease and outcome; a claim's gate and flow
    names each time."""
    return {name: _adapted(value) for name, value in params.items()}


def _adapted(value: object) -> object:
    if isinstance(value, Json):
        return Jsonb(value.value)
    if type(value) is list:
        if all(type(item) is int for item in value):  # an empty list too
            return "{" + ",".join(map(str, value)) + "}"
        if all(type(item) is str for item in value):
            return "{" + ",".join(map(_quoted, value)) + "}"
    return value


def _quoted(item: str) -> str:
    """An element of an array literal, quoted: read back as it is, whatever it holds."""
    return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Again(Exception):
    """A transaction that wrote nothing and may simply run again."""

    def give_up(self, tries: int) -> StoreError:
        raise NotImplementedError


class Conflict(Again):
    """A transaction lost to another writer (deadlock, serialization, key race)."""

    def give_up(self, tries: int) -> StoreError:
        return StoreError(
            f"postgres store: gave up after {tries} tries that conflicted with other writers "
            f"({first_line(self.__cause__ or self)})"
        )


class Dropped(Again):
    """The connection broke before the commit: run again on another (the pool replaces it)."""

    def give_up(self, tries: int) -> StoreError:
        return StoreUnavailable(
            f"postgres store unavailable: {tries} connections lost "
            f"({first_line(self.__cause__ or self)})"
        )


async def translated(work: Awaitable[T]) -> T:
    try:
        return await work
    except Again:
        raise
    except CONFLICTS as exc:
        raise Conflict from exc
    except pgerrors.UniqueViolation as exc:
        if exc.diag.constraint_name == KEY_INDEX:
            raise Conflict from exc
        raise StoreError(f"postgres store: {first_line(exc)}") from exc
    except SESSION_LOST as exc:
        raise StoreUnavailable(f"postgres store unavailable: {first_line(exc)}") from exc
    except psycopg.Error as exc:
        raise StoreError(f"postgres store: {first_line(exc)}") from exc


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
    if parts.scheme not in POSTGRES_SCHEMES:
        raise ConfigError(f"store url: expected postgresql://user@host:port/db, got {url!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = {name: value for name, value in query if name in URL_OPTIONS}
    rest = [(name, value) for name, value in query if name not in URL_OPTIONS]
    return urlunsplit(parts._replace(query=urlencode(rest))), options


def int_option(options: Mapping[str, str], name: str, default: int) -> int:
    value = options.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"store url: {name} must be an integer, got {value!r}") from None


def seconds_option(options: Mapping[str, str], name: str, default: float) -> float:
    value = options.get(name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"store url: {name} must be seconds >= 0, got {value!r}")
    return seconds


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    try:
        return BOOLEANS[value.lower()]
    except KeyError:
        raise ConfigError(f"store url: {name} must be true or false, got {value!r}") from None


def check_pool_sizes(pool_min: int, pool_max: int) -> None:
    if isinstance(pool_min, bool) or not isinstance(pool_min, int) or pool_min < 0:
        raise ConfigError(f"postgres pool_min: expected an integer >= 0, got {pool_min!r}")
    if isinstance(pool_max, bool) or not isinstance(pool_max, int) or pool_max < max(1, pool_min):
        raise ConfigError(
            f"postgres pool_max: expected an integer >= max(1, pool_min), got {pool_max!r}"
        )


def without_password(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))


async def check_connection(conn: Connection) -> None:
    """The pool's check of a connection before lending it, without a round trip: reading what
    the server sent meanwhile shows a connection it closed (a restart) as broken, and the pool
    replaces it. (A connection lost without a word fails its verb as StoreUnavailable.)"""
    pgconn = conn.pgconn
    if pgconn.status == ConnStatus.OK:
        with contextlib.suppress(psycopg.OperationalError):
            pgconn.consume_input()
    if conn.closed or pgconn.status != ConnStatus.OK:
        raise psycopg.OperationalError("the server closed the connection")


def client_side(dsn: str) -> str:
    """`dsn` with the client's timeouts and keepalives (`CLIENT_SIDE`) that it does not set
    itself: a value the URL gives wins."""
    given = conninfo_to_dict(dsn)
    missing = {name: value for name, value in CLIENT_SIDE.items() if name not in given}
    return make_conninfo(dsn, **missing) if missing else dsn


def named(dsn: str, application_name: str) -> str:
    """`dsn` naming its connections in pg_stat_activity (`headrace/<schema>`), unless it names
    them already."""
    if "application_name" in conninfo_to_dict(dsn):
        return dsn
    return make_conninfo(dsn, application_name=application_name[:63])


def retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a task's exception as seen (a task nobody awaits any more)."""
    if not task.cancelled():
        task.exception()


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
