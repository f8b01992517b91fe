"""The PostgreSQL tallies across connections: a fold moves only committed changes and waits for
no writer, two folds at once count each change once, a writer whose search_path leads to
another schema is refused, and a store's claims fold. Needs the test server (skips without it,
fails when `CI` is set)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.rows import DictRow, dict_row

from headrace.store.machine import sql
from headrace.store.postgres import QUERIES, PostgresStore
from headrace.store.protocol.types import NewTask, Settings, TaskState
from tests.conformance.conftest import drop_schemas, postgres_reachable

pytestmark = pytest.mark.anyio

Connection = psycopg.AsyncConnection[DictRow]
FOLD = sql.load_queries(QUERIES)["fold_tallies"].text
_names = iter(range(1, 1_000_000))


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real sockets need real time


@pytest.fixture
def schema() -> Iterator[str]:
    postgres_reachable()
    name = f"headrace_tallies_{os.getpid()}_t{next(_names)}"
    drop_schemas([name])
    yield name
    drop_schemas([name])


@pytest.fixture
async def store(schema: str) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore(postgres_reachable(), schema=schema, pool_max=2)
    await opened.open(Settings())
    yield opened
    await opened.close()


async def connect(schema: str | None) -> Connection:
    """A connection of its own, its search_path the store's schema (None: left as it is)."""
    conn = await psycopg.AsyncConnection.connect(
        postgres_reachable(), autocommit=True, row_factory=dict_row
    )
    if schema is not None:
        await conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", [schema])
    return conn


async def pending_changes(conn: Connection) -> int:
    found = await (await conn.execute("SELECT count(*) AS n FROM tally_changes")).fetchone()
    assert found is not None
    return int(found["n"])


async def test_a_fold_moves_what_is_committed_and_waits_for_no_writer(
    store: PostgresStore, schema: str
) -> None:
    await store.submit([NewTask("scan", f"s{n}", group="ev1") for n in range(5)])
    writer, reader = await connect(schema), await connect(schema)
    async with writer, reader:
        assert await pending_changes(reader) > 0
        await writer.execute("BEGIN")
        await writer.execute("UPDATE tasks SET state = 'cancelled' WHERE ref = 's0'")
        # The writer's change is appended but not committed: the fold neither sees nor waits
        # for it (the statement would wait here for a row lock otherwise).
        await asyncio.wait_for(reader.execute(FOLD), timeout=5.0)
        assert await pending_changes(reader) == 0
        assert (await store.counts())[TaskState.READY] == 5
        await writer.execute("COMMIT")
        assert await pending_changes(reader) == 2  # out of ready, into cancelled: left for later
        counts = await store.counts()
        assert (counts[TaskState.READY], counts[TaskState.CANCELLED]) == (4, 1)
        report = await store.group_report("ev1")
        assert (report.total, report.cancelled) == (5, 1)
        await reader.execute(FOLD)
        assert await pending_changes(reader) == 0
        assert await store.counts() == counts


async def test_two_folds_at_once_count_each_change_once(store: PostgresStore, schema: str) -> None:
    await store.submit([NewTask("scan", f"s{n}", group="ev1") for n in range(3)])
    first, second = await connect(schema), await connect(schema)
    async with first, second:
        await first.execute("BEGIN")
        await first.execute(FOLD)  # holds the fold's lock until it commits
        await asyncio.wait_for(second.execute(FOLD), timeout=5.0)  # skips: another folds
        assert await pending_changes(second) > 0  # the first's deletes are not committed
        await first.execute("COMMIT")
        assert await pending_changes(second) == 0
        await second.execute(FOLD)
        tallied = await (await second.execute("SELECT kind, state, n FROM kind_tally")).fetchall()
    assert tallied == [{"kind": "scan", "state": "ready", "n": 3}]
    assert await store.groups() == ["ev1"]


async def test_a_writer_whose_search_path_leads_elsewhere_is_refused(
    store: PostgresStore, schema: str
) -> None:
    """The triggers name the tallies through the writer's search_path: one that would count
    this schema's tasks in another schema's tallies (or fail to find any) is refused."""
    await store.submit([NewTask("scan", "s0")])
    async with await connect(None) as elsewhere:
        table = pgsql.Identifier(schema, "tasks")
        statement = pgsql.SQL("UPDATE {} SET state = 'cancelled'").format(table)
        with pytest.raises(psycopg.errors.RaiseException, match="search_path"):
            await elsewhere.execute(statement)
    assert (await store.counts())[TaskState.READY] == 1


async def test_a_stores_claims_fold_the_tallies(store: PostgresStore, schema: str) -> None:
    await store.submit([NewTask("scan", f"s{n}") for n in range(3)])
    async with await connect(schema) as reader:
        assert await pending_changes(reader) > 0
        result = await store.claim("w1", 1, lease_for=30.0)  # a store's first claim folds
        assert len(result.leases) == 1
        assert await pending_changes(reader) == 2  # the claim's own, after the fold
    counts = await store.counts()
    assert (counts[TaskState.READY], counts[TaskState.RUNNING]) == (2, 1)
