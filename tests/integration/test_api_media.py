"""Previews of media kept in a bucket (the test server, a bucket of its own per test): the API and
the page answer with a redirect to a URL signed for that request, or stream the preview through
the service; a directory's previews stay files the service sends.

Real sockets: these run on a real event loop, not the virtual-time one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.pipeline import DERIVE_VERSION
from headrace.service.api.deps import Delivery
from tests.objectstore import CREDENTIALS, ENDPOINT, fresh_bucket, keys_in, media_url

from .api import harness, reviewable, sign_in

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    with fresh_bucket() as made:
        yield made


def is_webp(data: bytes) -> bool:
    return data[:4] == b"RIFF" and data[8:12] == b"WEBP"


async def test_a_preview_redirects_to_a_url_signed_for_that_request(
    tmp_path: Path, bucket: str
) -> None:
    async with harness(tmp_path, media=media_url(bucket)) as h:
        media_id = await reviewable(h, data=samples.jpeg(640, 480))
        first = await h.client.get(f"/v1/items/{media_id}/preview", headers=h.auth("moderator"))
        again = await h.client.get(f"/v1/items/{media_id}/preview", headers=h.auth("moderator"))
        assert first.status_code == again.status_code == 307
        assert first.headers["cache-control"] == "private, no-store"
        location = first.headers["location"]
        derived = f"{ENDPOINT}/{bucket}/media/derived/{media_id}/derive.v{DERIVE_VERSION}/"
        assert location.startswith(derived)
        assert "X-Amz-Expires=300" in location and "X-Amz-Signature=" in location
        async with httpx.AsyncClient() as browser:
            assert is_webp((await browser.get(location)).content)
        item = (await h.client.get(f"/v1/items/{media_id}", headers=h.auth("moderator"))).json()
        assert item["preview"] == f"/v1/items/{media_id}/preview"  # never a signed URL
        assert "X-Amz" not in str(await h.moderation.records.get(media_id))
        await sign_in(h, "moderator")
        page = await h.client.get("/moderate/gala")
        assert f"img-src 'self' {ENDPOINT};" in page.headers["content-security-policy"]
        thumbnail = await h.client.get(f"/moderate/media/{media_id}")
        assert thumbnail.status_code == 307
        assert thumbnail.headers["location"].startswith(f"{ENDPOINT}/{bucket}/")
    assert not (tmp_path / "media").exists()  # nothing of it on the service's disk


@pytest.mark.parametrize("delivery", ["stream", "redirect"])
async def test_a_preview_streams_through_the_service_when_told_to(
    tmp_path: Path, bucket: str, delivery: Delivery
) -> None:
    where = None if delivery == "redirect" else media_url(bucket)  # a directory: always files
    async with harness(tmp_path, media=where, delivery=delivery) as h:
        media_id = await reviewable(h, data=samples.jpeg(640, 480))
        small = await h.client.get(
            f"/v1/items/{media_id}/preview?size=small", headers=h.auth("moderator")
        )
        assert small.status_code == 200 and is_webp(small.content)
        assert small.headers["cache-control"] == "private, max-age=300"
        assert small.headers["content-length"] == str(len(small.content))
        await sign_in(h, "moderator")
        page = await h.client.get("/moderate/gala")
        assert "img-src 'self';" in page.headers["content-security-policy"]
    kept = keys_in(bucket)
    assert bool(kept) is (where is not None)


async def test_a_streamed_preview_answers_conditional_requests(tmp_path: Path, bucket: str) -> None:
    async with harness(tmp_path, media=media_url(bucket), delivery="stream") as h:
        media_id = await reviewable(h, data=samples.jpeg(640, 480))
        path, auth = f"/v1/items/{media_id}/preview", h.auth("moderator")
        first = await h.client.get(path, headers=auth)
        assert first.status_code == 200 and is_webp(first.content)
        etag, modified = first.headers["etag"], first.headers["last-modified"]
        for asked in ({"If-None-Match": etag}, {"If-Modified-Since": modified}):
            again = await h.client.get(path, headers={**auth, **asked})
            assert again.status_code == 304 and again.content == b"", asked
            assert again.headers["etag"] == etag
        changed = await h.client.get(path, headers={**auth, "If-None-Match": '"other"'})
        assert changed.status_code == 200 and changed.content == first.content
