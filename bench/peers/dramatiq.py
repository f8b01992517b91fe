"""Dramatiq on Redis: one `dramatiq --processes N` command, each process with Dramatiq's default
of 8 worker threads (and its default prefetch of twice that)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.peers import probe
from bench.peers.base import Peer, Producer, Site

THREADS = 8


def noop() -> None:
    probe.ran()


def timed(ref: str) -> None:
    probe.started(ref)


def make_broker(
    site: Site,
) -> tuple[RedisBroker, dramatiq.Actor[[], None], dramatiq.Actor[[str], None]]:
    """A broker whose keys live under the case's name, and the two actors on it."""
    broker = RedisBroker(url=site.redis, namespace=site.name)
    return (
        broker,
        dramatiq.actor(broker=broker, actor_name="noop")(noop),
        dramatiq.actor(broker=broker, actor_name="timed")(timed),
    )


def setup_worker() -> None:
    """`dramatiq bench.peers.dramatiq:setup_worker`: makes the broker for the site in the
    environment the global one, which is where Dramatiq's command looks for it."""
    broker, _, _ = make_broker(Site.from_env())
    dramatiq.set_broker(broker)


class DramatiqProducer:
    def __init__(self, site: Site) -> None:
        self.broker, self.noop, self.timed_actor = make_broker(site)

    async def prepare(self) -> None:
        """Nothing to install: Redis keys are made on first use."""

    async def noops(self, count: int) -> None:
        for _ in range(count):
            self.noop.send()

    async def timed(self, ref: str) -> None:
        self.timed_actor.send(ref)


@asynccontextmanager
async def producer(site: Site) -> AsyncIterator[Producer]:
    fed = DramatiqProducer(site)
    try:
        yield fed
    finally:
        fed.broker.close()


def workers(site: Site, processes: int) -> list[list[str]]:
    command = [sys.executable, "-m", "dramatiq", "bench.peers.dramatiq:setup_worker"]
    return [[*command, "--processes", str(processes), "--threads", str(THREADS)]]


PEER = Peer(
    "dramatiq",
    "redis",
    f"one `dramatiq --processes N --threads {THREADS}` (its default threads and prefetch)",
    workers,
    producer,
)
