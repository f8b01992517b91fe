"""`headrace serve`: the HTTP API, the moderator page and /metrics over the moderation pipeline.

It needs `headrace[service]` (FastAPI, Jinja, the metrics client, and the moderation pipeline's
`headrace[moderation]`): `cli.py` loads this module only when it runs, and says which extra is
missing when it is.
"""

from __future__ import annotations

import asyncio

import click

from headrace.pipelines.moderation.deploy import make_moderation
from headrace.pipelines.moderation.pipeline import Admission, Moderation
from headrace.pipelines.moderation.review import ReviewRules
from headrace.pipelines.moderation.scan import ClamdScanner
from headrace.policy.durations import seconds
from headrace.policy.errors import ConfigError
from headrace.service.api.deps import ApiSettings, Delivery, host_names
from headrace.service.apps import store_url
from headrace.service.cli import memory_option, option_seconds, retention_option, with_retention
from headrace.service.cli_moderation import admission_options
from headrace.service.failures import WrongInput, use_store
from headrace.service.notify import OutboxRelay
from headrace.service.serve import ServeOptions, webhook_secrets
from headrace.service.serve import serve as serve_api


def _allowed_hosts(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    """The names `--allowed-host` gives; a bad one fails in one line naming the option."""
    try:
        return host_names(value, "--allowed-host")
    except ConfigError as error:
        raise WrongInput(str(error)) from None


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
