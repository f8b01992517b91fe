"""Worker processes under a supervisor that restarts them, on SQLite and on PostgreSQL, run 500
tasks of which 1 % kill their worker outright: every poison task is dead after at most three
crashes it caused, and no healthy task is dead or lost for dying beside one. Real time on
purpose: real processes die and real leases expire."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import (
    ACTIVE,
    Attempt,
    AttemptOutcome,
    Settings,
    TaskRecord,
    TaskState,
)
from headrace.store.urls import open_store
from tests.integration import poison_app

from .postgres import fresh_schema
from .processes import ROOT, stop

pytestmark = pytest.mark.realtime

TASKS = 500
POISONS = 5  # 1 %
WORKERS = 2
DEADLINE = 150.0


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'poison.db'}"
        return
    with fresh_schema("poison") as fresh:
        yield fresh


def read(url: str) -> list[tuple[TaskRecord, list[Attempt]]]:
    async def run() -> list[tuple[TaskRecord, list[Attempt]]]:
        store: Store = open_store(url)
        await store.open(Settings())
        try:
            return [(t, await store.attempts(t.id)) for t in await store.tasks(limit=100_000)]
        finally:
            await store.close()

    return asyncio.run(run())


def settled(url: str) -> bool:
    async def run() -> bool:
        store: Store = open_store(url)
        await store.open(Settings())
        try:
            counts = await store.counts()
        finally:
            await store.close()
        return sum(counts.values()) == TASKS and not any(counts[s] for s in ACTIVE)

    return asyncio.run(run())


def submit(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADRACE_DB", url)
    every = TASKS // POISONS
    refs = [
        f"{poison_app.POISON}-{n:03d}" if n % every == every // 2 else f"task-{n:03d}"
        for n in range(TASKS)
    ]

    async def run() -> None:
        app = poison_app.make_app()
        work = app.definition("work")
        async with app:
            await app.submit([work.spec(ref) for ref in refs])

    asyncio.run(run())


def start(url: str, generation: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "headrace", "worker", "tests.integration.poison_app:make_app"]
    options = ["--name", f"w{generation}", "--slots", "4", "--lease", "1s", "--idle", "0.2s"]
    return subprocess.Popen(
        [*command, *options],
        cwd=ROOT,
        env={**os.environ, "HEADRACE_DB": url},
        text=True,
        stderr=subprocess.DEVNULL,
    )


def supervise(url: str) -> int:
    """Keep WORKERS processes running, starting a new one for each that died, until every
    task has an outcome; return how many died."""
    generation = 0
    workers: list[subprocess.Popen[str]] = []
    deaths = 0
    deadline = time.monotonic() + DEADLINE
    try:
        while time.monotonic() < deadline:
            alive = [worker for worker in workers if worker.poll() is None]
            deaths += len(workers) - len(alive)
            while len(alive) < WORKERS:
                alive.append(start(url, generation))
                generation += 1
            workers = alive
            if settled(url):
                return deaths
            time.sleep(0.25)
        raise AssertionError(f"the tasks did not all reach an outcome in {DEADLINE:g}s")
    finally:
        for worker in workers:
            stop(worker)


@pytest.mark.timeout(240)
def test_poison_tasks_die_within_three_crashes_and_no_neighbour_with_them(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    submit(url, monkeypatch)
    deaths = supervise(url)
    history = read(url)
    assert len(history) == TASKS
    poison = [(t, a) for t, a in history if t.ref.startswith(poison_app.POISON)]
    healthy = [(t, a) for t, a in history if not t.ref.startswith(poison_app.POISON)]
    assert len(poison) == POISONS
    for task, attempts in poison:
        crashes = [a for a in attempts if a.outcome is AttemptOutcome.LEASE_EXPIRED]
        assert task.state is TaskState.DEAD and task.error_code == "poison_lease_expired", task
        assert len(crashes) <= 3, (task.ref, [(a.worker, a.outcome.value) for a in attempts])
    assert {task.state for task, _ in healthy} == {TaskState.SUCCEEDED}
    assert 0 < deaths <= 3 * POISONS
