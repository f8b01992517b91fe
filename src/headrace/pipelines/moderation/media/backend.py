"""The I/O edge of a media store: `Backend`, the few verbs of a place that keeps objects (a
directory, `directory.py`; an S3-compatible bucket, `s3.py`), and what a preview is served as.
The rules (originals by content, one derivative set per stage version, what is cleaned up and
when) are `MediaStore`'s, written once above every backend (`store.py`).

A key is `/`-separated (`blobs/ab/ab12…`, `derived/<media id>/derive.v1/manifest.json`) and
made by the store, never by a client. A prefix names the keys under it, as a directory does:
`derived/<media id>` holds `derived/<media id>/…`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class LocalFile:
    """A preview the service sends from this host's disk."""

    path: Path


@dataclass(frozen=True)
class SignedUrl:
    """A preview the browser fetches from the storage itself, by a URL that lets anyone read
    that one object for a few minutes: made per request, never stored, logged or shown in a
    repr."""

    url: str = field(repr=False)


@dataclass(frozen=True)
class Streamed:
    """A preview the service streams from the storage as it arrives: its chunks and size, and
    what the storage says of its version (its ETag, when it was written: Unix seconds), which
    conditional requests are answered by."""

    chunks: AsyncIterator[bytes]
    size: int
    etag: str | None = None
    modified: float | None = None


Served = LocalFile | SignedUrl | Streamed


@dataclass(frozen=True)
class Listed:
    """An object as a listing gives it: its key, and when it was last written (seconds since
    the epoch, by the storage's clock: a file's change time, a bucket's Last-Modified)."""

    key: str
    written: float


class Backend(Protocol):
    """Where a media store's objects are. Each object is written whole or not at all: no reader
    ever sees half of one. No verb blocks the event loop."""

    @property
    def scratch(self) -> Path:
        """A local directory for files on their way in or out: uploads being spooled, originals
        being decoded, derivatives being made."""

    def describe(self) -> str:
        """Where the objects are, for a log line: never a credential."""

    async def exists(self, key: str) -> bool: ...

    async def read(self, key: str) -> bytes | None:
        """A small object's bytes (a manifest, metadata); None when there is none."""

    async def put_file(self, key: str, path: Path) -> None:
        """Keep the local file `path` under `key`, replacing what is there, streamed (never
        read into memory whole); the file stays the caller's."""

    async def create(self, key: str, data: bytes) -> bool:
        """Write a small object only if `key` has none, atomically: False when it had one."""

    def local(self, key: str) -> AbstractAsyncContextManager[Path | None]:
        """The object as a local file for the block (in place, or a copy streamed down and
        removed after); None when there is none."""

    async def move(self, key: str, to: str) -> bool:
        """Give the object at `key` the key `to` instead; False when there was none."""

    async def copy(self, key: str, to: str) -> None:
        """Copy the object at `key` to `to`. An object already at `to` may be kept instead:
        the store copies only content-addressed objects, whose bytes are the same."""

    async def delete(self, key: str) -> bool:
        """Delete one object; False when there was none."""

    async def delete_under(self, prefix: str) -> int:
        """Delete every object under `prefix`; how many there were."""

    async def keys(self, prefix: str) -> list[str]:
        """The keys of every object under `prefix`."""

    async def listing(self, prefix: str) -> list[Listed]:
        """Every object under `prefix`, with when it was last written."""

    async def serve(self, key: str, *, signed: bool) -> Served | None:
        """The object as a preview is sent: a local file when it is on this host's disk, else
        a signed URL (`signed`) or a stream; None when it is known to be missing (a signed URL
        is made without asking the storage)."""


def scratch_file(scratch: Path, prefix: str) -> Path:
    """A new empty file in the scratch directory (made if need be), for one file on its way."""
    scratch.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(dir=scratch, prefix=f"headrace-{prefix}")
    os.close(descriptor)
    return Path(name)
