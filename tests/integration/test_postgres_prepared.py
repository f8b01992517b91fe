"""A PostgreSQL store's pooled connection prepares each statement the first time it runs it, so a
claim's statements are planned once per connection, not in full at each of its first runs.
Needs the test server (skips without it, fails when `CI` is set)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from headrace.store.machine import sql
from headrace.store.postgres import QUERIES, PostgresStore
from headrace.store.postgres.sessions import PREPARE_THRESHOLD, PREPARED_MAX
from headrace.store.protocol.types import NewTask
from tests.integration.postgres import opened_store

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": False})


@pytest.fixture
async def store() -> AsyncIterator[PostgresStore]:
    async with opened_store("headrace_prepared", options="pool_min=1&pool_max=1") as opened:
        yield opened  # one connection


async def prepared(store: PostgresStore) -> dict[str, tuple[int, int]]:
    """The statements the store's one connection has prepared, by text: generic and custom
    plans made so far."""
    async with store.sessions.pool().connection() as conn:
        cursor = await conn.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements",
            prepare=False,
        )
        rows = await cursor.fetchall()
    return {row["statement"]: (row["generic_plans"], row["custom_plans"]) for row in rows}


def as_sent(text: str) -> str:
    """A named query as the server holds it: each `%(name)s` numbered by its first use."""
    numbers: dict[str, int] = {}

    def number(found: re.Match[str]) -> str:
        return f"${numbers.setdefault(found[1], len(numbers) + 1)}"

    return re.sub(r"%\((\w+)\)s", number, text)


async def test_a_claim_is_prepared_the_first_time_it_runs(store: PostgresStore) -> None:
    queries = {name: as_sent(query.text) for name, query in sql.load_queries(QUERIES).items()}
    await store.submit([NewTask(kind="a", ref="1")])
    claimed = await store.claim("w", 1, lease_for=30.0)
    assert len(claimed.leases) == 1
    plans = await prepared(store)
    for name in ("claim_start", "claim_batch", "lease_tasks"):
        assert queries[name] in plans, f"{name} was not prepared at its first run"
    # the claim's batch planned once, for any parameters (the claim forces a generic plan)
    assert plans[queries["claim_batch"]] == (1, 0)


async def test_the_pool_prepares_at_once_and_keeps_every_named_statement(
    store: PostgresStore,
) -> None:
    assert len(sql.load_queries(QUERIES)) < PREPARED_MAX
    async with store.sessions.pool().connection() as conn:
        assert conn.prepare_threshold == PREPARE_THRESHOLD == 0
        assert conn.prepared_max == PREPARED_MAX
