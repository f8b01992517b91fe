"""The command line's logging: headrace's own loggers at INFO (DEBUG with `-v`), every other
library at WARNING, as text lines or one JSON object per line, on stderr."""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import TextIO

from headrace.policy.gate import GateConfig
from headrace.policy.redact import hide_passwords
from headrace.runtime.worker import Worker

HEADRACE = "headrace"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")


class JsonLines(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, and the
    exception's traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(*, verbose: int = 0, log_format: str = "text", stream: TextIO | None = None) -> None:
    """Send every record to `stream` (stderr); headrace's loggers at INFO, or DEBUG when
    `verbose`; the root logger, which every other library inherits, at WARNING."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLines() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    logging.getLogger(HEADRACE).setLevel(logging.DEBUG if verbose else logging.INFO)


def quiet_unless(verbose: int) -> None:
    """Keep headrace's INFO lines out of a command whose output is its own report."""
    if not verbose:
        logging.getLogger(HEADRACE).setLevel(logging.WARNING)


def worker_started(worker: Worker, target: str | None) -> None:
    """Say who the worker is, in one INFO line: its name, store, app, slots, lease and gates."""
    app = worker.app
    gates = ", ".join(describe_gate(config) for config in app.gates.values()) or "none"
    classes = ""
    if worker.classes is not None:
        slots = (f"{name} {count}" for name, count in worker.classes.slots.items())
        classes = f" ({', '.join(slots)})"
    logging.getLogger("headrace.worker").info(
        "worker %s started: store %s, app %s, %d slots%s, lease %gs, gates: %s",
        worker.name,
        hide_passwords(app.url),
        target or "-",
        worker.slots,
        classes,
        worker.lease_for,
        gates,
    )


def describe_gate(config: GateConfig) -> str:
    """`provider:video (cap 2, 20/60s)`."""
    limits = []
    if config.concurrency is not None:
        limits.append(f"cap {config.concurrency}")
    if config.rate is not None:
        limits.append(f"{config.rate.n}/{config.rate.window:g}s")
    return f"{config.name} ({', '.join(limits) or 'no limit'})"
