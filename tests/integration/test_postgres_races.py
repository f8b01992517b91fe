"""Writers racing on one PostgreSQL store, each with its own pool, as processes on other hosts
would: what one of them commits first decides, and the other's transaction runs again. Needs the
test server (skips without it, fails when `CI` is set)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from headrace.store.postgres import PostgresStore
from headrace.store.types import NewTask, Settings, TaskState
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
