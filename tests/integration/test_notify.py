"""The outbox relay sends each notification, signed, until a 2xx acknowledges it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from headrace.pipelines.moderation import samples
from headrace.policy.errors import ConfigError
from headrace.service.api.webhooks import signature_ok
from headrace.service.notify import OutboxRelay

from .api import harness

pytestmark = pytest.mark.anyio

SECRET = "notify-secret-0123456789"


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})


class Receiver:
    """An HTTP endpoint that refuses its first `refuse` requests with 503."""

    def __init__(self, refuse: int) -> None:
        self.refuse = refuse
        self.received: list[dict[str, Any]] = []
        self.app = Starlette(routes=[Route("/hook", self.hook, methods=["POST"])])

    async def hook(self, request: Request) -> Response:
        body = await request.body()
        good, _ = signature_ok(SECRET, request.headers["webhook-signature"], body)
        if not good:
            return Response(status_code=401)
        if self.refuse:
            self.refuse -= 1
            return Response(status_code=503)
        notice = json.loads(body)
        assert request.headers["webhook-id"] == str(notice["id"])
        self.received.append(notice)
        return Response(status_code=204)


async def test_notifications_are_sent_in_order_until_acknowledged(tmp_path: Path) -> None:
    receiver = Receiver(refuse=1)
    relay = OutboxRelay(
        "http://receiver/hook", SECRET, transport=httpx.ASGITransport(app=receiver.app)
    )
    async with harness(tmp_path) as h:
        ids = []
        for shade in (10, 200):
            answer = await h.upload(data=samples.jpeg(320, 240, shade=shade))
            ids.append(answer.json()["media_id"])
        await h.drain()
        await h.moderation.review(ids[0], approve=True, by="ana")
        await h.moderation.review(ids[1], approve=False, by="ana")
        store = h.moderation.app.store
        async with httpx.AsyncClient(transport=relay.transport) as client:
            assert await relay.relay_once(store, client) is True  # refused: both wait
            assert receiver.received == [] and len(await store.records.outbox()) == 2
            assert await relay.relay_once(store, client) is False
            assert await relay.relay_once(store, client) is False  # nothing twice
        assert await store.records.outbox() == []
    assert [(n["topic"], n["record_id"], n["scope"]) for n in receiver.received] == [
        ("item.approved", ids[0], "gala"),
        ("item.rejected", ids[1], "gala"),
    ]
    assert (relay.sent, relay.failures) == (2, 1)


def test_a_relay_needs_an_http_url_and_a_long_enough_secret() -> None:
    with pytest.raises(ConfigError, match="notify url"):
        OutboxRelay("ftp://x", SECRET)
    with pytest.raises(ConfigError, match="notify secret"):
        OutboxRelay("http://x", "short")
