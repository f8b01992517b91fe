"""What keeping the tallies costs a claim and its outcome: CPU per task while one worker (16
slots) drains no-op tasks in ten groups, on SQLite and on PostgreSQL, in this process, and on
PostgreSQL the time spent inside the tally triggers.

CPU is the worker process's (`time.process_time`) and, on PostgreSQL, the store's server
backends' (their utime and stime from /proc: the server must run on this host, as root or as its
user can read them). Trigger time is `pg_stat_user_functions` with `track_functions = pl`. CPU
moves less with the machine's other work than wall time does, but still moves: the command runs
each case `--runs` times and keeps the least. To compare with the code before the tallies, run
this file from a checkout of that commit too (the trigger column is then empty).

`python -m bench.tally_cost [--tasks N] [--runs N] [--no-postgres]` prints the table and saves
bench/results/tally-cost.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

import headrace as hr

SERVER = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_OUT = Path(__file__).parent / "results" / "tally-cost.json"
TRIGGERS = (
    "SELECT coalesce(sum(total_time), 0) AS ms FROM pg_stat_user_functions WHERE schemaname = %s"
)


@dataclass(frozen=True)
class TallyCost:
    store: str
    tasks: int
    runs: int
    worker_us: float  # the worker process's CPU per task, the least of the runs
    server_us: float | None  # the PostgreSQL backends' CPU per task
    triggers_us: float | None  # time inside the tally triggers per task (PostgreSQL)


def backend_cpu(schema: str) -> float:
    """CPU seconds the store's backends (named `headrace/<schema>`) have used so far."""
    with psycopg.connect(SERVER, autocommit=True) as conn:
        found = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [f"headrace/{schema}"]
        )
        pids = [row[0] for row in found]
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


async def drain(url: str, tasks: int, schema: str | None) -> tuple[float, float | None]:
    """CPU seconds of the drain: this process's, and the store's backends' on PostgreSQL."""
    app = hr.App(url)

    @app.task(name="noop")
    async def noop(ctx: hr.Context, ref: str) -> None:
        return None

    async with app:
        for first in range(0, tasks, 500):
            batch = range(first, min(tasks, first + 500))
            await app.submit([noop.spec(f"n{i}", group=f"g{i % 10}") for i in batch])
        server = None if schema is None else backend_cpu(schema)
        began = time.process_time()
        await hr.Worker(app, slots=16, idle="50ms").drain()
        worker = time.process_time() - began
        if schema is not None and server is not None:
            server = backend_cpu(schema) - server
    return worker, server


def sqlite_run(tasks: int) -> tuple[float, float | None, float | None]:
    with tempfile.TemporaryDirectory(prefix="headrace-tally-cost-") as scratch:
        worker, _ = asyncio.run(drain(f"sqlite:///{scratch}/bench.db", tasks, None))
    return worker, None, None


def postgres_run(tasks: int) -> tuple[float, float | None, float | None]:
    schema = f"tally_cost_{uuid.uuid4().hex[:8]}"
    previous = os.environ.get("PGOPTIONS")
    os.environ["PGOPTIONS"] = "-c track_functions=pl"  # the store's connections time functions
    try:
        worker, server = asyncio.run(drain(f"{SERVER}?schema={schema}", tasks, schema))
        time.sleep(1.0)  # a backend reports its function times when it goes idle
        with psycopg.connect(SERVER, autocommit=True) as conn:
            found = conn.execute(TRIGGERS, [schema]).fetchone()
        triggers = float(found[0]) / 1000 if found is not None else 0.0
    finally:
        if previous is None:
            del os.environ["PGOPTIONS"]
        else:
            os.environ["PGOPTIONS"] = previous
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    return worker, server, triggers


def least(store: str, tasks: int, runs: int) -> TallyCost:
    run = sqlite_run if store == "sqlite" else postgres_run
    measured = [run(tasks) for _ in range(runs)]

    def per_task(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return round(min(known) / tasks * 1e6, 1) if known else None

    worker = per_task([m[0] for m in measured])
    assert worker is not None
    return TallyCost(
        store,
        tasks,
        runs,
        worker,
        per_task([m[1] for m in measured]),
        per_task([m[2] for m in measured]),
    )


def tally_cost_table(figures: list[TallyCost]) -> Table:
    table = Table(title="CPU per no-op task, one worker draining (the least of the runs)")
    for column in ("store", "tasks", "runs", "worker", "server", "in the tally triggers"):
        table.add_column(column, justify="left" if column == "store" else "right")
    for f in figures:
        cpu = (_us(f.worker_us), _us(f.server_us), _us(f.triggers_us))
        table.add_row(f.store, f"{f.tasks:,}", str(f.runs), *cpu)
    return table


def _us(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} us"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tally_cost", description=__doc__)
    parser.add_argument("--tasks", type=int, default=4000, help="no-op tasks per run")
    parser.add_argument("--runs", type=int, default=5, help="runs per store; the least is kept")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to save the JSON")
    args = parser.parse_args()
    stores = ["sqlite"] if args.no_postgres else ["sqlite", "postgres"]
    figures = [least(store, args.tasks, args.runs) for store in stores]
    console = Console(width=110)
    console.print(tally_cost_table(figures))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = {"when": when, "tally_cost": [asdict(f) for f in figures]}
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"saved {args.out}")


if __name__ == "__main__":
    main()
