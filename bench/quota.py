"""The vendor's view of a shared quota: four `headrace worker` processes share one provider
gate (3 at once, 30 per 6 s, default settings) and make 300 calls of 0.2-0.5 s to the provider
simulator, which refuses any call over quota and records every arrival. Reported: the calls it
refused, the most arrivals in any 6 s window, and the makespan against an ideal limiter that
knows every arrival exactly (greedy: each call starts at the first moment that keeps 3 at once
and 30 per window, with the same call durations), on SQLite and PostgreSQL, idle and with a
busy loop taking a core.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from bench import quota_app
from headrace.pipelines.providersim import most_in_a_window

ROOT = Path(__file__).resolve().parents[1]
SERVER = "postgresql://postgres@127.0.0.1:5432/test"
CALLS = 300
WORKERS = 4
LOW, HIGH = 0.2, 0.5
SEED = 0
DEADLINE = 240.0


@dataclass(frozen=True)
class QuotaRun:
    case: str
    calls: int
    refused: int
    max_in_window: int
    max_at_once: int
    makespan_s: float
    ideal_s: float

    @property
    def ratio(self) -> float:
        return self.makespan_s / self.ideal_s


def durations(calls: int) -> list[float]:
    """The call durations the simulator draws, in arrival order (its seed + 1)."""
    draw = random.Random(SEED + 1)
    return [draw.uniform(LOW, HIGH) for _ in range(calls)]


def ideal_makespan(lengths: list[float]) -> float:
    """An exact limiter's makespan: call i starts at the earliest time with fewer than the cap
    running and fewer than the rate's n arrivals in the window before it."""
    starts: list[float] = []
    ends: list[float] = []
    for length in lengths:
        at = 0.0 if not starts else starts[-1]
        while True:
            running = sorted(end for end in ends if end > at)
            recent = [s for s in starts if at < s + quota_app.WINDOW]  # as policy/rate.py
            if len(running) >= quota_app.CONCURRENCY:
                at = running[len(running) - quota_app.CONCURRENCY]
            elif len(recent) >= quota_app.RATE:
                at = recent[len(recent) - quota_app.RATE] + quota_app.WINDOW
            else:
                break
        starts.append(at)
        ends.append(at + length)
    return max(ends) - starts[0]


@contextmanager
def simulator() -> Iterator[str]:
    command = [
        *(sys.executable, "-m", "headrace", "provider-sim", "--port", "0", "--window", "6s"),
        *("--quota", f"image={quota_app.RATE}/{quota_app.CONCURRENCY}"),
        *("--latency", f"image={LOW}..{HIGH}", "--seed", str(SEED)),
    ]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        found = re.search(r"(http://\S+)", process.stdout.readline())
        if found is None:
            raise RuntimeError("the provider simulator did not announce its address")
        with urllib.request.urlopen(f"{found[1]}/sim/stats", timeout=5):
            pass  # warmed up: its first answer is not the first call's
        yield found[1]
    finally:
        stop(process)


def stop(process: subprocess.Popen[str], sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def busy_core(loaded: bool) -> Iterator[None]:
    if not loaded:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"], text=True)
    try:
        yield
    finally:
        stop(spinner, signal.SIGKILL)


@contextmanager
def store_url(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="headrace-quota-") as scratch:
            yield f"sqlite:///{Path(scratch) / 'quota.db'}"
        return
    schema = f"bench_quota_{uuid.uuid4().hex[:8]}"
    try:
        yield f"{SERVER}?schema={schema}"
    finally:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def submit(url: str, provider: str) -> None:
    os.environ["HEADRACE_DB"], os.environ["HEADRACE_PROVIDER_URL"] = url, provider

    async def run() -> None:
        app = quota_app.make_app()
        call = app.definition("call")
        async with app:
            await app.submit([call.spec(f"c{n:03d}") for n in range(CALLS)])

    asyncio.run(run())


def arrivals(provider: str) -> list[tuple[float, bool]]:
    with urllib.request.urlopen(f"{provider}/sim/arrivals", timeout=5) as response:
        found: dict[str, list[tuple[float, bool]]] = json.load(response)
    return [(float(at), bool(accepted)) for at, accepted in found["image"]]


def stats(provider: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{provider}/sim/stats", timeout=5) as response:
        found: dict[str, dict[str, dict[str, int]]] = json.load(response)
    return found["providers"]["image"]


def run_workers(url: str, provider: str) -> list[tuple[float, bool]]:
    env = {**os.environ, "HEADRACE_DB": url, "HEADRACE_PROVIDER_URL": provider}
    command = [sys.executable, "-m", "headrace", "worker", "bench.quota_app:make_app"]
    workers = [
        subprocess.Popen(
            [*command, "--name", f"w{n}", "--slots", "4"],
            cwd=ROOT,
            env=env,
            text=True,
            stderr=subprocess.DEVNULL,
        )
        for n in range(WORKERS)
    ]
    try:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            seen = arrivals(provider)
            if sum(accepted for _, accepted in seen) >= CALLS:
                time.sleep(HIGH + 0.1)  # the last calls finish
                return seen
            time.sleep(0.5)
        raise RuntimeError(f"the calls did not all arrive in {DEADLINE:g}s")
    finally:
        for worker in workers:
            stop(worker)


def quota_run(backend: str, loaded: bool) -> QuotaRun:
    case = f"headrace-{backend}, 4 processes{', a core busy' if loaded else ''}"
    with store_url(backend) as url, simulator() as provider, busy_core(loaded):
        submit(url, provider)
        seen = run_workers(url, provider)
        figures = stats(provider)
    accepted = [at for at, ok in seen if ok]
    lengths = durations(len(accepted))
    makespan = max(at + d for at, d in zip(accepted, lengths, strict=True)) - min(accepted)
    return QuotaRun(
        case,
        len(accepted),
        len(seen) - len(accepted),
        most_in_a_window(accepted, quota_app.WINDOW),
        int(figures["max_concurrent"]),
        round(makespan, 2),
        round(ideal_makespan(lengths), 2),
    )


def quota_figures(postgres: bool) -> list[QuotaRun]:
    backends = ["sqlite", "postgres"] if postgres else ["sqlite"]
    return [quota_run(backend, loaded) for backend in backends for loaded in (False, True)]
