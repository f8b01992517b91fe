"""How answers travel, whatever made them: HEAD wherever GET works, compression of text, and
how long static files may be kept.

- `HeadAsGet`: a HEAD request is answered as its GET would be (RFC 9110 section 9.3.2): the
  same status and headers, compression included, and no body. Every GET route, the static
  files, previews, playback, /metrics and /docs take HEAD, and a route added later does too.
- `Compression`: gzip (Starlette's `GZipMiddleware`) for a text answer of `COMPRESS_FROM`
  bytes or more to a client that says it takes it (`Vary: Accept-Encoding`). Never for media
  (images, sound, video are compressed already), and never for an answer to a `Range`
  request (its byte positions count the bytes as they are kept). A compressed answer's ETag is
  made weak: its bytes are not the file's.
- `CachedFiles`: static files with a `Cache-Control` of their own, and their ETag and
  `Last-Modified` (304 to a conditional request).
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES, GZipMiddleware
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

COMPRESS_FROM = 1024  # bytes: below it, gzip's own header and a round of CPU gain nothing
NOT_COMPRESSED = (*DEFAULT_EXCLUDED_CONTENT_TYPES, "application/octet-stream")
# The page's own script and style: their URLs carry no version, so a browser asks again each
# time, and a 304 answers it when they did not change.
PAGE_FILES = "public, no-cache"
# Swagger UI's files change only with the package that ships them.
DOCS_FILES = "public, max-age=86400"
BODY = ("http.response.body", "http.response.pathsend")


class HeadAsGet:
    """Middleware: a HEAD request goes in as a GET; its answer's start goes out, its body not."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        # A copy: the server still reads the request's own scope as a HEAD's, and sends no body.
        inner = {**scope, "method": "GET"}
        ended = False

        async def send_head(message: Message) -> None:
            nonlocal ended
            if message["type"] == "http.response.start":
                await send(message)
            elif message["type"] in BODY and not ended:  # the headers are out: it ends here
                ended = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await self.app(inner, receive, send_head)
        finally:
            if "route" in inner:  # what the router matched, for the access log
                scope["route"] = inner["route"]


class Compression:
    """Middleware: gzip as the module says."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.gzip = GZipMiddleware(
            app, minimum_size=COMPRESS_FROM, exclude_content_types=NOT_COMPRESSED
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or "range" in Headers(scope=scope):
            await self.app(scope, receive, send)
            return

        async def send_weak(message: Message) -> None:
            if message["type"] == "http.response.start":
                weaken_etag(MutableHeaders(scope=message))
            await send(message)

        await self.gzip(scope, receive, send_weak)


def weaken_etag(headers: MutableHeaders) -> None:
    """A compressed answer's strong ETag made weak (RFC 9110 section 8.8.1)."""
    etag = headers.get("etag")
    if "content-encoding" in headers and etag is not None and not etag.startswith("W/"):
        headers["etag"] = f"W/{etag}"


class CachedFiles(StaticFiles):
    """Static files, each answer with `cache_control` (a 304 too)."""

    def __init__(self, *, directory: str, cache_control: str) -> None:
        super().__init__(directory=directory)
        self.cache_control = cache_control

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        answer = super().file_response(*args, **kwargs)
        answer.headers["Cache-Control"] = self.cache_control
        return answer
