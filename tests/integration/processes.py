"""Real processes for integration tests: the provider simulator and `headrace worker`s."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import ACTIVE, Attempt, Settings, TaskRecord, TaskState
from headrace.store.sqlite import SQLiteStore

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
STUDIO_APP = "examples.studio_app:make_app"


@dataclass
class Simulator:
    process: subprocess.Popen[str]
    url: str

    def stats(self) -> dict[str, dict[str, object]]:
        """The referee's figures per provider."""
        with urllib.request.urlopen(f"{self.url}/sim/stats", timeout=5) as response:
            providers: dict[str, dict[str, object]] = json.load(response)["providers"]
        return providers


VENDOR_PRIORITY = -10


@contextmanager
def provider_sim(window: str, *options: str) -> Iterator[Simulator]:
    command = [sys.executable, "-m", "headrace", "provider-sim", "--port", "0", "--window", window]
    command += options
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    # The simulator stands for a vendor on hardware of its own: its clock of arrivals should not
    # stall with the load the test puts on this machine's two cores (a stalled referee records
    # a backlog of calls as arriving together). Where allowed (root, as in CI), it runs ahead
    # of the workers; elsewhere at their priority.
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, process.pid, VENDOR_PRIORITY)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = re.search(r"(http://\S+)", line)
        assert found, f"the simulator did not announce its address: {line!r}"
        yield Simulator(process, found[1])
    finally:
        stop(process)
        if process.stdout is not None:
            process.stdout.close()


def studio_env(db: Path, simulator: Simulator, window: str) -> dict[str, str]:
    return {
        **os.environ,
        "HEADRACE_DB": f"sqlite:///{db}",
        "HEADRACE_PROVIDER_URL": simulator.url,
        "HEADRACE_WINDOW": window,
    }


def start_worker(env: dict[str, str], name: str, *options: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "headrace", "worker", STUDIO_APP, "--name", name, *options]
    return subprocess.Popen(command, cwd=ROOT, env=env, text=True)


def stop(process: subprocess.Popen[str], sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def read(db: Path, query: Callable[[Store], Awaitable[T]]) -> T:
    """Run one read against the SQLite file, as another process would."""

    async def run() -> T:
        store = SQLiteStore(db)
        await store.open(Settings())
        try:
            return await query(store)
        finally:
            await store.close()

    return asyncio.run(run())


def counts(db: Path) -> dict[TaskState, int]:
    return read(db, lambda store: store.counts())


async def everything(store: Store) -> list[tuple[TaskRecord, list[Attempt]]]:
    return [(task, await store.attempts(task.id)) for task in await store.tasks(limit=100_000)]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def settled(db: Path) -> bool:
    found = counts(db)
    return sum(found.values()) > 0 and not any(found[state] for state in ACTIVE)
