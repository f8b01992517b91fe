"""`headrace prune` and `headrace event close`: retention from the command line, each told in a
few lines (what went, or with `--dry-run` what would go, per kind)."""

from __future__ import annotations

import os
import socket

from headrace.pipelines.moderation.upkeep import close_event
from headrace.policy.redact import hide_passwords
from headrace.policy.retention import shown
from headrace.runtime.app import App
from headrace.runtime.pruner import Pruner, PruneReport, batches


def holder() -> str:
    """The lease holder `headrace prune` names itself: which host and process ran it."""
    return f"{socket.gethostname()}:{os.getpid()}:prune"


async def prune(app: App, *, dry_run: bool) -> str:
    """Prune the app's store now (whenever the last run was); what went, per kind."""
    async with app:
        report = await Pruner(app, holder=holder()).run(dry_run=dry_run)
    return said(report, hide_passwords(app.url))


def said(report: PruneReport, store: str) -> str:
    if report.dry_run:
        head = f"dry run: would remove {report.total} from {store}; nothing was changed"
    else:
        head = f"removed {report.total} from {store} in {batches(report.batches)}"
    width = max((len(label) for label in report.removed), default=0)
    rows = [f"  {label:<{width}}  {count:>9}" for label, count in report.removed.items()]
    return "\n".join([head, *rows])


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
