"""The app the command-line tests name with `--app tests.e2e.cli_app:app` (or `:make_app`).

Its own store is `memory://`: the tests give the store with `--db` or `HEADRACE_URL`.
"""

from __future__ import annotations

import headrace as hr


def make_app() -> hr.App:
    app = hr.App("memory://")
    app.gate("provider:image", concurrency=2, rate=hr.Rate(10, per="6s"))
    app.gate("local:publish", concurrency=1)

    @app.task(gates=["provider:image"])
    async def render(ctx: hr.Context, ref: str) -> hr.Result:
        return hr.Result(cost=2.0)

    @app.task(gates=["local:publish"], tier="low")
    async def publish(ctx: hr.Context, ref: str) -> None:
        return None

    return app


app = make_app()
