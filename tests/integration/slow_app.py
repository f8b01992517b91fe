"""An app whose tasks take real time, for shutdown tests: `slow` takes `SLOW_SECONDS`; `stuck`
is a sync handler that never returns (a call blocked for good in a library without a timeout)."""

from __future__ import annotations

import asyncio
import os
import threading

import headrace as hr


def make_app() -> hr.App:
    app = hr.App(os.environ["HEADRACE_DB"])
    pause = float(os.environ.get("SLOW_SECONDS", "1.5"))

    @app.task(name="slow")
    async def slow(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(pause)

    @app.task(name="stuck", max_attempts=2)
    def stuck(ctx: hr.Context, ref: str) -> None:
        threading.Event().wait()  # never set

    return app
