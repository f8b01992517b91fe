"""OS processes sharing one SQLite file: the gate's cap and rate hold across them, an
idempotency key names one task whoever submits it, and a submit wakes another process's idle
worker.

In the gate test each process runs two workers that claim one task at a time, hold it briefly and
succeed. The store's attempt history records every grant (`started_at`) and release (`ended_at`)
on the store's clock; afterwards the test checks the gate's limits over it by brute force.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import anyio
import pytest

import headrace as hr
from headrace.policy import GateConfig, Rate, StoreError
from headrace.store.protocol.types import (
    AttemptOutcome,
    NewTask,
    Settings,
    TaskState,
)
from headrace.store.sqlite import SQLiteStore
from headrace.store.sqlite.wake import channel_directory

from .gatecheck import (
    claim_and_finish,
    most_in_flight,
    most_starts_in_a_window,
    run_processes,
)

pytestmark = [pytest.mark.anyio, pytest.mark.realtime]

GATE = GateConfig("provider:video", concurrency=2, rate=Rate(5, per=0.4))
SETTINGS = Settings(gates=(GATE,))
TASKS = 30
PROCESSES = 2
WORKERS_PER_PROCESS = 2
HOLD = 0.03  # seconds a worker keeps each task
KEYS = 40


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {})


def drain_queue(path: str, name: str, barrier: Barrier) -> None:
    """The body of one OS process: wait for the other, then drain the queue."""
    barrier.wait(timeout=30)
    asyncio.run(drain(Path(path), name))


def submit_keys(path: str, out: str, barrier: Barrier) -> None:
    """The body of one OS process: submit the same keyed tasks as the other, record the ids."""
    barrier.wait(timeout=30)
    ids = asyncio.run(submit_keyed(Path(path)))
    Path(out).write_text(json.dumps(ids))


async def submit_keyed(path: Path) -> list[int]:
    store = SQLiteStore(path)
    await store.open(SETTINGS)
    try:
        ids: list[int] = []
        for first in range(0, KEYS, 4):
            batch = [
                NewTask("render", f"shot-{k}", key=f"shot-{k}") for k in range(first, first + 4)
            ]
            ids += [submitted.id for submitted in await store.submit(batch)]
        return ids
    finally:
        await store.close()


def submit_one(path: str, barrier: Barrier) -> None:
    """The body of one OS process: submit one task and leave."""
    barrier.wait(timeout=30)
    asyncio.run(submit_render(Path(path)))


async def submit_render(path: Path) -> None:
    store = SQLiteStore(path)
    await store.open(Settings())
    try:
        await store.submit([NewTask("render", "woken")])
    finally:
        await store.close()


async def drain(path: Path, name: str) -> None:
    store = SQLiteStore(path)
    await store.open(SETTINGS)
    try:
        workers = (claim_and_finish(store, f"{name}/{i}", HOLD) for i in range(WORKERS_PER_PROCESS))
        await asyncio.gather(*workers)
    finally:
        await store.close()


async def test_two_processes_never_exceed_one_gate(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    store = SQLiteStore(path)
    await store.open(SETTINGS)
    try:
        batch = [NewTask("render", f"shot-{i}", gates=(GATE.name,)) for i in range(TASKS)]
        submitted = await store.submit(batch)
        args = [(str(path), f"p{i}") for i in range(PROCESSES)]
        codes = await anyio.to_thread.run_sync(run_processes, drain_queue, args)
        assert codes == [0] * PROCESSES
        records = [await store.get(s.id) for s in submitted]
        histories = [await store.attempts(s.id) for s in submitted]
        [stats] = await store.gate_statistics()
    finally:
        await store.close()

    assert all(record.state is TaskState.SUCCEEDED for record in records)
    assert all(len(history) == 1 for history in histories), "a task ran more than once"
    history = [attempt for attempts in histories for attempt in attempts]
    assert all(attempt.outcome is AttemptOutcome.SUCCEEDED for attempt in history)
    assert {attempt.worker.split("/")[0] for attempt in history} == {"p0", "p1"}
    assert GATE.concurrency is not None and GATE.rate is not None
    assert most_in_flight(history) <= GATE.concurrency
    assert most_starts_in_a_window(history, GATE.rate.window) <= GATE.rate.n
    assert (stats.in_flight, stats.granted) == (0, TASKS)
    # Both limits were pressed, not merely unreached.
    assert stats.blocked_by_concurrency > 0 and stats.blocked_by_token > 0


async def test_processes_submitting_one_key_share_one_task(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    store = SQLiteStore(path)
    await store.open(SETTINGS)
    try:
        outs = [tmp_path / f"ids-{i}.json" for i in range(PROCESSES)]
        args = [(str(path), str(out)) for out in outs]
        assert await anyio.to_thread.run_sync(run_processes, submit_keys, args) == [0] * PROCESSES
        records = await store.tasks()
    finally:
        await store.close()
    [first, second] = [json.loads(out.read_text()) for out in outs]
    assert first == second
    assert sorted(first) == sorted(record.id for record in records)
    assert sorted(str(record.key) for record in records) == sorted(f"shot-{k}" for k in range(KEYS))


async def test_a_lock_held_past_busy_timeout_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    store = SQLiteStore(path, busy_timeout=0.1)
    await store.open(SETTINGS)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreError, match="locked past busy_timeout"):
            await store.submit([NewTask("render", "blocked")])
        assert await store.counts()  # readers are not blocked by the writer
        blocker.execute("ROLLBACK")
        [submitted] = await store.submit([NewTask("render", "after")])
        assert submitted.created
    finally:
        blocker.close()
        await store.close()


async def test_a_submit_in_another_process_wakes_an_idle_worker(tmp_path: Path) -> None:
    path = tmp_path / "wake.db"
    # The file's data version is looked at once a minute and the worker claims every 30 s when
    # idle: a start within seconds can only come from the other process's wake-up.
    app = hr.App(f"sqlite:///{path}", store=SQLiteStore(path, data_version_poll=60.0))
    started = asyncio.Event()

    @app.task(name="render")
    async def render(ctx: hr.Context, ref: str) -> None:
        started.set()

    async with app:
        worker = hr.Worker(app, slots=1, idle="30s")
        running = asyncio.create_task(worker.run())
        try:
            await anyio.to_thread.run_sync(until_listening, path)
            await asyncio.sleep(0.5)  # past the wait's first look at the data version
            codes = await anyio.to_thread.run_sync(run_processes, submit_one, [(str(path),)])
            assert codes == [0]
            await asyncio.wait_for(started.wait(), 10.0)
        finally:
            worker.stop()
            await running


def until_listening(path: Path, within: float = 10.0) -> None:
    """Return once a process has bound its wake-up socket for `path`."""
    directory = channel_directory(path)
    deadline = time.monotonic() + within
    while not any(directory.glob("*.sock")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nobody listens in {directory}")
        time.sleep(0.01)
