"""`python -m bench [--quick] [--only SECTION]`: benchmarks, printed as tables, saved as JSON."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from bench.claims import ClaimCost, claim_figures
from bench.contention import Contention, contention_figures
from bench.latency import REQUESTS, latency_figures, latency_table
from bench.peers.systems import SYSTEMS
from bench.quota import QuotaRun, quota_figures
from bench.scrape import DEFAULT_OUT as SCRAPE_OUT
from bench.scrape import QUICK_SIZES as SCRAPE_QUICK_SIZES
from bench.scrape import SIZES as SCRAPE_SIZES
from bench.scrape import save as save_scrape
from bench.scrape import scrape_figures, scrape_table
from bench.studio import StudioFigure, studio_figures
from bench.throughput import Throughput, throughput_figures

if TYPE_CHECKING:
    # The peer section's libraries are imported when it runs: pip install -e '.[bench]'
    from bench.peers.harness import Drain, PeerFigures

DEFAULT_OUT = Path(__file__).parent / "results" / "latest.json"
DEFAULT_CHART = Path(__file__).parents[1] / "docs" / "img" / "peers.png"
SECTIONS = ("studio", "throughput", "claims", "quota", "contention", "latency", "scrape", "peers")
POSTGRES_SYSTEMS = (
    "headrace-postgres",
    "procrastinate",
    "pgqueuer",
    "bare-postgres",
    "bare-postgres-2rt",
)


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


def claims_table(claims: list[ClaimCost]) -> Table:
    table = Table(title="Claim of 16 tasks against the size of the ready queue (PostgreSQL)")
    for column in ("ready tasks", "claims", "p50 ms", "p99 ms", "vs smallest"):
        table.add_column(column, justify="right")
    smallest = claims[0]
    for c in claims:
        ratio = f"{c.p50_ms / smallest.p50_ms:.2f}"
        table.add_row(f"{c.ready:,}", str(c.claims), f"{c.p50_ms:.2f}", f"{c.p99_ms:.2f}", ratio)
    return table


def _baseline(figures: PeerFigures) -> str | None:
    """The headrace case the peers are compared with: PostgreSQL's, else SQLite's."""
    ran = {d.system for d in figures.drains if d.error is None}
    return next((name for name in ("headrace-postgres", "headrace-sqlite") if name in ran), None)


def peer_tables(figures: PeerFigures) -> list[Table]:
    base = _baseline(figures)
    against = f"; vs: against {base} in this run" if base else ""
    return [
        peer_rates_table(figures, base, against),
        peer_cpu_table(figures),
        peer_latency_table(figures, base, against),
    ]


def peer_rates_table(figures: PeerFigures, base: str | None, against: str) -> Table:
    runs = f", medians of {figures.runs} interleaved runs" if figures.runs > 1 else ""
    rates = Table(
        title=f"No-op tasks per second: {figures.tasks:,} queued, then drained by 1 and by 4 "
        f"worker processes{runs}{against}"
    )
    columns = ["system", "store", "1 process", "4 processes", "4 / 1", "spread, 4"]
    columns += ["vs, 1", "vs, 4"] if base else []
    for column in columns:
        rates.add_column(column, justify="left" if column in ("system", "store") else "right")
    from bench.peers.harness import medians

    drains = medians(figures)
    for system in figures.systems:
        one, four = drains[system.name, 1], drains[system.name, 4]
        spread = "" if four.error else f"{four.start_spread_s:.2f}s"
        row = [system.name, system.store, _rate(one), _rate(four), _ratio(four, one), spread]
        if base:
            row += [_ratio(one, drains[base, 1]), _ratio(four, drains[base, 4])]
        rates.add_row(*row)
    return rates


def peer_cpu_table(figures: PeerFigures) -> Table:
    """CPU per task while the queue drained: what the rates cost, less moved by the noise."""
    runs = f", medians of {figures.runs} runs" if figures.runs > 1 else ""
    table = Table(
        title=f"CPU per task while draining, microseconds: the worker processes' and the store "
        f"server's (none for SQLite){runs}"
    )
    columns = ["system", "worker, 1", "server, 1", "total, 1", "worker, 4", "server, 4"]
    columns += ["total, 4"]
    for column in columns:
        table.add_column(column, justify="left" if column == "system" else "right")
    from bench.peers.harness import PROCESSES, medians

    drains = medians(figures)
    for system in figures.systems:
        row = [system.name]
        for processes in PROCESSES:
            found = drains[system.name, processes]
            parts = [found.worker_cpu_us, found.server_cpu_us]
            total = sum(part for part in parts if part is not None)
            known = found.error is None and found.worker_cpu_us is not None
            row += [_us(part) for part in parts] + [f"{total:,.0f}" if known else ""]
        table.add_row(*row)
    return table


def peer_goal(figures: PeerFigures) -> list[str]:
    """Each headrace store's rate over the faster of PgQueuer and Dramatiq, at 1 and 4
    processes (the medians), where those ran."""
    from bench.peers.harness import PROCESSES, medians

    drains = medians(figures)
    lines = []
    for name in ("headrace-postgres", "headrace-sqlite"):
        for processes in PROCESSES:
            ours = drains.get((name, processes))
            peers = [
                drains[peer, processes]
                for peer in ("pgqueuer", "dramatiq")
                if (peer, processes) in drains and drains[peer, processes].error is None
            ]
            if ours is None or ours.error is not None or not peers:
                continue
            fastest = max(peers, key=lambda d: d.tasks_per_s)
            lines.append(
                f"{name}, {processes} process(es): {ours.tasks_per_s / fastest.tasks_per_s:.2f}"
                f" times {fastest.system}, the faster of its peers there"
            )
    return lines


def _us(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def peer_latency_table(figures: PeerFigures, base: str | None, against: str) -> Table:
    latency = Table(title=f"Enqueue -> start on an idle worker process{against}")
    columns = ["system", "store", "samples", "p50 ms", "p99 ms", "call p50", "after call p50"]
    columns += ["vs, p50"] if base else []
    for column in columns:
        latency.add_column(column, justify="left" if column in ("system", "store") else "right")
    stores = {system.name: system.store for system in figures.systems}
    waits = {lat.system: lat for lat in figures.latency}
    for lat in figures.latency:
        if lat.error is not None:
            latency.add_row(lat.system, stores[lat.system], "failed", *[""] * (len(columns) - 3))
            continue
        row = [lat.system, stores[lat.system], str(lat.samples), f"{lat.p50_ms:.2f}"]
        row += [f"{lat.p99_ms:.2f}", f"{lat.enqueue_p50_ms:.2f}", f"{lat.queued_p50_ms:.2f}"]
        if base:
            reference = waits[base]
            row += [f"{lat.p50_ms / reference.p50_ms:.2f}" if reference.error is None else ""]
        latency.add_row(*row)
    return latency


def _rate(d: Drain) -> str:
    return "failed" if d.error is not None else f"{d.tasks_per_s:,.0f}"


def _ratio(d: Drain, reference: Drain) -> str:
    if d.error is not None or reference.error is not None:
        return ""
    return f"{d.tasks_per_s / reference.tasks_per_s:.2f}"


def peer_failures(figures: PeerFigures) -> list[str]:
    drains = [
        f"{d.system}, {d.processes} process(es): {d.error}" for d in figures.drains if d.error
    ]
    waits = [f"{lat.system}, enqueue -> start: {lat.error}" for lat in figures.latency if lat.error]
    return drains + waits


def run_studio(args: argparse.Namespace, console: Console) -> dict[str, object]:
    studio = studio_figures(args.quick)
    console.print(studio_table(studio))
    held = next(f for f in studio if f.case.endswith("held"))
    returned = next(f for f in studio if f.case.endswith("returned"))
    console.print(
        f"video slot held / returned makespan: {held.makespan_s / returned.makespan_s:.2f}"
    )
    return {
        "studio": [asdict(f) for f in studio],
        "held_over_returned": round(held.makespan_s / returned.makespan_s, 3),
    }


def run_throughput(args: argparse.Namespace, console: Console) -> dict[str, object]:
    throughput = throughput_figures(args.quick)
    console.print(throughput_table(throughput))
    return {"throughput": [asdict(f) for f in throughput]}


def run_claims(args: argparse.Namespace, console: Console) -> dict[str, object]:
    claims = claim_figures(args.quick)
    console.print(claims_table(claims))
    return {"claims": [asdict(c) for c in claims]}


def run_quota(args: argparse.Namespace, console: Console) -> dict[str, object]:
    quota = quota_figures(postgres=not args.no_postgres)
    console.print(quota_table(quota))
    return {"quota": [{**asdict(run), "ratio": round(run.ratio, 4)} for run in quota]}


def run_contention(args: argparse.Namespace, console: Console) -> dict[str, object]:
    contention = contention_figures()
    console.print(contention_table(contention))
    return {"contention": [asdict(run) for run in contention]}


def run_latency(args: argparse.Namespace, console: Console) -> dict[str, object]:
    latency = latency_figures(200 if args.quick else REQUESTS)
    console.print(latency_table(latency))
    return {"latency": [asdict(f) for f in latency]}


def run_scrape(args: argparse.Namespace, console: Console) -> dict[str, object]:
    sizes = SCRAPE_QUICK_SIZES if args.quick else SCRAPE_SIZES
    figures = scrape_figures(sizes, postgres=not args.no_postgres, log=console.log)
    console.print(scrape_table(figures))
    save_scrape(figures, SCRAPE_OUT)
    console.print(f"saved {SCRAPE_OUT}")
    return {"scrape": [asdict(f) for f in figures]}


def run_peers(args: argparse.Namespace, console: Console) -> dict[str, object]:
    from bench.peers.chart import draw
    from bench.peers.harness import peer_figures

    skipped = POSTGRES_SYSTEMS if args.no_postgres else ()
    chosen = args.system or SYSTEMS
    names = [name for name in SYSTEMS if name in chosen and name not in skipped]
    tasks, samples = (1000, 50) if args.quick else (10_000, 200)
    figures = peer_figures(names, tasks, samples, console.log, runs=args.runs)
    for table in peer_tables(figures):
        console.print(table)
    for line in peer_goal(figures):
        console.print(line)
    for failure in peer_failures(figures):
        console.print(f"failed: {failure}")
    caption = (
        f"python -m bench, peer section, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
        f"{os.cpu_count()} cores, 1-minute load {figures.load_before:.1f} before and "
        f"{figures.load_after:.1f} after"
    )
    draw(figures, args.chart, caption)
    console.print(f"saved {args.chart}")
    return {"peers": {**asdict(figures), "chart": str(args.chart)}}


RUNS = {
    "studio": run_studio,
    "throughput": run_throughput,
    "claims": run_claims,
    "quota": run_quota,
    "contention": run_contention,
    "latency": run_latency,
    "scrape": run_scrape,
    "peers": run_peers,
}


def sections(args: argparse.Namespace) -> list[str]:
    skipped = {
        "claims": args.no_postgres,
        "contention": args.no_postgres,
        "quota": args.no_quota,
        "scrape": args.no_scrape,
        "peers": args.no_peers,
    }
    chosen = args.only or SECTIONS
    return [name for name in SECTIONS if name in chosen and not skipped.get(name, False)]


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to save the JSON")
    parser.add_argument("--only", action="append", choices=SECTIONS, help="run this section")
    parser.add_argument("--no-postgres", action="store_true", help="skip what needs PostgreSQL")
    parser.add_argument("--no-quota", action="store_true", help="skip the shared-quota runs")
    parser.add_argument(
        "--no-scrape", action="store_true", help="skip the scrape runs (10^7 tasks on each store)"
    )
    parser.add_argument("--no-peers", action="store_true", help="skip the peer section")
    parser.add_argument(
        "--system", action="append", choices=list(SYSTEMS), help="peer section: only this system"
    )
    parser.add_argument(
        "--chart", type=Path, default=DEFAULT_CHART, help="where to draw the peer section's PNG"
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="peer section: drain every system this many times, interleaved; tables show medians",
    )
    return parser.parse_args()


def main() -> None:
    args = arguments()
    console = Console(width=110)
    results: dict[str, object] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cores": os.cpu_count(),
        },
        "quick": args.quick,
    }
    for name in sections(args):
        results.update(RUNS[name](args, console))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"saved {args.out}")


if __name__ == "__main__":
    main()
