"""The commands of the moderation pipeline: `demo moderation` (a burst of real media, fair
beside FIFO) and `event close`, with the options `serve` shares.

They need `headrace[moderation]` (PyAV, libvips, Pillow, obstore, matplotlib): `cli.py` loads
this module only when one of them runs, and says which extra is missing when it is.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click
from rich.console import Console

from headrace.pipelines.moderation.burst import Burst
from headrace.pipelines.moderation.pipeline import Admission
from headrace.pipelines.moderation.scan import ClamdScanner
from headrace.pipelines.moderation.upkeep import close_event
from headrace.policy.retention import shown
from headrace.runtime.app import App
from headrace.service import logs
from headrace.service.apps import require_existing, resolve
from headrace.service.cli import F, memory_option, retention_option, store_options, with_retention
from headrace.service.failures import WrongInput
from headrace.service.moderation_demo import ModerationDemoOptions, run_moderation_demo


def admission_options(command: F) -> F:
    """`--per-event`, `--per-session` and `--stage-bound`: the moderation pipeline's
    `Admission`, as `demo moderation` and `serve` take it."""
    for name, default, what in reversed(
        (
            ("--per-event", Admission.per_event, "Uploads one event may have waiting."),
            ("--per-session", Admission.per_session, "Uploads one session may have waiting."),
            (
                "--stage-bound",
                Admission.stage_bound,
                "Tasks each scan and derive stage holds (10 per slot that runs it).",
            ),
        )
    ):
        command = click.option(
            name,
            default=default,
            show_default=True,
            type=click.IntRange(1, 10_000_000),
            help=what,
        )(command)
    return command


@click.command("moderation")
@click.option(
    "--crowd",
    default=Burst.crowd_sessions,
    show_default=True,
    type=click.IntRange(1, 500),
    help="Sessions that send photos at the same moment.",
)
@click.option(
    "--photos",
    default=Burst.crowd_photos,
    show_default=True,
    type=click.IntRange(1, 100),
    help="Photos each crowd session sends.",
)
@click.option(
    "--heavy",
    default=Burst.heavy_photos,
    show_default=True,
    type=click.IntRange(0, 1000),
    help="Photos the one heavy contributor sends.",
)
@click.option(
    "--latecomers", default=Burst.latecomers, show_default=True, type=click.IntRange(0, 500)
)
@click.option("--videos", default=Burst.videos, show_default=True, type=click.IntRange(0, 100))
@click.option("--voice", default=Burst.voice_notes, show_default=True, type=click.IntRange(0, 100))
@admission_options
@memory_option
@click.option(
    "--clamd",
    metavar="SOCKET|HOST:PORT",
    help="Scan with clamd there (default: the built-in EICAR and deny-list scanner).",
)
@click.option(
    "--chart",
    type=click.Path(path_type=Path),
    default=Path("headrace-moderation.png"),
    show_default=True,
    help="Where to draw the stage depths over time.",
)
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Save the report.")
@click.option("--no-fifo", is_flag=True, help="Skip the FIFO run beside it.")
@click.option("--no-progress", is_flag=True, help="No live progress bars.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.pass_context
def demo_moderation(
    ctx: click.Context,
    crowd: int,
    photos: int,
    heavy: int,
    latecomers: int,
    videos: int,
    voice: int,
    per_session: int,
    per_event: int,
    stage_bound: int,
    memory: int | None,
    clamd: str | None,
    chart: Path,
    json_path: Path | None,
    no_fifo: bool,
    no_progress: bool,
    seed: int,
) -> None:
    """Run the moderation pipeline on an event-shaped burst of real media, then the same burst
    in one FIFO queue, and compare: time to the first reviewable photo, queue age by class,
    duplicate derivatives, fairness across sessions, stage depths (drawn to --chart)."""
    logs.quiet_unless(ctx.find_root().params["verbose"])
    scanner = None
    if clamd is not None:
        scanner = ClamdScanner(clamd)
        if not scanner.ping():
            raise WrongInput(
                f"--clamd {clamd}: no clamd answers there; start clamd or leave "
                "--clamd out to use the built-in scanner"
            )
    burst = Burst(
        crowd_sessions=crowd,
        crowd_photos=photos,
        heavy_photos=heavy,
        latecomers=latecomers,
        videos=videos,
        voice_notes=voice,
        seed=seed,
    )
    admission = Admission(per_event=per_event, per_session=per_session, stage_bound=stage_bound)
    options = ModerationDemoOptions(
        burst,
        admission,
        scanner,
        chart,
        json_path,
        progress=not no_progress,
        fifo=not no_fifo,
        memory=memory,
    )
    reports = asyncio.run(run_moderation_demo(options, Console()))
    if reports["fair"].duplicate_derivatives:
        sys.exit(1)


@click.group()
def event() -> None:
    """Events of the moderation pipeline."""


@event.command("close")
@store_options
@retention_option
@click.argument("name", metavar="EVENT")
@click.option("--by", default="cli", show_default=True, help="Who closes it, for the audit log.")
def event_close(
    db: str | None, app_target: str | None, retention: tuple[str, ...], name: str, by: str
) -> None:
    """Close EVENT: it takes no more uploads, and its settled items go with their media once
    the retention's closed_events age has passed. Audited."""
    app = with_retention(require_existing(resolve(db, app_target)), retention)
    click.echo(asyncio.run(close(app, name, by=by)))


async def close(app: App, event: str, *, by: str) -> str:
    """Close an event; say what that means for its items."""
    async with app:
        applied = await close_event(app.store, event, by=by)
    if not applied:
        return f"event {event} was closed already: nothing changed"
    age = app.retention.closed_events
    after = "never (closed_events is off)" if age is None else f"{shown(age)} from now"
    return (
        f"closed event {event}: it takes no more uploads; its settled items go with their "
        f"media {after}"
    )
