"""`headrace demo moderation`: an event-shaped burst of real media through the moderation
pipeline on the embedded store, with live progress; then the same burst in one arrival-order
queue (FIFO) over the same number of slots; the two reports side by side, the stage depths over
time as a PNG chart, and the figures as JSON."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table

import headrace as hr
from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.burst import VIDEO, VOICE, Burst, BurstReport, run_burst
from headrace.pipelines.moderation.media import open_media
from headrace.pipelines.moderation.pipeline import Admission, Moderation, Order, Staff, derive_stage
from headrace.pipelines.moderation.probe import MediaClass
from headrace.pipelines.moderation.scan import BuiltinScanner, Scanner
from headrace.runtime.classes import DEFAULT_CLASSES
from headrace.runtime.memory import DEFAULT_MEMORY
from headrace.store.protocol.types import StageStats, TaskState

STAFF = Staff(weight=2.0, by="organiser", reason="official event video")
TITLES = {
    "fair": "headrace: fair sessions, cost classes, bounds",
    "fair without heavy": "the same, without the heavy contributor (to measure its delay)",
    "fifo": "FIFO: one queue in arrival order, the same slots",
}
COLUMNS = {"fair": "headrace", "fair without heavy": "without heavy", "fifo": "FIFO"}


@dataclass(frozen=True)
class ModerationDemoOptions:
    burst: Burst
    admission: Admission
    scanner: Scanner | None = None
    chart: Path | None = None
    json_path: Path | None = None
    progress: bool = True
    fifo: bool = True
    memory: int | None = DEFAULT_MEMORY  # each worker's memory budget (runtime/memory.py)


async def run_moderation_demo(
    options: ModerationDemoOptions, console: Console
) -> dict[str, BurstReport]:
    burst = options.burst
    console.print(
        f"[bold]headrace demo moderation[/]: {burst.size} uploads to one event: "
        f"{burst.videos * burst.scale} videos, then {burst.heavy_photos} photos from one "
        f"contributor, {burst.crowd_sessions * burst.scale} sessions x {burst.crowd_photos} "
        f"photos at once, {burst.latecomers * burst.scale} latecomers with one photo, "
        f"{burst.voice_notes * burst.scale} voice notes; worker slots "
        + ", ".join(f"{name} {n}" for name, n in DEFAULT_CLASSES.items())
    )
    console.print("making the sample media (a photo, a voice note, a 12 s video) ...")
    payloads = {
        "crowd": samples.jpeg(1600, 1200),
        "heavy": samples.jpeg(1600, 1200, shade=90),
        "latecomer": samples.jpeg(1600, 1200, shade=180),
        VIDEO: samples.mp4(12.0, 960, 540, fps=24),
        VOICE: samples.mp3(20.0),
    }
    reports: dict[str, BurstReport] = {}
    runs: list[tuple[str, Order, Burst]] = [("fair", "fair", burst)]
    if burst.heavy_photos:  # the heavy contributor's delay: the same burst without it
        runs.append(("fair without heavy", "fair", replace(burst, heavy_photos=0)))
    if options.fifo:
        runs.append(("fifo", "fifo", burst))
    for name, order, shape in runs:
        with tempfile.TemporaryDirectory(prefix="headrace-moderation-") as scratch:
            reports[name] = await _run_once(
                name, order, replace(options, burst=shape), payloads, Path(scratch), console
            )
    render(console, reports)
    if options.chart is not None:
        draw_depths(reports, options.chart)
        console.print(f"stage depths over time: {options.chart}")
    if options.json_path is not None:
        figures: dict[str, object] = {name: report.as_json() for name, report in reports.items()}
        if alone_report := reports.get("fair without heavy"):
            figures["heavy_delay_s"] = round(reports["fair"].heavy_delay(alone_report), 3)
        options.json_path.write_text(json.dumps(figures, indent=2) + "\n")
        console.print(f"report saved to {options.json_path}")
    return reports


async def _run_once(
    name: str,
    order: Order,
    options: ModerationDemoOptions,
    payloads: dict[str, bytes],
    scratch: Path,
    console: Console,
) -> BurstReport:
    app = hr.App(f"sqlite:///{scratch / 'moderation.db'}")
    moderation = Moderation(
        app,
        open_media(scratch / "media"),
        options.scanner or BuiltinScanner(),
        admission=options.admission,
        order=order,
    )
    totals = _class_totals(options.burst)
    console.print(f"\n[bold]{TITLES[name]}[/]")
    async with app:
        with ClassBars(console, totals, enabled=options.progress) as bars:

            async def tick(stages: Sequence[StageStats], at: float) -> None:
                bars.update(await _done_by_class(app), stages, at)

            slots = sum(DEFAULT_CLASSES.values())
            return await run_burst(
                moderation,
                options.burst,
                payloads,
                slots=slots if order == "fifo" else None,
                on_tick=tick,
                staff=STAFF,
                memory=options.memory,
            )


def _class_totals(burst: Burst) -> dict[str, int]:
    totals = dict.fromkeys((c.value for c in MediaClass), 0)
    for upload in burst.uploads():
        totals[upload.media_class.value] += 1
    return totals


async def _done_by_class(app: hr.App) -> dict[str, int]:
    done: dict[str, int] = {}
    for media_class in MediaClass:
        counts = await app.store.counts(kinds=[derive_stage(media_class)])
        done[media_class.value] = counts[TaskState.SUCCEEDED]
    return done


class ClassBars:
    """Live bars: items reviewable per class, and what waits in each stage now."""

    def __init__(self, console: Console, totals: dict[str, int], *, enabled: bool) -> None:
        self.totals = totals
        self.progress = Progress(
            TextColumn("{task.description:>8}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            console=console,
            disable=not enabled,
            transient=False,
        )
        self.bars: dict[str, TaskID] = {}

    def __enter__(self) -> ClassBars:
        self.progress.start()
        for name, total in self.totals.items():
            self.bars[name] = self.progress.add_task(name, total=total, note="")
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, done: dict[str, int], stages: Sequence[StageStats], at: float) -> None:
        for name, bar in self.bars.items():
            waiting = {
                stage.kind.split(".")[1]: (stage.pending + stage.ready, stage.running)
                for stage in stages
                if stage.kind.endswith(f".{name}")
            }
            note = "  ".join(f"{k} {w} queued/{r} processing" for k, (w, r) in waiting.items())
            self.progress.update(bar, completed=done.get(name, 0), note=f"{at:5.1f}s  {note}")


Measure = Callable[[BurstReport], object]


def _over_bound(report: BurstReport) -> str:
    over = [
        kind
        for kind, peak in report.peak_waiting.items()
        if (bound := report.bounds.get(kind)) is not None and peak > bound
    ]
    return ", ".join(over) or "none"


MEASURES: list[tuple[str, str, Measure]] = [
    ("uploads, all settled in", "", lambda r: f"{r.uploads}, {r.makespan:.1f} s"),
    ("first reviewable photo at", "", lambda r: f"{r.first_photo['at']:.2f} s"),
    ("first photo: latency / its processing", "<= 2", lambda r: f"{r.first_photo_ratio:.2f}"),
    *(
        (f"p95 queue age, {c.value}", "", (lambda r, c=c: f"{r.queue_p95[c.value]:.2f} s"))
        for c in MediaClass
    ),
    ("Jain's index, crowd sessions", ">= 0.98", lambda r: f"{r.jain:.3f}"),
    (
        "latecomer's wait / one photo's processing",
        "<= 1",
        lambda r: f"{r.latecomer_wait:.2f} / {r.photo_processing:.2f} s = {r.latecomer_ratio:.2f}",
    ),
    ("items with a duplicate derivative set", "0", lambda r: r.duplicate_derivatives),
    ("stage runs done again (deferred)", "", lambda r: r.repeated_runs),
    ("uploads refused, sent again", "", lambda r: sum(r.refusals.values())),
    ("stages past their bound (sampled)", "none", _over_bound),
]


def render(console: Console, reports: dict[str, BurstReport]) -> None:
    table = Table(title="the burst, measured", title_justify="left")
    table.add_column("measure")
    for order in reports:
        table.add_column(COLUMNS[order], justify="right")
    table.add_column("goal")
    for name, goal, measure in MEASURES:
        table.add_row(name, *(str(measure(report)) for report in reports.values()), goal)
    console.print(table)
    fair = reports["fair"]
    alone = reports.get("fair without heavy")
    if alone is not None:
        delay = fair.heavy_delay(alone)
        console.print(
            f"the heavy contributor's delay on a latecomer's first photo: {delay:.2f} s "
            f"(goal: at most one photo's processing, {alone.photo_processing:.2f} s)"
        )
    states = ", ".join(f"{n} {state}" for state, n in sorted(fair.states.items()))
    console.print(f"items: {states}")


def draw_depths(reports: dict[str, BurstReport], path: Path) -> None:
    """Waiting tasks per stage over time, one panel per order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        len(reports), 1, figsize=(10, 3.6 * len(reports)), sharex=True, squeeze=False
    )
    every = sorted({k for r in reports.values() for _, depths in r.depth_series for k in depths})
    palette = plt.get_cmap("tab10")
    colours = {kind: palette(n % palette.N) for n, kind in enumerate(every)}  # one per stage
    for axis, (order, report) in zip(axes[:, 0], reports.items(), strict=True):
        kinds = sorted({kind for _, depths in report.depth_series for kind in depths})
        times = [at for at, _ in report.depth_series]
        for kind in kinds:
            depths = [d.get(kind, 0) for _, d in report.depth_series]
            axis.plot(times, depths, label=kind, color=colours[kind])
        bounds = {b for b in report.bounds.values() if b is not None}
        for bound in sorted(bounds):
            axis.axhline(bound, color="grey", linestyle=":", linewidth=1)
        axis.set_title(f"{TITLES[order]}: waiting tasks per stage", fontsize=9)
        axis.set_ylabel("waiting")
        axis.legend(fontsize=7, ncol=3, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the burst began")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
