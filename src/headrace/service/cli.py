"""The `headrace` command."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console

from headrace.pipelines.providersim import parse_inject, parse_quotas, run_server
from headrace.pipelines.studio_scenario import Scenario
from headrace.policy.durations import seconds
from headrace.policy.errors import ConfigError, UnknownTask
from headrace.runtime.app import App
from headrace.runtime.worker import Worker
from headrace.service.demo import DemoOptions, run_demo
from headrace.service.dlq import dead_letters, letters_table
from headrace.service.dlq import show as show_task
from headrace.store.sqlite import path_from_url


def _duration(value: str, name: str) -> float:
    try:
        return seconds(value, field=name)
    except ConfigError as error:
        raise click.BadParameter(str(error)) from None


def _store_url(db: str) -> str:
    """Accept a store URL, or a plain file path for the embedded store."""
    if "://" in db:
        return db
    return f"sqlite:///{Path(db).resolve()}"


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """headrace: a durable scheduler for bursty media pipelines."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@click.option("--db", help="Store URL or SQLite file (default: a new file in a temp dir).")
@click.option("--window", default="6s", show_default=True, help="Quota window ('60s' is real).")
@click.option("--inject", default="", help="Provider faults: ratelimit, auth, flaky, videofail.")
@click.option("--episodes", default=5, show_default=True, type=click.IntRange(1, 50))
@click.option("--shots", default=6, show_default=True, type=click.IntRange(1, 40))
@click.option("--slots", default=4, show_default=True, type=click.IntRange(1, 256))
@click.option("--low-batch", default=8, show_default=True, type=click.IntRange(0, 500))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Save the report.")
@click.option("--no-progress", is_flag=True, help="No live progress bars.")
def demo(
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
    """Run the studio pipeline: five episodes, a low batch and a rush episode, under quota."""
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
    options = DemoOptions(
        scenario, _store_url(db) if db else None, faults, json_path, not no_progress
    )
    report = asyncio.run(run_demo(options, Console()))
    if not report.all_succeeded and not faults:
        sys.exit(1)


def load_app(target: str) -> App:
    """`module:attribute` (attribute defaults to `app`); a callable attribute is called."""
    module_name, _, attribute = target.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like uvicorn: the user's modules by their names
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise click.BadParameter(f"cannot import {module_name!r}: {error}") from None
    found = getattr(module, attribute or "app", None)
    if _is_factory(found):
        found = found()  # type: ignore[misc]
    if not isinstance(found, App):
        raise click.BadParameter(f"{target!r} is not a headrace App (nor makes one)")
    return found


def _is_factory(found: object) -> bool:
    """A callable that needs no arguments: called to make the app."""
    if isinstance(found, App) or not callable(found):
        return False
    try:
        inspect.signature(found).bind()
    except (TypeError, ValueError):
        return False
    return True


@main.command()
@click.argument("target")
@click.option("--db", help="Override the app's store URL (or SQLite file).")
@click.option("--slots", default=4, show_default=True, type=click.IntRange(1, 1024))
@click.option("--lease", default="30s", show_default=True)
@click.option("--idle", default="0.5s", show_default=True, help="Longest sleep between claims.")
@click.option("--grace", default="30s", show_default=True, help="Shutdown wait for handlers.")
@click.option("--name", help="Worker name in leases and attempt history.")
def worker(
    target: str,
    db: str | None,
    slots: int,
    lease: str,
    idle: str,
    grace: str,
    name: str | None,
) -> None:
    """Run workers for the app at TARGET (module:app) until SIGINT or SIGTERM."""
    app = load_app(target)
    if db:
        app.url = _store_url(db)
    try:
        runner = Worker(
            app,
            slots=slots,
            name=name,
            lease=_duration(lease, "--lease"),
            idle=_duration(idle, "--idle"),
            grace=_duration(grace, "--grace"),
        )
    except ConfigError as error:  # e.g. --lease 0: the worker's own checks, named
        raise click.UsageError(str(error)) from None

    async def serve() -> None:
        try:
            await runner.run(handle_signals=True)
        finally:
            # A signal while closing (a second Ctrl-C, a process-group signal) must not
            # interrupt the close: the outcome writes are done, nothing is left to hurry.
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, lambda: None)
            await app.close()

    asyncio.run(serve())


@main.command("provider-sim")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8090, show_default=True, type=click.IntRange(0, 65535))
@click.option("--window", default="6s", show_default=True, help="Quota window ('60s' is real).")
@click.option(
    "--inject", default="", help="Faults: ratelimit, auth, flaky, videofail (comma-separated)."
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--quota",
    "quotas",
    multiple=True,
    help="Override a quota: PROVIDER=RPM/CONCURRENCY, e.g. image=30/3 (repeatable).",
)
def provider_sim(
    host: str, port: int, window: str, inject: str, seed: int, quotas: tuple[str, ...]
) -> None:
    """Serve the MiniMax-shaped provider simulator, the quota referee, over HTTP."""
    try:
        limits = parse_quotas(quotas)
        run_server(host, port, _duration(window, "--window"), inject, seed, limits)
    except ConfigError as error:
        raise click.BadParameter(str(error)) from None


def _open_store_for(db: str | None, app_target: str | None) -> App:
    if bool(db) == bool(app_target):
        raise click.UsageError("give the store with exactly one of --db URL or --app module:app")
    app = load_app(app_target) if app_target else App(_store_url(db or ""))
    if app.url.startswith("sqlite:") and not path_from_url(app.url).exists():
        raise click.BadParameter(f"no store at {app.url}", param_hint="--db")
    return app


def _store_options(command: Callable[..., None]) -> Callable[..., None]:
    command = click.option("--app", "app_target", help="Take the store from this app.")(command)
    return click.option("--db", help="Store URL or SQLite file.")(command)


@main.group()
def dlq() -> None:
    """Dead letters: tasks that failed for good, kept with their attempt history."""


@dlq.command("list")
@_store_options
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

    asyncio.run(run(_open_store_for(db, app_target)))


@dlq.command("show")
@_store_options
@click.argument("task_id", type=int)
def dlq_show(db: str | None, app_target: str | None, task_id: int) -> None:
    """Show one task and its attempt history."""

    async def run(app: App) -> None:
        async with app:
            try:
                await show_task(app.store, task_id, Console())
            except UnknownTask as error:
                raise click.BadParameter(str(error), param_hint="TASK_ID") from None

    asyncio.run(run(_open_store_for(db, app_target)))


@dlq.command("retry")
@_store_options
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

    asyncio.run(run(_open_store_for(db, app_target)))


@main.group()
def db() -> None:
    """The store's schema."""


@db.command("upgrade")
@click.option("--db", "url", required=True, help="Store URL (postgresql://…, sqlite:///…).")
def db_upgrade(url: str) -> None:
    """Apply the schema migrations the store lacks; print the version before and after."""
    from headrace.policy.errors import StoreError
    from headrace.store.urls import upgrade_schema

    try:
        before, after = asyncio.run(upgrade_schema(_store_url(url)))
    except ConfigError as error:
        raise click.BadParameter(str(error), param_hint="--db") from None
    except StoreError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"schema version {before} -> {after}")
