"""Many worker processes on one PostgreSQL, one of them killed with -9 over and over, sharing
one provider gate; the provider simulator referees the gate. Real time on purpose."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from headrace.store.postgres import PostgresStore
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import (
    ACTIVE,
    Attempt,
    AttemptOutcome,
    Settings,
    TaskRecord,
    TaskState,
)
from tests.integration import fleet_app

from .postgres import fresh_schema
from .processes import ROOT, Simulator, provider_sim, stop

pytestmark = pytest.mark.realtime

PARENTS = 500  # each spawns three: 2,000 tasks, 500 of them through the gate
WORKERS = 4
KILL_EVERY = (2.0, 4.0)


def read(url: str) -> list[tuple[TaskRecord, list[Attempt]]]:
    async def run() -> list[tuple[TaskRecord, list[Attempt]]]:
        store = PostgresStore.from_url(url)
        await store.open(Settings())
        try:
            return [(t, await store.attempts(t.id)) for t in await store.tasks(limit=100_000)]
        finally:
            await store.close()

    return asyncio.run(run())


def counts(url: str) -> dict[TaskState, int]:
    async def run() -> dict[TaskState, int]:
        store: Store = PostgresStore.from_url(url)
        await store.open(Settings())
        try:
            return await store.counts()
        finally:
            await store.close()

    return asyncio.run(run())


def submit_parents(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADRACE_DB", url)

    async def run() -> None:
        app = fleet_app.make_app()
        parent = app.definition("parent")
        async with app:
            await app.submit([parent.spec(f"p{n:04d}", key=f"p{n:04d}") for n in range(PARENTS)])

    asyncio.run(run())


def worker(env: dict[str, str], name: str, lease: str) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-m",
        "headrace",
        "worker",
        "tests.integration.fleet_app:make_app",
        "--name",
        name,
        "--slots",
        "4",
        "--lease",
        lease,
        "--idle",
        "0.5s",
    ]
    return subprocess.Popen(command, cwd=ROOT, env=env, text=True, stderr=subprocess.DEVNULL)


@pytest.fixture
def url() -> Iterator[str]:
    with fresh_schema("fleet") as fresh:
        yield fresh


def run_fleet(url: str, simulator: Simulator, deadline: float) -> int:
    env = {**os.environ, "HEADRACE_DB": url, "HEADRACE_PROVIDER_URL": simulator.url}
    # The doomed worker's short lease makes its lost tasks come back soon; the fleet's longer
    # one keeps a busy survivor from losing a task it is still working on.
    fleet = [worker(env, f"fleet-{n}", "10s") for n in range(WORKERS)]
    kills = 0
    try:
        while time.monotonic() < deadline:
            doomed = worker(env, f"doomed-{kills}", "2s")
            time.sleep(KILL_EVERY[kills % 2])
            stop(doomed, signal.SIGKILL)
            kills += 1
            found = counts(url)
            if sum(found.values()) and not any(found[s] for s in ACTIVE):
                return kills
        raise AssertionError("the fleet did not finish in time")
    finally:
        for process in fleet:
            stop(process)


@pytest.mark.timeout(420)
def test_a_fleet_with_a_worker_killed_over_and_over_keeps_every_limit(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    submit_parents(url, monkeypatch)
    with provider_sim("6s", "--quota", "image=30/3") as simulator:
        kills = run_fleet(url, simulator, time.monotonic() + 360)
        referee = simulator.stats()["image"]
    assert kills >= 3
    assert referee["rejected"] == 0, referee
    assert referee["max_concurrent"] == fleet_app.CONCURRENCY
    assert referee["max_in_window"] == fleet_app.RATE

    history = read(url)
    assert {task.state for task, _ in history} == {TaskState.SUCCEEDED}
    assert len(history) == PARENTS * 4
    assert set(Counter((task.kind, task.ref) for task, _ in history).values()) == {1}
    for task, attempts in history:
        again = attempts[:-1]  # every attempt but the last was lost with its holder
        lost = [(a.worker, a.outcome.value, a.code, a.message) for a in again]
        assert all(a.outcome is AttemptOutcome.LEASE_EXPIRED for a in again), (task.ref, lost)
        assert all(a.worker.startswith("doomed-") for a in again), (task.ref, lost)
        assert attempts[-1].outcome is AttemptOutcome.SUCCEEDED
