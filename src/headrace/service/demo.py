"""`headrace demo`: the studio scenario in real time on the embedded store, with the provider
simulator served over loopback HTTP, live progress per episode, and the report."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table

from headrace.pipelines.providers import MiniMaxClient
from headrace.pipelines.providersim import Latency, ProviderSimulator, ProviderStats, SimServer
from headrace.pipelines.studio_scenario import Scenario, ScenarioReport, run_scenario
from headrace.policy.redact import hide_passwords
from headrace.service.tables import groups_table
from headrace.store.protocol.types import GroupReport, TaskState

SIM_API_KEY = "sim-local-key"


@dataclass(frozen=True)
class DemoOptions:
    scenario: Scenario
    db: str | None = None
    inject: frozenset[str] = frozenset()
    json_path: Path | None = None
    progress: bool = True


async def run_demo(options: DemoOptions, console: Console) -> ScenarioReport:
    scenario = options.scenario
    sim = ProviderSimulator(scenario.window, inject=options.inject, seed=scenario.seed)
    with tempfile.TemporaryDirectory(prefix="headrace-demo-") as scratch:
        url = options.db or f"sqlite:///{Path(scratch) / 'studio.db'}"
        _intro(console, scenario, url, options.inject)
        async with SimServer(sim) as server, httpx.AsyncClient(base_url=server.url) as http:
            client = MiniMaxClient(http, SIM_API_KEY)
            with GroupBars(console, enabled=options.progress) as bars:
                report = await run_scenario(scenario, client, url=url, on_tick=bars.update)
                bars.update(report.groups, report.makespan)
    render(console, report, sim.stats())
    if options.json_path is not None:
        options.json_path.write_text(json.dumps(as_json(report, sim.stats()), indent=2) + "\n")
        console.print(f"report saved to {options.json_path}")
    return report


def _intro(console: Console, scenario: Scenario, url: str, inject: frozenset[str]) -> None:
    console.print(
        f"[bold]headrace demo[/]: {scenario.episodes} episodes x {scenario.shots} shots, "
        f"{scenario.low_batch} low-tier posters, a rush episode after {scenario.rush_at:g}s; "
        f"{scenario.slots} worker slots; quota window {scenario.window:g}s; "
        f"faults: {', '.join(sorted(inject)) or 'none'}"
    )
    console.print(f"store: {hide_passwords(url)}", markup=False)


class GroupBars:
    """One progress bar per group: succeeded / total, with queued, processing, dead and
    cancelled counts (a dead or cancelled task never fills the bar)."""

    def __init__(self, console: Console, *, enabled: bool) -> None:
        self.progress = Progress(
            TextColumn("{task.description:<10}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            console=console,
            disable=not enabled,
        )
        self.rows: dict[str, TaskID] = {}

    def __enter__(self) -> GroupBars:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, reports: Sequence[GroupReport], elapsed: float) -> None:
        for report in reports:
            row = self.rows.get(report.group)
            if row is None:
                row = self.progress.add_task(report.group, total=report.total, detail="")
                self.rows[report.group] = row
            self.progress.update(
                row, completed=report.succeeded, total=report.total, detail=_detail(report)
            )


def _detail(report: GroupReport) -> str:
    states = report.by_state
    queued = states[TaskState.READY] + states[TaskState.PENDING]
    processing = states[TaskState.RUNNING] + states[TaskState.WAITING]
    return (
        f"queued {queued:>3}  processing {processing:>2}  "
        f"dead {report.dead}  cancelled {report.cancelled}"
    )


def render(console: Console, report: ScenarioReport, referee: dict[str, ProviderStats]) -> None:
    console.print(groups_table(report.groups, title="Episodes"))
    console.print(_gates_table(report))
    console.print(_referee_table(referee))
    console.print(_summary_table(report))


def _gates_table(report: ScenarioReport) -> Table:
    table = Table(
        title="Gates (refusals: no token = rate window full, at cap = concurrency full)",
        title_justify="left",
        collapse_padding=True,
    )
    # In a narrow terminal (80 columns) the figures' headers wrap at their spaces and a gate's
    # name keeps its width; what still does not fit is folded onto the next line, never cut.
    table.add_column("gate", no_wrap=True, overflow="fold")
    for column in ("cap", "rate", "granted", "no token", "at cap", "rate limited", "peak"):
        table.add_column(column, justify="right", overflow="fold")
    table.add_column("1st jam", justify="right", overflow="fold")
    for gate in report.gates:
        rate = f"{gate.rate.n}/{gate.rate.window:g}s" if gate.rate else "-"
        jam = gate.first_blocked_at
        table.add_row(
            gate.name,
            str(gate.concurrency or "-"),
            rate,
            str(gate.granted),
            str(gate.blocked_by_token),
            str(gate.blocked_by_concurrency),
            str(gate.rate_limited),
            str(gate.peak_in_flight),
            "-" if jam is None else f"{jam - report.started_at:.1f}s",
        )
    return table


def _referee_table(referee: dict[str, ProviderStats]) -> Table:
    table = Table(title="Provider simulator (the referee)", title_justify="left")
    for column in ("provider", "accepted", "refused", "injected"):
        table.add_column(column, justify="left" if column == "provider" else "right")
    table.add_column("max in a window/quota", justify="right")
    table.add_column("max at once/cap", justify="right")
    for name, stats in referee.items():
        table.add_row(
            name,
            str(stats.accepted),
            str(stats.rejected),
            str(stats.injected),
            f"{stats.max_in_window} / {stats.quota.rpm}",
            f"{stats.max_concurrent} / {stats.quota.concurrency}",
        )
    return table


def _summary_table(report: ScenarioReport) -> Table:
    table = Table(title="Run", title_justify="left", show_header=False)
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("makespan", f"{report.makespan:.1f}s"),
        ("quota lower bound", f"{report.lower_bound:.1f}s"),
        ("makespan / lower bound", f"{report.ratio:.2f}"),
        ("first gate to jam", report.first_jammed or "-"),
        ("rush jumps (queued tasks overtaken)", str(report.rush_jumps)),
        ("aging promotions (low -> normal)", str(report.promotions)),
        ("promoted to rush", str(report.promoted_to_rush)),
        ("rate-limit responses received", str(report.rate_limited_responses)),
        ("backoff delays chosen", ", ".join(f"{d:.2f}s" for d in report.worker.backoffs) or "-"),
        ("all tasks succeeded", "yes" if report.all_succeeded else "NO"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def as_json(report: ScenarioReport, referee: dict[str, ProviderStats]) -> dict[str, object]:
    return {
        "scenario": asdict(report.scenario),
        "makespan_s": report.makespan,
        "lower_bound_s": report.lower_bound,
        "ratio": report.ratio,
        "first_jammed": report.first_jammed,
        "rush_jumps": report.rush_jumps,
        "aging_promotions": report.promotions,
        "promoted_to_rush": report.promoted_to_rush,
        "rate_limited_responses": report.rate_limited_responses,
        "all_succeeded": report.all_succeeded,
        "groups": [
            {
                "group": g.group,
                "total": g.total,
                "succeeded": g.succeeded,
                "dead": g.dead,
                "cancelled": g.cancelled,
                "percent": g.percent,
                "cost": dict(g.cost),
            }
            for g in report.groups
        ],
        "gates": [
            {
                "name": g.name,
                "granted": g.granted,
                "blocked_by_token": g.blocked_by_token,
                "blocked_by_concurrency": g.blocked_by_concurrency,
                "rate_limited": g.rate_limited,
                "peak_in_flight": g.peak_in_flight,
            }
            for g in report.gates
        ],
        "referee": {name: s.as_dict() for name, s in referee.items()},
        "latency": asdict(Latency()),
    }
