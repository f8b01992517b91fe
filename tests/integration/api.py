"""A service over an SQLite store for API tests: the ASGI app in this process (its lifespan
entered), an httpx client on it, tokens of every role, and a worker to drain the stages."""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

import headrace as hr
from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.deploy import make_moderation
from headrace.pipelines.moderation.pipeline import Admission, Item, ItemState, Moderation
from headrace.pipelines.moderation.probe import DEFAULT_LIMITS
from headrace.service.api.app import create_api
from headrace.service.api.auth import Role, create_token
from headrace.service.api.deps import LOGIN_COOKIE, ApiSettings, Delivery
from headrace.service.api.webhooks import sign

WEBHOOK_SECRET = "whsec-test-0123456789abcdef"


@dataclass
class Harness:
    client: httpx.AsyncClient
    moderation: Moderation
    tokens: dict[str, str]
    api: FastAPI

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
    allowed_hosts: tuple[str, ...] = (),
    media: str | None = None,
    delivery: Delivery = "redirect",
) -> AsyncIterator[Harness]:
    """`declare`: more stages on the moderation app, before the service opens it. `url`: the
    store (an SQLite file in `tmp_path` unless given). `media`: the media store (a directory in
    `tmp_path` unless given), its previews delivered as `delivery` says. The client sends
    `Host: test`."""
    moderation = make_moderation(
        url or f"sqlite:///{tmp_path / 'api.db'}",
        media or str(tmp_path / "media"),
        admission=admission,
        limits=SMALL_LIMITS,
    )
    if declare is not None:
        declare(moderation.app)
    settings = ApiSettings(
        webhook_secrets={"vidgen": WEBHOOK_SECRET},
        allowed_hosts=allowed_hosts,
        media_delivery=delivery,
    )
    api = create_api(moderation, settings)
    async with api.router.lifespan_context(api):
        store = moderation.app.store
        tokens = {
            name: await create_token(store, name=name, role=role, events=events)
            for name, (role, events) in TOKENS.items()
        }
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield Harness(client, moderation, tokens, api)


async def reviewable(h: Harness, caption: str | None = None, data: bytes | None = None) -> str:
    """An upload, drained until reviewable: its media id."""
    answer = await h.upload(caption=caption, data=data)
    assert answer.status_code == 202, answer.text
    await h.drain()
    media_id: str = answer.json()["media_id"]
    return media_id


async def waiting_items(h: Harness, count: int, event: str = "gala") -> list[str]:
    """`count` items waiting for a decision as the pipeline leaves them, kept directly (for
    tests of what comes after): their media ids."""
    ids = []
    for n in range(count):
        media_id = hashlib.sha256(f"{event}/{n}".encode()).hexdigest()[:32]
        item = Item(media_id, event, f"s{n % 4}", "0" * 64, 10, state=ItemState.REVIEWABLE)
        await h.moderation.records.put(item)
        ids.append(media_id)
    return ids


async def sign_in_form(h: Harness) -> str:
    """Load the sign-in page, as a browser does before signing in: its form token (the client
    keeps the form's cookie)."""
    return form_token_of(await h.client.get("/login"))


async def sign_in(h: Harness, who: str) -> str:
    """Sign `who` in on the page, as its form does; the sign-in cookie (the client keeps it)."""
    form = {"token": h.tokens[who], "form_token": await sign_in_form(h)}
    answer = await h.client.post("/login", data=form)
    assert answer.status_code == 303 and answer.headers["location"] == "/moderate"
    cookie = answer.cookies[LOGIN_COOKIE]
    assert "HttpOnly" in answer.headers["set-cookie"]
    assert "SameSite=strict" in answer.headers["set-cookie"]
    return cookie


def form_token_of(page: httpx.Response) -> str:
    """The form token a page's forms carry."""
    found = re.search(r'name="form_token" value="([0-9a-f]+)"', page.text)
    assert found is not None, page.text
    return found[1]


def problem(answer: httpx.Response) -> dict[str, Any]:
    """An error answer's RFC 9457 problem (one place that knows the error body's shape): its
    type, its status matching the answer's, its code and detail."""
    assert answer.headers["content-type"] == "application/problem+json", answer.headers
    body = answer.json()
    assert isinstance(body, dict), body
    assert body["status"] == answer.status_code and body["type"] == "about:blank", body
    assert isinstance(body["code"], str) and isinstance(body["detail"], str), body
    return body


def error_code(answer: httpx.Response) -> str:
    """The error code of an error answer."""
    return str(problem(answer)["code"])


def error_message(answer: httpx.Response) -> str:
    """What an error answer says to do."""
    return str(problem(answer)["detail"])
