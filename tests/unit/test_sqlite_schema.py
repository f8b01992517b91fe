"""The SQLite schema: migrating an empty file gives exactly `sqlite/schema.sql`, and every named
query compiles against it."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.policy import ConfigError, KeyConflict, ManualClock, StoreError
from headrace.policy.errors import SchemaTooNew
from headrace.store.machine import sql
from headrace.store.protocol.types import AttemptOutcome, NewTask, Settings, TaskState
from headrace.store.sqlite import SQLiteStore
from headrace.store.sqlite.connection import (
    MIGRATIONS,
    QUERIES,
    connect,
    migrate,
    path_from_url,
    scripts,
)

Schema = list[tuple[str, str, str, str]]


def normalized(text: str | None) -> str:
    """A statement without comments, with whitespace collapsed and none around punctuation."""
    without_comments = re.sub(r"--[^\n]*", "", text or "")
    collapsed = " ".join(without_comments.split())
    return re.sub(r" ?([(),]) ?", r"\1", collapsed)


def schema_of(connection: sqlite3.Connection) -> Schema:
    rows = connection.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
    )
    return [(kind, name, table, normalized(text)) for kind, name, table, text in rows]


def columns_of(connection: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
    tables = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    return {
        table: [tuple(column) for column in connection.execute(f"PRAGMA table_xinfo({table})")]
        for (table,) in tables.fetchall()
    }


def user_version(connection: sqlite3.Connection) -> int:
    return int(connection.execute("PRAGMA user_version").fetchone()[0])


@pytest.fixture
def queries() -> dict[str, sql.Query]:
    return sql.load_queries(QUERIES)


@pytest.fixture
def migrated(tmp_path: Path, queries: dict[str, sql.Query]) -> Iterator[sqlite3.Connection]:
    connection = connect(tmp_path / "migrated.db", 1.0, queries)
    migrate(connection, queries)
    yield connection
    connection.close()


@pytest.fixture
def declared(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(tmp_path / "declared.db")
    connection.executescript(sql.read_text("sqlite/sql/schema.sql"))
    yield connection
    connection.close()


def test_migrating_from_empty_gives_the_declared_schema(
    migrated: sqlite3.Connection, declared: sqlite3.Connection
) -> None:
    assert schema_of(migrated) == schema_of(declared)
    assert columns_of(migrated) == columns_of(declared)
    assert {"tasks", "task_deps", "tickets", "gates", "attempts", "ledger"} <= set(
        columns_of(migrated)
    )


def test_migrating_records_the_version_and_runs_once(
    migrated: sqlite3.Connection, queries: dict[str, sql.Query]
) -> None:
    latest = sql.load_migrations(MIGRATIONS)[-1].version
    assert user_version(migrated) == latest
    before = schema_of(migrated)
    assert migrate(migrated, queries) == latest
    assert schema_of(migrated) == before


def test_a_file_from_a_newer_headrace_is_refused(
    migrated: sqlite3.Connection, queries: dict[str, sql.Query]
) -> None:
    latest = user_version(migrated)
    migrated.execute(f"PRAGMA user_version = {latest + 1}")
    with pytest.raises(SchemaTooNew, match="schema version") as info:
        migrate(migrated, queries)
    assert (info.value.version, info.value.known) == (latest + 1, latest)
    assert not migrated.in_transaction


def test_migrations_are_numbered_without_gaps() -> None:
    migrations = sql.load_migrations(MIGRATIONS)
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))
    assert migrations[0].name == "initial" and migrations[0].statements


def test_every_query_has_a_description_and_compiles(
    migrated: sqlite3.Connection, queries: dict[str, sql.Query]
) -> None:
    class Unbound(dict[str, object]):
        def __missing__(self, key: str) -> None:
            return None

    assert len(queries) > 40
    statements = scripts(queries)
    for query in queries.values():
        assert query.description and "\n" not in query.description, query.name
        for text in statements[query.name]:
            text = text.format(version=1) if "{" in text else text
            migrated.execute(f"EXPLAIN {text}", Unbound()).fetchall()


# Listings an operator pages through by id: reading tasks in id order is what they ask for.
SCANS_ALLOWED = {"audit_rows", "dead_letters", "list_tasks"}
HISTORY = ("tasks", "attempts", "tickets", "task_deps", "records", "audit", "outbox")


class AnyValue(dict[str, object]):
    """Parameters for EXPLAIN: any name is an empty JSON array."""

    def __missing__(self, key: str) -> str:
        return "[]"


def plans(
    connection: sqlite3.Connection, queries: dict[str, sql.Query]
) -> Iterator[tuple[str, str, list[tuple[int, int, int, str]]]]:
    """Each named statement's text and the planner's rows for it (id, parent, -, detail),
    without statistics (a store never runs ANALYZE)."""
    statements = scripts(queries)
    for name in sorted(statements):
        for text in statements[name]:
            text = text.format(version=1) if "{" in text else text
            rows = connection.execute(f"EXPLAIN QUERY PLAN {text}", AnyValue()).fetchall()
            yield name, text, [(r[0], r[1], r[2], str(r[3])) for r in rows]


def test_no_query_reads_a_whole_table_that_grows_with_history(
    migrated: sqlite3.Connection, queries: dict[str, sql.Query]
) -> None:
    """Without statistics (a store never runs ANALYZE), the planner's choice for each statement:
    none but the id-ordered listings walks a table whose size is the store's history. (The
    lease sweep read every task ever kept, ordered by id, and a keyed submit every task, when
    its key's partial index was not implied.)"""

    scans = []
    for name, _, rows in plans(migrated, queries):
        for *_, detail in rows:
            words = detail.split()
            scanned = words[1] if words[0] == "SCAN" and len(words) > 1 else None
            if name not in SCANS_ALLOWED and scanned in HISTORY and "INDEX" not in detail:
                scans.append(f"{name}: {detail}")
    assert scans == []


def test_a_stages_ready_tasks_are_read_in_order_from_its_index(
    migrated: sqlite3.Connection, queries: dict[str, sql.Query]
) -> None:
    """The oldest and newest ready tasks of a kind come off tasks_queued_by_kind in order. SQLite
    uses a partial index only when the query names its condition (`state IN ('pending',
    'ready')`): without it these read every ready task of every kind and sorted them."""
    found = {name: rows for name, _, rows in plans(migrated, queries)}
    for name in ("oldest_ready", "newest_ready", "stage_stats"):
        details = [detail for *_, detail in found[name]]
        # covering (oldest_ready, newest_ready): the index holds `ready_since` itself
        used = re.compile(r"USING (COVERING )?INDEX tasks_queued_by_kind\b")
        assert any(used.search(d) for d in details), (name, details)
        sorted_reads = [d for d in details if "TEMP B-TREE FOR ORDER BY" in d]
        # stage_stats sorts its few rows by kind, outside the read of tasks
        assert len(sorted_reads) == (1 if name == "stage_stats" else 0), (name, details)


def test_malformed_query_files_are_refused() -> None:
    with pytest.raises(StoreError, match="description"):
        sql.parse_queries("-- name: bare\nSELECT 1;\n")
    with pytest.raises(StoreError, match="twice"):
        sql.parse_queries("-- name: a\n-- one\nSELECT 1;\n-- name: a\n-- two\nSELECT 2;\n")
    with pytest.raises(StoreError, match="no statement"):
        sql.parse_queries("-- name: empty\n-- nothing here\n")
    parsed = sql.parse_queries("-- preamble\n-- name: one\n-- The number one.\nSELECT 1;\n")
    assert parsed["one"] == sql.Query("one", "The number one.", "SELECT 1")


def test_scripts_split_into_whole_statements() -> None:
    script = "-- a; comment\nCREATE TABLE a (x -- not; the end\n);\n\nCREATE TABLE b (y);\n-- end\n"
    statements = sql.split_statements(script)
    assert len(statements) == 2 and statements[1] == "CREATE TABLE b (y);"
    with pytest.raises(StoreError, match="incomplete"):
        sql.split_statements("CREATE TABLE a (x);\nCREATE TABLE b (\n")


def test_postgres_scripts_split_around_function_bodies_and_triggers() -> None:
    """A PostgreSQL statement ends at a `;` outside quotes, comments and `$$` bodies; SQLite's
    rule would wait for `END;` after its CREATE TRIGGER."""
    script = (
        "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "BEGIN\n    INSERT INTO a VALUES ('x;'); -- not; the end\n    RETURN NULL;\nEND\n$$;\n"
        "CREATE TRIGGER t AFTER INSERT ON a\nFOR EACH STATEMENT EXECUTE FUNCTION f();\n"
        "SELECT 'it''s; still' -- one;\n;\n"
    )
    statements = sql.split_statements(script, dialect="postgres")
    assert [s.split()[:2] for s in statements] == [
        ["CREATE", "FUNCTION"],
        ["CREATE", "TRIGGER"],
        ["SELECT", "'it''s;"],
    ]
    assert statements[0].endswith("$$;")
    with pytest.raises(StoreError, match="incomplete"):
        sql.split_statements("CREATE FUNCTION f() AS $$ BEGIN;\n", dialect="postgres")


def test_urls_name_relative_and_absolute_files() -> None:
    assert path_from_url("sqlite:///studio.db") == Path("studio.db")
    assert path_from_url("sqlite:///data/studio%20one.db") == Path("data/studio one.db")
    assert path_from_url("sqlite:////var/lib/headrace.db") == Path("/var/lib/headrace.db")
    assert SQLiteStore.from_url("sqlite:///x.db").path == Path("x.db")
    for bad in ("postgresql:///x", "sqlite://host/x.db", "sqlite:///", "sqlite:///x.db?mode=ro"):
        with pytest.raises(ConfigError, match="store url"):
            path_from_url(bad)


@pytest.mark.anyio
async def test_open_migrates_in_wal_mode_and_close_releases_everything(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "opened.db")
    await store.open(Settings())
    await store.open(Settings())  # a second open keeps the connection
    await store.close()
    await store.close()
    with pytest.raises(StoreError, match="not open"):
        await store.counts()
    connection = sqlite3.connect(tmp_path / "opened.db")
    try:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert user_version(connection) == sql.load_migrations(MIGRATIONS)[-1].version
    finally:
        connection.close()


@pytest.mark.anyio
async def test_a_failed_open_leaves_nothing_running(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA user_version = 999")
    connection.close()
    store = SQLiteStore(path)
    with pytest.raises(StoreError, match="schema version 999"):
        await store.open(Settings())
    with pytest.raises(StoreError, match="not open"):
        await store.counts()


@pytest.mark.anyio
async def test_a_key_stored_before_payload_digests_names_its_task_whatever_the_payload(
    tmp_path: Path,
) -> None:
    """Migration 4 adds the digest column with no value for the tasks already stored: their keys
    keep naming them, as they did before the digest existed."""
    store = SQLiteStore(tmp_path / "older.db")
    await store.open(Settings())
    [first] = await store.submit([NewTask("render", "ep6-s01", key="ep6-s01:v1")])
    with pytest.raises(KeyConflict):
        await store.submit([NewTask("render", "ep6-s02", key="ep6-s01:v1")])
    await store.close()
    connection = sqlite3.connect(tmp_path / "older.db")
    with connection:
        connection.execute("UPDATE tasks SET payload_digest = NULL")
    connection.close()
    await store.open(Settings())
    [again] = await store.submit([NewTask("render", "ep6-s02", key="ep6-s01:v1")])
    await store.close()
    assert (again.id, again.created) == (first.id, False)


@pytest.mark.anyio
async def test_gates_kept_space_joined_by_an_older_file_are_read_as_before(tmp_path: Path) -> None:
    """Migration 8 turns each task's gate list into a JSON array: every name kept, quotes in a
    name included, and the counters exist before the first claim."""
    path = tmp_path / "older.db"
    queries = sql.load_queries(QUERIES)
    connection = connect(path, 1.0, queries)
    for migration in sql.load_migrations(MIGRATIONS)[:7]:
        for statement in migration.statements:
            connection.execute(statement)
    connection.execute("PRAGMA user_version = 7")
    insert = (
        "INSERT INTO tasks (kind, ref, gates, gate_key, flow, tier, submitted_tier, cost, state,"
        " max_attempts, tag, created_at, run_at) VALUES (?, ?, ?, ?, 'f', 1, 1, 1, 'ready', 3,"
        " 0, 0, 0)"
    )
    connection.execute(insert, ("render", "a", 'provider:image session:"s1"', "x"))
    connection.execute(insert, ("render", "b", "", ""))
    connection.close()
    store = SQLiteStore(path)
    await store.open(Settings())
    try:
        gated, ungated = await store.tasks()
        meta = sqlite3.connect(path).execute("SELECT name FROM meta ORDER BY name").fetchall()
    finally:
        await store.close()
    assert gated.gates == ("provider:image", 'session:"s1"')
    assert ungated.gates == ()
    assert meta == [("dispatches",), ("virtual_time",)]


@pytest.mark.anyio
async def test_upgrade_migrates_a_file_and_says_from_which_version(tmp_path: Path) -> None:
    latest = sql.load_migrations(MIGRATIONS)[-1].version
    store = SQLiteStore(tmp_path / "new.db")
    assert await store.upgrade() == (0, latest)
    assert await store.upgrade() == (latest, latest)


# Tasks a file holds before the tallies (kind, group, state) and their attempts' outcomes.
STORED = [
    ("scan", "ev1", "ready", ()),
    ("scan", "ev1", "running", ("retry", "running")),
    ("scan", None, "succeeded", ("succeeded",)),
    ("render", "ev2", "dead", ("retry", "dead")),
    ("render", "ev2", "waiting", ("waiting",)),
    ("render", None, "pending", ()),
]


@pytest.mark.anyio
async def test_tasks_stored_before_the_tallies_are_counted_by_the_upgrade(tmp_path: Path) -> None:
    """Migration 12 tallies the tasks and attempts the file holds already."""
    path = tmp_path / "older.db"
    queries = sql.load_queries(QUERIES)
    connection = connect(path, 1.0, queries)
    for migration in sql.load_migrations(MIGRATIONS)[:11]:
        for statement in migration.statements:
            connection.execute(statement)
    connection.execute("PRAGMA user_version = 11")
    for n, (kind, group, state, outcomes) in enumerate(STORED, start=1):
        connection.execute(
            "INSERT INTO tasks (id, kind, ref, gates, gate_key, flow, grp, tier, submitted_tier,"
            " cost, state, max_attempts, tag, created_at, run_at, ready_since, attempt)"
            " VALUES (?, ?, ?, '[]', '', 'f', ?, 1, 1, 1, ?, 5, ?, 100, 100, 100, ?)",
            (n, kind, f"r{n}", group, state, n, len(outcomes)),
        )
        for number, outcome in enumerate(outcomes, start=1):
            connection.execute(
                "INSERT INTO attempts (task_id, number, worker, started_at, outcome)"
                " VALUES (?, ?, 'w', 100, ?)",
                (n, number, outcome),
            )
    connection.close()
    store = SQLiteStore(path)
    await store.open(Settings())
    try:
        counts = {state: n for state, n in (await store.counts()).items() if n}
        groups = await store.groups()
        ev2 = await store.group_report("ev2")
        attempts = await store.attempt_counts()
        stages = [(s.kind, s.pending, s.ready, s.running, s.waiting) for s in await store.stages()]
    finally:
        await store.close()
    assert counts == {TaskState(state): 1 for _, _, state, _ in STORED}
    assert groups == ["ev1", "ev2"]
    assert (ev2.total, ev2.dead, [f.ref for f in ev2.failures]) == (2, 1, ["r4"])
    assert attempts == {
        AttemptOutcome.RETRY: 2,
        AttemptOutcome.RUNNING: 1,
        AttemptOutcome.SUCCEEDED: 1,
        AttemptOutcome.DEAD: 1,
        AttemptOutcome.WAITING: 1,
    }
    assert stages == [("render", 1, 0, 0, 1), ("scan", 0, 1, 1, 0)]


@pytest.mark.anyio
async def test_ready_tasks_stored_before_ready_since_count_from_their_last_move(
    tmp_path: Path,
) -> None:
    """Migration 15 dates each ready task from when it last became ready: a task redriven
    (run_at set then, ready_since left at its first readiness) reads its age from the redrive."""
    path = tmp_path / "older.db"
    connection = connect(path, 1.0, sql.load_queries(QUERIES))
    for migration in sql.load_migrations(MIGRATIONS)[:14]:
        for statement in migration.statements:
            connection.execute(statement)
    connection.execute("PRAGMA user_version = 14")
    for n, (created, since, run_at) in enumerate(((100, 100, 1300), (1000, 1000, 1000)), 1):
        connection.execute(
            "INSERT INTO tasks (id, kind, ref, gates, gate_key, flow, tier, submitted_tier,"
            " cost, state, max_attempts, tag, created_at, run_at, ready_since)"
            " VALUES (?, 'scan', ?, '[]', '', 'f', 1, 1, 1, 'ready', 5, ?, ?, ?, ?)",
            (n, f"r{n}", n, created, run_at, since),
        )
    connection.close()
    store = SQLiteStore(path, clock=ManualClock(1310.0))
    await store.open(Settings())
    try:
        [stage] = await store.stages()
        ages = (await store.ready_ages())["scan"]
    finally:
        await store.close()
    assert stage.oldest_ready_age == 310.0
    assert (ages.oldest, ages.newest) == ((310.0, 10.0), ())


def test_no_query_reads_a_parameter_array_once_per_row(
    migrated: sqlite3.Connection, queries: dict[str, sql.Query]
) -> None:
    """A JSON array parameter is scanned once, not inside a loop over other rows: a join of two
    json_each scans on their keys read the whole second array for every element of the first
    (a batch of outcomes cost the square of its size). A row's own array (a task's gates) may be."""

    nested = []
    for name, text, rows in plans(migrated, queries):
        loops: dict[int, list[str]] = {}
        for _, parent, _, detail in rows:
            if detail.startswith(("SCAN ", "SEARCH ")):
                loops.setdefault(parent, []).append(detail)
        arrays = set(re.findall(r"json_each\(:\w+\) AS (\w+)", text))
        for inner in loops.values():
            nested += [f"{name}: {d}" for d in inner[1:] if d.split()[1] in arrays]
    assert nested == []


def test_a_connection_keeps_temporary_b_trees_in_memory(tmp_path: Path) -> None:
    """`temp_store = MEMORY` (2): a statement's IN lists, DISTINCT and sorts cost no temporary
    file's pager; the log and foreign keys as before."""
    connection = connect(tmp_path / "pragmas.db", 1.0, sql.load_queries(QUERIES))
    try:
        assert connection.execute("PRAGMA temp_store").fetchone()[0] == 2
        assert connection.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert connection.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    finally:
        connection.close()
