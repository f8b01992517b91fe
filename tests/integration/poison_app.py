"""A poison test app: a `work` task whose ref starts with "poison" kills its worker process
outright (as a crash in a native library would); every other one works for a moment."""

from __future__ import annotations

import asyncio
import os
import signal

import headrace as hr

POISON = "poison"


def make_app() -> hr.App:
    app = hr.App(os.environ["HEADRACE_DB"])

    @app.task(name="work", max_attempts=5)
    async def work(ctx: hr.Context, ref: str) -> None:
        if ref.startswith(POISON):
            os.kill(os.getpid(), signal.SIGKILL)
        await asyncio.sleep(0.05 + (hash(ref) % 10) / 100)

    return app
