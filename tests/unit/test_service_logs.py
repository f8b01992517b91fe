"""The command line's logging: headrace at INFO (DEBUG with -v), other libraries at WARNING,
text or JSON lines; and the line a worker says who it is with."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

import headrace as hr
from headrace.service import logs


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """A stream the logging writes to; the logging configuration is restored after."""
    root = logging.getLogger()
    ours = logging.getLogger(logs.HEADRACE)
    saved = (root.handlers[:], root.level, ours.level)
    yield io.StringIO()
    root.handlers[:], root.level = saved[0], saved[1]
    ours.setLevel(saved[2])


def emit_all() -> None:
    for name in ("headrace.worker", "headrace.store.postgres", "httpx", "uvicorn.error"):
        for level in (logging.DEBUG, logging.INFO, logging.WARNING):
            logging.getLogger(name).log(level, "%s at %s", name, logging.getLevelName(level))


def test_headrace_at_info_and_other_libraries_at_warning(stream: io.StringIO) -> None:
    logs.configure(stream=stream)
    emit_all()
    shown = stream.getvalue()
    assert "headrace.worker at INFO" in shown and "headrace.store.postgres at INFO" in shown
    assert "headrace.worker at DEBUG" not in shown
    assert "httpx at INFO" not in shown and "httpx at WARNING" in shown
    assert "uvicorn.error at INFO" not in shown


def test_verbose_is_debug_for_headrace_only(stream: io.StringIO) -> None:
    logs.configure(verbose=1, stream=stream)
    emit_all()
    shown = stream.getvalue()
    assert "headrace.worker at DEBUG" in shown
    assert "httpx at DEBUG" not in shown and "httpx at INFO" not in shown


def test_json_is_one_object_per_line_with_the_exception(stream: io.StringIO) -> None:
    logs.configure(log_format="json", stream=stream)
    log = logging.getLogger("headrace.worker")
    log.info("task %d done", 7)
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        log.exception("handler raised")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert set(first) == {"time", "level", "logger", "message"}
    assert (first["level"], first["logger"], first["message"]) == (
        "INFO",
        "headrace.worker",
        "task 7 done",
    )
    assert first["time"].endswith("+00:00")
    assert second["level"] == "ERROR" and "RuntimeError: boom" in second["exception"]


def test_a_worker_says_who_it_is_in_one_line(stream: io.StringIO) -> None:
    logs.configure(stream=stream)
    app = hr.App("postgresql://studio:s3cret@db.internal:5432/media")
    app.gate("provider:video", concurrency=2, rate=hr.Rate(20, per="1m"))
    app.gate("session:*", concurrency=1)
    app.gate("free")
    worker = hr.Worker(app, name="render-1", slots=3, lease="20s")
    logs.worker_started(worker, "studio:app")
    [line] = stream.getvalue().splitlines()
    assert "INFO headrace.worker: worker render-1 started: " in line
    assert "store postgresql://studio:***@db.internal:5432/media" in line
    assert "s3cret" not in line
    assert "app studio:app, 3 slots, lease 20s" in line
    assert "gates: provider:video (cap 2, 20/60s), session:* (cap 1), free (no limit)" in line
