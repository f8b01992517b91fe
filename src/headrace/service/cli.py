"""The `headrace` command.

Commands that use a store take it the same way (`service/apps.py`): `--db URL` or `HEADRACE_URL`,
`--app MODULE:ATTR` or `HEADRACE_APP`, the store given overriding the app's own. An expected
failure is one line on stderr (`service/failures.py`); logging is set up once, here, by
`service/logs.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click
from rich.console import Console

from headrace.pipelines.moderation.burst import Burst
from headrace.pipelines.moderation.deploy import make_moderation
from headrace.pipelines.moderation.media import MediaStore, MediaUnavailable
from headrace.pipelines.moderation.pipeline import Admission
from headrace.pipelines.moderation.review import ReviewRules
from headrace.pipelines.moderation.scan import ClamdScanner
from headrace.pipelines.providersim import parse_inject, parse_quotas, parse_spreads, run_server
from headrace.pipelines.studio_scenario import Scenario
from headrace.policy.durations import seconds
from headrace.policy.errors import ConfigError
from headrace.policy.retention import Retention
from headrace.runtime.app import App
from headrace.runtime.memory import DEFAULT_MEMORY, MIB, parse_size
from headrace.runtime.worker import Worker
from headrace.service import logs, prune, status, tasks
from headrace.service.api.auth import Role, create_token, revoke_token
from headrace.service.api.deps import ApiSettings, Delivery, host_names
from headrace.service.apps import require_existing, resolve, store_url
from headrace.service.demo import DemoOptions, run_demo
from headrace.service.dlq import dead_letters, letters_table
from headrace.service.dlq import show as show_task
from headrace.service.failures import CommandFailed, CommandGroup, WrongInput, use_store
from headrace.service.moderation_demo import ModerationDemoOptions, run_moderation_demo
from headrace.service.notify import OutboxRelay
from headrace.service.serve import ServeOptions, webhook_secrets
from headrace.service.serve import serve as serve_api
from headrace.store.urls import upgrade_schema

F = TypeVar("F", bound=Callable[..., object])


def _duration(value: str, name: str) -> float:
    try:
        return seconds(value, field=name)
    except ConfigError as error:
        raise click.BadParameter(str(error), param_hint=name) from None


def store_options(command: F) -> F:
    """`--app` and `--db`, with their environment variables, as every store command takes them."""
    command = click.option(
        "--app",
        "app_target",
        envvar="HEADRACE_APP",
        show_envvar=True,
        metavar="MODULE:ATTR",
        help="The app: its tasks, gates and store.",
    )(command)
    return click.option(
        "--db",
        envvar="HEADRACE_URL",
        show_envvar=True,
        metavar="URL",
        help="Store URL or SQLite file; overrides the app's store.",
    )(command)


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


def memory_option(command: F) -> F:
    """`--memory`: what the tasks running in a worker may be charged at once (their `memory`),
    as `worker`, `serve` and `demo moderation` take it."""
    return click.option(
        "--memory",
        default=f"{DEFAULT_MEMORY // MIB}MiB",
        show_default=True,
        metavar="SIZE",
        callback=_memory_budget,
        help="Memory budget of each worker for its tasks' estimates, e.g. 768MiB, 1GiB, 800M "
        "(powers of 1000), a number of bytes; 'off': none.",
    )(command)


def _memory_budget(ctx: click.Context, param: click.Parameter, value: str) -> int | None:
    """The bytes `--memory` gives (None: off); a bad size fails in one line naming it."""
    if value.strip().lower() == "off":
        return None
    try:
        return parse_size(value, field="--memory")
    except ConfigError as error:
        raise WrongInput(str(error)) from None


def retention_option(command: F) -> F:
    """`--retention NAME=AGE` (repeatable; HEADRACE_RETENTION, words separated by spaces): how
    long finished work is kept and how often workers prune, as `worker`, `serve`, `prune` and
    `status` take it."""
    return click.option(
        "--retention",
        "retention",
        multiple=True,
        envvar="HEADRACE_RETENTION",
        show_envvar=True,
        metavar="NAME=AGE",
        help="A retention setting, e.g. dead=14d, succeeded=6h, every=off, batch=1000 "
        "(repeatable; the variable: words separated by spaces). Default: the app's.",
    )(command)


def with_retention(app: App, words: tuple[str, ...]) -> App:
    """`app` with the `--retention` words applied over its own; a bad one fails in one line."""
    if words:
        try:
            app.retention = Retention.parse(words, base=app.retention)
        except ConfigError as error:
            raise WrongInput(f"--retention: {error}") from None
    return app


def _allowed_hosts(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    """The names `--allowed-host` gives; a bad one fails in one line naming the option."""
    try:
        return host_names(value, "--allowed-host")
    except ConfigError as error:
        raise WrongInput(str(error)) from None


@click.group(cls=CommandGroup)
@click.version_option(package_name="headrace", prog_name="headrace")
@click.option(
    "-v", "--verbose", count=True, help="headrace's own log lines at DEBUG (others stay quiet)."
)
@click.option(
    "--log-format",
    type=click.Choice(logs.FORMATS),
    default="text",
    show_default=True,
    help="Log lines as text, or as one JSON object per line.",
)
def main(verbose: int, log_format: str) -> None:
    """headrace: a durable scheduler for bursty media pipelines."""
    logs.configure(verbose=verbose, log_format=log_format)


@main.group(cls=CommandGroup, invoke_without_command=True)
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
        window=_duration(window, "--window"),
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


@main.command()
@click.argument("target", required=False, metavar="[MODULE:ATTR]")
@store_options
@click.option(
    "--slots",
    type=click.IntRange(1, 1024),
    help="Handlers at once [default: 4, or the cost classes' slots and 4 more].",
)
@click.option(
    "--prefetch",
    type=click.IntRange(0, 65536),
    help="Most tasks claimed ahead of the slots while there is a backlog, only tasks that pass "
    "no gate and charge no memory [default: 8 per slot; 0 with cost classes].",
)
@click.option(
    "--class",
    "classes",
    multiple=True,
    metavar="NAME=SLOTS",
    help="Slots of a cost class, e.g. --class video=2 (default: image=6 audio=2 video=2 when "
    "the app's stages name classes).",
)
@click.option(
    "--borrow/--no-borrow",
    default=True,
    show_default=True,
    help="Let a full cost class run in the slots a class with fewer slots leaves idle.",
)
@click.option("--lease", default="30s", show_default=True)
@click.option("--idle", default="0.5s", show_default=True, help="Longest sleep between claims.")
@click.option("--grace", default="30s", show_default=True, help="Shutdown wait for handlers.")
@click.option("--timeout", help="Time limit of an attempt whose stage sets none (default: none).")
@click.option("--name", help="Worker name in leases and attempt history.")
@click.option(
    "--report-every",
    default="10s",
    show_default=True,
    help="How often to log a progress line (tasks ended, by outcome); 0: never. Each success "
    "is a DEBUG line (-v).",
)
@memory_option
@retention_option
@click.pass_context
def worker(
    ctx: click.Context,
    target: str | None,
    db: str | None,
    app_target: str | None,
    slots: int | None,
    prefetch: int | None,
    classes: tuple[str, ...],
    borrow: bool,
    lease: str,
    idle: str,
    grace: str,
    timeout: str | None,
    name: str | None,
    report_every: str,
    memory: int | None,
    retention: tuple[str, ...],
) -> None:
    """Run a worker for the app at MODULE:ATTR (or --app) until SIGINT or SIGTERM. It prunes
    the store by the app's retention (see --retention) when a run is due."""
    target = _one_target(ctx, target, app_target)
    budget = _class_slots(classes)
    app = with_retention(resolve(db, target), retention)
    runner = Worker(
        app,
        slots=slots,
        prefetch=prefetch,
        classes=budget,
        borrow=borrow,
        name=name,
        lease=_duration(lease, "--lease"),
        idle=_duration(idle, "--idle"),
        grace=_duration(grace, "--grace"),
        timeout=None if timeout is None else _duration(timeout, "--timeout"),
        memory=memory,
        report_every=_every(report_every),
    )
    asyncio.run(_serve(runner, target))


def _every(given: str) -> float | None:
    """`--report-every`: a duration, or 0 for no progress lines."""
    every = _duration(given, "--report-every")
    return every if every > 0 else None


def _class_slots(given: tuple[str, ...]) -> dict[str, int] | None:
    """`--class NAME=SLOTS` options as a budget (None: none given)."""
    if not given:
        return None
    budget: dict[str, int] = {}
    for item in given:
        name, _, count = item.partition("=")
        if not name or not count.isdigit() or int(count) < 1 or name in budget:
            raise WrongInput(
                f"--class: expected NAME=SLOTS once per class, with SLOTS >= 1, got {item!r}"
            )
        budget[name] = int(count)
    return budget


def _one_target(ctx: click.Context, target: str | None, app_target: str | None) -> str:
    """The app, given positionally (as `uvicorn module:app`) or with --app / HEADRACE_APP; a
    positional one wins over the environment's."""
    given_twice = ctx.get_parameter_source("app_target") is click.core.ParameterSource.COMMANDLINE
    if target and app_target and given_twice and target != app_target:
        raise click.UsageError(f"two apps given: {target} and --app {app_target}; give one")
    chosen = target or app_target
    if not chosen:
        raise WrongInput("give the app: headrace worker MODULE:ATTR (or --app, or HEADRACE_APP)")
    return chosen


async def _serve(runner: Worker, target: str) -> None:
    app = runner.app
    try:
        await app.open()
        logs.worker_started(runner, target)
        await runner.run(handle_signals=True)
    finally:
        # A signal while closing (a second Ctrl-C, a process-group signal) must not interrupt
        # the close: the outcome writes are done, nothing is left to hurry.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: None)
        await app.close()


@main.command()
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
    "item is in focus).",
)
@click.option(
    "--undo-window",
    default="30s",
    show_default=True,
    help="How long a moderator may undo a decision; after it, only an admin changes it.",
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
    check_media(moderation.media)
    if clamd is not None and not ClamdScanner(clamd).ping():
        raise WrongInput(f"--clamd {clamd}: no clamd answers there; start clamd or leave it out")
    settings = ApiSettings(
        webhook_secrets=webhook_secrets(webhook_secret),
        secure_cookies=secure_cookies,
        allowed_hosts=allowed_hosts,
        media_delivery=media_delivery,
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


def check_media(media: MediaStore) -> None:
    """Fail in one line, before serving, when the media store cannot be used."""
    try:
        asyncio.run(media.check())
    except MediaUnavailable as error:
        raise CommandFailed(
            f"--media {media.describe()}: {error.reason}; check the endpoint, the bucket and "
            "the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
        ) from None


@main.group(cls=CommandGroup)
def token() -> None:
    """Bearer tokens of the API and the moderator page."""


@token.command("create")
@click.option("--db", envvar="HEADRACE_URL", show_envvar=True, metavar="URL", required=True)
@click.argument("name")
@click.option(
    "--role",
    type=click.Choice([role.value for role in Role]),
    required=True,
    help="What it may do.",
)
@click.option(
    "--event",
    "events",
    multiple=True,
    required=True,
    help="An event it covers (again for more; '*' for every event: admin only).",
)
def token_create(db: str, name: str, role: str, events: tuple[str, ...]) -> None:
    """Make a token for NAME and print it, once: only its hash is kept."""
    app = App(store_url(db))
    use_store(app.url)

    async def run() -> str:
        async with app:
            return await create_token(app.store, name=name, role=Role(role), events=events)

    click.echo(asyncio.run(run()))


@token.command("revoke")
@click.option("--db", envvar="HEADRACE_URL", show_envvar=True, metavar="URL", required=True)
@click.argument("name")
def token_revoke(db: str, name: str) -> None:
    """Revoke every token of NAME."""
    app = require_existing(App(store_url(db)))
    use_store(app.url)

    async def run() -> int:
        async with app:
            return await revoke_token(app.store, name)

    click.echo(f"{asyncio.run(run())} token(s) of {name} revoked")


@main.command()
@store_options
@click.argument("kind")
@click.argument("ref")
@click.option("--group", help="The reporting label (an episode, an event).")
@click.option("--flow", help="The fairness key (default: the group, or the kind).")
@click.option("--tier", type=click.Choice(["rush", "normal", "low"]), help="Default: the task's.")
@click.option("--key", help="Idempotency key: a known key returns its task, nothing new.")
@click.option("--after", type=int, multiple=True, metavar="TASK_ID", help="Wait for it (repeat).")
@click.option("--delay", default="0s", show_default=True, help="Not before this much later.")
def submit(
    db: str | None,
    app_target: str | None,
    kind: str,
    ref: str,
    group: str | None,
    flow: str | None,
    tier: str | None,
    key: str | None,
    after: tuple[int, ...],
    delay: str,
) -> None:
    """Enqueue one task of KIND for REF through the app's task definition; print its id."""
    if not app_target:
        raise WrongInput("submit needs the app that defines the task: --app MODULE:ATTR")
    app = resolve(db, app_target)
    fields = tasks.SubmitFields(group, flow, tier, key, after, _duration(delay, "--delay"))
    click.echo(asyncio.run(tasks.submit(app, kind, ref, fields)))


@main.command()
@store_options
@click.argument("task_id", type=int)
def cancel(db: str | None, app_target: str | None, task_id: int) -> None:
    """Cancel a task that has no outcome yet, and the tasks that wait on it."""
    app = require_existing(resolve(db, app_target))
    click.echo(asyncio.run(tasks.cancel(app, task_id)))


@main.command("status")
@store_options
@click.option("--group", "groups", multiple=True, help="Only this group (repeat for more).")
@click.option("--watch", is_flag=True, help="Redraw until Ctrl-C.")
@click.option("--every", default="1s", show_default=True, help="Time between redraws.")
@retention_option
def status_command(
    db: str | None,
    app_target: str | None,
    groups: tuple[str, ...],
    watch: bool,
    every: str,
    retention: tuple[str, ...],
) -> None:
    """Groups (progress and cost), stages (queued and running work), gates, and retention."""
    app = with_retention(require_existing(resolve(db, app_target)), retention)
    pause = _duration(every, "--every")
    if pause <= 0:
        raise click.BadParameter("must be more than 0", param_hint="--every")
    if not watch:
        asyncio.run(status.show(app, Console(), groups))
        return
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a watch ends, not a failure
        asyncio.run(status.watch(app, Console(), groups, every=pause))


@main.command("prune")
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


@main.group()
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


@main.command("provider-sim")
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
    run_server(host, port, _duration(window, "--window"), inject, seed, limits, durations)


@main.group()
def dlq() -> None:
    """Dead letters: tasks that failed for good, kept with their attempt history."""


@dlq.command("list")
@store_options
@click.option("--group", help="Only this group (episode, event).")
@click.option("--kind", help="Only this task kind (stage).")
@click.option("--limit", default=200, show_default=True, type=click.IntRange(1, 100_000))
def dlq_list(
    db: str | None, app_target: str | None, group: str | None, kind: str | None, limit: int
) -> None:
    """List dead letters."""

    async def run(app: App) -> None:
        async with app:
            found = await dead_letters(app.store, group=group, kind=kind, limit=limit)
            Console().print(letters_table(found))

    asyncio.run(run(require_existing(resolve(db, app_target))))


@dlq.command("show")
@store_options
@click.argument("task_id", type=int)
def dlq_show(db: str | None, app_target: str | None, task_id: int) -> None:
    """Show one task and its attempt history."""

    async def run(app: App) -> None:
        async with app:
            await show_task(app.store, task_id, Console())

    asyncio.run(run(require_existing(resolve(db, app_target))))


@dlq.command("retry")
@store_options
@click.option("--group", help="Only this group.")
@click.option("--kind", help="Only this task kind.")
@click.argument("task_ids", type=int, nargs=-1)
def dlq_retry(
    db: str | None,
    app_target: str | None,
    group: str | None,
    kind: str | None,
    task_ids: tuple[int, ...],
) -> None:
    """Re-enqueue dead letters (all, or those given by id, group, kind) with fresh attempts."""

    async def run(app: App) -> None:
        async with app:
            ids = await app.store.redrive(task_ids=task_ids or None, group=group, kind=kind)
            app.notify()
        shown = ", ".join(map(str, ids)) if ids else "none"
        click.echo(f"re-enqueued {len(ids)}: {shown}")

    asyncio.run(run(require_existing(resolve(db, app_target))))


@main.group()
def db() -> None:
    """The store's schema."""


@db.command("upgrade")
@store_options
def db_upgrade(db: str | None, app_target: str | None) -> None:
    """Apply the schema migrations the store lacks; print the version before and after."""
    before, after = asyncio.run(upgrade_schema(resolve(db, app_target).url))
    click.echo(f"schema version {before} -> {after}")
