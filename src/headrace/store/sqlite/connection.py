"""The SQLite store's file: its URL, connections (WAL, foreign keys, JSON columns), migrations,
and the driver that runs the machine's named statements at once on the store's thread."""

from __future__ import annotations

import atexit
import contextlib
import json
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import unquote, urlsplit

from headrace.policy.errors import ConfigError, SchemaTooNew, StoreError
from headrace.store.machine import Json, sql
from headrace.store.schemes import SQLITE_SCHEME

T = TypeVar("T")

QUERIES = "sqlite/sql/queries.sql"
MIGRATIONS = "sqlite/sql/migrations"
# RETURNING (3.35) and json_each; every supported Python ships a newer SQLite.
MIN_SQLITE_VERSION = (3, 35, 0)
STATEMENT_CACHE = 256  # prepared statements kept per connection: every named one, and more

Queries = Mapping[str, sql.Query]

sqlite3.register_converter("headrace_json", json.loads)
_LOCKED = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)  # primary result codes
_AS_JSON = (Json, list, tuple)
_split: dict[int, tuple[Queries, Mapping[str, tuple[str, ...]]]] = {}  # by id(queries)
_named: dict[str, list[str]] = {}  # by statement: its columns
_template: list[sqlite3.Connection] = []  # the migrated in-memory database, once made
_template_lock = threading.Lock()
_to_json = json.JSONEncoder().encode  # json.dumps's encoding, without its keyword checks


def path_from_url(url: str) -> Path:
    """The file a `sqlite:///relative/path.db` or `sqlite:////absolute/path.db` URL names."""
    parts = urlsplit(url)
    path = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    if parts.scheme != SQLITE_SCHEME or parts.netloc or parts.query or parts.fragment or not path:
        raise ConfigError(
            "store url: expected sqlite:///relative/path.db or sqlite:////absolute/path.db, "
            f"got {url!r}"
        )
    return Path(path)


def connect(path: Path, busy_timeout: float, queries: Queries) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, foreign keys on; its
    commits leave checkpoints to the store's checkpointer. (An in-memory database, `:memory:`,
    keeps its journal in memory whatever it is asked, and has no log to checkpoint.)"""
    connection = sqlite3.connect(
        path,
        timeout=busy_timeout,
        check_same_thread=False,  # the store runs one statement at a time itself
        isolation_level=None,
        detect_types=sqlite3.PARSE_COLNAMES,  # a column "x [headrace_json]" is read as JSON
        cached_statements=STATEMENT_CACHE,
    )
    try:
        for name in (
            "journal_wal",
            "synchronous_normal",
            "foreign_keys_on",
            "temp_store_memory",
            "checkpoint_backstop",
        ):
            connection.execute(queries[name].text).fetchall()
    except BaseException:
        connection.close()
        raise
    return connection


def migrate(connection: sqlite3.Connection, queries: Queries) -> int:
    """Apply the migrations the file lacks, all in one transaction; return the schema version."""

    def apply(conn: sqlite3.Connection) -> int:
        current = int(conn.execute(queries["user_version"].text).fetchone()[0])
        migrations = sql.load_migrations(MIGRATIONS)
        latest = migrations[-1].version
        if current > latest:
            raise SchemaTooNew("the database", current, latest)
        for migration in migrations[current:]:
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute(queries["set_user_version"].text.format(version=migration.version))
        return latest

    return in_transaction(connection, queries, "begin_write", apply)


def in_transaction(
    connection: sqlite3.Connection,
    queries: Queries,
    begin: str | None,
    work: Callable[[sqlite3.Connection], T],
) -> T:
    """Run `work` in one transaction (`begin`, the statement that opens it): commit, or roll
    back and re-raise; None: with none, each statement on its own (a reader nothing else can
    write beside). SQLite errors come out as StoreError."""
    if begin is None:
        return translated(lambda: work(connection))

    def attempt() -> T:
        connection.execute(queries[begin].text)
        try:
            result = work(connection)
            connection.execute(queries["commit"].text)
        except BaseException:
            if connection.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute(queries["rollback"].text)
            raise
        return result

    return translated(attempt)


def scripts(queries: Queries) -> Mapping[str, tuple[str, ...]]:
    """Each named query's statements: a query may be several, run in order. Split once per
    set of queries (`sql.load_queries` gives every store the same one): splitting them took
    ~3 ms a store, and the tests and the simulator open thousands."""
    kept = _split.get(id(queries))
    if kept is None or kept[0] is not queries:
        split = {name: tuple(sql.split_statements(q.text + ";")) for name, q in queries.items()}
        kept = _split[id(queries)] = (queries, split)
    return kept[1]


def migrate_in_memory(connection: sqlite3.Connection, queries: Queries) -> int:
    """Give a new in-memory database the schema, and return its version: a copy of a database
    migrated once per process (migrating each one took ~7 ms)."""
    with _template_lock:
        if not _template:
            template = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            migrate(template, queries)
            atexit.register(template.close)
            _template.append(template)
        _template[0].backup(connection)
    return int(connection.execute(queries["user_version"].text).fetchone()[0])


class Driver:
    """Named statements on the store thread's connection, run at once: a transaction's steps
    never wait for anything else, so `_drive` runs them to the end without an event loop."""

    name = "sqlite"

    def __init__(self, conn: sqlite3.Connection, statements: Mapping[str, tuple[str, ...]]):
        self._conn = conn
        self._statements = statements

    async def send(self, query: str, params: Mapping[str, object]) -> _Rows:
        bound = _bound(params)
        *before, last = self._statements[query]
        for statement in before:
            self._conn.execute(statement, bound)
        cursor = self._conn.execute(last, bound)
        return _Rows(cursor.fetchall(), _columns(last, cursor))

    async def run_many(self, query: str, params: Sequence[Mapping[str, object]]) -> None:
        [statement] = self._statements[query]
        self._conn.executemany(statement, [_bound(p) for p in params])

    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[object]:
        (begin,), (undo,), (end,) = (
            self._statements[name]
            for name in ("savepoint", "rollback_to_savepoint", "release_savepoint")
        )
        self._conn.execute(begin)
        try:
            yield self
        except BaseException:
            self._conn.execute(undo)
            raise
        finally:
            self._conn.execute(end)


class _Rows:
    """A statement's rows, read already: as tuples, made dicts when read as such."""

    def __init__(self, tuples: list[tuple[Any, ...]], columns: list[str]) -> None:
        self._tuples = tuples
        self._columns = columns

    async def fetchall(self) -> list[dict[str, Any]]:
        """The rows as dicts, as PostgreSQL's are read. (A `sqlite3.Row` finds a column by
        comparing its name with each column's in turn: a task's record, 31 columns read by
        name, took 6.2 us from one and 3.4 from a dict, the dict made included.)"""
        columns = self._columns
        return [dict(zip(columns, row, strict=True)) for row in self._tuples]

    async def fetchone(self) -> dict[str, Any] | None:
        if not self._tuples:
            return None
        return dict(zip(self._columns, self._tuples[0], strict=True))

    async def table(self) -> tuple[list[str], list[tuple[Any, ...]]]:
        return self._columns, self._tuples


def _columns(statement: str, cursor: sqlite3.Cursor) -> list[str]:
    """The names of a statement's columns, taken from its first cursor: a statement's columns
    never change once the schema is migrated."""
    names = _named.get(statement)
    if names is None:
        names = _named[statement] = [column[0] for column in cursor.description or ()]
    return names


def _bound(params: Mapping[str, object]) -> dict[str, object]:
    """Parameters as SQLite takes them: lists and `Json` values as JSON text."""
    bound = dict(params)
    for name, value in params.items():
        if isinstance(value, _AS_JSON):  # a tuple of types: faster to test than a union
            bound[name] = _to_json(value.value if isinstance(value, Json) else value)
    return bound


def drive(steps: Coroutine[Any, Any, T]) -> T:
    """Run a transaction's steps, which only ever await `Driver` (it never suspends)."""
    try:
        steps.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    steps.close()
    raise StoreError("sqlite store: a transaction step waited on something else than the file")


def translated(work: Callable[[], T]) -> T:
    try:
        return work()
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _LOCKED:
            raise StoreError("sqlite store: the database stayed locked past busy_timeout") from exc
        raise StoreError(f"sqlite store: {exc}") from exc
