"""`headrace worker` on SIGTERM: stop claiming, let running tasks finish within the grace
period, hand the rest back; nothing is lost. Real time on purpose: a real signal."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headrace.store.protocol.types import TaskState
from tests.integration.slow_app import make_app

from .processes import ROOT, counts, read, stop, wait_until

pytestmark = pytest.mark.realtime


def submit(tasks: int, kind: str = "slow") -> None:
    async def run() -> None:
        app = make_app()
        definition = app.definition(kind)
        async with app:
            for n in range(tasks):
                await definition.submit(f"t{n}")

    asyncio.run(run())


def start(env: dict[str, str], *options: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "headrace", "worker", "tests.integration.slow_app:make_app"]
    return subprocess.Popen([*command, "--idle", "0.1s", *options], cwd=ROOT, env=env, text=True)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("HEADRACE_DB", f"sqlite:///{tmp_path / 'slow.db'}")
    return dict(os.environ)


def running(db: Path, n: int) -> bool:
    return counts(db)[TaskState.RUNNING] == n


def signal_when_busy(
    env: dict[str, str], db: Path, grace: str, signals: int = 1, within: float = 20
) -> None:
    """Start a 2-slot worker, SIGTERM it (`signals` times, half a second apart) once both slots
    are busy, and require a clean exit within `within` seconds of the last signal."""
    worker = start(env, "--slots", "2", "--grace", grace)
    try:
        wait_until(lambda: running(db, 2), 20, "two running tasks")
        for n in range(signals):
            if n:
                time.sleep(0.5)
            worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=within) == 0
    finally:
        stop(worker, signal.SIGKILL)


def test_sigterm_lets_running_tasks_finish_and_claims_nothing_more(
    tmp_path: Path, env: dict[str, str]
) -> None:
    db = tmp_path / "slow.db"
    env["SLOW_SECONDS"] = "1.5"
    submit(4)
    signal_when_busy(env, db, "20s")
    found = counts(db)
    assert found[TaskState.SUCCEEDED] == 2
    assert found[TaskState.READY] == 2
    assert found[TaskState.RUNNING] == 0


def test_past_the_grace_period_running_tasks_are_handed_back(
    tmp_path: Path, env: dict[str, str]
) -> None:
    db = tmp_path / "slow.db"
    env["SLOW_SECONDS"] = "600"
    submit(2)
    signal_when_busy(env, db, "0.5s")
    tasks = read(db, lambda store: store.tasks())
    assert {t.state for t in tasks} == {TaskState.READY}
    assert {t.error_code for t in tasks} == {"interrupted"}


def test_a_second_signal_does_not_wait_for_the_grace_period(
    tmp_path: Path, env: dict[str, str]
) -> None:
    db = tmp_path / "slow.db"
    env["SLOW_SECONDS"] = "600"
    submit(2)
    signal_when_busy(env, db, "120s", signals=2)
    tasks = read(db, lambda store: store.tasks())
    assert {t.state for t in tasks} == {TaskState.READY}


def test_a_sync_handler_that_never_returns_does_not_keep_the_worker_past_its_grace(
    tmp_path: Path, env: dict[str, str]
) -> None:
    db = tmp_path / "slow.db"
    submit(2, kind="stuck")
    signal_when_busy(env, db, "1s", within=10)
    tasks = read(db, lambda store: store.tasks())
    assert {t.state for t in tasks} == {TaskState.READY}
    assert {t.error_code for t in tasks} == {"interrupted"}


def test_a_second_signal_ends_a_worker_whose_sync_handler_never_returns(
    tmp_path: Path, env: dict[str, str]
) -> None:
    db = tmp_path / "slow.db"
    submit(2, kind="stuck")
    signal_when_busy(env, db, "120s", signals=2, within=10)
    assert counts(db)[TaskState.READY] == 2


def test_an_attempt_past_its_time_limit_fails_and_frees_its_slot(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """A sync handler stuck for good: with `--timeout` its attempts fail as `timeout` (the slot
    and the task's tickets return; the thread cannot be stopped) until its attempts are spent,
    and the worker still exits at once when told."""
    db = tmp_path / "slow.db"
    submit(1, kind="stuck")
    worker = start(env, "--slots", "1", "--timeout", "0.5s", "--grace", "1s")
    try:
        wait_until(lambda: counts(db)[TaskState.DEAD] == 1, 20, "the task to spend its attempts")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=10) == 0
    finally:
        stop(worker, signal.SIGKILL)
    [task] = read(db, lambda store: store.tasks())
    attempts = read(db, lambda store: store.attempts(task.id))
    assert [a.code for a in attempts] == ["timeout", "timeout"]
