"""headrace on PostgreSQL against its peers on this machine, in one run:

- no-op tasks/s: headrace-postgres, headrace-sqlite, and Procrastinate on the same server;
- enqueue -> start latency p50/p99 on an idle system (the producer is a process of its own, so
  the worker learns of work from the store: LISTEN/NOTIFY on PostgreSQL, a datagram through the
  directory beside the file on SQLite);
- claim latency with 10^3 and with 10^6 ready tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.queues import Queue as QueueType
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import psycopg
from psycopg import sql

import headrace as hr
from headrace.store.postgres import PostgresStore
from headrace.store.types import NewTask, Settings

if TYPE_CHECKING:
    import procrastinate  # the peer, imported where it runs: pip install -e '.[bench]'

T = TypeVar("T")

SERVER = "postgresql://postgres@127.0.0.1:5432"
SLOTS = 16
SUBMIT_BATCH = 1000
PRODUCER_TIMEOUT = 30.0
WARM_UP = 10  # tasks submitted and started before the samples
SPAWN = multiprocessing.get_context("spawn")  # a producer with nothing of the worker's process

Sent = dict[str, tuple[float, float]]  # task ref -> (submit called, submit returned)


@dataclass(frozen=True)
class Rate:
    case: str
    tasks: int
    seconds: float
    tasks_per_s: float


@dataclass(frozen=True)
class Latency:
    """From the submit call to the handler's first line (p50, p99), and its two parts: the
    submit call itself, and from its return (the task committed) to the handler."""

    case: str
    samples: int
    p50_ms: float
    p99_ms: float
    submit_p50_ms: float
    queued_p50_ms: float


@dataclass(frozen=True)
class ClaimCost:
    ready: int
    claims: int
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True)
class PostgresFigures:
    throughput: list[Rate]
    latency: list[Latency]
    claims: list[ClaimCost]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _admin(statement: sql.Composed) -> None:
    async with await psycopg.AsyncConnection.connect(f"{SERVER}/postgres", autocommit=True) as c:
        await c.execute(statement)


class FreshDatabase:
    """A database of its own for one peer, dropped afterwards."""

    def __init__(self, prefix: str) -> None:
        self.name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self.url = f"{SERVER}/{self.name}"

    async def __aenter__(self) -> str:
        await _admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        return self.url

    async def __aexit__(self, *exc: object) -> None:
        await _admin(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(self.name)))


# -- throughput


def noop_app(url: str) -> tuple[hr.App, hr.TaskDefinition]:
    app = hr.App(url)

    @app.task(name="noop")
    async def noop(ctx: hr.Context, ref: str) -> None:
        return None

    return app, noop


async def headrace_rate(case: str, url: str, tasks: int) -> Rate:
    app, noop = noop_app(url)
    async with app:
        for start in range(0, tasks, SUBMIT_BATCH):
            end = min(tasks, start + SUBMIT_BATCH)
            await app.submit([noop.spec(f"n{i}") for i in range(start, end)])
        began = time.perf_counter()
        await hr.Worker(app, slots=SLOTS, idle="50ms").drain()
        seconds = time.perf_counter() - began
    return Rate(case, tasks, round(seconds, 3), round(tasks / seconds, 1))


def procrastinate_app(url: str) -> procrastinate.App:
    import procrastinate

    return procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))


async def procrastinate_rate(url: str, tasks: int) -> Rate:
    app = procrastinate_app(url)

    @app.task(name="noop")
    async def noop() -> None:
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, tasks, SUBMIT_BATCH):
            await noop.batch_defer_async(
                *[{} for _ in range(start, min(tasks, start + SUBMIT_BATCH))]
            )
        began = time.perf_counter()
        await app.run_worker_async(
            wait=False, concurrency=SLOTS, install_signal_handlers=False, listen_notify=False
        )
        seconds = time.perf_counter() - began
    return Rate("procrastinate (postgres)", tasks, round(seconds, 3), round(tasks / seconds, 1))


# -- latency


def timing_app(url: str, started: dict[str, float], seen: Callable[[], None]) -> hr.App:
    app = hr.App(url)

    @app.task(name="timed")
    async def timed(ctx: hr.Context, ref: str) -> None:
        started[ref] = time.time()
        seen()

    return app


def produce(peer: str, url: str, samples: int, seen: EventType, sent: QueueType[Sent]) -> None:
    """The producer process: submit one task at a time, each once the last one has started."""
    asyncio.run(_produce(peer, url, samples, seen, sent))


@contextlib.asynccontextmanager
async def submitter(peer: str, url: str) -> AsyncIterator[Callable[[str], Awaitable[object]]]:
    """How `peer` enqueues one `timed` task."""
    if peer == "headrace":
        producer = timing_app(url, {}, lambda: None)
        async with producer:
            yield producer.definition("timed").submit
    else:
        app = procrastinate_timing_app(url, {}, lambda: None)
        async with app.open_async():
            yield lambda ref: app.tasks["timed"].defer_async(ref=ref)


async def _produce(
    peer: str, url: str, samples: int, seen: EventType, sent: QueueType[Sent]
) -> None:
    times: Sent = {}
    async with submitter(peer, url) as submit:
        for n in range(-WARM_UP, samples):  # the first open the pools and prepare statements
            await asyncio.sleep(0.01)
            seen.clear()
            before = time.time()
            await submit(f"t{n}")
            times[f"t{n}"] = (before, time.time())
            if not await asyncio.to_thread(seen.wait, PRODUCER_TIMEOUT):
                raise TimeoutError(f"task t{n} did not start in {PRODUCER_TIMEOUT} s")
    sent.put({ref: at for ref, at in times.items() if not ref.startswith("t-")})


def procrastinate_timing_app(
    url: str, started: dict[str, float], seen: Callable[[], None]
) -> procrastinate.App:
    app = procrastinate_app(url)

    @app.task(name="timed")
    async def timed(ref: str) -> None:
        started[ref] = time.time()
        seen()

    return app


async def enqueue_to_start(case: str, url: str, samples: int) -> Latency:
    """An idle headrace worker here; a producer in a process of its own submits one task at a
    time, so the worker learns of each from the store (NOTIFY on PostgreSQL, a datagram beside
    the file on SQLite)."""
    started: dict[str, float] = {}
    seen, sent = SPAWN.Event(), SPAWN.Queue()
    worker_app = timing_app(url, started, seen.set)
    async with worker_app:  # creates the schema before the producer starts
        worker = hr.Worker(worker_app, slots=SLOTS, idle="1s")
        running = asyncio.create_task(worker.run())
        try:
            times = await _producer("headrace", url, samples, seen, sent)
        finally:
            worker.stop()
            await running
    return _latency(case, times, started)


async def procrastinate_enqueue_to_start(url: str, samples: int) -> Latency:
    """The same with an idle Procrastinate worker of as many slots, woken by its own NOTIFY."""
    started: dict[str, float] = {}
    seen, sent = SPAWN.Event(), SPAWN.Queue()
    app = procrastinate_timing_app(url, started, seen.set)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        running = asyncio.create_task(
            app.run_worker_async(
                concurrency=SLOTS, install_signal_handlers=False, listen_notify=True
            )
        )
        try:
            times = await _producer("procrastinate", url, samples, seen, sent)
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
    return _latency("procrastinate (postgres)", times, started)


async def _producer(
    peer: str, url: str, samples: int, seen: EventType, sent: QueueType[Sent]
) -> Sent:
    producer = SPAWN.Process(target=produce, args=(peer, url, samples, seen, sent))
    producer.start()
    try:
        times: Sent = await asyncio.to_thread(sent.get, True, 60 + samples)
    finally:
        await asyncio.to_thread(producer.join, PRODUCER_TIMEOUT)
    return times


def _latency(case: str, times: Sent, started: dict[str, float]) -> Latency:
    waits = [(started[ref] - before) * 1000 for ref, (before, _) in times.items()]
    submits = [(after - before) * 1000 for before, after in times.values()]
    queued = [(started[ref] - after) * 1000 for ref, (_, after) in times.items()]
    return Latency(
        case,
        len(times),
        _ms(waits, 0.5),
        _ms(waits, 0.99),
        submit_p50_ms=_ms(submits, 0.5),
        queued_p50_ms=_ms(queued, 0.5),
    )


def _ms(values: list[float], q: float) -> float:
    return round(percentile(values, q), 2)


# -- claim cost against the size of the queue


async def claim_cost(url: str, ready: int, claims: int) -> ClaimCost:
    store = PostgresStore.from_url(url)
    await store.open(Settings())
    try:
        for start in range(0, ready, 5000):
            batch = [NewTask("noop", f"r{i}") for i in range(start, min(ready, start + 5000))]
            await store.submit(batch)
        costs = []
        for _ in range(claims):
            began = time.perf_counter()
            result = await store.claim("bench", SLOTS, lease_for=300.0)
            costs.append((time.perf_counter() - began) * 1000)
            assert len(result.leases) == SLOTS
        return ClaimCost(
            ready, claims, round(percentile(costs, 0.5), 2), round(percentile(costs, 0.99), 2)
        )
    finally:
        await store.close()


async def _in_database(prefix: str, body: Callable[[str], Awaitable[T]]) -> T:
    async with FreshDatabase(prefix) as url:
        return await body(url)


async def measure(quick: bool) -> PostgresFigures:
    tasks = 2000 if quick else 10_000
    big = 10_000 if quick else 1_000_000
    with tempfile.TemporaryDirectory(prefix="headrace-bench-") as scratch:
        sqlite_url = f"sqlite:///{Path(scratch) / 'bench.db'}"
        sqlite_latency_url = f"sqlite:///{Path(scratch) / 'latency.db'}"
        throughput = [
            await _in_database("hr_pg", lambda u: headrace_rate("headrace postgres", u, tasks)),
            await headrace_rate("headrace sqlite", sqlite_url, tasks),
            await _in_database("procrastinate", lambda u: procrastinate_rate(u, tasks)),
        ]
        latency = [
            await _in_database("hr_lat", lambda u: enqueue_to_start("headrace postgres", u, 200)),
            await enqueue_to_start("headrace sqlite", sqlite_latency_url, 200),
            await _in_database("pc_lat", lambda u: procrastinate_enqueue_to_start(u, 200)),
        ]
    claims = [
        await _in_database("hr_small", lambda u: claim_cost(u, 1000, 50)),
        await _in_database("hr_big", lambda u: claim_cost(u, big, 50)),
    ]
    return PostgresFigures(throughput, latency, claims)


def postgres_figures(quick: bool) -> PostgresFigures:
    return asyncio.run(measure(quick))
