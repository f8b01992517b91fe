"""Two bare queues on the same PostgreSQL and the same driver as headrace (psycopg 3): what
this host's server and loopback cost a task before any scheduler's rules, for reading the other
rows against.

A table of jobs (a kind and a ref); a submit is one durable statement that inserts the job and
sends a NOTIFY, as headrace's submit is. A worker process listens, and takes up to 16 jobs at a
time in the oldest-first order, skipping those another worker holds; each job taken is deleted
and run at once, in the worker's loop. There are no leases, attempts, gates, turns or outcomes:
a worker that dies loses what it took. A take's commit does not wait for the WAL flush, as a
headrace claim's does not.

- `bare-postgres` takes in one statement, one round trip (a `DELETE` of the rows a sub-select
  locked, returning them): the shape of a claim made in the server, as PgQueuer's.
- `bare-postgres-2rt` takes in two round trips, choosing between them in the worker: `BEGIN`
  and the locking `SELECT`, then the `DELETE` of what it chose and `COMMIT`, pipelined as
  headrace's claim is (whose first trip brings the candidates and its second leases them).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import psycopg
from psycopg import sql

from bench.peers import probe
from bench.peers.base import Peer, Producer, Site

BATCH = 1000  # jobs a producer inserts at once
TAKE = 16  # jobs a worker takes at once, as headrace's 16 slots
IDLE_WAIT = 1.0  # a worker with nothing to take looks again after this, notified or not
CHANNEL = "bare_jobs"

CREATE = "CREATE TABLE jobs (id bigserial PRIMARY KEY, kind text NOT NULL, ref text NOT NULL)"
SUBMIT = (
    "WITH added AS (INSERT INTO jobs (kind, ref) VALUES (%(kind)s, %(ref)s)) "
    "SELECT pg_notify(%(channel)s, '')"
)
SUBMIT_MANY = "INSERT INTO jobs (kind, ref) SELECT %(kind)s, unnest(%(refs)s::text[])"
TAKE_ONE_TRIP = """
DELETE FROM jobs WHERE id IN (
    SELECT id FROM jobs ORDER BY id LIMIT %(n)s FOR UPDATE SKIP LOCKED
)
RETURNING id, kind, ref
"""
CHOOSE = "SELECT id, kind, ref FROM jobs ORDER BY id LIMIT %(n)s FOR UPDATE SKIP LOCKED"
DELETE = "DELETE FROM jobs WHERE id = ANY(%(ids)s::bigint[])"

Row = tuple[int, str, str]


def channel(site: Site) -> str:
    """The NOTIFY channel, the database's: named after the case."""
    return f"{CHANNEL}_{site.name}"


def run(kind: str, ref: str) -> None:
    if kind == "timed":
        probe.started(ref)
    else:
        probe.ran()


async def take_one_trip(conn: psycopg.AsyncConnection[Any]) -> list[Row]:
    cursor = await conn.execute(TAKE_ONE_TRIP, {"n": TAKE}, binary=True)
    return sorted(await cursor.fetchall())  # oldest first: RETURNING keeps no order


async def take_two_trips(conn: psycopg.AsyncConnection[Any]) -> list[Row]:
    async with conn.pipeline() as pipeline:
        await conn.execute("BEGIN")
        cursor = await conn.execute(CHOOSE, {"n": TAKE}, binary=True)
        await pipeline.sync()
        rows: list[Row] = await cursor.fetchall()
        if rows:
            await conn.execute(DELETE, {"ids": [row[0] for row in rows]})
        await conn.execute("COMMIT")
        await pipeline.sync()
    return rows


async def work(take: Callable[[psycopg.AsyncConnection[Any]], Awaitable[list[Row]]]) -> None:
    """Take and run jobs until stopped; with none to take, wait for a NOTIFY (or `IDLE_WAIT`)."""
    site = Site.from_env()
    listener = await psycopg.AsyncConnection.connect(site.postgres_in_schema, autocommit=True)
    conn = await psycopg.AsyncConnection.connect(site.postgres_in_schema, autocommit=True)
    await conn.execute("SET synchronous_commit = off")
    await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(site))))
    notified = asyncio.Event()

    async def hear() -> None:
        async for _ in listener.notifies():
            notified.set()

    hearing = asyncio.create_task(hear())
    try:
        while True:
            notified.clear()  # before the take: a NOTIFY after it is not missed
            rows = await take(conn)
            for _, kind, ref in rows:
                run(kind, ref)
            if len(rows) < TAKE:
                with suppress(TimeoutError):
                    await asyncio.wait_for(notified.wait(), IDLE_WAIT)
    finally:
        hearing.cancel()
        with suppress(asyncio.CancelledError):
            await hearing
        await conn.close()
        await listener.close()


class BareProducer:
    def __init__(self, conn: psycopg.AsyncConnection[Any], channel: str) -> None:
        self.conn = conn
        self.channel = channel

    async def prepare(self) -> None:
        await self.conn.execute(CREATE)

    async def noops(self, count: int) -> None:
        for first in range(0, count, BATCH):
            refs = [f"n{i}" for i in range(first, min(count, first + BATCH))]
            await self.conn.execute(SUBMIT_MANY, {"kind": "noop", "refs": refs})

    async def timed(self, ref: str) -> None:
        await self.conn.execute(SUBMIT, {"kind": "timed", "ref": ref, "channel": self.channel})


@asynccontextmanager
async def producer(site: Site) -> AsyncIterator[Producer]:
    conn = await psycopg.AsyncConnection.connect(site.postgres_in_schema, autocommit=True)
    try:
        yield BareProducer(conn, channel(site))
    finally:
        await conn.close()


def workers_of(variant: str) -> Callable[[Site, int], list[list[str]]]:
    def workers(site: Site, processes: int) -> list[list[str]]:
        return [[sys.executable, "-m", "bench.peers.bare", variant] for _ in range(processes)]

    return workers


ONE_TRIP = Peer(
    "bare-postgres",
    "postgres",
    "a bare queue on psycopg, no rules: takes 16 jobs in one statement (one round trip)",
    workers_of("one"),
    producer,
)
TWO_TRIPS = Peer(
    "bare-postgres-2rt",
    "postgres",
    "the same bare queue, taking 16 in two round trips (choose, then delete and commit)",
    workers_of("two"),
    producer,
)


TAKES = {"one": take_one_trip, "two": take_two_trips}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in TAKES:
        sys.exit("usage: python -m bench.peers.bare one|two (started by the peer benchmark)")
    asyncio.run(work(TAKES[sys.argv[1]]))
