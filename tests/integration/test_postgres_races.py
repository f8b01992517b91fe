"""Writers sharing one PostgreSQL store, each with its own pool, as processes on other hosts
would: what one of them commits first decides and the other's transaction runs again, and idle
workers hear of new work by NOTIFY. Needs the test server (skips without it, fails when `CI` is
set)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from headrace.store.postgres import PostgresStore
from headrace.store.types import NewTask, Settings, Sibling, Succeeded, TaskState
from tests.integration.postgres import fresh_schema

pytestmark = pytest.mark.anyio

ROUNDS = 20


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real sockets need real time


@pytest.fixture
async def stores() -> AsyncIterator[list[PostgresStore]]:
    with fresh_schema("headrace_race") as url:
        opened = [PostgresStore.from_url(url) for _ in range(2)]
        for store in opened:
            await store.open(Settings())
        try:
            yield opened
        finally:
            for store in opened:
                await store.close()


async def test_a_key_submitted_by_two_writers_at_once_names_one_task(
    stores: list[PostgresStore],
) -> None:
    first, second = stores
    for n in range(ROUNDS):
        # Overlapping batches in other flows, so neither waits on the other's flow lock.
        mine = [NewTask("shot", f"r{n}", key=f"k{n}/{i}", flow=f"a{n}") for i in range(4)]
        theirs = [NewTask("shot", f"r{n}", key=f"k{n}/{i}", flow=f"b{n}") for i in range(2, 6)]
        a, b = await asyncio.gather(first.submit(mine), second.submit(theirs))
        assert [s.id for s in a[2:]] == [s.id for s in b[:2]]  # the shared keys
        assert sum(s.created for s in [*a, *b]) == 6  # each key created once
    counts = await first.counts()
    assert counts[TaskState.READY] == 6 * ROUNDS


async def notified(store: PostgresStore, write: Any) -> bool:
    """Whether `write()` makes the store NOTIFY its channel (listened to on a connection of its
    own, as an idle worker's store does)."""
    async with await psycopg.AsyncConnection.connect(store.dsn, autocommit=True) as listener:
        await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(store.channel)))
        await write()
        heard = [n async for n in listener.notifies(timeout=0.5, stop_after=1)]
    return bool(heard)


async def test_a_write_notifies_idle_workers_only_when_work_may_be_ready(
    stores: list[PostgresStore],
) -> None:
    store = stores[0]
    assert await notified(store, lambda: store.submit([NewTask("shot", "alone")]))
    [alone] = (await store.claim("w", 1, lease_for=30.0)).leases
    # A success that returns no ticket and leaves no dependent frees nothing for anyone.
    assert not await notified(store, lambda: store.finish_many([(alone, Succeeded())]))
    pair = [NewTask("script", "ep"), NewTask("assembly", "ep", after=(Sibling(0),))]
    await store.submit(pair)
    [script] = (await store.claim("w", 1, lease_for=30.0)).leases
    assert await notified(store, lambda: store.finish_many([(script, Succeeded())]))
    [assembly] = (await store.claim("w", 1, lease_for=30.0)).leases
    assert assembly.task.kind == "assembly"
