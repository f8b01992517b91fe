"""SAQ on Redis: one `saq --workers N` command, each process running up to 16 jobs at once."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from saq import Queue
from saq.types import Context, SettingsDict

from bench.peers import probe
from bench.peers.base import Peer, Producer, Site

CONCURRENCY = 16
BATCH = 500


async def noop(ctx: Context) -> None:
    probe.ran()


async def timed(ctx: Context, *, ref: str) -> None:
    probe.started(ref)


def make_queue(site: Site) -> Queue:
    """A queue named after the case: SAQ keeps its keys under the name."""
    return Queue.from_url(site.redis, name=site.name)


def worker_settings() -> SettingsDict[Context]:
    """`saq bench.peers.saq.worker_settings`: the worker for the site in the environment."""
    queue = make_queue(Site.from_env())
    return {"queue": queue, "functions": [noop, timed], "concurrency": CONCURRENCY}


class SaqProducer:
    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    async def prepare(self) -> None:
        """Nothing to install: Redis keys are made on first use."""

    async def noops(self, count: int) -> None:
        for first in range(0, count, BATCH):
            size = min(count, first + BATCH) - first
            await asyncio.gather(*(self.queue.enqueue("noop") for _ in range(size)))

    async def timed(self, ref: str) -> None:
        await self.queue.enqueue("timed", ref=ref)


@asynccontextmanager
async def producer(site: Site) -> AsyncIterator[Producer]:
    queue = make_queue(site)
    await queue.connect()
    try:
        yield SaqProducer(queue)
    finally:
        await queue.disconnect()


def workers(site: Site, processes: int) -> list[list[str]]:
    command = [sys.executable, "-m", "saq", "bench.peers.saq.worker_settings"]
    return [[*command, "--workers", str(processes)]]


PEER = Peer(
    "saq",
    "redis",
    f"one `saq --workers N`, `concurrency={CONCURRENCY}` in its settings",
    workers,
    producer,
)
