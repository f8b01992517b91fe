"""Liveness and readiness, as a load balancer or an orchestrator probes them: /livez answers
while the process does; /readyz says whether to send it requests (its store and its media
answer, and it is not draining after SIGTERM), and which of them fails."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from headrace.pipelines.moderation.media import MediaUnavailable
from headrace.policy.errors import StoreUnavailable
from headrace.service.api.deps import Service
from headrace.service.serve import QuietExit

from .api import error_code, harness

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})


async def test_live_and_ready_while_everything_answers(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        live, ready = await h.client.get("/livez"), await h.client.get("/readyz")
    assert (live.status_code, live.json()) == (200, {"status": "ok"})
    assert (ready.status_code, ready.json()) == (200, {"status": "ok"})


async def test_ready_says_which_part_fails_and_live_does_not_ask_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def unreachable(*_: object) -> Any:
        raise StoreUnavailable("postgres store unavailable: test")

    async def no_media(*_: object) -> None:
        raise MediaUnavailable("exists", ".probe/ready", "connection refused")

    async with harness(tmp_path) as h:
        service: Service = h.api.state.service
        service.draining = True
        monkeypatch.setattr(h.moderation.app.store, "now", unreachable)
        monkeypatch.setattr(h.moderation.media, "answers", no_media)
        ready = await h.client.get("/readyz")
        live = await h.client.get("/livez")
    assert ready.status_code == 503 and ready.headers["retry-after"] == "2"
    assert error_code(ready) == "unready"
    assert ready.json()["failing"] == ["draining", "store", "media"]
    assert live.status_code == 200


async def test_a_stop_signal_marks_the_service_draining(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        service: Service = h.api.state.service
        server = QuietExit(uvicorn.Config(h.api), service)
        server.handle_exit(signal.SIGTERM, None)
        assert service.draining and server.should_exit
        ready = await h.client.get("/readyz")
    assert ready.json()["failing"] == ["draining"]
