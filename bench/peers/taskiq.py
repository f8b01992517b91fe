"""taskiq on Redis with taskiq-redis's stream broker (the one with acknowledgements, its README's
example): one `taskiq worker --workers N` command, each process running up to 16 tasks at
once."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from taskiq import AsyncTaskiqDecoratedTask
from taskiq_redis import RedisStreamBroker

from bench.peers import probe
from bench.peers.base import Peer, Producer, Site

MAX_ASYNC_TASKS = 16
BATCH = 500


async def noop() -> None:
    probe.ran()


async def timed(ref: str) -> None:
    probe.started(ref)


Noop = AsyncTaskiqDecoratedTask[[], Coroutine[Any, Any, None]]
Timed = AsyncTaskiqDecoratedTask[[str], Coroutine[Any, Any, None]]


def make_broker(site: Site) -> tuple[RedisStreamBroker, Noop, Timed]:
    """A broker on a stream named after the case, and the two tasks on it."""
    broker = RedisStreamBroker(url=site.redis, queue_name=site.name)
    return (
        broker,
        broker.register_task(noop, task_name="noop"),
        broker.register_task(timed, task_name="timed"),
    )


def worker_broker() -> RedisStreamBroker:
    """`taskiq worker bench.peers.taskiq:worker_broker`: the broker for the site in the
    environment."""
    broker, _, _ = make_broker(Site.from_env())
    return broker


class TaskiqProducer:
    def __init__(self, site: Site) -> None:
        self.broker, self.noop, self.timed_task = make_broker(site)

    async def prepare(self) -> None:
        """Nothing more: starting the broker made the stream and its consumer group, which
        must exist before the first message for the workers to see it."""

    async def noops(self, count: int) -> None:
        for first in range(0, count, BATCH):
            size = min(count, first + BATCH) - first
            await asyncio.gather(*(self.noop.kiq() for _ in range(size)))

    async def timed(self, ref: str) -> None:
        await self.timed_task.kiq(ref)


@asynccontextmanager
async def producer(site: Site) -> AsyncIterator[Producer]:
    fed = TaskiqProducer(site)
    await fed.broker.startup()
    try:
        yield fed
    finally:
        await fed.broker.shutdown()


def workers(site: Site, processes: int) -> list[list[str]]:
    command = [sys.executable, "-m", "taskiq", "worker", "bench.peers.taskiq:worker_broker"]
    return [[*command, "--workers", str(processes), "--max-async-tasks", str(MAX_ASYNC_TASKS)]]


PEER = Peer(
    "taskiq",
    "redis",
    f"one `taskiq worker --workers N --max-async-tasks {MAX_ASYNC_TASKS}`, RedisStreamBroker",
    workers,
    producer,
)
