"""Where PostgreSQL claims and outcomes wait when several worker processes share a store.

10,000 no-op tasks are drained by 1 and by 4 `headrace worker` processes (16 slots each); while
they run, `pg_stat_activity` is sampled every 10 ms for the store's connections. Each active
sample is sorted by the statement it runs and what it waits on (a lock, the client's next
message inside a transaction, or nothing: running). The share of samples waiting on a lock in
`lease_tasks` (it updates the store-wide `meta` counters and the flows' turns) is the cost of
those rows that every claim updates.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from bench import noop_app

ROOT = Path(__file__).resolve().parents[1]
SERVER = "postgresql://postgres@127.0.0.1:5432/test"
TASKS = 10_000
SLOTS = 16
SAMPLE_EVERY = 0.01
DEADLINE = 300.0

# Statements by a phrase of their text (store/postgres/sql/queries.sql).
STATEMENTS = (
    ("claim: gates", "peek AS MATERIALIZED"),
    ("claim: tasks", "FOR UPDATE OF t SKIP LOCKED"),
    ("claim: lease (meta, flows)", "counted AS ("),
    ("claim: start", "headrace.now"),
    ("clock", "clock_timestamp()"),
    ("claim: flows", "FROM flows WHERE flow = ANY"),
    ("outcome: lock", "WITH RECURSIVE tree"),
    ("outcome: write", "WITH done AS"),
    ("outcome: tickets", "FROM tickets WHERE task_id = ANY"),
    ("commit", "COMMIT"),
)


@dataclass(frozen=True)
class Contention:
    processes: int
    tasks: int
    seconds: float
    tasks_per_s: float
    samples: int
    waits: dict[str, float] = field(default_factory=dict)  # share of active samples, by kind

    @property
    def lock_share(self) -> float:
        return sum(v for k, v in self.waits.items() if k.startswith("lock"))


def statement(query: str) -> str:
    for name, phrase in STATEMENTS:
        if phrase in query:
            return name
    return "other"


def classify(state: str, wait_type: str | None, query: str) -> str:
    """What a sampled connection is doing: waiting for its worker's next message inside a
    transaction ("client": the worker's CPU and the loopback), waiting on a lock (by
    statement), running a statement, or another wait (I/O, an internal lock)."""
    if state == "idle in transaction" or wait_type == "Client":
        return "client"
    if wait_type == "Lock":
        return f"lock in {statement(query)}"
    if wait_type in (None, "", "CPU"):
        return f"running {statement(query)}"
    return f"{wait_type.lower()} in {statement(query)}"


def submit(url: str) -> None:
    os.environ["HEADRACE_DB"] = url

    async def run() -> None:
        app = noop_app.make_app()
        noop = app.definition("noop")
        async with app:
            for first in range(0, TASKS, 1000):
                await app.submit([noop.spec(f"n{i}") for i in range(first, first + 1000)])

    asyncio.run(run())


def drain(url: str, schema: str, processes: int) -> tuple[Counter[str], int]:
    env = {**os.environ, "HEADRACE_DB": url}
    command = [sys.executable, "-m", "headrace", "worker", "bench.noop_app:make_app"]
    workers = [
        subprocess.Popen(
            [*command, "--slots", str(SLOTS), "--idle", "50ms", "--name", f"w{n}"],
            cwd=ROOT,
            env=env,
            stderr=subprocess.DEVNULL,
        )
        for n in range(processes)
    ]
    seen: Counter[str] = Counter()
    samples = 0
    name = f"headrace/{schema}"
    left = sql.SQL("SELECT count(*) FROM {}.tasks WHERE state <> 'succeeded'").format(
        sql.Identifier(schema)
    )
    try:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            deadline = time.monotonic() + DEADLINE
            checked = 0.0
            while time.monotonic() < deadline:
                rows = conn.execute(
                    "SELECT state, wait_event_type, query FROM pg_stat_activity "
                    "WHERE application_name = %s AND state <> 'idle'",
                    [name],
                ).fetchall()
                samples += 1
                seen.update(classify(state, wait, query) for state, wait, query in rows)
                if time.monotonic() - checked > 0.5:
                    checked = time.monotonic()
                    found = conn.execute(left).fetchone()
                    if found is not None and found[0] == 0:
                        return seen, samples
                time.sleep(SAMPLE_EVERY)
        raise RuntimeError(f"{processes} workers did not drain {TASKS} tasks in {DEADLINE:g}s")
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=30)


def span(schema: str) -> float:
    """From the first attempt's start to the last one's end, on the store's clock."""
    query = sql.SQL("SELECT max(ended_at) - min(started_at) FROM {}.attempts").format(
        sql.Identifier(schema)
    )
    with psycopg.connect(SERVER) as conn:
        found = conn.execute(query).fetchone()
    assert found is not None
    return float(found[0])


def contention(processes: int) -> Contention:
    schema = f"bench_contention_{uuid.uuid4().hex[:8]}"
    url = f"{SERVER}?schema={schema}"
    try:
        submit(url)
        seen, samples = drain(url, schema, processes)
        seconds = span(schema)
    finally:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    active = sum(seen.values()) or 1
    waits = {kind: round(n / active, 3) for kind, n in seen.most_common()}
    return Contention(
        processes, TASKS, round(seconds, 2), round(TASKS / seconds, 1), samples, waits
    )


def contention_figures() -> list[Contention]:
    return [contention(processes) for processes in (1, 4)]
