"""`headrace prune`: retention from the command line, told in a few lines (what went, or with
`--dry-run` what would go, per kind). `headrace event close` is in `cli_moderation.py`."""

from __future__ import annotations

import os
import socket

from headrace.policy.redact import hide_passwords
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
