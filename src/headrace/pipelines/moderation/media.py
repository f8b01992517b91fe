"""The media store: uploaded files and their derivatives under one data directory.

Nothing a client sends becomes a path. An original is kept under its content's SHA-256
(`blobs/ab/abcdef…`), written to a temporary file first and renamed into place once whole, so a
reader never sees half a file and the same bytes are kept once. A media item is named by a
media id the store draws (32 hex digits), never by a file name; a task carries that id.

Derivatives (previews, thumbnails, posters, waveforms, metadata) live under
`derived/<media id>/<stage>.v<version>/`. A stage writes them into a directory of its own
beside the others and renames it into place: the first attempt to finish wins, and a retry, or a
second worker after a crash, finds the directory there and reuses it. So there is exactly one
set of derivatives per (media id, stage version), whatever happened before.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from headrace.policy.errors import ConfigError

CHUNK = 1 << 20
_MEDIA_ID = re.compile(r"[0-9a-f]{32}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_STAGE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


class TooLarge(Exception):
    """An upload went past its size limit; nothing of it was kept."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"upload larger than {limit} bytes")
        self.limit = limit


@dataclass(frozen=True)
class Blob:
    """An original as kept: its content's SHA-256 and size."""

    digest: str
    size: int


@dataclass(frozen=True)
class Derived:
    """The derivatives of one (media id, stage version): `created` is False when an earlier
    attempt had already made them (they are reused, not made again)."""

    path: Path
    created: bool

    def file(self, name: str) -> Path:
        return self.path / check_name(name)


class BlobWriter:
    """An original being written (`MediaStore.writer`): its size is checked on every chunk, so
    no more than `limit` bytes are ever buffered or written."""

    def __init__(self, media: MediaStore, handle: BinaryIO, temporary: Path, limit: int) -> None:
        self._media = media
        self._handle = handle
        self._temporary = temporary
        self._digest = hashlib.sha256()
        self.limit = limit
        self.size = 0

    def write(self, chunk: bytes) -> None:
        """Append a chunk; TooLarge once the whole would pass the limit."""
        self.size += len(chunk)
        if self.size > self.limit:
            raise TooLarge(self.limit)
        self._digest.update(chunk)
        self._handle.write(chunk)

    def keep(self) -> Blob:
        """Flush to disk and keep under the content's digest (the same bytes twice: one file)."""
        self._handle.flush()
        os.fsync(self._handle.fileno())
        blob = Blob(self._digest.hexdigest(), self.size)
        target = self._media.blob_path(blob.digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._temporary, target)
        return blob


class MediaStore:
    """Files of a moderation pipeline under `root`."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # -- originals

    def put(self, source: BinaryIO, *, limit: int) -> Blob:
        """Keep what `source` holds (read to its end, at most `limit` bytes: TooLarge past it,
        with nothing kept)."""
        with self.writer(limit=limit) as writer:
            while chunk := source.read(CHUNK):
                writer.write(chunk)
            return writer.keep()

    @contextlib.contextmanager
    def writer(self, *, limit: int) -> Iterator[BlobWriter]:
        """A blob written chunk by chunk as it arrives (an upload streamed from a socket):
        `keep()` makes it a blob; leaving the block without keeping it leaves nothing."""
        with self._temporary_file() as (handle, temporary):
            yield BlobWriter(self, handle, temporary, limit)

    def put_bytes(self, data: bytes, *, limit: int) -> Blob:
        from io import BytesIO

        return self.put(BytesIO(data), limit=limit)

    def blob_path(self, digest: str) -> Path:
        if not _DIGEST.fullmatch(digest):
            raise ConfigError(f"media digest: expected 64 hex digits, got {digest!r}")
        return self.root / "blobs" / digest[:2] / digest

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def take_blob(self, digest: str) -> Path | None:
        """Move a blob out of its place, to be deleted or put back (`settle_blob`); None when
        there is none. From here, an upload of the same bytes renames a copy of its own in."""
        path = self.blob_path(digest)
        taken = path.with_name(f".{digest}.{secrets.token_hex(8)}.taken")
        try:
            os.rename(path, taken)
        except FileNotFoundError:
            return None
        return taken

    def settle_blob(self, digest: str, taken: Path, *, keep: bool) -> None:
        """Delete a taken blob, or (`keep`) put it back: unless an upload put the same bytes
        in place meanwhile, which then stand."""
        if keep:
            with contextlib.suppress(FileExistsError):
                os.link(taken, self.blob_path(digest))
        taken.unlink(missing_ok=True)

    def remove_blob(self, digest: str) -> bool:
        """Delete an original; False if it was not there. The caller has made sure no item
        needs it any more."""
        try:
            self.blob_path(digest).unlink()
        except FileNotFoundError:
            return False
        return True

    # -- media ids and derivatives

    @staticmethod
    def new_media_id() -> str:
        return secrets.token_hex(16)

    def derived(self, media_id: str, stage: str, version: int) -> Derived | None:
        """The derivatives (media id, stage version) has, or None."""
        path = self._derived_path(media_id, stage, version)
        return Derived(path, created=False) if path.is_dir() else None

    @contextlib.contextmanager
    def deriving(self, media_id: str, stage: str, version: int) -> Iterator[Derived]:
        """Where to write (media id, stage version)'s derivatives: a fresh directory, renamed
        into place when the block ends without an error. When they exist already (an earlier
        attempt made them) the block gets those, with `created` False, and should reuse them.
        An error in the block leaves nothing behind."""
        made = self.begin_deriving(media_id, stage, version)
        if not made.created:
            yield made
            return
        try:
            yield made
            self.finish_deriving(made, media_id, stage, version)
        finally:
            shutil.rmtree(made.path, ignore_errors=True)

    def begin_deriving(self, media_id: str, stage: str, version: int) -> Derived:
        """The derivatives (media id, stage version) has (`created` False), or a fresh
        directory to write them in (`created` True): `finish_deriving` puts it in place, and
        the caller removes it if it never does.

        What an earlier attempt left half written (its worker killed) is removed first: the
        stage's lease makes this the only live attempt, and an attempt that lost its lease and
        still writes fails at its rename, its outcome refused by the store."""
        final = self._derived_path(media_id, stage, version)
        if final.is_dir():
            return Derived(final, created=False)
        final.parent.mkdir(parents=True, exist_ok=True)
        for stale in final.parent.glob(f".{final.name}.*"):
            shutil.rmtree(stale, ignore_errors=True)
        return Derived(Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent)), True)

    def finish_deriving(self, made: Derived, media_id: str, stage: str, version: int) -> Derived:
        """Flush what `made` holds and rename it into place, unless another attempt got there
        first (then its set stands and this one is dropped); return the set in place."""
        final = self._derived_path(media_id, stage, version)
        try:
            written = list(made.path.iterdir())
        except FileNotFoundError:  # swept by a later attempt (this one had lost its lease)
            if final.is_dir():
                return Derived(final, created=False)
            raise
        for path in written:
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
        try:
            os.rename(made.path, final)  # fails when another attempt got there first
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(made.path, ignore_errors=True)
        return Derived(final, created=False)

    def remove_derived(self, media_id: str) -> int:
        """Delete every derivative set of a media id (every stage and version, and what an
        attempt left half written); how many files were removed. No stage may be deriving it:
        the caller removes the derivatives of items whose stages are done."""
        directory = self.root / "derived" / check_media_id(media_id)
        if not directory.is_dir():
            return 0
        removed = 0
        for path in sorted(directory.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()
                removed += 1
        directory.rmdir()
        return removed

    def _derived_path(self, media_id: str, stage: str, version: int) -> Path:
        if not _STAGE.fullmatch(stage):
            raise ConfigError(f"derivative stage: expected a short lower-case name, got {stage!r}")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ConfigError(f"derivative version: expected a positive integer, got {version!r}")
        return self.root / "derived" / check_media_id(media_id) / f"{stage}.v{version}"

    @contextlib.contextmanager
    def _temporary_file(self) -> Iterator[tuple[BinaryIO, Path]]:
        spool = self.root / "tmp"
        spool.mkdir(parents=True, exist_ok=True)
        descriptor, name = tempfile.mkstemp(dir=spool, prefix="upload.")
        path = Path(name)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                yield handle, path
        finally:
            path.unlink(missing_ok=True)


def check_media_id(media_id: str) -> str:
    if not isinstance(media_id, str) or not _MEDIA_ID.fullmatch(media_id):
        raise ConfigError(f"media id: expected 32 hex digits, got {media_id!r}")
    return media_id


def check_name(name: str) -> str:
    """A derivative's file name: chosen by the stage, never by a client."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise ConfigError(f"derivative name: expected a short lower-case file name, got {name!r}")
    return name
