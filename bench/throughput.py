"""No-op tasks per second through a store, in real time: submit in batches, then one worker
drains them. Peers measured in the same run: the memory store (no durability), and bare
sqlite3 doing one claim-like and one completion-like write transaction per task."""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import headrace as hr

BATCH = 500


@dataclass(frozen=True)
class Throughput:
    case: str
    tasks: int
    seconds: float
    tasks_per_s: float


async def _noop_run(url: str, tasks: int, slots: int) -> float:
    app = hr.App(url)

    @app.task(name="noop")
    async def noop(ctx: hr.Context, ref: str) -> None:
        return None

    async with app:
        for start in range(0, tasks, BATCH):
            specs = [noop.spec(f"n{i}") for i in range(start, min(tasks, start + BATCH))]
            await app.submit(specs)
        began = time.perf_counter()
        await hr.Worker(app, slots=slots, idle="50ms").drain()
        return time.perf_counter() - began


def headrace_store(case: str, url: str, tasks: int, slots: int = 16) -> Throughput:
    seconds = asyncio.run(_noop_run(url, tasks, slots))
    return Throughput(case, tasks, round(seconds, 3), round(tasks / seconds, 1))


def bare_sqlite(tasks: int, directory: Path) -> Throughput:
    """Two WAL write transactions per task, the least a durable claim-and-complete costs."""
    db = sqlite3.connect(directory / "bare.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, state TEXT)")
    db.executemany("INSERT INTO t (state) VALUES ('ready')", [()] * tasks)
    began = time.perf_counter()
    for task_id in range(1, tasks + 1):
        for state in ("running", "succeeded"):
            db.execute("BEGIN IMMEDIATE")
            db.execute("UPDATE t SET state = ? WHERE id = ?", (state, task_id))
            db.execute("COMMIT")
    seconds = time.perf_counter() - began
    db.close()
    return Throughput(
        "bare sqlite3, 2 txns/task", tasks, round(seconds, 3), round(tasks / seconds, 1)
    )


def throughput_figures(quick: bool) -> list[Throughput]:
    tasks = 1000 if quick else 5000
    with tempfile.TemporaryDirectory(prefix="headrace-bench-") as scratch:
        directory = Path(scratch)
        return [
            headrace_store("headrace memory://", "memory://", tasks),
            headrace_store("headrace sqlite", f"sqlite:///{directory / 'bench.db'}", tasks),
            bare_sqlite(tasks, directory),
        ]
