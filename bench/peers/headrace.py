"""headrace itself, on PostgreSQL and on SQLite: `headrace worker` processes of 16 slots."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import headrace as hr
from bench.peers import probe
from bench.peers.base import Peer, Producer, Site

SLOTS = 16
BATCH = 1000


def make_app() -> hr.App:
    """The app of the worker and the producer, on the store in `HEADRACE_URL` (which the
    worker command also reads)."""
    app = hr.App(os.environ["HEADRACE_URL"])

    @app.task(name="noop")
    async def noop(ctx: hr.Context, ref: str) -> None:
        probe.ran()

    @app.task(name="timed")
    async def timed(ctx: hr.Context, ref: str) -> None:
        probe.started(ref)

    return app


class HeadraceProducer:
    def __init__(self, app: hr.App) -> None:
        self.app = app

    async def prepare(self) -> None:
        """Nothing more: opening the app migrated the store."""

    async def noops(self, count: int) -> None:
        noop = self.app.definition("noop")
        for first in range(0, count, BATCH):
            last = min(count, first + BATCH)
            await self.app.submit([noop.spec(f"n{i}") for i in range(first, last)])

    async def timed(self, ref: str) -> None:
        await self.app.definition("timed").submit(ref)


@asynccontextmanager
async def producer(site: Site) -> AsyncIterator[Producer]:
    async with make_app() as app:
        yield HeadraceProducer(app)


def workers(site: Site, processes: int) -> list[list[str]]:
    command = [sys.executable, "-m", "headrace", "worker", "bench.peers.headrace:make_app"]
    return [[*command, "--slots", str(SLOTS), "--name", f"w{n}"] for n in range(processes)]


def postgres_env(site: Site) -> dict[str, str]:
    return {"HEADRACE_URL": f"{site.postgres}?schema={site.name}"}


def sqlite_env(site: Site) -> dict[str, str]:
    return {"HEADRACE_URL": f"sqlite:///{Path(site.scratch) / 'headrace.db'}"}


SETTINGS = f"`headrace worker --slots {SLOTS}` per process, other options at their defaults"

POSTGRES = Peer("headrace-postgres", "postgres", SETTINGS, workers, producer, postgres_env)
SQLITE = Peer("headrace-sqlite", "sqlite", SETTINGS, workers, producer, sqlite_env)
