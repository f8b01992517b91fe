"""A fleet test app: parents spawn three successors each, one of which calls the simulated
provider through `provider:image` (3 at once, 30 per 6 s, the default guard); `call` tasks may
also be submitted alone."""

from __future__ import annotations

import asyncio
import os

import httpx

import headrace as hr
from headrace.pipelines.providers import MiniMaxClient

GATE = "provider:image"
CONCURRENCY = 3
RATE = 30
WINDOW = "6s"


def make_app() -> hr.App:
    # A worker killed every few seconds is the test's doing, not a poison task: raise the
    # number of lost leases that buries a task well above what the killer can cause.
    app = hr.App(os.environ["HEADRACE_DB"], poison_expiries=50)
    app.gate(GATE, concurrency=CONCURRENCY, rate=hr.Rate(RATE, per=WINDOW))
    provider = os.environ.get("HEADRACE_PROVIDER_URL", "http://127.0.0.1:8090")
    http = httpx.AsyncClient(base_url=provider, timeout=10.0)
    app.on_close(http.aclose)
    client = MiniMaxClient(http, "sim-key")

    @app.task(name="call", gates=[GATE], max_attempts=50)
    async def call(ctx: hr.Context, ref: str) -> None:
        await client.generate_image(f"frame for {ref}", stamps=ctx)

    @app.task(name="local", max_attempts=50)
    async def local(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(0.01)

    @app.task(name="parent", max_attempts=50)
    async def parent(ctx: hr.Context, ref: str) -> None:
        ctx.spawn(call, f"{ref}/call")
        ctx.spawn(local, f"{ref}/a")
        ctx.spawn(local, f"{ref}/b")

    return app
