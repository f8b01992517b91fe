"""The PostgreSQL schema: migrating an empty schema gives exactly `postgres/schema.sql`, migrating
again changes nothing, two processes migrating at once do not race, and every named query
prepares against the schema. Needs the test server (skips without it, fails when `CI` is set)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.rows import DictRow, dict_row

from headrace.policy import ConfigError, StoreError
from headrace.policy.errors import KeyConflict, SchemaTooNew, StoreUnavailable
from headrace.store.machine import sql
from headrace.store.postgres import MIGRATIONS, QUERIES, PostgresStore, migrate, split_url
from headrace.store.protocol.types import AttemptOutcome, NewTask, Settings, TaskState
from headrace.store.urls import open_store
from tests.conformance.conftest import drop_schemas, postgres_reachable

pytestmark = pytest.mark.anyio

Connection = psycopg.AsyncConnection[DictRow]
Description = dict[str, list[tuple[Any, ...]]]

# What describes a schema: its tables' columns, its indexes, its constraints, its triggers and
# its functions. `{schema}` is the schema described; names and definitions are compared with
# it replaced.
DESCRIBE = {
    "columns": """
        SELECT table_name, ordinal_position, column_name, data_type, udt_name, is_nullable,
               column_default, is_identity, identity_generation
        FROM information_schema.columns WHERE table_schema = %(schema)s
        ORDER BY table_name, ordinal_position""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %(schema)s
        ORDER BY tablename, indexname""",
    "constraints": """
        SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid)
        FROM pg_constraint AS k
        JOIN pg_class AS c ON c.oid = k.conrelid
        JOIN pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s
        ORDER BY c.relname, k.conname""",
    "relations": """
        SELECT c.relname, c.relkind FROM pg_class AS c
        JOIN pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s ORDER BY c.relname""",
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger AS t
        JOIN pg_class AS c ON c.oid = t.tgrelid
        JOIN pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND NOT t.tgisinternal
        ORDER BY c.relname, t.tgname""",
    "functions": """
        SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc AS p
        JOIN pg_namespace AS n ON n.oid = p.pronamespace
        WHERE n.nspname = %(schema)s ORDER BY p.proname""",
}

_names = iter(range(1, 1_000_000))


def placeholders_to_numbers(text: str) -> tuple[str, int]:
    """psycopg's `%(name)s` placeholders as `$1, $2, …` (a name keeps its number)."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match[1], len(numbers) + 1)}"

    return re.sub(r"%\((\w+)\)s", number, text), len(numbers)


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real sockets need real time


@pytest.fixture
def schemas() -> Iterator[list[str]]:
    """Fresh schema names for a test; dropped after it."""
    dsn = postgres_reachable()
    made = [f"headrace_schema_{os.getpid()}_t{next(_names)}_{i}" for i in range(3)]
    drop_schemas(made)
    yield made
    assert dsn
    drop_schemas(made)


@pytest.fixture
async def conn() -> AsyncIterator[Connection]:
    dsn = postgres_reachable()
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, row_factory=dict_row
    ) as connection:
        yield connection


@pytest.fixture
def queries() -> dict[str, sql.Query]:
    return sql.load_queries(QUERIES)


async def describe(conn: Connection, schema: str) -> Description:
    found: Description = {}
    async with conn.transaction():
        # An empty search_path: every definition names its schema, which is then neutralised.
        await conn.execute("SELECT set_config('search_path', '', true)")
        for what, query in DESCRIBE.items():
            rows = await (await conn.execute(query, {"schema": schema})).fetchall()
            found[what] = [tuple(_neutral(v, schema) for v in row.values()) for row in rows]
    return found


def _neutral(value: object, schema: str) -> object:
    """`value` with the schema's name as `{schema}` (as a prefix, or a function's search_path)."""
    return value.replace(schema, "{schema}") if isinstance(value, str) else value


async def apply_declared(conn: Connection, schema: str) -> None:
    """`postgres/schema.sql` run as it is, in a fresh schema."""
    async with conn.transaction():
        await conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(pgsql.Identifier(schema)))
        await conn.execute("SELECT set_config('search_path', quote_ident(%s), true)", [schema])
        script = sql.read_text("postgres/sql/schema.sql")
        for statement in sql.split_statements(script, dialect="postgres"):
            await conn.execute(statement)


async def test_migrating_from_empty_gives_the_declared_schema(
    conn: Connection, queries: dict[str, sql.Query], schemas: list[str]
) -> None:
    migrated, declared, _ = schemas
    assert await migrate(conn, queries, migrated) == (
        0,
        sql.load_migrations(MIGRATIONS)[-1].version,
    )
    await apply_declared(conn, declared)
    ours, theirs = await describe(conn, migrated), await describe(conn, declared)
    assert ours == theirs
    tables = {row[0] for row in ours["relations"] if row[1] == "r"}
    assert tables == {
        "schema_migrations",
        "tasks",
        "task_deps",
        "tickets",
        "gates",
        "flows",
        "attempts",
        "records",
        "audit",
        "outbox",
        "ledger",
        "group_rollup",
        "pruner",
        "leases",
        "kind_tally",
        "group_tally",
        "attempt_tally",
        "tally_changes",
        "attempt_changes",
    }
    triggers = {(row[0], row[1]) for row in ours["triggers"]}
    assert triggers == {
        ("tasks", "tally_added"),
        ("tasks", "tally_moved"),
        ("tasks", "tally_removed"),
        ("attempts", "tally_moved"),
    }
    indexes = {row[1] for row in ours["indexes"]}
    assert {"tasks_claim_order", "tasks_ready_run_at", "tasks_running_lease"} <= indexes
    assert {"tasks_waiting_polls", "tasks_key"} <= indexes
    assert {"tasks_finished", "task_deps_task", "audit_at", "outbox_delivered"} <= indexes


async def test_the_claim_index_is_partial_on_ready_tasks(
    conn: Connection, queries: dict[str, sql.Query], schemas: list[str]
) -> None:
    await migrate(conn, queries, schemas[0])
    definitions = {row[1]: row[2] for row in (await describe(conn, schemas[0]))["indexes"]}
    claim_order = definitions["tasks_claim_order"]
    assert "(tier, tag, id)" in claim_order and "WHERE (state = 'ready'::text)" in claim_order
    assert "UNIQUE" in definitions["tasks_key"]


@pytest.mark.parametrize("commit", ["off", "on"])
async def test_a_claim_sets_its_own_commit_for_its_transaction_only(
    conn: Connection, queries: dict[str, sql.Query], schemas: list[str], commit: str
) -> None:
    """`durable_claims` false: a claim's commit does not wait for the WAL flush (`off`)."""
    await migrate(conn, queries, schemas[0])
    await conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", [schemas[0]])
    async with conn.transaction():
        await conn.execute(
            queries["claim_start"].text,
            {
                "clock": None,
                "commit": commit,
                "sweep_check": False,
                "ceiling": 1,
                "aging_step": None,
                "slack": 0.0,
            },
        )
        found = await (await conn.execute("SHOW synchronous_commit")).fetchone()
        assert found == {"synchronous_commit": commit}
    found = await (await conn.execute("SHOW synchronous_commit")).fetchone()
    assert found == {"synchronous_commit": "on"}


async def test_migrating_twice_changes_nothing(
    conn: Connection, queries: dict[str, sql.Query], schemas: list[str]
) -> None:
    latest = sql.load_migrations(MIGRATIONS)[-1].version
    await migrate(conn, queries, schemas[0])
    before = await describe(conn, schemas[0])
    assert await migrate(conn, queries, schemas[0]) == (latest, latest)
    assert await describe(conn, schemas[0]) == before
    cursor = await conn.execute(
        pgsql.SQL("SELECT version FROM {}.schema_migrations").format(pgsql.Identifier(schemas[0]))
    )
    assert [row["version"] for row in await cursor.fetchall()] == list(range(1, latest + 1))


async def test_two_processes_migrating_at_once_do_not_race(
    queries: dict[str, sql.Query], schemas: list[str]
) -> None:
    dsn = postgres_reachable()

    async def migrate_alone() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, row_factory=dict_row
        ) as own:
            return await migrate(own, queries, schemas[0])

    results = await asyncio.gather(*(migrate_alone() for _ in range(4)))
    latest = sql.load_migrations(MIGRATIONS)[-1].version
    assert sorted(results) == [(0, latest)] + [(latest, latest)] * 3


async def test_a_schema_from_a_newer_headrace_is_refused(
    conn: Connection, queries: dict[str, sql.Query], schemas: list[str]
) -> None:
    await migrate(conn, queries, schemas[0])
    table = pgsql.Identifier(schemas[0], "schema_migrations")
    await conn.execute(pgsql.SQL("INSERT INTO {} (version) VALUES (999)").format(table))
    with pytest.raises(SchemaTooNew, match="version 999"):
        await migrate(conn, queries, schemas[0])
    store = PostgresStore(postgres_reachable(), schema=schemas[0])
    with pytest.raises(StoreError, match="version 999"):
        await store.open(Settings())
    with pytest.raises(StoreError, match="not open"):
        await store.counts()


async def test_every_query_has_a_description_and_prepares(
    conn: Connection, queries: dict[str, sql.Query], schemas: list[str]
) -> None:
    await migrate(conn, queries, schemas[0])
    composed = {"create_schema", "listen"}  # identifiers composed in: checked by running them
    assert len(queries) > 50
    for query in queries.values():
        assert query.description and "\n" not in query.description, query.name
        assert not query.text.startswith("--"), f"{query.name}: a one-line description only"
        assert "{" not in query.text or query.name in composed, query.name
    await conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", [schemas[0]])
    for number, query in enumerate(queries.values()):
        async with conn.transaction(force_rollback=True):
            await check_prepares(conn, query, number, schemas[0])


async def check_prepares(conn: Connection, query: sql.Query, number: int, schema: str) -> None:
    """A statement with placeholders is prepared (parsed and analysed, not run); the others
    (SET TRANSACTION, LISTEN, DDL) run in the caller's rolled-back transaction."""
    text, _ = placeholders_to_numbers(query.text)
    if re.match(r"(SELECT|INSERT|UPDATE|DELETE|WITH)\b", text):
        await conn.execute(f"PREPARE check_{number} AS {text}")
        await conn.execute(f"DEALLOCATE check_{number}")
        return
    statement = pgsql.SQL(text).format(
        schema=pgsql.Identifier(schema), channel=pgsql.Identifier(schema)
    )
    await conn.execute(statement)


async def test_no_generic_plan_unnests_a_parameter_once_per_row(
    conn: Connection, queries: dict[str, sql.Query], schemas: list[str]
) -> None:
    """The store's sessions run generic plans (a claim forces them; psycopg prepares what
    repeats), made without the arrays' sizes. No statement's plan may unnest a parameter on the
    inner side of a nested loop, where it is unnested again for every outer row: closing a
    batch's attempts by a join with its (id, number) pairs cost the square of the batch. A
    row's own array (a task's gates) may be unnested per row."""
    await migrate(conn, queries, schemas[0])
    await conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", [schemas[0]])
    await conn.execute("SET enable_seqscan = off")  # as the store's sessions run
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    await conn.execute("SET headrace.now = '0'")  # a claim's time, which its statements read
    nested: list[str] = []
    for number, query in enumerate(queries.values()):
        text, count = placeholders_to_numbers(query.text)
        if not count or not re.match(r"(SELECT|INSERT|UPDATE|DELETE|WITH)\b", text):
            continue
        async with conn.transaction(force_rollback=True):
            await conn.execute(f"PREPARE plan_{number} AS {text}")
            nulls = ", ".join(["NULL"] * count)
            found = await (
                await conn.execute(f"EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE plan_{number}({nulls})")
            ).fetchone()
            assert found is not None
            plan = next(iter(found.values()))[0]["Plan"]
            nested += [f"{query.name}: {call}" for call in _unnested_per_row(plan, inner=False)]
    assert nested == []


def _unnested_per_row(node: dict[str, Any], *, inner: bool) -> Iterator[str]:
    """Calls unnesting a parameter (`$n`) on the inner side of a nested loop, in `node`."""
    call = str(node.get("Function Call", ""))
    if inner and node.get("Node Type") == "Function Scan" and "$" in call:
        yield call
    for child in node.get("Plans", []):
        rescanned = inner or (
            node.get("Node Type") == "Nested Loop" and child.get("Parent Relationship") == "Inner"
        )
        yield from _unnested_per_row(child, inner=rescanned)


def test_urls_carry_headrace_options_apart_from_libpq_ones() -> None:
    dsn, options = split_url(
        "postgresql://u:secret@db:5433/app?sslmode=require&schema=hr&pool_max=3"
    )
    assert dsn == "postgresql://u:secret@db:5433/app?sslmode=require"
    assert options == {"schema": "hr", "pool_max": "3"}
    store = PostgresStore.from_url("postgres://u:secret@db/app?schema=hr&pool_min=2&pool_max=3")
    assert (store.schema, store.sessions.pool_min, store.sessions.pool_max) == ("hr", 2, 3)
    assert not store.durable_claims
    assert PostgresStore.from_url("postgresql://db/app?durable_claims=true").durable_claims
    assert "secret" not in repr(store)
    assert isinstance(open_store("postgresql://db/app"), PostgresStore)
    with pytest.raises(ConfigError, match="pool_max"):
        PostgresStore.from_url("postgresql://db/app?pool_max=x")
    with pytest.raises(ConfigError, match="pool_max"):
        PostgresStore("postgresql://db/app", pool_min=4, pool_max=2)
    with pytest.raises(ConfigError, match="durable_claims must be true or false"):
        PostgresStore.from_url("postgresql://db/app?durable_claims=maybe")
    assert store.sessions.idle_in_transaction == 10.0
    quiet = PostgresStore.from_url("postgresql://db/app?idle_in_transaction=0")
    assert quiet.sessions.idle_in_transaction == 0
    for bad in ("soon", "-1", "inf", "nan"):
        with pytest.raises(ConfigError, match="idle_in_transaction must be seconds >= 0"):
            PostgresStore.from_url(f"postgresql://db/app?idle_in_transaction={bad}")
    with pytest.raises(ConfigError, match="store url"):
        split_url("sqlite:///x.db")


async def test_an_unreachable_server_is_unavailable_at_once() -> None:
    store = PostgresStore("postgresql://postgres@127.0.0.1:1/none?connect_timeout=2")
    with pytest.raises(StoreUnavailable, match="unavailable"):
        await store.open(Settings())
    with pytest.raises(StoreError, match="not open"):
        await store.counts()
    await store.close()


async def test_a_key_stored_before_payload_digests_names_its_task_whatever_the_payload(
    conn: Connection, schemas: list[str]
) -> None:
    """Migration 2 adds the digest column with no value for the tasks already stored: their keys
    keep naming them, as they did before the digest existed."""
    store = PostgresStore(postgres_reachable(), schema=schemas[0])
    await store.open(Settings())
    try:
        [first] = await store.submit([NewTask("render", "ep6-s01", key="ep6-s01:v1")])
        with pytest.raises(KeyConflict):
            await store.submit([NewTask("render", "ep6-s02", key="ep6-s01:v1")])
        # By hand, with the store's schema as the search_path: the tallies' triggers need it.
        await conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", [schemas[0]])
        await conn.execute("UPDATE tasks SET payload_digest = NULL")
        [again] = await store.submit([NewTask("render", "ep6-s02", key="ep6-s01:v1")])
    finally:
        await store.close()
    assert (again.id, again.created) == (first.id, False)


# Tasks a schema holds before the tallies (kind, group, state) and their attempts' outcomes.
STORED = [
    ("scan", "ev1", "ready", ()),
    ("scan", "ev1", "running", ("retry", "running")),
    ("scan", None, "succeeded", ("succeeded",)),
    ("render", "ev2", "dead", ("retry", "dead")),
    ("render", "ev2", "waiting", ("waiting",)),
    ("render", None, "pending", ()),
]


async def test_tasks_stored_before_the_tallies_are_counted_by_the_upgrade(
    conn: Connection, queries: dict[str, sql.Query], schemas: list[str]
) -> None:
    """Migration 11 tallies the tasks and attempts the schema holds already."""
    schema = schemas[0]
    async with conn.transaction():
        await conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(pgsql.Identifier(schema)))
        await conn.execute(queries["set_search_path"].text, {"schema": schema})
        await conn.execute(queries["create_migrations_table"].text)
        for migration in sql.load_migrations(MIGRATIONS)[:10]:
            for statement in migration.statements:
                await conn.execute(statement)
            await conn.execute(queries["record_migration"].text, {"version": migration.version})
        for n, (kind, group, state, outcomes) in enumerate(STORED, start=1):
            await conn.execute(
                "INSERT INTO tasks (id, kind, ref, gates, gate_key, flow, grp, tier,"
                " submitted_tier, cost, state, max_attempts, tag, created_at, run_at,"
                " ready_since, attempt) VALUES (%s, %s, %s, '{}', '', 'f', %s, 1, 1, 1, %s, 5,"
                " %s, 100, 100, 100, %s)",
                (n, kind, f"r{n}", group, state, n, len(outcomes)),
            )
            for number, outcome in enumerate(outcomes, start=1):
                await conn.execute(
                    "INSERT INTO attempts (task_id, number, worker, started_at, outcome)"
                    " VALUES (%s, %s, 'w', 100, %s)",
                    (n, number, outcome),
                )
    store = PostgresStore(postgres_reachable(), schema=schema)
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
