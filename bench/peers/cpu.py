"""CPU time spent by a case's worker processes and by its store's server, read from the kernel
and the server, so that a rate can be read without the machine's noise.

- Workers: every process in each worker command's session (each command is started in a
  session of its own: a pool's children are counted with their parent), user and system time,
  with what their exited children had (`/proc/PID/stat`).
- PostgreSQL: every `postgres` process on this host, with what the postmaster's exited
  children had: backends that ended during the case count too. Other databases' work on the
  same server counts as well; the benchmark runs nothing else there.
- Redis: its `INFO cpu` (the main process and its children).
- SQLite: no server; its work is the workers'.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.peers.base import REDIS, Store

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    workers: float  # seconds of CPU
    server: float | None  # None: no server (SQLite), or not on this host


def _stat(pid: str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone meanwhile
        return None
    return text.rsplit(")", 1)[1].split()  # fields from the state on


def _seconds(fields: list[str]) -> float:
    # utime, stime, cutime, cstime: fields 14 to 17 of stat(5), 11 to 14 after the name
    return sum(int(value) for value in fields[11:15]) / TICK


def _processes() -> list[str]:
    return [entry for entry in os.listdir("/proc") if entry.isdigit()]


def workers_cpu(sessions: set[int]) -> float:
    total = 0.0
    for pid in _processes():
        fields = _stat(pid)
        if fields is not None and int(fields[3]) in sessions:  # the session id
            total += _seconds(fields)
    return total


def postgres_cpu() -> float | None:
    total, found = 0.0, False
    for pid in _processes():
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if name == "postgres" and (fields := _stat(pid)) is not None:
            total += _seconds(fields)
            found = True
    return total if found else None


def redis_cpu() -> float:
    with redis.Redis.from_url(REDIS) as client:
        info = client.info("cpu")
    parts = ("used_cpu_sys", "used_cpu_user", "used_cpu_sys_children", "used_cpu_user_children")
    return sum(float(info.get(part, 0.0)) for part in parts)


def sample(store: Store, sessions: set[int]) -> Sample:
    server: float | None = None
    if store == "postgres":
        server = postgres_cpu()
    elif store == "redis":
        server = redis_cpu()
    return Sample(workers_cpu(sessions), server)


def per_task_us(first: Sample, last: Sample, tasks: int) -> tuple[float | None, float | None]:
    """Microseconds of worker and server CPU per task between two samples."""
    if tasks <= 0:
        return None, None
    workers = round((last.workers - first.workers) / tasks * 1e6, 1)
    server = None
    if first.server is not None and last.server is not None:
        server = round((last.server - first.server) / tasks * 1e6, 1)
    return workers, server
