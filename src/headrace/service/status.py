"""`headrace status`: groups, stages and gates of a store, and its retention, once or redrawn
until Ctrl-C."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from headrace.policy import gate as gating
from headrace.policy.gate import GateConfig, GateState, GateStatistics
from headrace.policy.redact import hide_passwords
from headrace.policy.retention import Retention
from headrace.runtime.app import App
from headrace.service.tables import groups_table, plain
from headrace.store.protocol.pruning import PrunerState
from headrace.store.protocol.types import GroupReport, StageStats


@dataclass(frozen=True)
class Snapshot:
    """What the store said, one read verb after another, and when (its clock, at the end)."""

    store: str  # the URL, without its password
    taken_at: float  # the store's clock
    groups: tuple[GroupReport, ...]
    stages: tuple[StageStats, ...]
    gates: tuple[GateStatistics, ...]
    gates_note: str = ""  # what to say when there is no gate to show
    retention: Retention = field(default_factory=Retention)  # the app's
    pruner: PrunerState | None = None  # the pruner's lease row: its last run


async def snapshot(app: App, groups: Sequence[str] = ()) -> Snapshot:
    """Read the groups (those named, or all), every stage with unfinished work (and the app's
    own stages, idle or not) and the app's gates."""
    store = app.store
    names = list(groups) or await store.groups()
    reports = await asyncio.gather(*(store.group_report(name) for name in names))
    busy = {stage.kind: stage for stage in await store.stages()}
    idle = {kind: StageStats(kind, 0, 0, 0, 0) for kind in app.definitions if kind not in busy}
    stages = sorted({**busy, **idle}.values(), key=lambda stage: stage.kind)
    now = await store.now()
    return Snapshot(
        hide_passwords(app.url),
        now,
        tuple(reports),
        tuple(stages),
        tuple(_with_unused(await store.gate_statistics(), app.gates.values(), now)),
        _gates_note(app),
        app.retention,
        await store.pruner_state(),
    )


def _gates_note(app: App) -> str:
    if app.definitions:
        return "Gates: the app declares none"
    return "Gates: they are declared by the app; give --app to see them"


def _with_unused(
    used: Sequence[GateStatistics], declared: Iterable[GateConfig], now: float
) -> list[GateStatistics]:
    """The store's gate figures, and a zero row for each gate the app declares that has granted
    or refused nothing yet (a template has no row until a task names one of its keys)."""
    seen = {stats.name for stats in used}
    unused = [
        gating.statistics(config, GateState(), now)
        for config in declared
        if not config.is_template and config.name not in seen
    ]
    return sorted([*used, *unused], key=lambda stats: stats.name)


async def show(app: App, console: Console, groups: Sequence[str] = ()) -> None:
    async with app:
        console.print(render(await snapshot(app, groups)))


async def watch(app: App, console: Console, groups: Sequence[str], *, every: float) -> None:
    """Redraw the snapshot every `every` seconds until cancelled (Ctrl-C)."""
    async with app:
        console.print(
            f"watching {hide_passwords(app.url)} every {every:g}s; Ctrl-C to stop", markup=False
        )
        with Live(console=console, auto_refresh=False) as live:
            while True:
                live.update(render(await snapshot(app, groups)), refresh=True)
                await asyncio.sleep(every)


def render(snap: Snapshot) -> Group:
    when = datetime.datetime.fromtimestamp(snap.taken_at, datetime.UTC)
    return Group(
        plain(f"store {snap.store} at {when:%Y-%m-%d %H:%M:%S} UTC"),
        groups_table(snap.groups),
        stages_table(snap.stages),
        gates_table(snap.gates, snap.taken_at) if snap.gates else plain(snap.gates_note),
        plain(retention_line(snap.retention)),
        plain(pruner_line(snap.pruner, snap.taken_at)),
    )


def retention_line(retention: Retention) -> str:
    """The ages after which finished rows go, as `--retention NAME=AGE` sets them."""
    settings = ", ".join(f"{name} {value}" for name, value in retention.described())
    return f"Retention (headrace prune; --retention NAME=AGE): {settings}"


def pruner_line(held: PrunerState | None, now: float) -> str:
    """The pruner's last run, or the one running now."""
    if held is None:
        return "Pruner: no run yet"
    if held.until > now:
        return f"Pruner: running now ({held.holder}, its lease ends in {age(held.until - now)})"
    if held.done_at is None:
        return f"Pruner: its last run failed ({held.holder}); the next one is due"
    return (
        f"Pruner: last run {age(now - held.done_at)} ago ({held.holder}), "
        f"removed {held.removed} rows"
    )


def stages_table(stages: Sequence[StageStats]) -> Table:
    table = Table(title="Stages", title_justify="left")
    table.add_column("stage", no_wrap=True)
    for column in ("pending", "ready", "running", "waiting", "oldest ready"):
        table.add_column(column, justify="right")
    for stage in stages:
        table.add_row(
            plain(stage.kind),
            str(stage.pending),
            str(stage.ready),
            str(stage.running),
            str(stage.waiting),
            age(stage.oldest_ready_age),
        )
    return table


def gates_table(gates: Sequence[GateStatistics], now: float) -> Table:
    table = Table(
        title="Gates (refusals: no token = rate window full, at cap = concurrency full)",
        title_justify="left",
    )
    table.add_column("gate", no_wrap=True)
    for column in ("cap", "rate", "held", "granted", "no token", "at cap", "limited", "penalty"):
        table.add_column(column, justify="right")
    for gate in gates:
        penalty = gate.penalized_until
        table.add_row(
            plain(gate.name),
            str(gate.concurrency or "-"),
            f"{gate.rate.n}/{gate.rate.window:g}s" if gate.rate else "-",
            str(gate.in_flight),
            str(gate.granted),
            str(gate.blocked_by_token),
            str(gate.blocked_by_concurrency),
            str(gate.rate_limited),
            age(penalty - now) if penalty is not None and penalty > now else "-",
        )
    return table


def age(seconds: float | None) -> str:
    """`-`, `42s`, `3m05s` or `2h07m`."""
    if seconds is None:
        return "-"
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
