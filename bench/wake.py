"""`python -m bench.wake [--runs N] [--samples N]`: enqueue -> start on SQLite alone (no
PostgreSQL needed), measured as `bench/postgres.py` does: an idle worker here, a producer in a
process of its own. Several runs, since one run moves with whatever else the machine does."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.postgres import Latency, enqueue_to_start


def sqlite_latency(samples: int) -> Latency:
    with tempfile.TemporaryDirectory(prefix="headrace-bench-") as scratch:
        url = f"sqlite:///{Path(scratch) / 'latency.db'}"
        return asyncio.run(enqueue_to_start("headrace sqlite", url, samples))


def runs_table(runs: list[Latency]) -> Table:
    table = Table(title="Enqueue -> start on SQLite, an idle worker (producer in another process)")
    for column in ("run", "samples", "p50 ms", "p99 ms", "submit p50", "committed->start p50"):
        table.add_column(column, justify="right")
    for number, run in enumerate(runs, 1):
        figures = (run.p50_ms, run.p99_ms, run.submit_p50_ms, run.queued_p50_ms)
        table.add_row(str(number), str(run.samples), *(f"{f:.2f}" for f in figures))
    medians = (
        statistics.median(getattr(run, field) for run in runs)
        for field in ("p50_ms", "p99_ms", "submit_p50_ms", "queued_p50_ms")
    )
    table.add_row("median", "", *(f"{m:.2f}" for m in medians))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wake", description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="runs, each on a fresh file")
    parser.add_argument("--samples", type=int, default=200, help="tasks measured per run")
    args = parser.parse_args()
    runs = [sqlite_latency(args.samples) for _ in range(args.runs)]
    Console(width=110).print(runs_table(runs))


if __name__ == "__main__":
    main()
