"""Procrastinate on the same PostgreSQL: `procrastinate worker --concurrency 16` processes, woken
by its LISTEN/NOTIFY."""

from __future__ import annotations

import functools
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import procrastinate

from bench.peers import probe
from bench.peers.base import Peer, Producer, Site

CONCURRENCY = 16
BATCH = 1000


async def noop() -> None:
    probe.ran()


async def timed(ref: str) -> None:
    probe.started(ref)


def make_app(site: Site) -> procrastinate.App:
    """An app whose connections work in the case's schema."""
    connector = procrastinate.PsycopgConnector(conninfo=site.postgres_in_schema)
    app = procrastinate.App(connector=connector)
    app.task(name="noop")(noop)
    app.task(name="timed")(timed)
    return app


@functools.cache
def _worker_app() -> procrastinate.App:
    return make_app(Site.from_env())


def __getattr__(name: str) -> procrastinate.App:
    """`procrastinate --app bench.peers.procrastinate.app` asks for a module attribute: the
    worker's app, made for the site in its environment when asked."""
    if name == "app":
        return _worker_app()
    raise AttributeError(name)


class ProcrastinateProducer:
    def __init__(self, app: procrastinate.App) -> None:
        self.app = app

    async def prepare(self) -> None:
        await self.app.schema_manager.apply_schema_async()

    async def noops(self, count: int) -> None:
        task = self.app.tasks["noop"]
        for first in range(0, count, BATCH):
            await task.batch_defer_async(*[{} for _ in range(first, min(count, first + BATCH))])

    async def timed(self, ref: str) -> None:
        await self.app.tasks["timed"].defer_async(ref=ref)


@asynccontextmanager
async def producer(site: Site) -> AsyncIterator[Producer]:
    app = make_app(site)
    async with app.open_async():
        yield ProcrastinateProducer(app)


def workers(site: Site, processes: int) -> list[list[str]]:
    command = [sys.executable, "-m", "procrastinate", "--app", "bench.peers.procrastinate.app"]
    return [[*command, "worker", "--concurrency", str(CONCURRENCY)] for _ in range(processes)]


PEER = Peer(
    "procrastinate",
    "postgres",
    f"`procrastinate worker --concurrency {CONCURRENCY}` per process (LISTEN/NOTIFY on)",
    workers,
    producer,
)
