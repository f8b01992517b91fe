"""Claims on PostgreSQL take turns (`claim_turn`, migration 0013): one waits for the claim
before it, and none waits longer than CLAIM_TURN_WAIT_MS for a holder that stalled. Real time:
the turn is a lock held by another connection. Needs the test server (skips without it, fails
when `CI` is set)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow, dict_row

from headrace.store.postgres import PostgresStore
from headrace.store.postgres.store import CLAIM_TURN_WAIT_MS
from headrace.store.types import NewTask, Settings
from tests.integration.postgres import fresh_schema

pytestmark = pytest.mark.anyio

Connection = psycopg.AsyncConnection[DictRow]


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real sockets need real time


@pytest.fixture
async def store_and_url() -> AsyncIterator[tuple[PostgresStore, str]]:
    with fresh_schema("headrace_turn") as url:
        store = PostgresStore.from_url(url)
        await store.open(Settings())
        try:
            yield store, url
        finally:
            await store.close()


async def connect(store: PostgresStore) -> Connection:
    conn = await psycopg.AsyncConnection.connect(store.dsn, row_factory=dict_row)
    await conn.execute("SELECT set_config('search_path', %s, false)", [store.schema])
    await conn.commit()
    return conn


async def holder(store: PostgresStore) -> Connection:
    """A connection in a transaction that holds the store's claim turn, as a stalled claim
    would."""
    conn = await connect(store)
    found = await (await conn.execute("SELECT claim_turn(1000) AS had")).fetchone()
    assert found is not None and found["had"] is True
    return conn


async def test_a_turn_is_had_once_its_holder_ends_and_not_before(
    store_and_url: tuple[PostgresStore, str],
) -> None:
    store, _ = store_and_url
    first = await holder(store)
    second = await connect(store)
    try:
        began = time.monotonic()
        refused = await (await second.execute("SELECT claim_turn(50) AS had")).fetchone()
        waited = time.monotonic() - began
        assert refused is not None and refused["had"] is False
        assert 0.04 <= waited < 1.0
        # Its own lock_timeout is as it was: a later lock in the transaction waits as usual.
        setting = await (await second.execute("SHOW lock_timeout")).fetchone()
        assert setting is not None and setting["lock_timeout"] == "0"
        await second.rollback()
        await first.commit()  # the holder's transaction ends: the turn is free
        had = await (await second.execute("SELECT claim_turn(50) AS had")).fetchone()
        assert had is not None and had["had"] is True
    finally:
        await second.close()
        await first.close()


async def test_a_claim_goes_on_past_a_stalled_holder_of_the_turn(
    store_and_url: tuple[PostgresStore, str],
) -> None:
    store, _ = store_and_url
    await store.submit([NewTask("work", f"t{i}") for i in range(3)])
    stalled = await holder(store)
    try:
        began = time.monotonic()
        claimed = await store.claim("w1", 3, lease_for=30.0)
        took = time.monotonic() - began
    finally:
        await stalled.close()
    assert [lease.task.ref for lease in claimed.leases] == ["t0", "t1", "t2"]
    assert CLAIM_TURN_WAIT_MS / 1000 <= took < 2.0  # it waited its turn, then went on
