"""Celery on Redis: one `celery worker` with the prefork pool of N processes, and a prefetch
multiplier of 64 as Celery's optimizing guide advises for many short tasks."""

from __future__ import annotations

import functools
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from celery import Celery

from bench.peers import probe
from bench.peers.base import Peer, Producer, Site

PREFETCH_MULTIPLIER = 64


def noop() -> None:
    probe.ran()


def timed(ref: str) -> None:
    probe.started(ref)


def make_app(site: Site) -> Celery:
    """An app whose queue and every Redis key are named after the case; no result backend."""
    app = Celery("bench", broker=site.redis, set_as_current=False)
    app.conf.update(
        broker_transport_options={"global_keyprefix": f"{site.name}:"},
        broker_connection_retry_on_startup=True,
        task_default_queue=site.name,
        task_ignore_result=True,
        worker_prefetch_multiplier=PREFETCH_MULTIPLIER,
    )
    app.task(name="noop")(noop)
    app.task(name="timed")(timed)
    return app


@functools.cache
def _worker_app() -> Celery:
    return make_app(Site.from_env())


def __getattr__(name: str) -> Celery:
    """`celery -A bench.peers.celery:app` asks for a module attribute: the worker's app, made
    for the site in its environment when asked."""
    if name == "app":
        return _worker_app()
    raise AttributeError(name)


class CeleryProducer:
    def __init__(self, app: Celery) -> None:
        self.app = app

    async def prepare(self) -> None:
        """Nothing to install: Redis keys are made on first use."""

    async def noops(self, count: int) -> None:
        noop = self.app.tasks["noop"]
        with self.app.producer_or_acquire() as publisher:
            for _ in range(count):
                noop.apply_async(producer=publisher)

    async def timed(self, ref: str) -> None:
        self.app.tasks["timed"].apply_async((ref,))


@asynccontextmanager
async def producer(site: Site) -> AsyncIterator[Producer]:
    app = make_app(site)
    try:
        yield CeleryProducer(app)
    finally:
        app.close()


def workers(site: Site, processes: int) -> list[list[str]]:
    command = [sys.executable, "-m", "celery", "-A", "bench.peers.celery:app", "worker"]
    options = ["--pool", "prefork", "--concurrency", str(processes), "--loglevel", "WARNING"]
    return [[*command, *options, "--without-gossip", "--without-mingle"]]


PEER = Peer(
    "celery",
    "redis",
    f"one `celery worker --pool prefork --concurrency N --without-gossip --without-mingle`, "
    f"`worker_prefetch_multiplier={PREFETCH_MULTIPLIER}`, no result backend",
    workers,
    producer,
)
