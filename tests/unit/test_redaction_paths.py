"""Secrets in percent-encoded form stay out of everything that is redacted: attempt messages and
codes, dead letters, the `dlq` tables the command line prints, and the worker's log lines."""

from __future__ import annotations

import io
import logging
from urllib.parse import quote

import pytest
from rich.console import Console

import headrace as hr
from headrace.service.dlq import attempts_table, letters_table, task_table
from headrace.store.protocol.types import TaskState

pytestmark = pytest.mark.anyio

SECRET = "Zq7T0pS3cr3tVa1ue9"
SIGNED = f"https://b.s3.amazonaws.com/ev42/clip.mp4?X-Amz-Signature={SECRET}"
ENCODED = [
    f"fetch%3Fsrc%3D{quote(SIGNED, safe='')}",  # a signed URL inside another URL's query
    f"X-Amz-Signature%3D{SECRET}",
    f"retry%26sig%3D{SECRET}",
    f"TOKEN%3d{SECRET}",
    f"token%253D{SECRET}",  # encoded twice
    quote(quote(f"access_token={SECRET}", safe=""), safe=""),
]


def rendered(*tables: object) -> str:
    out = io.StringIO()
    console = Console(file=out, width=400)
    for table in tables:
        console.print(table)
    return out.getvalue()


@pytest.mark.parametrize("leak", ENCODED)
async def test_an_encoded_secret_reaches_no_attempt_dead_letter_or_table(leak: str) -> None:
    app = hr.App("memory://")

    @app.task(max_attempts=2)
    async def fetch(ctx: hr.Context, ref: str) -> None:
        if ctx.attempt == 1:
            raise hr.Transient(f"upstream said {leak}", code="http_503")
        raise hr.Fatal(f"gave up on {leak}", code=f"denied:{leak}")

    async with app:
        task_id = await fetch.submit("ev42/clip-8f14e45f")
        await hr.Worker(app).drain()
        [letter] = await app.store.tasks(state=TaskState.DEAD)
        attempts = await app.store.attempts(task_id)
    assert letter.id == task_id
    assert [a.outcome.value for a in attempts] == ["retry", "dead"]
    stored = " ".join(f"{a.code} {a.message}" for a in attempts) + f" {letter.error_code}"
    assert "upstream said" in stored and "gave up on" in stored
    assert SECRET not in stored
    assert "[redacted]" in stored
    printed = rendered(letters_table([letter]), task_table(letter), attempts_table(attempts))
    assert "gave up on" in printed
    assert SECRET not in printed


@pytest.mark.parametrize("leak", ENCODED)
async def test_an_encoded_secret_reaches_no_log_line(
    leak: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = hr.App("memory://")

    @app.task(max_attempts=1)
    async def fetch(ctx: hr.Context, ref: str) -> None:
        raise RuntimeError(f"the client failed on {leak}")

    caplog.set_level(logging.DEBUG, logger="headrace")
    async with app:
        await fetch.submit("ev42/clip-8f14e45f")
        await hr.Worker(app).drain(fail_fast=False)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "the client failed on" in logged
    assert SECRET not in logged


async def test_a_successor_with_a_signed_url_is_refused_without_the_secret() -> None:
    app = hr.App("memory://")

    @app.task(max_attempts=1)
    async def script(ctx: hr.Context, ref: str) -> None:
        ctx.spawn(render, SIGNED)

    @app.task()
    async def render(ctx: hr.Context, ref: str) -> None: ...

    async with app:
        task_id = await script.submit("ep6")
        await hr.Worker(app).drain(fail_fast=False)
        [attempt] = await app.store.attempts(task_id)
        assert len(await app.store.tasks()) == 1
    assert attempt.message is not None and "task.ref: carries a credential" in attempt.message
    assert SECRET not in attempt.message
