"""Four `headrace worker` processes share one provider gate (3 at once, 30 per 6 s) with its
default settings, on SQLite and on PostgreSQL, while a busy loop takes a core: the provider
simulator, a strict referee that refuses any call over quota and records every arrival, must
refuse none and see no sliding window over 30. Real time on purpose: the lag between our stamp
of a call and its arrival at the vendor is what is tested."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.pipelines.providersim import most_in_a_window
from tests.integration import fleet_app

from .postgres import fresh_schema
from .processes import ROOT, Simulator, provider_sim, stop

pytestmark = pytest.mark.realtime

CALLS = 300
WORKERS = 4
WINDOW = 6.0
DEADLINE = 150.0  # ten windows of work, with room for a slow machine


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'quota.db'}"
        return
    with fresh_schema("quota") as fresh:
        yield fresh


@pytest.fixture
def busy_core() -> Iterator[None]:
    """A process that spins for the whole test: the machine is loaded."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"], text=True)
    try:
        yield
    finally:
        stop(spinner, signal.SIGKILL)


def submit_calls(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADRACE_DB", url)

    async def run() -> None:
        app = fleet_app.make_app()
        call = app.definition("call")
        async with app:
            await app.submit([call.spec(f"c{n:03d}") for n in range(CALLS)])

    asyncio.run(run())


def start_workers(url: str, simulator: Simulator) -> list[subprocess.Popen[str]]:
    env = {**os.environ, "HEADRACE_DB": url, "HEADRACE_PROVIDER_URL": simulator.url}
    command = [sys.executable, "-m", "headrace", "worker", "tests.integration.fleet_app:make_app"]
    return [
        subprocess.Popen(
            [*command, "--name", f"w{n}", "--slots", "4"],
            cwd=ROOT,
            env=env,
            text=True,
            stderr=subprocess.DEVNULL,
        )
        for n in range(WORKERS)
    ]


def arrivals(simulator: Simulator) -> list[tuple[float, bool]]:
    with urllib.request.urlopen(f"{simulator.url}/sim/arrivals", timeout=5) as response:
        found: dict[str, list[tuple[float, bool]]] = json.load(response)
    return [(float(at), bool(accepted)) for at, accepted in found["image"]]


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("busy_core")
def test_four_workers_keep_the_vendors_quota_with_default_settings(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    submit_calls(url, monkeypatch)
    options = ("--quota", "image=30/3", "--latency", "image=0.2..0.5")
    with provider_sim(f"{WINDOW:g}s", *options) as simulator:
        workers = start_workers(url, simulator)
        try:
            deadline = time.monotonic() + DEADLINE
            while len(arrivals(simulator)) < CALLS and time.monotonic() < deadline:
                time.sleep(0.5)
            seen = arrivals(simulator)
            referee = simulator.stats()["image"]
        finally:
            for worker in workers:
                stop(worker)
    refused = [at for at, accepted in seen if not accepted]
    assert refused == [], f"{len(refused)} calls over quota: {referee}"
    assert len(seen) == CALLS, f"{len(seen)} of {CALLS} calls made in {DEADLINE:g}s"
    assert most_in_a_window([at for at, _ in seen], WINDOW) == fleet_app.RATE
    assert referee["max_concurrent"] == fleet_app.CONCURRENCY
