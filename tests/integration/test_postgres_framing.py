"""A PostgreSQL verb's transaction, framed by the store in its pipeline (BEGIN with the first
statement, COMMIT with the last Sync): what a verb that fails or is interrupted wrote is rolled
back, and its connection goes back to the pool idle, not `idle in transaction`. Needs the test
server (skips without it, fails when `CI` is set)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from headrace.policy.errors import StoreError
from headrace.store.machine import Transaction
from headrace.store.postgres import PostgresStore
from tests.integration.postgres import opened_store

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": False})


@pytest.fixture
async def store() -> AsyncIterator[PostgresStore]:
    async with opened_store("headrace_framing") as opened:
        yield opened


async def flows(store: PostgresStore) -> list[str]:
    """The flows the store holds, read outside any verb (the pool's sessions use its schema)."""
    async with store.sessions.pool().connection() as conn:
        rows = await (await conn.execute("SELECT flow FROM flows ORDER BY flow")).fetchall()
    return [row["flow"] for row in rows]


async def open_transactions(store: PostgresStore) -> int:
    async with store.sessions.pool().connection() as conn:
        found = await (
            await conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity"
                " WHERE application_name = current_setting('application_name')"
                " AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
            )
        ).fetchone()
    assert found is not None
    return int(found["n"])


async def test_a_verb_commits_what_it_wrote(store: PostgresStore) -> None:
    async def write(tx: Transaction) -> None:
        await tx.run("add_flows", flows=["a"])

    await store._write(write)
    assert await flows(store) == ["a"]
    assert await open_transactions(store) == 0


async def test_a_verb_that_fails_after_writing_leaves_nothing_and_an_idle_connection(
    store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="psycopg")

    async def fails(tx: Transaction) -> None:
        await tx.run("add_flows", flows=["a"])
        await tx.rows("lock_flows", flows=["a"])  # read: the write has reached the server
        raise RuntimeError("the verb's own error")

    with pytest.raises(RuntimeError, match="the verb's own error"):
        await store._write(fails)
    assert await flows(store) == []
    assert await open_transactions(store) == 0
    await store._write(lambda tx: tx.run("add_flows", flows=["b"]))
    assert await flows(store) == ["b"]
    # Rolled back by the store, not by the pool (which warns when it has to).
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []


async def test_a_statement_that_fails_rolls_back_the_rest(store: PostgresStore) -> None:
    async def fails(tx: Transaction) -> None:
        await tx.run("add_flows", flows=["a"])
        await tx.rows("promote", ids=[1], tiers=["not a tier"])  # refused by the server

    with pytest.raises(StoreError, match=r"invalid input"):
        await store._write(fails)
    assert await flows(store) == []
    assert await open_transactions(store) == 0


async def test_an_interrupted_verb_is_rolled_back(
    store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="psycopg")
    reached = asyncio.Event()

    async def waits(tx: Transaction) -> None:
        await tx.run("add_flows", flows=["a"])
        await tx.rows("lock_flows", flows=["a"])
        reached.set()
        await asyncio.Event().wait()  # until cancelled

    running = asyncio.create_task(store._write(waits))
    await reached.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert await flows(store) == []
    assert await open_transactions(store) == 0
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
