"""The studio pipeline as an app module, configured from the environment.

    headrace provider-sim --port 8090 &
    HEADRACE_URL=sqlite:///studio.db headrace worker examples.studio_app:make_app --slots 4

HEADRACE_DB (the store URL when code builds the app; the command line's --db or HEADRACE_URL
override it), HEADRACE_PROVIDER_URL (the vendor or the simulator), HEADRACE_WINDOW (the quota
window: 6s compressed, 60s real), MINIMAX_API_KEY.
"""

from __future__ import annotations

import os

import httpx

import headrace as hr
from headrace.pipelines.providers import MiniMaxClient
from headrace.pipelines.studio import Studio, StudioConfig, build
from headrace.policy.durations import seconds


def make_studio() -> Studio:
    window = seconds(os.environ.get("HEADRACE_WINDOW", "6s"), field="HEADRACE_WINDOW")
    app = hr.App(os.environ.get("HEADRACE_DB", "sqlite:///studio.db"), aging_step=2 * window)
    http = httpx.AsyncClient(
        base_url=os.environ.get("HEADRACE_PROVIDER_URL", "http://127.0.0.1:8090"), timeout=10.0
    )
    app.on_close(http.aclose)
    client = MiniMaxClient(http, os.environ.get("MINIMAX_API_KEY", "sim-local-key"))
    return build(app, client, StudioConfig(window=window))


def make_app() -> hr.App:
    return make_studio().app
