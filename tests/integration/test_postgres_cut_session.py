"""A host cut off in the middle of a transaction: the server ends its session after the store's
`idle_in_transaction` limit, so the locks it held stop holding up the other hosts. Real time on
purpose (a server-side timeout). Needs the test server (skips without it, fails when `CI` is set).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg.errors import IdleInTransactionSessionTimeout

from headrace.store.machine import Transaction, reads
from headrace.store.machine.core import SEQ_LOCK
from headrace.store.postgres import PostgresStore
from headrace.store.protocol.types import Settings, TaskState
from tests.integration.postgres import fresh_schema

pytestmark = [pytest.mark.anyio, pytest.mark.realtime]

QUIET_FOR = 1.5  # seconds a write is seen waiting behind a quiet session with no limit


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": False})


@pytest.fixture
async def url() -> AsyncIterator[str]:
    with fresh_schema("headrace_cut") as fresh:
        yield fresh


async def opened(url: str) -> PostgresStore:
    store = PostgresStore.from_url(url)
    await store.open(Settings())
    return store


async def test_the_pool_sessions_carry_the_limit(url: str) -> None:
    store = await opened(f"{url}&idle_in_transaction=2.5")
    try:
        async with store.sessions.pool().connection() as conn:
            found = await (
                await conn.execute("SHOW idle_in_transaction_session_timeout")
            ).fetchone()
            probes = await (
                await conn.execute(
                    "SELECT current_setting('tcp_keepalives_idle') AS idle,"
                    " current_setting('tcp_keepalives_interval') AS every,"
                    " current_setting('tcp_keepalives_count') AS count,"
                    " current_setting('tcp_user_timeout') AS unacked"
                )
            ).fetchone()
        assert found == {"idle_in_transaction_session_timeout": "2500ms"}
        assert probes == {"idle": "10", "every": "5", "count": "3", "unacked": "25000"}
    finally:
        await store.close()


async def test_a_session_gone_quiet_holding_the_record_lock_is_ended(url: str) -> None:
    """Host B takes the records' seq lock and goes quiet, as a host whose link was cut would:
    host A's write waits for B's limit (half a second), not for ever, and B's connection is
    broken when B speaks again."""
    here = await opened(url)
    cut = await opened(f"{url}&idle_in_transaction=0.5")
    try:
        async with cut.sessions.pool().connection() as quiet:
            await quiet.execute("BEGIN")
            await quiet.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [SEQ_LOCK])
            started = time.monotonic()
            made = await asyncio.wait_for(
                here.records.put_record("item", "a", scope="s", state="new"), 10
            )
            waited = time.monotonic() - started
            with pytest.raises(IdleInTransactionSessionTimeout):
                await quiet.execute("SELECT 1")  # the link is back: the session is gone
        assert made.applied and 0.4 <= waited < 5, waited
    finally:
        await cut.close()
        await here.close()


async def test_without_a_limit_the_quiet_session_holds_the_others_up(url: str) -> None:
    """The same with `idle_in_transaction=0`: A's write is still waiting after QUIET_FOR seconds,
    and goes through once B's transaction ends."""
    here = await opened(url)
    cut = await opened(f"{url}&idle_in_transaction=0")
    try:
        async with cut.sessions.pool().connection() as quiet:
            async with quiet.transaction():
                await quiet.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [SEQ_LOCK])
                write = asyncio.create_task(
                    here.records.put_record("item", "a", scope="s", state="new")
                )
                await asyncio.sleep(QUIET_FOR)
                assert not write.done()
            made = await asyncio.wait_for(write, 10)
        assert made.applied
    finally:
        await cut.close()
        await here.close()


async def test_a_verb_whose_process_stalled_past_the_limit_runs_again(url: str) -> None:
    """This process stalls inside one of its own transactions for longer than its limit: the
    server ends the session, and the verb runs again on another connection and succeeds."""
    store = await opened(f"{url}&idle_in_transaction=0.3")
    tries = 0

    async def stalls_once(tx: Transaction) -> dict[TaskState, int]:
        nonlocal tries
        tries += 1
        counts = await reads.counts(tx, None)
        if tries == 1:
            await asyncio.sleep(0.8)  # a frozen event loop, as the server sees it
        await reads.counts(tx, None)
        return counts

    try:
        counts = await store._write(stalls_once)
        assert tries == 2 and sum(counts.values()) == 0
    finally:
        await store.close()
