"""A media store's objects in an S3-compatible bucket (`--media s3://bucket/prefix?…`): AWS S3,
MinIO, Cloudflare R2, Ceph RGW. Workers on any host reach it; nothing is shared on disk.

The client is obstore (Rust's object_store): async verbs that never block the event loop, a
local file uploaded from a path in parts of `PART` bytes, `PARTS` at a time (read by the
library, never whole in memory), conditional puts (`If-None-Match: *`), and URLs signed
locally. A download to a local file (an original to decode) runs in a thread of its own, as
the library's sync stream writes it chunk by chunk.

Credentials are the library's to find, as every S3 tool finds them: `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` / `AWS_DEFAULT_REGION`, a web
identity or the instance's role; never the URL. Errors are translated here
(`MediaUnavailable`), naming the operation and the key.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, PreconditionError
from obstore.store import S3Store

from headrace.pipelines.moderation.media.backend import (
    Listed,
    Served,
    SignedUrl,
    Streamed,
    scratch_file,
)
from headrace.pipelines.moderation.media.errors import MediaUnavailable
from headrace.runtime.calls import off_loop

if TYPE_CHECKING:
    from obstore import GetResult
    from obstore.store import ClientConfig, S3Config

PART = 8 << 20  # bytes per part of an upload (S3 takes 5 MiB and up)
PARTS = 2  # parts in flight at once: an upload holds a few parts, whatever the file's size
CHUNK = 1 << 20  # bytes per chunk of a download or a streamed preview
SIGNED_URL_LIFETIME = timedelta(minutes=5)
# Each request may take long (a large original's download), but a stalled read fails fast.
CLIENT: ClientConfig = {"connect_timeout": "5s", "read_timeout": "60s", "timeout": "30m"}
MAX_RETRIES = 3
RETRY_TIMEOUT = timedelta(seconds=30)
REASON = 400  # characters of the library's message kept in an error


@dataclass(frozen=True)
class S3Location:
    """Where a bucket's objects are: `endpoint` (None: AWS S3 in `region`), `path_style`
    addressing (`http://host/bucket/key`) or virtual-hosted (`http://bucket.host/key`)."""

    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    region: str | None = None
    path_style: bool = True

    def describe(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}"
        return where if self.endpoint is None else f"{where} at {self.endpoint}"


class S3Backend:
    """Objects in an S3-compatible bucket (`Backend`). `scratch`: the local directory for files
    on their way (the system's temporary directory unless given)."""

    def __init__(self, location: S3Location, *, scratch: Path | None = None) -> None:
        self.location = location
        self._scratch = scratch or Path(tempfile.gettempdir())
        self.store = S3Store(
            location.bucket,
            prefix=location.prefix or None,
            config=_config(location),
            client_options={**CLIENT, "allow_http": _plain_http(location.endpoint)},
            retry_config={"max_retries": MAX_RETRIES, "retry_timeout": RETRY_TIMEOUT},
        )

    @property
    def scratch(self) -> Path:
        return self._scratch

    def describe(self) -> str:
        return self.location.describe()

    async def exists(self, key: str) -> bool:
        with _translated("head", key):
            try:
                await obstore.head_async(self.store, key)
            except FileNotFoundError:
                return False
            return True

    async def read(self, key: str) -> bytes | None:
        with _translated("get", key):
            try:
                found = await obstore.get_async(self.store, key)
            except FileNotFoundError:
                return None
            return bytes(await found.bytes_async())

    async def put_file(self, key: str, path: Path) -> None:
        with _translated("put", key):
            await obstore.put_async(self.store, key, path, chunk_size=PART, max_concurrency=PARTS)

    async def create(self, key: str, data: bytes) -> bool:
        with _translated("put (if none match)", key):
            try:
                await obstore.put_async(self.store, key, data, mode="create")
            except (AlreadyExistsError, PreconditionError):
                return False
            return True

    @contextlib.asynccontextmanager
    async def local(self, key: str) -> AsyncIterator[Path | None]:
        path = await off_loop(scratch_file, self.scratch, "original.")
        try:
            found = await off_loop(self._download, key, path)
            yield path if found else None
        finally:
            await off_loop(path.unlink, missing_ok=True)

    async def move(self, key: str, to: str) -> bool:
        # Not atomic, unlike a rename: the store reads what it must only after the delete.
        with _translated("copy", key):
            try:
                await obstore.copy_async(self.store, key, to)
            except FileNotFoundError:
                return False
            await obstore.delete_async(self.store, key)
        return True

    async def copy(self, key: str, to: str) -> None:
        with _translated("copy", key):
            await obstore.copy_async(self.store, key, to)

    async def delete(self, key: str) -> bool:
        # S3's delete says nothing of what was there: the head before it does.
        there = await self.exists(key)
        with _translated("delete", key):
            await obstore.delete_async(self.store, key)
        return there

    async def delete_under(self, prefix: str) -> int:
        keys = await self.keys(prefix)
        if keys:
            with _translated("delete", f"{prefix}/"):
                await obstore.delete_async(self.store, keys)
        return len(keys)

    async def keys(self, prefix: str) -> list[str]:
        with _translated("list", f"{prefix}/"):
            pages = obstore.list(self.store, prefix, chunk_size=1000)
            return sorted([meta["path"] async for page in pages for meta in page])

    async def listing(self, prefix: str) -> list[Listed]:
        with _translated("list", f"{prefix}/"):
            pages = obstore.list(self.store, prefix, chunk_size=1000)
            found = [
                Listed(meta["path"], meta["last_modified"].timestamp())
                async for page in pages
                for meta in page
            ]
        return sorted(found, key=lambda listed: listed.key)

    async def serve(self, key: str, *, signed: bool) -> Served | None:
        if signed:
            with _translated("sign", key):
                url = await obstore.sign_async(self.store, "GET", key, SIGNED_URL_LIFETIME)
            return SignedUrl(url)
        with _translated("get", key):
            try:
                found = await obstore.get_async(self.store, key)
            except FileNotFoundError:
                return None
        meta = found.meta
        return Streamed(
            _chunks(found, key),
            meta["size"],
            etag=meta["e_tag"],
            modified=meta["last_modified"].timestamp(),
        )

    def _download(self, key: str, path: Path) -> bool:
        """Stream the object into the local file `path` (in a thread: the writes block)."""
        with _translated("get", key):
            try:
                found = obstore.get(self.store, key)
            except FileNotFoundError:
                return False
            with path.open("wb") as handle:
                for chunk in found.stream(min_chunk_size=CHUNK):
                    handle.write(chunk)
        return True


def _config(location: S3Location) -> S3Config:
    """What the URL says; the rest (credentials, a region not given) from the environment."""
    config: S3Config = {"virtual_hosted_style_request": not location.path_style}
    if location.endpoint is not None:
        config["endpoint"] = location.endpoint
    if location.region is not None:
        config["region"] = location.region
    return config


def _plain_http(endpoint: str | None) -> bool:
    return endpoint is not None and endpoint.startswith("http://")


async def _chunks(found: GetResult, key: str) -> AsyncIterator[bytes]:
    with _translated("get", key):
        async for chunk in found.stream(min_chunk_size=CHUNK):
            yield bytes(chunk)


@contextlib.contextmanager
def _translated(operation: str, key: str) -> Iterator[None]:
    """The library's errors as MediaUnavailable, with its message on one line, up to its debug
    dump: the request and the server's answer, no credential (requests are signed in headers).
    A verb that expects an object to be missing catches FileNotFoundError first: one that
    reaches here is a missing bucket."""
    try:
        yield
    except (BaseError, FileNotFoundError) as error:
        said = " ".join(str(error).split("Debug source:")[0].split())
        raise MediaUnavailable(operation, key, said[:REASON] or type(error).__name__) from error
