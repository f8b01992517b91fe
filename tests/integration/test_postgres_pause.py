"""A worker paused past its lease (SIGSTOP, then SIGCONT) has every late write refused: the
task's new owner keeps its outcome. Real time on purpose: a real signal, a real lease."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from headrace.store.protocol.types import AttemptOutcome, TaskState
from tests.integration.slow_app import make_app

from .postgres import fresh_schema, read_store, settled
from .processes import ROOT, stop, wait_until

pytestmark = pytest.mark.realtime


@pytest.fixture
def url() -> Iterator[str]:
    with fresh_schema("pause") as fresh:
        yield fresh


def start(env: dict[str, str], name: str, *, listen: bool = False) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "headrace", "worker", "tests.integration.slow_app:make_app"]
    options = ["--name", name, "--slots", "1", "--lease", "2s", "--idle", "0.1s"]
    return subprocess.Popen(
        [*command, *options],
        cwd=ROOT,
        env=env,
        text=True,
        stderr=subprocess.PIPE if listen else None,
    )


def submit_one(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADRACE_DB", url)

    async def run() -> None:
        app = make_app()
        async with app:
            await app.definition("slow").submit("only")

    asyncio.run(run())


def holding(url: str) -> bool:
    return read_store(url, lambda store: store.counts())[TaskState.RUNNING] == 1


def test_a_paused_worker_has_its_late_writes_refused(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    submit_one(url, monkeypatch)
    env = {**os.environ, "HEADRACE_DB": url, "SLOW_SECONDS": "3"}
    paused = start(env, "paused", listen=True)
    owner: subprocess.Popen[str] | None = None
    try:
        wait_until(lambda: holding(url), 20, "the first worker to hold the task")
        paused.send_signal(signal.SIGSTOP)
        owner = start(env, "owner")
        wait_until(lambda: settled(url), 30, "the second worker to finish the task")
        paused.send_signal(signal.SIGCONT)
        time.sleep(3.0)  # its handler's sleep ends; its renewal and its outcome come in late
    finally:
        paused.send_signal(signal.SIGCONT)
        stop(paused)
        if owner is not None:
            stop(owner)
    _, complaints = paused.communicate(timeout=10)
    [task] = read_store(url, lambda s: s.tasks())
    attempts = read_store(url, lambda s: s.attempts(task.id))
    assert task.state is TaskState.SUCCEEDED
    assert [(a.worker, a.outcome) for a in attempts] == [
        ("paused", AttemptOutcome.LEASE_EXPIRED),
        ("owner", AttemptOutcome.SUCCEEDED),
    ]
    assert "lease lost" in complaints
