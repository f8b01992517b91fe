"""The contention benchmark's app: no-op tasks on the store at `HEADRACE_DB`."""

from __future__ import annotations

import os

import headrace as hr


def make_app() -> hr.App:
    app = hr.App(os.environ["HEADRACE_DB"])

    @app.task(name="noop")
    async def noop(ctx: hr.Context, ref: str) -> None:
        return None

    return app
