"""The quota benchmark's app: `call` tasks through one provider gate with its default settings,
each making one image call to the provider simulator (`HEADRACE_PROVIDER_URL`)."""

from __future__ import annotations

import os

import httpx

import headrace as hr
from headrace.pipelines.providers import MiniMaxClient

GATE = "provider:image"
CONCURRENCY = 3
RATE = 30
WINDOW = 6.0


def make_app() -> hr.App:
    app = hr.App(os.environ["HEADRACE_DB"])
    app.gate(GATE, concurrency=CONCURRENCY, rate=hr.Rate(RATE, per=WINDOW))
    http = httpx.AsyncClient(base_url=os.environ["HEADRACE_PROVIDER_URL"], timeout=30.0)
    app.on_close(http.aclose)
    client = MiniMaxClient(http, "sim-key")

    @app.task(name="call", gates=[GATE], max_attempts=20)
    async def call(ctx: hr.Context, ref: str) -> None:
        await client.generate_image(f"frame for {ref}", stamps=ctx)

    return app
