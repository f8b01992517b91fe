"""`python -m bench [--quick] [--out FILE]`: every benchmark, printed as tables, saved as JSON."""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.contention import Contention, contention_figures
from bench.postgres import PostgresFigures, postgres_figures
from bench.quota import QuotaRun, quota_figures
from bench.studio import StudioFigure, studio_figures
from bench.throughput import Throughput, throughput_figures

DEFAULT_OUT = Path(__file__).parent / "results" / "latest.json"


def studio_table(figures: list[StudioFigure]) -> Table:
    table = Table(title="Studio makespan vs quota lower bound (virtual clock)")
    for column in ("case", "episodes", "slots", "makespan", "lower bound", "ratio", "1002s", "ok"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for f in figures:
        table.add_row(
            f.case,
            str(f.episodes),
            str(f.slots),
            f"{f.makespan_s:.1f}s",
            f"{f.lower_bound_s:.1f}s",
            f"{f.ratio:.2f}",
            str(f.rate_limited),
            "yes" if f.all_succeeded else "NO",
        )
    return table


def throughput_table(figures: list[Throughput]) -> Table:
    table = Table(title="No-op tasks per second (real time, this machine)")
    for column in ("case", "tasks", "seconds", "tasks/s", "vs bare sqlite3"):
        table.add_column(column, justify="left" if column == "case" else "right")
    bare = next(f for f in figures if f.case.startswith("bare"))
    for f in figures:
        table.add_row(
            f.case,
            str(f.tasks),
            f"{f.seconds:.2f}",
            f"{f.tasks_per_s:,.0f}",
            f"{f.tasks_per_s / bare.tasks_per_s:.2f}",
        )
    return table


def quota_table(runs: list[QuotaRun]) -> Table:
    table = Table(title="A shared quota as the vendor counts it (3 at once, 30 per 6 s, 300 calls)")
    columns = ("case", "calls", "refused", "max in 6 s", "max at once", "makespan", "ideal")
    for column in (*columns, "vs ideal"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for run in runs:
        table.add_row(
            run.case,
            str(run.calls),
            str(run.refused),
            str(run.max_in_window),
            str(run.max_at_once),
            f"{run.makespan_s:.1f}s",
            f"{run.ideal_s:.1f}s",
            f"{run.ratio:.3f}",
        )
    return table


def contention_table(runs: list[Contention]) -> Table:
    table = Table(title="Where PostgreSQL verbs wait: 10,000 no-op tasks, `headrace worker`s")
    columns = ("processes", "tasks/s", "vs 1 process", "waiting on a lock", "of it in lease_tasks")
    for column in (*columns, "most sampled"):
        table.add_column(column, justify="left" if column == "most sampled" else "right")
    one = runs[0]
    for run in runs:
        in_lease = run.waits.get("lock in claim: lease (meta, flows)", 0.0)
        top = ", ".join(f"{kind} {share:.0%}" for kind, share in list(run.waits.items())[:3])
        table.add_row(
            str(run.processes),
            f"{run.tasks_per_s:,.0f}",
            f"{run.tasks_per_s / one.tasks_per_s:.2f}",
            f"{run.lock_share:.1%}",
            f"{in_lease:.1%}",
            top,
        )
    return table


def postgres_tables(figures: PostgresFigures) -> list[Table]:
    rates = Table(title="No-op tasks per second, one worker of 16 slots (real time, PostgreSQL)")
    for column in ("case", "tasks", "seconds", "tasks/s", "vs procrastinate"):
        rates.add_column(column, justify="left" if column == "case" else "right")
    peer = next(f for f in figures.throughput if f.case.startswith("procrastinate"))
    for f in figures.throughput:
        ratio = f"{f.tasks_per_s / peer.tasks_per_s:.1f}x"
        rates.add_row(f.case, str(f.tasks), f"{f.seconds:.2f}", f"{f.tasks_per_s:,.0f}", ratio)
    latency = Table(title="Enqueue -> start on an idle worker (producer in another process)")
    columns = ("case", "samples", "p50 ms", "p99 ms", "submit p50", "committed->start p50")
    for column in (*columns, "vs procrastinate"):
        latency.add_column(column, justify="left" if column == "case" else "right")
    slowest = next(f for f in figures.latency if f.case.startswith("procrastinate"))
    for lat in figures.latency:
        latency.add_row(
            lat.case,
            str(lat.samples),
            f"{lat.p50_ms:.2f}",
            f"{lat.p99_ms:.2f}",
            f"{lat.submit_p50_ms:.2f}",
            f"{lat.queued_p50_ms:.2f}",
            f"{lat.p50_ms / slowest.p50_ms:.2f}",
        )
    claims = Table(title="Claim of 16 tasks against the size of the ready queue (PostgreSQL)")
    for column in ("ready tasks", "claims", "p50 ms", "p99 ms", "vs smallest"):
        claims.add_column(column, justify="right")
    smallest = figures.claims[0]
    for c in figures.claims:
        ratio = f"{c.p50_ms / smallest.p50_ms:.2f}"
        claims.add_row(f"{c.ready:,}", str(c.claims), f"{c.p50_ms:.2f}", f"{c.p99_ms:.2f}", ratio)
    return [rates, latency, claims]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to save the JSON")
    parser.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL benchmarks")
    parser.add_argument("--no-quota", action="store_true", help="skip the shared-quota runs")
    args = parser.parse_args()
    console = Console(width=110)
    studio = studio_figures(args.quick)
    console.print(studio_table(studio))
    held = next(f for f in studio if f.case.endswith("held"))
    returned = next(f for f in studio if f.case.endswith("returned"))
    console.print(
        f"video slot held / returned makespan: {held.makespan_s / returned.makespan_s:.2f}"
    )
    throughput = throughput_figures(args.quick)
    console.print(throughput_table(throughput))
    postgres = None if args.no_postgres else postgres_figures(args.quick)
    if postgres is not None:
        for table in postgres_tables(postgres):
            console.print(table)
    quota = [] if args.no_quota else quota_figures(postgres=not args.no_postgres)
    if quota:
        console.print(quota_table(quota))
    contention = [] if args.no_postgres else contention_figures()
    if contention:
        console.print(contention_table(contention))
    results = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "quick": args.quick,
        "studio": [asdict(f) for f in studio],
        "held_over_returned": round(held.makespan_s / returned.makespan_s, 3),
        "throughput": [asdict(f) for f in throughput],
        "postgres": asdict(postgres) if postgres is not None else None,
        "quota": [{**asdict(run), "ratio": round(run.ratio, 4)} for run in quota],
        "contention": [asdict(run) for run in contention],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"saved {args.out}")


if __name__ == "__main__":
    main()
