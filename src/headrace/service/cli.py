"""The `headrace` command.

Commands that use a store take it the same way (`service/apps.py`): `--db URL` or `HEADRACE_URL`,
`--app MODULE:ATTR` or `HEADRACE_APP`, the store given overriding the app's own. An expected
failure is one line on stderr (`service/failures.py`); logging is set up once, here, by
`service/logs.py`.

The commands that run the shipped pipelines or a server live in modules imported only when one
of them runs (`LazyGroup`): `demo`, `provider-sim` and `prune` in `cli_pipelines.py`, `demo
moderation` and `event` in `cli_moderation.py`, `serve` in `cli_serve.py`. A `headrace worker`
process starts in a fifth of the time and memory without the web and media stacks, which matters
most when many start at once; and the last two modules need extras (`service/extras.py`), which
`pip install headrace` does not bring: without them, their commands say which in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import signal
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console

from headrace.policy.durations import seconds
from headrace.policy.errors import ConfigError
from headrace.policy.retention import Retention
from headrace.runtime.app import App
from headrace.runtime.memory import DEFAULT_MEMORY, MIB, parse_size
from headrace.runtime.worker import Worker
from headrace.service import extras, logs, status, tasks
from headrace.service.api.auth import Role, create_token, revoke_token
from headrace.service.apps import require_existing, resolve, store_url
from headrace.service.dlq import dead_letters, letters_table
from headrace.service.dlq import show as show_task
from headrace.service.failures import CommandGroup, WrongInput, use_store
from headrace.store.urls import upgrade_schema

F = TypeVar("F", bound=Callable[..., object])


def option_seconds(value: str, name: str) -> float:
    """A duration option's value in seconds; a bad one fails naming the option."""
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


class LazyGroup(CommandGroup):
    """A command group some of whose commands are imported when they are first looked up
    (`lazy`: name -> "module:attribute"), as Click's documentation shows for large CLIs. A
    command of an extra (`extras`: name -> extra) that is not installed is a stand-in that says
    which extra it needs (`service/extras.py`)."""

    def __init__(
        self,
        *args: Any,
        lazy: dict[str, str],
        extras: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy
        self.extras = extras or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        extra = self.extras.get(cmd_name)
        lacking = () if extra is None else extras.missing(extra)
        if extra is not None and lacking:
            path = f"{ctx.command_path if ctx is not None else self.name} {cmd_name}"
            return extras.stand_in(cmd_name, path, extra, lacking)
        module, _, attribute = self.lazy[cmd_name].partition(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy[cmd_name]} is not a click command")
        return command


PIPELINES = "headrace.service.cli_pipelines"
MODERATION = "headrace.service.cli_moderation"


@click.group(
    cls=LazyGroup,
    lazy={
        "demo": f"{PIPELINES}:demo",
        "event": f"{MODERATION}:event",
        "provider-sim": f"{PIPELINES}:provider_sim",
        "prune": f"{PIPELINES}:prune_command",
        "serve": "headrace.service.cli_serve:serve",
    },
    extras={"event": "moderation", "serve": "service"},
)
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
    "no gate and charge no memory [default: 16 per slot; 0 with cost classes].",
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
        lease=option_seconds(lease, "--lease"),
        idle=option_seconds(idle, "--idle"),
        grace=option_seconds(grace, "--grace"),
        timeout=None if timeout is None else option_seconds(timeout, "--timeout"),
        memory=memory,
        report_every=_every(report_every),
    )
    asyncio.run(_serve(runner, target))


def _every(given: str) -> float | None:
    """`--report-every`: a duration, or 0 for no progress lines."""
    every = option_seconds(given, "--report-every")
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
        await app.check_start()  # before the first log line: a failure is one line
        logs.worker_started(runner, target)
        await runner.run(handle_signals=True)
    finally:
        # A signal while closing (a second Ctrl-C, a process-group signal) must not interrupt
        # the close: the outcome writes are done, nothing is left to hurry.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: None)
        await app.close()


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
    fields = tasks.SubmitFields(group, flow, tier, key, after, option_seconds(delay, "--delay"))
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
    pause = option_seconds(every, "--every")
    if pause <= 0:
        raise click.BadParameter("must be more than 0", param_hint="--every")
    if not watch:
        asyncio.run(status.show(app, Console(), groups))
        return
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a watch ends, not a failure
        asyncio.run(status.watch(app, Console(), groups, every=pause))


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
