"""A PostgreSQL schema of its own for a test, on the server the suite uses."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TypeVar

import psycopg
from psycopg import sql

from headrace.policy.clock import Clock
from headrace.store.postgres import PostgresStore
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import ACTIVE, Settings
from tests.services import unavailable

T = TypeVar("T")

DSN = os.environ.get("HEADRACE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def reachable() -> str:
    """The test server's DSN; skip when it does not answer (fail when `CI` is set)."""
    try:
        with psycopg.connect(DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as error:
        unavailable(f"PostgreSQL not reachable at {DSN}: {error}".strip(), "PostgreSQL tests")
    return DSN


@contextmanager
def fresh_schema(prefix: str) -> Iterator[str]:
    """A store URL on a schema no one else uses, dropped afterwards."""
    dsn = reachable()
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    separator = "&" if "?" in dsn else "?"
    try:
        yield f"{dsn}{separator}schema={schema}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@asynccontextmanager
async def opened_store(
    prefix: str, *, options: str = "", clock: Clock | None = None, settings: Settings | None = None
) -> AsyncIterator[PostgresStore]:
    """A store opened on a schema of its own (`fresh_schema`), closed and dropped afterwards;
    `options`: more of its URL's query (`pool_max=1`)."""
    with fresh_schema(prefix) as url:
        store = PostgresStore.from_url(f"{url}&{options}" if options else url, clock=clock)
        await store.open(settings or Settings())
        try:
            yield store
        finally:
            await store.close()


def read_store(url: str, query: Callable[[Store], Awaitable[T]]) -> T:
    """Run one read against the PostgreSQL store at `url`, as another process would."""

    async def run() -> T:
        store = PostgresStore.from_url(url)
        await store.open(Settings())
        try:
            return await query(store)
        finally:
            await store.close()

    return asyncio.run(run())


def settled(url: str) -> bool:
    found = read_store(url, lambda store: store.counts())
    return sum(found.values()) > 0 and not any(found[state] for state in ACTIVE)
