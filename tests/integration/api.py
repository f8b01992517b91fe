"""A service over an SQLite store for API tests: the ASGI app in this process (its lifespan
entered), an httpx client on it, tokens of every role, and a worker to drain the stages."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

import headrace as hr
from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.deploy import make_moderation
from headrace.pipelines.moderation.pipeline import Admission, Moderation
from headrace.pipelines.moderation.probe import DEFAULT_LIMITS
from headrace.service.api.app import create_api
from headrace.service.api.auth import Role, create_token
from headrace.service.api.deps import ApiSettings
from headrace.service.api.webhooks import sign

WEBHOOK_SECRET = "whsec-test-0123456789abcdef"


@dataclass
class Harness:
    client: httpx.AsyncClient
    moderation: Moderation
    tokens: dict[str, str]

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    async def upload(
        self,
        who: str = "uploader",
        event: str = "gala",
        data: bytes | None = None,
        key: str | None = None,
        caption: str | None = None,
        cookies: dict[str, str] | None = None,
    ) -> httpx.Response:
        headers = self.auth(who)
        if key is not None:
            headers["Idempotency-Key"] = key
        files = {"file": ("photo.jpg", data if data is not None else samples.jpeg(320, 240))}
        form = {} if caption is None else {"caption": caption}
        if cookies:
            self.client.cookies.update(cookies)
        try:
            return await self.client.post(
                f"/v1/events/{event}/uploads", headers=headers, files=files, data=form
            )
        finally:
            self.client.cookies.clear()

    async def deliver(self, raw: bytes, *, skew: float = 0.0, secret: str = "") -> httpx.Response:
        """A webhook delivery of `raw`, signed now (plus `skew`) with `secret` (the test's)."""
        now = int(await self.moderation.app.store.now() + skew)
        return await self.client.post(
            "/webhooks/vidgen",
            content=raw,
            headers={
                "Webhook-Signature": sign(secret or WEBHOOK_SECRET, raw, now),
                "Content-Type": "application/json",
            },
        )

    async def drain(self) -> None:
        await hr.Worker(self.moderation.app).drain(fail_fast=False)


# The default limits with sizes cut to 4 MiB: a test goes past them without sending 1 GiB.
SMALL_LIMITS = {name: replace(limits, max_bytes=4 << 20) for name, limits in DEFAULT_LIMITS.items()}

TOKENS = {
    "admin": (Role.ADMIN, ["*"]),
    "moderator": (Role.MODERATOR, ["gala"]),
    "other-moderator": (Role.MODERATOR, ["fair"]),
    "uploader": (Role.CONTRIBUTOR, ["gala"]),
}


@contextlib.asynccontextmanager
async def harness(
    tmp_path: Path,
    *,
    admission: Admission | None = None,
    declare: Callable[[hr.App], object] | None = None,
    url: str | None = None,
) -> AsyncIterator[Harness]:
    """`declare`: more stages on the moderation app, before the service opens it. `url`: the
    store (an SQLite file in `tmp_path` unless given)."""
    moderation = make_moderation(
        url or f"sqlite:///{tmp_path / 'api.db'}",
        str(tmp_path / "media"),
        admission=admission,
        limits=SMALL_LIMITS,
    )
    if declare is not None:
        declare(moderation.app)
    settings = ApiSettings(webhook_secrets={"vidgen": WEBHOOK_SECRET})
    api = create_api(moderation, settings)
    async with api.router.lifespan_context(api):
        store = moderation.app.store
        tokens = {
            name: await create_token(store, name=name, role=role, events=events)
            for name, (role, events) in TOKENS.items()
        }
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield Harness(client, moderation, tokens)
