"""The commands that run the shipped pipelines or a server: `demo` (the studio episodes and
`demo moderation`), `serve`, `provider-sim`, `prune` and `event close` (which reach the
moderation pipeline's records and media).

`cli.py` loads this module when one of them runs, so `headrace worker`, `submit` and the other
store commands start without the web and media stacks (FastAPI, PyAV, Pillow, the notifier).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click
from rich.console import Console

from headrace.pipelines.moderation.burst import Burst
from headrace.pipelines.moderation.deploy import make_moderation
from headrace.pipelines.moderation.pipeline import Admission, Moderation
from headrace.pipelines.moderation.review import ReviewRules
from headrace.pipelines.moderation.scan import ClamdScanner
from headrace.pipelines.providersim import parse_inject, parse_quotas, parse_spreads, run_server
from headrace.pipelines.studio_scenario import Scenario
from headrace.policy.durations import seconds
from headrace.policy.errors import ConfigError
from headrace.service import logs, prune
from headrace.service.api.deps import ApiSettings, Delivery, host_names
from headrace.service.apps import require_existing, resolve, store_url
from headrace.service.cli import (
    F,
    memory_option,
    option_seconds,
    retention_option,
    store_options,
    with_retention,
)
from headrace.service.demo import DemoOptions, run_demo
from headrace.service.failures import CommandGroup, WrongInput, use_store
from headrace.service.moderation_demo import ModerationDemoOptions, run_moderation_demo
from headrace.service.notify import OutboxRelay
from headrace.service.serve import ServeOptions, webhook_secrets
from headrace.service.serve import serve as serve_api


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


def _allowed_hosts(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    """The names `--allowed-host` gives; a bad one fails in one line naming the option."""
    try:
        return host_names(value, "--allowed-host")
    except ConfigError as error:
        raise WrongInput(str(error)) from None


@click.group(cls=CommandGroup, invoke_without_command=True)
@click.option("--db", help="Store URL or SQLite file (default: a new file in a temp dir).")
@click.option("--window", default="6s", show_default=True, help="Quota window ('60s' is real).")
@click.option(
    "--inject", default="", help="Provider faults: ratelimit, auth, flaky, videofail, slowsubmit."
)
@click.option("--episodes", default=5, show_default=True, type=click.IntRange(1, 50))
@click.option("--shots", default=6, show_default=True, type=click.IntRange(1, 40))
@click.option("--slots", default=4, show_default=True, type=click.IntRange(1, 256))
@click.option("--low-batch", default=8, show_default=True, type=click.IntRange(0, 500))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Save the report.")
@click.option("--no-progress", is_flag=True, help="No live progress bars.")
@click.pass_context
def demo(
    ctx: click.Context,
    db: str | None,
    window: str,
    inject: str,
    episodes: int,
    shots: int,
    slots: int,
    low_batch: int,
    seed: int,
    json_path: Path | None,
    no_progress: bool,
) -> None:
    """Run the studio pipeline: five episodes, a low batch and a rush episode, under quota.
    `headrace demo moderation` runs the moderation pipeline on a burst of real media.

    The demo needs a store of its own: without --db a new file in a temporary directory
    (HEADRACE_URL is not read, so the demo never writes into a deployment's store)."""
    if ctx.invoked_subcommand is not None:
        return
    logs.quiet_unless(ctx.find_root().params["verbose"])  # the report is the demo's output
    try:
        faults = parse_inject(inject) if inject else frozenset[str]()
    except ConfigError as error:
        raise click.BadParameter(str(error), param_hint="--inject") from None
    scenario = Scenario(
        episodes=episodes,
        shots=shots,
        low_batch=low_batch,
        slots=slots,
        window=option_seconds(window, "--window"),
        seed=seed,
    )
    url = store_url(db) if db else None
    if url is not None:
        use_store(url)
    options = DemoOptions(scenario, url, faults, json_path, not no_progress)
    report = asyncio.run(run_demo(options, Console()))
    if not report.all_succeeded and not faults:
        sys.exit(1)


@demo.command("moderation")
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


@click.command()
@click.option(
    "--db",
    envvar="HEADRACE_URL",
    show_envvar=True,
    metavar="URL",
    help="Store URL or SQLite file [default: sqlite:///headrace.db].",
)
@click.option(
    "--media",
    envvar="HEADRACE_MEDIA",
    show_envvar=True,
    default="headrace-media",
    show_default=True,
    metavar="DIR|URL",
    help="Where uploads and previews are kept, shared by every process of a deployment: a "
    "directory (or file:///DIR), or s3://BUCKET/PREFIX?endpoint=URL&region=NAME&path_style="
    "true|false with credentials in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.",
)
@click.option(
    "--media-delivery",
    type=click.Choice(["redirect", "stream"]),
    default="redirect",
    show_default=True,
    envvar="HEADRACE_MEDIA_DELIVERY",
    show_envvar=True,
    help="How a preview kept in a bucket reaches the browser: a redirect to a URL signed for "
    "five minutes, or streamed through this service.",
)
@click.option("--clamd", envvar="HEADRACE_CLAMD", show_envvar=True, metavar="SOCKET|HOST:PORT")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(0, 64),
    help="Workers in this process (0: leave the work to `headrace worker` processes).",
)
@click.option(
    "--webhook-secret",
    "webhook_secret",
    multiple=True,
    envvar="HEADRACE_WEBHOOK_SECRETS",
    show_envvar=True,
    metavar="PROVIDER=SECRET",
    help="The key a provider signs its webhooks with (the variable: pairs separated by spaces).",
)
@click.option("--secure-cookies", is_flag=True, help="Cookies only over HTTPS (behind TLS).")
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    envvar="HEADRACE_ALLOWED_HOSTS",
    show_envvar=True,
    metavar="HOST",
    callback=_allowed_hosts,
    help="A host name the service answers for, on any port; others get 400. Repeatable (the "
    "variable: names separated by spaces); none: any host.",
)
@click.option(
    "--notify-url",
    envvar="HEADRACE_NOTIFY_URL",
    show_envvar=True,
    metavar="URL",
    help="Send the outbox's notifications (item.approved, item.rejected) there.",
)
@click.option(
    "--notify-secret",
    envvar="HEADRACE_NOTIFY_SECRET",
    show_envvar=True,
    metavar="SECRET",
    help="The key notifications are signed with (16 characters or more).",
)
@click.option(
    "--claim-ttl",
    default="5m",
    show_default=True,
    help="How long a moderator's claim on an item lasts unrenewed (the page renews it while the "
    "item is the current one).",
)
@click.option(
    "--undo-window",
    default="30s",
    show_default=True,
    help="How long a moderator may undo a decision; after it, only an admin changes it.",
)
@click.option(
    "--metrics-lease",
    default="2m",
    show_default=True,
    envvar="HEADRACE_METRICS_LEASE",
    show_envvar=True,
    help="How long a scrape of /metrics makes this process the one that exports the store's "
    "figures: more than Prometheus's scrape interval (another process takes over once it ran "
    "out).",
)
@admission_options
@memory_option
@retention_option
def serve(
    db: str | None,
    media: str,
    media_delivery: Delivery,
    clamd: str | None,
    host: str,
    port: int,
    workers: int,
    webhook_secret: tuple[str, ...],
    secure_cookies: bool,
    allowed_hosts: tuple[str, ...],
    notify_url: str | None,
    notify_secret: str | None,
    claim_ttl: str,
    undo_window: str,
    metrics_lease: str,
    per_event: int,
    per_session: int,
    stage_bound: int,
    memory: int | None,
    retention: tuple[str, ...],
) -> None:
    """Serve the HTTP API, the moderator page and /metrics (until SIGINT or SIGTERM)."""
    relay = None
    if notify_url is not None:
        if not notify_secret:
            raise WrongInput("--notify-url: give --notify-secret (or HEADRACE_NOTIFY_SECRET) too")
        relay = OutboxRelay(notify_url, notify_secret)
    admission = Admission(per_event=per_event, per_session=per_session, stage_bound=stage_bound)
    url = store_url(db) if db else None
    review = review_rules(claim_ttl, undo_window)
    moderation = make_moderation(url, media, clamd, admission=admission, review=review)
    with_retention(moderation.app, retention)
    use_store(moderation.app.url)
    check_media(moderation)
    if clamd is not None and not ClamdScanner(clamd).ping():
        raise WrongInput(f"--clamd {clamd}: no clamd answers there; start clamd or leave it out")
    settings = ApiSettings(
        webhook_secrets=webhook_secrets(webhook_secret),
        secure_cookies=secure_cookies,
        allowed_hosts=allowed_hosts,
        media_delivery=media_delivery,
        metrics_lease=lease_seconds(metrics_lease),
    )
    serve_api(moderation, ServeOptions(host, port, workers, settings, relay, memory))


def review_rules(claim_ttl: str, undo_window: str) -> ReviewRules:
    """`--claim-ttl` and `--undo-window` as the moderators' rules; a bad one named by its option."""
    ttl = seconds(claim_ttl, field="--claim-ttl")
    window = seconds(undo_window, field="--undo-window")
    for option, field, given in (
        ("--claim-ttl", "claim_ttl", ttl),
        ("--undo-window", "undo_window", window),
    ):
        try:
            ReviewRules(**{field: given})
        except ConfigError as error:
            raise WrongInput(f"{option}: {str(error).split(': ', 1)[1]}") from None
    return ReviewRules(claim_ttl=ttl, undo_window=window)


def lease_seconds(given: str) -> float:
    """`--metrics-lease` in seconds; a bad one named by its option."""
    lease = option_seconds(given, "--metrics-lease")
    if not 1 <= lease <= 3600:
        raise click.BadParameter("expected 1s to 1h", param_hint="--metrics-lease")
    return lease


def check_media(moderation: Moderation) -> None:
    """Fail in one line, before serving, when the media store cannot be used: the checks a
    worker process runs at start (`pipelines/moderation/originals.py`), once for the process."""

    async def checked() -> None:
        try:
            await moderation.app.check_start()
        finally:
            await moderation.app.close()

    asyncio.run(checked())


@click.command("prune")
@store_options
@retention_option
@click.option("--dry-run", is_flag=True, help="Say what would go, per kind; change nothing.")
def prune_command(
    db: str | None, app_target: str | None, retention: tuple[str, ...], dry_run: bool
) -> None:
    """Remove what the retention says is old enough, now: finished tasks, notices, audit
    rows, sign-ins, deliveries, and with the app's pipelines their records and files (give
    --app for those). One pruner runs at a time: while another does, this one fails."""
    app = with_retention(require_existing(resolve(db, app_target)), retention)
    click.echo(asyncio.run(prune.prune(app, dry_run=dry_run)))


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
    click.echo(asyncio.run(prune.close(app, name, by=by)))


@click.command("provider-sim")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8090, show_default=True, type=click.IntRange(0, 65535))
@click.option("--window", default="6s", show_default=True, help="Quota window ('60s' is real).")
@click.option(
    "--inject",
    default="",
    help="Faults: ratelimit, auth, flaky, videofail, slowsubmit (comma-separated).",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--quota",
    "quotas",
    multiple=True,
    help="Override a quota: PROVIDER=RPM/CONCURRENCY, e.g. image=30/3 (repeatable).",
)
@click.option(
    "--latency",
    "spreads",
    multiple=True,
    help="Call durations: PROVIDER=LOW..HIGH seconds, e.g. image=0.2..0.5 (repeatable).",
)
def provider_sim(
    host: str,
    port: int,
    window: str,
    inject: str,
    seed: int,
    quotas: tuple[str, ...],
    spreads: tuple[str, ...],
) -> None:
    """Serve the MiniMax-shaped provider simulator, the quota referee, over HTTP."""
    limits, durations = parse_quotas(quotas), parse_spreads(spreads)
    run_server(host, port, option_seconds(window, "--window"), inject, seed, limits, durations)
