"""Every conformance case runs against every backend; the store's clock is a ManualClock.

PostgreSQL runs when a server answers at `HEADRACE_TEST_PG` (default
`postgresql://postgres@127.0.0.1:5432/test`); each test gets a fresh schema of its own, which
`open()` migrates and the test drops after (measured here, faster than a database cloned from a
migrated template: ~35 ms against ~95-135 ms a test). Without a server the PostgreSQL cases skip,
saying why, or fail when `CI` is set.
"""

from __future__ import annotations

import functools
import os
import zlib
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from headrace.policy import GateConfig, ManualClock, Rate
from headrace.sim.loop import VirtualTimeLoop
from headrace.store.protocol.records import RecordStore
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import Settings
from headrace.store.sqlite import SQLiteStore
from tests.services import unavailable

BACKENDS = ["memory", "sqlite", "postgres"]

GATES = (  # no guard: the cases time starts to the edge of a window
    GateConfig("provider:video", concurrency=2, rate=Rate(4, per="10s"), guard=0),
    GateConfig("provider:image", concurrency=3, rate=Rate(10, per="6s"), guard=0),
    GateConfig("provider:speech", rate=Rate(2, per="10s"), guard=0),  # a rate, no cap
    GateConfig("session:*", concurrency=1),
    GateConfig("free"),
)
AGING_STEP = 30.0

POSTGRES_DSN = os.environ.get("HEADRACE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
_made_schemas: set[str] = set()
DROP_AT_ONCE = 10


def make_backend(name: str, clock: ManualClock, tmp_path: Path) -> Store:
    """A store for backend `name` whose durable state belongs to `tmp_path`: a second call with
    the same path reopens the same state (a file, or a PostgreSQL schema named after it)."""
    if name == "memory":
        return SQLiteStore.in_memory(clock=clock)
    if name == "sqlite":
        return SQLiteStore(tmp_path / "conformance.db", clock=clock)
    if name == "postgres":
        from headrace.store.postgres import PostgresStore

        schema = postgres_schema(tmp_path)
        _made_schemas.add(schema)
        return PostgresStore(postgres_reachable(), clock=clock, schema=schema, pool_max=4)
    raise ValueError(name)


def postgres_schema(tmp_path: Path) -> str:
    """The schema that holds the PostgreSQL state of `tmp_path`."""
    return f"headrace_t{os.getpid()}_{zlib.crc32(str(tmp_path).encode()):08x}"


@functools.cache
def postgres_reachable(dsn: str = POSTGRES_DSN) -> str:
    """`dsn` if a PostgreSQL server answers there; else skip (fail when `CI` is set)."""
    try:
        psycopg.connect(dsn, connect_timeout=3).close()
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        unavailable(f"PostgreSQL not reachable at {dsn}: {first}", "PostgreSQL tests")
    return dsn


def drop_schemas(schemas: Collection[str]) -> None:
    if not schemas:
        return
    ordered = sorted(schemas)
    with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
        # A few at a time: one DROP of many schemas can outgrow the server's lock table.
        for first in range(0, len(ordered), DROP_AT_ONCE):
            names = sql.SQL(", ").join(map(sql.Identifier, ordered[first : first + DROP_AT_ONCE]))
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(names))
    _made_schemas.difference_update(schemas)


@pytest.fixture(scope="session", autouse=True)
def _drop_leftover_schemas() -> Iterator[None]:
    """Schemas made outside a test's own fixture (e.g. one per state-machine example) go at
    the end of the session."""
    yield
    drop_schemas(set(_made_schemas))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def anyio_backend(backend: str) -> tuple[str, dict[str, Any]]:
    """The virtual-time loop, except on PostgreSQL: real sockets need real time (sim/loop.py).
    The store's clock is the ManualClock either way."""
    if backend == "postgres":
        return ("asyncio", {"debug": True})
    return ("asyncio", {"loop_factory": VirtualTimeLoop, "debug": True})


@pytest.fixture
def durable(backend: str, tmp_path: Path) -> Iterator[None]:
    """Skip the PostgreSQL cases without a server; drop a test's PostgreSQL schema after it."""
    if backend != "postgres":
        yield
        return
    postgres_reachable()
    yield
    drop_schemas({postgres_schema(tmp_path)})


@pytest.fixture
async def store(
    backend: str, clock: ManualClock, tmp_path: Path, durable: None
) -> AsyncIterator[Store]:
    opened = make_backend(backend, clock, tmp_path)
    await opened.open(Settings(gates=GATES, aging_step=AGING_STEP, poison_expiries=3))
    yield opened
    await opened.close()


@pytest.fixture
def records(store: Store) -> RecordStore:
    """The records beside `store`: the `RecordStore` cases run against this protocol alone."""
    return store.records


@pytest.fixture
def reopen(backend: str, clock: ManualClock, tmp_path: Path, durable: None) -> Callable[[], Store]:
    """A second handle on the same durable state (a restarted process); memory has none."""
    if backend == "memory":
        pytest.skip("the memory store does not outlive its process")
    return lambda: make_backend(backend, clock, tmp_path)
