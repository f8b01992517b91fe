"""Worker processes sharing one SQLite file, with the provider simulator as the referee.

Real time on purpose: separate OS processes, real leases, a real kill -9. Each run is bounded
(a 2 s quota window, a handful of episodes).
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import pytest
from examples.studio_app import make_studio

from headrace.pipelines.providersim import STUDIO_QUOTAS
from headrace.store.protocol.types import AttemptOutcome, TaskState

from .processes import (
    Simulator,
    counts,
    everything,
    provider_sim,
    read,
    settled,
    start_worker,
    stop,
    studio_env,
    wait_until,
)

pytestmark = pytest.mark.realtime

WINDOW = "2s"
EPISODES = 3
SHOTS = 6  # StudioConfig().shots
TASKS_PER_EPISODE = 1 + 3 * SHOTS + 1  # script, image/speech/video per shot, assembly


def submit_episodes(env: dict[str, str], episodes: int) -> None:
    async def submit() -> None:
        studio = make_studio()
        async with studio.app:
            for n in range(1, episodes + 1):
                await studio.script.submit(f"ep{n}", group=f"ep{n}", key=f"ep{n}:script")

    with pytest.MonkeyPatch.context() as patch:
        for name in ("HEADRACE_DB", "HEADRACE_PROVIDER_URL", "HEADRACE_WINDOW"):
            patch.setenv(name, env[name])
        asyncio.run(submit())


def check_referee(simulator: Simulator) -> None:
    for provider, stats in simulator.stats().items():
        quota = STUDIO_QUOTAS[provider]
        assert stats["rejected"] == 0, provider
        assert isinstance(stats["max_in_window"], int)
        assert isinstance(stats["max_concurrent"], int)
        assert 0 < stats["max_in_window"] <= quota.rpm, provider
        assert 0 < stats["max_concurrent"] <= quota.concurrency, provider


def test_two_workers_on_one_file_never_exceed_a_gate(tmp_path: Path) -> None:
    db = tmp_path / "studio.db"
    with provider_sim(WINDOW) as simulator:
        env = studio_env(db, simulator, WINDOW)
        submit_episodes(env, EPISODES)
        workers = [start_worker(env, f"w{n}", "--slots", "3", "--idle", "0.1s") for n in (1, 2)]
        try:
            wait_until(lambda: settled(db), 90, "every task to reach an outcome")
        finally:
            for worker in workers:
                stop(worker)
        check_referee(simulator)
    assert [w.returncode for w in workers] == [0, 0]
    history = read(db, everything)
    assert {task.state for task, _ in history} == {TaskState.SUCCEEDED}
    assert len(history) == EPISODES * TASKS_PER_EPISODE
    assert {a.worker for _, runs in history for a in runs} == {"w1", "w2"}


def test_a_killed_worker_loses_nothing_and_duplicates_no_successor(tmp_path: Path) -> None:
    db = tmp_path / "studio.db"
    with provider_sim(WINDOW) as simulator:
        env = studio_env(db, simulator, WINDOW)
        submit_episodes(env, EPISODES)
        doomed = start_worker(env, "doomed", "--slots", "4", "--lease", "2s", "--idle", "0.1s")

        def busy() -> bool:
            found = counts(db)
            return found[TaskState.SUCCEEDED] >= 2 and found[TaskState.RUNNING] > 0

        try:
            wait_until(busy, 60, "the first worker to be mid-run")
        finally:
            stop(doomed, signal.SIGKILL)
        survivor = start_worker(env, "survivor", "--slots", "4", "--lease", "2s", "--idle", "0.1s")
        try:
            wait_until(lambda: settled(db), 90, "every task to reach an outcome")
        finally:
            stop(survivor)
        check_referee(simulator)
    history = read(db, everything)
    assert {task.state for task, _ in history} == {TaskState.SUCCEEDED}
    made = Counter((task.kind, task.ref) for task, _ in history)
    assert len(history) == EPISODES * TASKS_PER_EPISODE
    assert set(made.values()) == {1}  # every successor created exactly once
    outcomes = [a.outcome for _, runs in history for a in runs]
    assert AttemptOutcome.LEASE_EXPIRED in outcomes
    assert {a.worker for _, runs in history for a in runs} == {"doomed", "survivor"}
