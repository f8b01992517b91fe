"""An app whose task takes real time, for shutdown tests: `SLOW_SECONDS` per task."""

from __future__ import annotations

import asyncio
import os

import headrace as hr


def make_app() -> hr.App:
    app = hr.App(os.environ["HEADRACE_DB"])
    pause = float(os.environ.get("SLOW_SECONDS", "1.5"))

    @app.task(name="slow")
    async def slow(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(pause)

    return app
