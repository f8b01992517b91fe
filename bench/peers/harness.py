"""The peer benchmark's cases, run the same way for every system.

Each case gets a site of its own (a PostgreSQL schema, Redis keys named after it, a scratch
directory), removed afterwards whatever happened; every worker is started in a process group
of its own, and the group is sent SIGTERM, then SIGKILL, when the case ends.

- drain: `tasks` no-op tasks are enqueued by a producer process, then the system's worker
  processes are started; the harness watches the tasks' marks until every task has run. Tasks
  per second are the tasks over the time from the first task's run to the last one's.
- enqueue -> start: one worker process, idle; a producer process enqueues one timed task at a
  time and waits for its start (`produce.py`).
"""

from __future__ import annotations

import compileall
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis
from psycopg import sql

import headrace
from bench.claims import percentile
from bench.peers import cpu, probe
from bench.peers.base import POSTGRES, REDIS, Peer, Site
from bench.peers.produce import REPORTS_FD
from bench.peers.systems import load

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = (1, 4)
DRAIN_DEADLINE = 300.0
PRODUCE_TIMEOUT = 300.0
STOP_WAIT = 20.0
WATCH_EVERY = 0.05


@dataclass(frozen=True)
class System:
    name: str
    store: str
    settings: str


@dataclass(frozen=True)
class Drain:
    system: str
    processes: int
    tasks: int
    run: int = 1  # which of the interleaved runs
    ran: int = 0  # tasks stamped: more than `tasks` if a system ran one twice
    busy_processes: int = 0  # processes that ran at least one task
    seconds: float = 0.0
    tasks_per_s: float = 0.0
    start_spread_s: float = 0.0  # between the first and the last process's first task
    # CPU per task while the queue drained (bench/peers/cpu.py): the worker processes', and
    # the store server's (None: SQLite has none)
    worker_cpu_us: float | None = None
    server_cpu_us: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class Latency:
    """From the enqueue call to the task's first line (p50, p99), and its two parts: the
    enqueue call, and from its return (the task accepted) to the task."""

    system: str
    samples: int
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    enqueue_p50_ms: float = 0.0
    queued_p50_ms: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class PeerFigures:
    tasks: int
    samples: int
    runs: int  # interleaved drains of every system; the tables show their medians
    systems: list[System]
    drains: list[Drain]
    latency: list[Latency]
    load_before: float  # the machine's 1-minute load average
    load_after: float


class CaseFailed(RuntimeError):
    """A case that could not finish: what happened, and the end of the process's log."""


def _tail(log: Path, lines: int = 6) -> str:
    text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return " | ".join(text[-lines:])


# -- the site


def _admin(statement: sql.Composed) -> None:
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(statement)


def _drop_keys(name: str) -> None:
    with redis.Redis.from_url(REDIS) as client:
        keys = list(client.scan_iter(match=f"*{name}*", count=1000))
        for first in range(0, len(keys), 1000):
            client.delete(*keys[first : first + 1000])


@contextmanager
def case_site(peer: Peer, port: int = 0) -> Iterator[Site]:
    name = f"hrbench_{peer.name.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    schema = sql.Identifier(name)
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as scratch:
        site = Site(name, scratch, port)
        site.marks.mkdir()
        if peer.store == "postgres":
            _admin(sql.SQL("CREATE SCHEMA {}").format(schema))
        try:
            yield site
        finally:
            if peer.store == "postgres":
                _admin(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(schema))
            if peer.store == "redis":
                _drop_keys(name)


def _env(peer: Peer, site: Site) -> dict[str, str]:
    return {**os.environ, **site.env(), **peer.env(site)}


# -- the processes


def produce(peer: Peer, site: Site, *args: str, reports: socket.socket | None = None) -> None:
    log = Path(site.scratch) / "producer.log"
    command = [sys.executable, "-m", "bench.peers.produce", peer.name, *args]
    env = _env(peer, site)
    fds: tuple[int, ...] = ()
    if reports is not None:
        env[REPORTS_FD] = str(reports.fileno())
        fds = (reports.fileno(),)
    with log.open("ab") as out:
        done = subprocess.run(
            command,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
            pass_fds=fds,
            timeout=PRODUCE_TIMEOUT,
            check=False,
        )
    if done.returncode != 0:
        raise CaseFailed(f"producer {args[0]} exited with {done.returncode}: {_tail(log)}")


def _signal(process: subprocess.Popen[bytes], signum: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each worker's process group, a grace period, then SIGKILL to whatever of the
    groups is left (a pool's children whose parent is gone, too)."""
    for process in processes:
        _signal(process, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT
    for process in processes:
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        _signal(process, signal.SIGKILL)
        process.wait()


@contextmanager
def running(peer: Peer, site: Site, processes: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        for n, command in enumerate(peer.workers(site, processes)):
            with (Path(site.scratch) / f"worker-{n}.log").open("ab") as out:
                started.append(
                    subprocess.Popen(
                        command,
                        cwd=ROOT,
                        env=_env(peer, site),
                        stdout=out,
                        stderr=out,
                        start_new_session=True,
                    )
                )
        yield started
    finally:
        _stop(started)


def _watch(
    peer: Peer, site: Site, workers: list[subprocess.Popen[bytes]], tasks: int
) -> tuple[float | None, float | None]:
    """Until every task has run; a worker that exits ends the case. Returns the worker's and
    the server's CPU per task from the first look that saw a task run to the last."""
    deadline = time.monotonic() + DRAIN_DEADLINE
    sessions = {worker.pid for worker in workers}  # each started a session of its own
    first: tuple[int, cpu.Sample] | None = None
    while time.monotonic() < deadline:
        ran = probe.tally(site.marks).ran
        if first is None and ran > 0:
            first = (ran, cpu.sample(peer.store, sessions))
        if ran >= tasks:
            assert first is not None
            return cpu.per_task_us(first[1], cpu.sample(peer.store, sessions), ran - first[0])
        for n, worker in enumerate(workers):
            if worker.poll() is not None:
                log = Path(site.scratch) / f"worker-{n}.log"
                raise CaseFailed(f"worker exited with {worker.returncode}: {_tail(log)}")
        time.sleep(WATCH_EVERY)
    ran = probe.tally(site.marks).ran
    raise CaseFailed(f"{ran} of {tasks} tasks ran in {DRAIN_DEADLINE:g} s")


# -- the cases


def drain(peer: Peer, processes: int, tasks: int, run: int = 1) -> Drain:
    with case_site(peer) as site:
        produce(peer, site, "noops", str(tasks))
        with running(peer, site, processes) as workers:
            worker_cpu, server_cpu = _watch(peer, site, workers, tasks)
        marks = probe.tally(site.marks)
    seconds = marks.last - marks.first
    return Drain(
        peer.name,
        processes,
        tasks,
        run,
        ran=marks.ran,
        busy_processes=marks.processes,
        seconds=round(seconds, 3),
        tasks_per_s=round(tasks / seconds, 1),
        start_spread_s=round(marks.start_spread, 3),
        worker_cpu_us=worker_cpu,
        server_cpu_us=server_cpu,
    )


def enqueue_to_start(peer: Peer, samples: int) -> Latency:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as reports:
        reports.bind(("127.0.0.1", 0))
        with case_site(peer, port=reports.getsockname()[1]) as site:
            produce(peer, site, "prepare")
            with running(peer, site, 1):
                produce(peer, site, "timed", str(samples), reports=reports)
            times = json.loads((Path(site.scratch) / "samples.json").read_text())
    waits = [(started - before) * 1000 for before, _, started in times]
    calls = [(after - before) * 1000 for before, after, _ in times]
    queued = [(started - after) * 1000 for _, after, started in times]
    return Latency(
        peer.name,
        len(times),
        p50_ms=_ms(waits, 0.5),
        p99_ms=_ms(waits, 0.99),
        enqueue_p50_ms=_ms(calls, 0.5),
        queued_p50_ms=_ms(queued, 0.5),
    )


def _ms(values: list[float], q: float) -> float:
    return round(percentile(values, q), 2)


def _failure(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def peer_figures(
    names: list[str], tasks: int, samples: int, say: Callable[[str], None], runs: int = 1
) -> PeerFigures:
    """`runs` times: every drain at one process, then every drain at four; then every latency
    case. The cases a table sets side by side run within minutes of each other, and each
    system's runs are interleaved with the others'."""
    peers = [load(name) for name in names]
    compiled(say)
    load_before = round(os.getloadavg()[0], 2)
    drains: list[Drain] = []
    for run in range(1, runs + 1):
        for processes in PROCESSES:
            for peer in peers:
                try:
                    done = drain(peer, processes, tasks, run)
                except Exception as error:  # one system's failure must not cost the others'
                    done = Drain(peer.name, processes, tasks, run, error=_failure(error))
                drains.append(done)
                rate = f"{done.tasks_per_s:,.0f} tasks/s"
                say(f"run {run}, {peer.name}, {processes} process(es): {done.error or rate}")
    latency: list[Latency] = []
    for peer in peers:
        try:
            found = enqueue_to_start(peer, samples)
        except Exception as error:
            found = Latency(peer.name, samples, error=_failure(error))
        latency.append(found)
        say(f"{peer.name}, enqueue -> start: {found.error or f'p50 {found.p50_ms} ms'}")
    systems = [System(peer.name, peer.store, peer.settings) for peer in peers]
    load_after = round(os.getloadavg()[0], 2)
    return PeerFigures(tasks, samples, runs, systems, drains, latency, load_before, load_after)


def compiled(say: Callable[[str], None]) -> None:
    """Write the bytecode of headrace and of these benchmarks' own modules, as installing a
    package from an index does for the peers: an editable install run with
    `PYTHONDONTWRITEBYTECODE` set (as on some CI machines) would otherwise compile every module
    from source in every worker process it starts, and four processes starting at once would
    spend that in the drain they are measured on."""
    for package in (Path(headrace.__file__).parent, ROOT / "bench"):
        if not compileall.compile_dir(package, quiet=1):
            say(f"could not write the bytecode of {package}: its processes compile it at start")


def medians(figures: PeerFigures) -> dict[tuple[str, int], Drain]:
    """Each (system, processes)'s drains as one (`median_drain`)."""
    grouped: dict[tuple[str, int], list[Drain]] = {}
    for found in figures.drains:
        grouped.setdefault((found.system, found.processes), []).append(found)
    return {key: median_drain(found) for key, found in grouped.items()}


def median_drain(drains: list[Drain]) -> Drain:
    """One system's drains at one process count, as one: the medians of those that finished
    (each figure's own median), failed if none did."""
    done = [d for d in drains if d.error is None]
    first = drains[0]
    if not done:
        return first
    return Drain(
        first.system,
        first.processes,
        first.tasks,
        0,
        ran=int(statistics.median(d.ran for d in done)),
        busy_processes=int(statistics.median(d.busy_processes for d in done)),
        seconds=round(statistics.median(d.seconds for d in done), 3),
        tasks_per_s=round(statistics.median(d.tasks_per_s for d in done), 1),
        start_spread_s=round(statistics.median(d.start_spread_s for d in done), 3),
        worker_cpu_us=_median([d.worker_cpu_us for d in done]),
        server_cpu_us=_median([d.server_cpu_us for d in done]),
    )


def _median(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return round(statistics.median(known), 1) if known else None
