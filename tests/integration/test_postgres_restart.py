"""`pg_ctl restart -m fast` in the middle of a run: the workers reconnect and finish, nothing is
lost and no slot is left dead. Real time on purpose: a real server restart."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import Attempt, AttemptOutcome, TaskState
from tests.integration.slow_app import make_app

from .postgres import fresh_schema, reachable, read_store, settled
from .processes import ROOT, stop, wait_until

pytestmark = [pytest.mark.realtime, pytest.mark.server_restart]

TASKS = 400
SLOTS = 4


def restart_server() -> None:
    """Restart this machine's PostgreSQL cluster with a fast shutdown."""
    [version] = os.listdir("/etc/postgresql")
    command = ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"]
    subprocess.run([*command, "--", "-m", "fast"], check=True, capture_output=True, timeout=60)


@pytest.fixture
def url() -> Iterator[str]:
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        pytest.skip(
            "restarting PostgreSQL would end the sessions of the tests running beside it: "
            "run it alone (`pytest -m server_restart`, as .ci/run does)"
        )
    if shutil.which("pg_ctlcluster") is None or not Path("/etc/postgresql").is_dir():
        if os.environ.get("CI"):
            pytest.fail("pg_ctlcluster is needed to restart PostgreSQL", pytrace=False)
        pytest.skip("no pg_ctlcluster here to restart PostgreSQL with")
    with fresh_schema("restart") as fresh:
        yield fresh


def submit(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADRACE_DB", url)

    async def run() -> None:
        app = make_app()
        slow = app.definition("slow")
        async with app:
            await app.submit([slow.spec(f"t{n}") for n in range(TASKS)])

    asyncio.run(run())


def start(env: dict[str, str], name: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "headrace", "worker", "tests.integration.slow_app:make_app"]
    options = ["--name", name, "--slots", str(SLOTS), "--lease", "10s", "--idle", "0.2s"]
    return subprocess.Popen([*command, *options], cwd=ROOT, env=env, text=True)


def succeeded(url: str) -> int:
    return read_store(url, lambda store: store.counts())[TaskState.SUCCEEDED]


def busiest(attempts: list[Attempt], worker: str, after: float) -> int:
    """The most attempts `worker` had running at once among those it started after `after`."""
    mine = [a for a in attempts if a.worker == worker and a.started_at >= after]
    ends = [a.ended_at or a.started_at for a in mine]
    return max(
        (
            sum(1 for b, end in zip(mine, ends, strict=True) if b.started_at <= a.started_at < end)
            for a in mine
        ),
        default=0,
    )


def test_a_server_restart_mid_run_loses_nothing(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    submit(url, monkeypatch)
    env = {**os.environ, "HEADRACE_DB": url, "SLOW_SECONDS": "0.1"}
    workers = [start(env, f"w{n}") for n in range(2)]
    try:
        wait_until(lambda: succeeded(url) >= TASKS // 4, 60, "a quarter of the tasks")
        restart_server()
        restarted_at = time.time()
        reachable()
        wait_until(lambda: settled(url), 120, "every task to reach an outcome after the restart")
    finally:
        for worker in workers:
            stop(worker)
    assert [w.returncode for w in workers] == [0, 0]
    tasks = read_store(url, lambda s: s.tasks(limit=10_000))
    assert len(tasks) == TASKS
    assert {t.state for t in tasks} == {TaskState.SUCCEEDED}

    async def every_attempt(store: Store) -> list[Attempt]:
        return [a for task in tasks for a in await store.attempts(task.id)]

    attempts = read_store(url, every_attempt)
    lost = [a for a in attempts if a.outcome is not AttemptOutcome.SUCCEEDED]
    assert all(a.outcome is AttemptOutcome.LEASE_EXPIRED for a in lost)
    for name in ("w0", "w1"):
        # Every slot works again. An attempt stays open until its outcome is written, which a
        # slot's next attempt may overlap: up to twice as many open at once, never more.
        assert SLOTS <= busiest(attempts, name, restarted_at) <= 2 * SLOTS
