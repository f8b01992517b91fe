"""OS processes sharing one PostgreSQL store, on the server's clock (no test clock): one gate's
cap and rate hold across them, an idempotency key names one task whoever submits it, a waiting
task is reconciled by a store opened after its process is gone, LISTEN/NOTIFY wakes an idle
waiter, and lost connections are replaced without the caller seeing an error.

In the gate test each process runs two workers that claim one task at a time, hold it briefly and
succeed. The attempt history records every grant (`started_at`) and release (`ended_at`) on the
server's clock; afterwards the test checks the gate's limits over it by brute force.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from headrace.policy import GateConfig, Rate
from headrace.store.postgres import PostgresStore
from headrace.store.protocol.types import (
    AttemptOutcome,
    AwaitRemote,
    NewTask,
    Settings,
    Succeeded,
    TaskState,
)
from tests.conformance.conftest import drop_schemas, postgres_reachable

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


@pytest.fixture
def url() -> Iterator[str]:
    """A store URL on a schema of the test's own, dropped after it."""
    dsn = postgres_reachable()
    schema = f"headrace_proc_{uuid.uuid4().hex[:10]}"
    separator = "&" if "?" in dsn else "?"
    yield f"{dsn}{separator}schema={schema}"
    drop_schemas({schema})


# -- the bodies of the spawned processes


def drain_queue(url: str, name: str, barrier: Barrier) -> None:
    """Wait for the other processes, then drain the queue."""
    barrier.wait(timeout=30)
    asyncio.run(drain(url, name))


async def drain(url: str, name: str) -> None:
    store = PostgresStore.from_url(url)
    await store.open(SETTINGS)
    try:
        await asyncio.gather(
            *(claim_and_finish(store, f"{name}/{i}", HOLD) for i in range(WORKERS_PER_PROCESS))
        )
    finally:
        await store.close()


def submit_keys(url: str, out: str, barrier: Barrier) -> None:
    """Submit the same keyed tasks as the other process; record the ids."""
    barrier.wait(timeout=30)
    Path(out).write_text(json.dumps(asyncio.run(submit_keyed(url))))


async def submit_keyed(url: str) -> list[int]:
    store = PostgresStore.from_url(url)
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


def start_remote_job(url: str, barrier: Barrier) -> None:
    """Submit a task, run it up to its remote job, and exit: the job outlives the process."""
    barrier.wait(timeout=30)

    async def run() -> None:
        store = PostgresStore.from_url(url)
        await store.open(SETTINGS)
        try:
            await store.submit([NewTask("render", "clip", gates=(GATE.name,), key="clip")])
            [lease] = (await store.claim("gone", 1, lease_for=30.0)).leases
            await store.finish(lease, AwaitRemote("job-7", poll_every=0.2))
        finally:
            await store.close()

    asyncio.run(run())


# -- the tests


async def test_two_processes_never_exceed_one_gate(url: str) -> None:
    store = PostgresStore.from_url(url)
    await store.open(SETTINGS)
    try:
        batch = [NewTask("render", f"shot-{i}", gates=(GATE.name,)) for i in range(TASKS)]
        submitted = await store.submit(batch)
        args = [(url, f"p{i}") for i in range(PROCESSES)]
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


async def test_processes_submitting_one_key_share_one_task(url: str, tmp_path: Path) -> None:
    store = PostgresStore.from_url(url)
    await store.open(SETTINGS)
    try:
        outs = [tmp_path / f"ids-{i}.json" for i in range(PROCESSES)]
        args = [(url, str(out)) for out in outs]
        assert await anyio.to_thread.run_sync(run_processes, submit_keys, args) == [0] * PROCESSES
        records = await store.tasks()
    finally:
        await store.close()
    [first, second] = [json.loads(out.read_text()) for out in outs]
    assert first == second
    assert sorted(first) == sorted(record.id for record in records)
    assert sorted(str(record.key) for record in records) == sorted(f"shot-{k}" for k in range(KEYS))


async def test_a_waiting_task_is_reconciled_after_its_process_is_gone(url: str) -> None:
    assert await anyio.to_thread.run_sync(run_processes, start_remote_job, [(url,)]) == [0]
    restarted = PostgresStore.from_url(url)
    await restarted.open(SETTINGS)
    try:
        task = await restarted.find("clip")
        assert task is not None and task.state is TaskState.WAITING
        polls = await restarted.claim_polls("w2", 5, lease_for=5.0)
        if not polls.leases:  # the poll is not due yet: wait for it on the server's clock
            assert polls.wake_at is not None
            await asyncio.sleep(max(0.0, polls.wake_at - polls.now) + 0.05)
            polls = await restarted.claim_polls("w2", 5, lease_for=5.0)
        [poll] = polls.leases
        assert (poll.task.id, poll.task.remote_id) == (task.id, "job-7")  # not resubmitted
        assert (await restarted.claim("w2", 5, lease_for=5.0)).leases == ()
        [stats] = await restarted.gate_statistics()
        assert stats.in_flight == 1  # the remote job still holds its ticket
        await restarted.finish(poll, Succeeded())
        [attempt] = await restarted.attempts(task.id)
        assert attempt.outcome is AttemptOutcome.SUCCEEDED and attempt.worker == "gone"
        assert [s.in_flight for s in await restarted.gate_statistics()] == [0]
    finally:
        await restarted.close()


async def test_a_submit_elsewhere_wakes_an_idle_waiter_at_once(url: str) -> None:
    idle = PostgresStore.from_url(url)
    other = PostgresStore.from_url(url)
    await idle.open(SETTINGS)
    await other.open(SETTINGS)
    try:
        await idle.wait_for_work(0.3)  # opens the listening connection
        begun = time.monotonic()
        waiting = asyncio.create_task(idle.wait_for_work(20.0))
        await asyncio.sleep(0.1)
        await other.submit([NewTask("render", "wake-up")])
        await asyncio.wait_for(waiting, 5.0)
        woke_after = time.monotonic() - begun
        quiet = time.monotonic()
        await idle.wait_for_work(0.2)  # nothing new: the poll fallback
        assert time.monotonic() - quiet >= 0.19
    finally:
        await idle.close()
        await other.close()
    assert woke_after < 2.0, f"woke after {woke_after:.2f}s of a 20s wait"


async def test_a_dropped_listener_reconnects(url: str) -> None:
    idle = PostgresStore.from_url(url)
    await idle.open(SETTINGS)
    try:
        await idle.wait_for_work(0.3)
        assert terminate(f"headrace-listen/{idle.schema}") == 1
        # Back on a new connection, the listener wakes its waiter: notices may have been missed.
        await asyncio.wait_for(idle.wait_for_work(20.0), 5.0)
        waiting = asyncio.create_task(idle.wait_for_work(20.0))
        await asyncio.sleep(0.1)
        await idle.submit([NewTask("render", "after-the-drop")])
        await asyncio.wait_for(waiting, 5.0)
    finally:
        await idle.close()


async def test_connections_lost_under_the_pool_are_replaced_unseen(url: str) -> None:
    store = PostgresStore.from_url(url)
    await store.open(SETTINGS)
    try:
        await store.submit([NewTask("render", "before")])
        # What a server restart does to every idle connection of the pool.
        assert terminate(f"headrace/{store.schema}") >= 1
        [after] = await store.submit([NewTask("render", "after")])
        assert after.created
        assert (await store.counts())[TaskState.READY] == 2
    finally:
        await store.close()


def terminate(application_name: str) -> int:
    """End the server sessions of one application name (as a restart would); how many."""
    with psycopg.connect(postgres_reachable(), autocommit=True) as conn:
        found = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            [application_name],
        ).fetchall()
    return len(found)
