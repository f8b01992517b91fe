"""PgQueuer on the same PostgreSQL, over asyncpg as its quick start has it: worker processes with
its defaults (batches of 10 jobs per dequeue, no cap on jobs at once), woken by its
LISTEN/NOTIFY.

Each process runs `pgqueuer.run`, what `pgq run` runs, on uvloop as `pgq run` does: the
command itself fails on start with typer 0.29 (its `--log-level` parser hands a string to code
that wants the enum).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pgqueuer
import uvloop
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

from bench.peers import probe
from bench.peers.base import Peer, Producer, Site

BATCH = 1000


@asynccontextmanager
async def make_worker() -> AsyncIterator[PgQueuer]:
    """The worker's PgQueuer; its schema and names come from the environment (`env` below),
    where PgQueuer reads them."""
    connection = await asyncpg.connect(Site.from_env().postgres)
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        probe.ran()

    @pgq.entrypoint("timed")
    async def timed(job: Job) -> None:
        probe.started((job.payload or b"").decode())

    try:
        yield pgq
    finally:
        await connection.close()


class PgQueuerProducer:
    def __init__(self, queries: Queries) -> None:
        self.queries = queries

    async def prepare(self) -> None:
        await self.queries.install()

    async def noops(self, count: int) -> None:
        for first in range(0, count, BATCH):
            size = min(count, first + BATCH) - first
            await self.queries.enqueue(["noop"] * size, [None] * size, [0] * size)

    async def timed(self, ref: str) -> None:
        await self.queries.enqueue("timed", ref.encode())


@asynccontextmanager
async def producer(site: Site) -> AsyncIterator[Producer]:
    connection = await asyncpg.connect(site.postgres)
    try:
        yield PgQueuerProducer(Queries(AsyncpgDriver(connection)))
    finally:
        await connection.close()


def env(site: Site) -> dict[str, str]:
    """Its tables in the case's schema; its NOTIFY channel, which is the database's, named
    after the case too."""
    return {"PGQUEUER_SCHEMA": site.name, "PGQUEUER_PREFIX": f"{site.name}_"}


def workers(site: Site, processes: int) -> list[list[str]]:
    return [[sys.executable, "-m", "bench.peers.pgqueuer"] for _ in range(processes)]


PEER = Peer(
    "pgqueuer",
    "postgres",
    "`pgqueuer.run` per process (what `pgq run` runs) with its defaults: batches of 10, "
    "no cap on jobs at once",
    workers,
    producer,
    env,
)


if __name__ == "__main__":
    uvloop.run(pgqueuer.run(make_worker))
