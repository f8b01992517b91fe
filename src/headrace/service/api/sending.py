"""A preview or playable copy the service sends itself (a directory's file, or a bucket's object
streamed through): with an ETag and `Last-Modified`, answered by RFC 9110's rules.

- A conditional request: `If-None-Match` naming the current ETag (`*`, or a weak match), else
  `If-Modified-Since` no earlier than `Last-Modified`, is `304` with no body.
- `Range` (a file; a stream is sent whole, and says no `Accept-Ranges`): byte ranges in a
  header RFC 9110 can read are served `206`, the ranges past the end left out; when every
  range starts past the end, `416` with `Content-Range: bytes */<size>`. A header it cannot
  read (another unit, `bytes=5-3`, letters) is ignored: `200` with the whole body. `If-Range`
  naming another version sends the whole body too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from email.utils import formatdate, parsedate_to_datetime
from typing import Any

import anyio.to_thread
from starlette.datastructures import Headers
from starlette.responses import FileResponse, StreamingResponse
from starlette.staticfiles import NotModifiedResponse
from starlette.types import Receive, Scope, Send

from headrace.pipelines.moderation.media import Streamed
from headrace.service.api.deps import ApiError, error_response

_RANGE = re.compile(r"([0-9]*)-([0-9]*)")


def not_modified(request: Headers, etag: str | None, last_modified: str | None) -> bool:
    """Whether a GET with these headers gets 304 (RFC 9110 section 13.2.2: If-None-Match
    first; If-Modified-Since only without it)."""
    if_none_match = request.get("if-none-match")
    if if_none_match is not None:
        if if_none_match.strip() == "*":
            return True
        tags = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
        return etag is not None and etag.removeprefix("W/") in tags
    since, modified = request.get("if-modified-since"), last_modified
    if since is None or modified is None:
        return False
    try:
        return parsedate_to_datetime(modified) <= parsedate_to_datetime(since)
    except (TypeError, ValueError):  # a date it cannot read: as if not sent
        return False


def byte_ranges(header: str, size: int) -> list[tuple[int, int]] | None:
    """The satisfiable ranges of a `Range` header, as (first, last) byte positions; None when
    the header is to be ignored (not `bytes`, or a range-spec RFC 9110 cannot read)."""
    unit, equals, spec = header.partition("=")
    if not equals or unit.strip().lower() != "bytes":
        return None
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if not parts:
        return None
    ranges = []
    for part in parts:
        found = _RANGE.fullmatch(part)
        if found is None or found[0] == "-":
            return None
        first, last = found[1], found[2]
        if first and last and int(last) < int(first):
            return None
        if first and int(first) < size:
            ranges.append((int(first), min(int(last), size - 1) if last else size - 1))
        elif not first and int(last) > 0 and size > 0:
            ranges.append((max(size - int(last), 0), size - 1))
    return ranges


def unsatisfiable(size: int) -> ApiError:
    return ApiError(
        416,
        "range_not_satisfiable",
        f"every range asked for starts past the end ({size} bytes)",
        {"Content-Range": f"bytes */{size}"},
    )


def with_range(scope: Scope, ranges: list[tuple[int, int]] | None) -> Scope:
    """`scope` with its Range header as Starlette's FileResponse should read it: none when it
    is to be ignored, else only the satisfiable ranges."""
    kept = [(name, value) for name, value in scope["headers"] if name != b"range"]
    if ranges is not None:
        spec = ",".join(f"{first}-{last}" for first, last in ranges)
        kept.append((b"range", f"bytes={spec}".encode("latin-1")))
    return {**scope, "headers": kept}


class MediaFile(FileResponse):
    """A file on this host's disk, sent as the module says."""

    def __init__(self, path: str | os.PathLike[str], media_type: str, headers: Mapping[str, str]):
        super().__init__(path, media_type=media_type, headers=headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.stat_result is None:
            self.stat_result = await anyio.to_thread.run_sync(os.stat, self.path)
            self.set_stat_headers(self.stat_result)
        asked = Headers(scope=scope)
        if not_modified(asked, self.headers.get("etag"), self.headers.get("last-modified")):
            await NotModifiedResponse(self.headers)(scope, receive, send)
            return
        header = asked.get("range")
        if header is not None and not self.range_applies(asked.get("if-range")):
            scope = with_range(scope, None)
        elif header is not None:
            size = self.stat_result.st_size
            ranges = byte_ranges(header, size)
            if ranges == []:
                await error_response(unsatisfiable(size))(scope, receive, send)
                return
            scope = with_range(scope, ranges)
        await super().__call__(scope, receive, send)

    def range_applies(self, if_range: str | None) -> bool:
        """Whether Range is read: no If-Range, or one naming this version (a strong ETag or
        the exact Last-Modified); else the whole body goes (RFC 9110 section 13.1.5)."""
        if if_range is None:
            return True
        return not if_range.startswith("W/") and if_range in (
            self.headers.get("etag"),
            self.headers.get("last-modified"),
        )


class MediaStream(StreamingResponse):
    """An object streamed from the media store as it arrives, whole (no range)."""

    def __init__(self, served: Streamed, media_type: str, headers: Mapping[str, str]):
        sent = {**headers, "Content-Length": str(served.size)}
        if served.etag is not None:
            sent["ETag"] = served.etag
        if served.modified is not None:
            sent["Last-Modified"] = formatdate(served.modified, usegmt=True)
        super().__init__(served.chunks, media_type=media_type, headers=sent)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        etag, modified = self.headers.get("etag"), self.headers.get("last-modified")
        if not_modified(Headers(scope=scope), etag, modified):
            await close(self.body_iterator)
            await NotModifiedResponse(self.headers)(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


async def close(chunks: Any) -> None:
    """Let go of a stream not sent (its connection to the store)."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        await aclose()
