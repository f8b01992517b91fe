"""The service's edge, in process: a request that needs a credential is refused before a byte of
its body is read, and every body is capped (Content-Length, or the bytes as they stream in,
chunked bodies too). Bodies are sent as streams whose generator counts what the service took."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute, iter_route_contexts

from headrace.service.api.edge import DEFAULT_BODY_LIMIT, EdgeRoute, SignedInRoute
from headrace.service.api.uploads import FORM_OVERHEAD
from headrace.service.api.webhooks import MAX_BODY, sign

from .api import WEBHOOK_SECRET, error_code, harness, reviewable, sign_in

pytestmark = pytest.mark.anyio

CHUNK = 64 * 1024
HUGE = 200 << 20  # what the outside tools sent: 200 MB


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real time: the SQLite store's thread


@dataclass
class Body:
    """A body of `size` bytes sent in chunks, counting the bytes the service took: `start`,
    then filler."""

    size: int
    start: bytes = b""
    taken: int = 0

    async def chunks(self) -> AsyncIterator[bytes]:
        while self.taken < self.size:
            chunk = (self.start + b"x" * CHUNK)[: min(CHUNK, self.size - self.taken)]
            self.start = b""
            self.taken += len(chunk)
            yield chunk


# A form's file part, its closing boundary never reached.
FILE_PART = b'--b\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n'


# (path, who may send it, its body's content type): one JSON route, an upload, a page call.
NEEDS_A_TOKEN = [
    ("/v1/events/gala/decisions", "application/json"),
    ("/v1/items/" + "0" * 32 + "/reject", "application/json"),
    ("/v1/events/gala/uploads", "multipart/form-data; boundary=b"),
]


@pytest.mark.parametrize(("path", "content_type"), NEEDS_A_TOKEN)
@pytest.mark.parametrize("token", [None, "hr_unknown"])
@pytest.mark.parametrize("declared", [True, False])
async def test_no_valid_token_is_401_before_a_byte_of_the_body_is_read(
    tmp_path: Path, path: str, content_type: str, token: str | None, declared: bool
) -> None:
    async with harness(tmp_path) as h:
        body = Body(HUGE)
        headers = {"Content-Type": content_type}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if declared:
            headers["Content-Length"] = str(HUGE)
        answer = await h.client.post(path, headers=headers, content=body.chunks())
        assert answer.status_code == 401 and error_code(answer) == "unauthenticated"
        assert body.taken == 0


async def test_a_page_call_without_a_sign_in_is_401_before_its_body_is_read(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path) as h:
        body = Body(HUGE)
        answer = await h.client.post(
            "/moderate/gala/bulk",
            headers={"Content-Type": "application/json", "X-Form-Token": "0" * 64},
            content=body.chunks(),
        )
        assert answer.status_code == 401 and error_code(answer) == "unauthenticated"
        assert body.taken == 0


@pytest.mark.parametrize("declared", [True, False])
async def test_a_json_body_past_its_cap_is_413_and_the_rest_is_never_read(
    tmp_path: Path, declared: bool
) -> None:
    async with harness(tmp_path) as h:
        body = Body(HUGE)
        headers = {**h.auth("moderator"), "Content-Type": "application/json"}
        if declared:
            headers["Content-Length"] = str(HUGE)
        answer = await h.client.post(
            "/v1/events/gala/decisions", headers=headers, content=body.chunks()
        )
        assert answer.status_code == 413 and error_code(answer) == "too_large"
        assert str(DEFAULT_BODY_LIMIT) in answer.json()["detail"]
        # Declared: nothing read. Chunked: read until it passed the cap, not a chunk more.
        assert body.taken == (0 if declared else DEFAULT_BODY_LIMIT + CHUNK)


async def test_a_signed_in_page_call_past_its_cap_is_413(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await sign_in(h, "moderator")
        body = Body(HUGE)
        answer = await h.client.post(
            "/moderate/gala/bulk",
            headers={"Content-Type": "application/json", "X-Form-Token": "0" * 64},
            content=body.chunks(),
        )
        assert answer.status_code == 413 and body.taken == DEFAULT_BODY_LIMIT + CHUNK


@pytest.mark.parametrize("declared", [True, False])
async def test_an_upload_is_capped_at_the_configured_limit(tmp_path: Path, declared: bool) -> None:
    async with harness(tmp_path) as h:
        cap = h.moderation.max_bytes + FORM_OVERHEAD
        body = Body(HUGE, FILE_PART)
        headers = {**h.auth("uploader"), "Content-Type": "multipart/form-data; boundary=b"}
        if declared:
            headers["Content-Length"] = str(HUGE)
        answer = await h.client.post(
            "/v1/events/gala/uploads", headers=headers, content=body.chunks()
        )
        assert answer.status_code == 413 and error_code(answer) == "too_large"
        assert body.taken <= (0 if declared else cap + CHUNK)
        assert await h.moderation.media.backend.keys("blobs") == []


async def test_a_route_that_declares_more_takes_more(tmp_path: Path) -> None:
    """A webhook delivery may be up to 256 KiB: past the default cap, within its own."""
    async with harness(tmp_path) as h:
        padding = "x" * (DEFAULT_BODY_LIMIT * 2)
        raw = json.dumps({"id": "e-big", "type": "note", "result": padding}).encode()
        assert DEFAULT_BODY_LIMIT < len(raw) < MAX_BODY
        assert (await h.deliver(raw)).status_code == 200
        now = int(await h.moderation.app.store.now())
        past = b" " * (MAX_BODY + 1)
        refused = await h.client.post(
            "/webhooks/vidgen",
            content=past,
            headers={"Webhook-Signature": sign(WEBHOOK_SECRET, past, now)},
        )
        assert refused.status_code == 413 and error_code(refused) == "too_large"


async def test_a_body_within_its_cap_is_read_as_before(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        media_id = await reviewable(h)
        asked = {"decision": "approve", "media_ids": [media_id]}
        answer = await h.client.post(
            "/v1/events/gala/decisions", headers=h.auth("moderator"), json=asked
        )
        assert answer.status_code == 200 and answer.json()[0]["applied"] is True


async def test_every_route_of_the_service_checks_its_edge(tmp_path: Path) -> None:
    """Every route, whichever router it came from, is an EdgeRoute, and every form of the
    signed-in page checks the sign-in: a route added without one fails here."""
    async with harness(tmp_path) as h:
        routes = [
            context
            for context in iter_route_contexts(h.api.router.routes)
            if isinstance(context.original_route, APIRoute)
        ]
        assert len(routes) > 40
        for context in routes:
            assert isinstance(context.original_route, EdgeRoute), context.path
        signed_in = {
            context.path for context in routes if isinstance(context.original_route, SignedInRoute)
        }
        page_calls = {
            context.path
            for context in routes
            if str(context.path).startswith("/moderate/{event}/")
            and "POST" in (context.methods or ())
        }
        assert page_calls and signed_in == page_calls
