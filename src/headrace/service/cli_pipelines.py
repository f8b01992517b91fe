"""The commands that run the studio pipeline, its provider simulator, and the pruner on the core
alone: `demo` (the studio episodes; `demo moderation` is in `cli_moderation.py`),
`provider-sim` and `prune`.

`cli.py` loads this module when one of them runs, so `headrace worker`, `submit` and the other
store commands start without the HTTP stack the simulator is served with.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click
from rich.console import Console

from headrace.pipelines.providersim import parse_inject, parse_quotas, parse_spreads, run_server
from headrace.pipelines.studio_scenario import Scenario
from headrace.policy.errors import ConfigError
from headrace.service import logs, prune
from headrace.service.apps import require_existing, resolve, store_url
from headrace.service.cli import (
    LazyGroup,
    option_seconds,
    retention_option,
    store_options,
    with_retention,
)
from headrace.service.demo import DemoOptions, run_demo
from headrace.service.failures import use_store


@click.group(
    cls=LazyGroup,
    lazy={"moderation": "headrace.service.cli_moderation:demo_moderation"},
    extras={"moderation": "moderation"},
    invoke_without_command=True,
)
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
