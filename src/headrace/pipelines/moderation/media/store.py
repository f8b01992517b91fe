"""The media store: uploaded originals and their derivatives, over a `Backend` (a directory, an
S3-compatible bucket). The rules are here, once; a backend only moves bytes.

Nothing a client sends becomes a key. An original is spooled to a local file as it arrives,
hashed on the way, and kept under its content's SHA-256 (`blobs/ab/abcdef…`) unless it is there
already: the same bytes are kept once. A media item is named by a media id the store draws (32
hex digits), never by a file name; a task carries that id.

Derivatives (previews, thumbnails, posters, waveforms, metadata) are made in a local scratch
directory, then kept as a set under `derived/<media id>/<stage>.v<version>/<attempt>/`, a
prefix of the attempt's own. The set's manifest, `derived/<media id>/<stage>.v<version>/
manifest.json`, naming the attempt and its files, is written last and only if there is none
(`If-None-Match: *` on S3, a hard link on a directory): the first attempt to finish wins, and
a retry, or a second worker after a crash, finds the manifest and reuses that set. So there is
exactly one set of derivatives per (media id, stage version), whatever happened before. Once a
manifest stands, whoever wrote or read it removes every other attempt's objects: a loser's own,
and what a killed attempt left half written.

Decoding needs local files: `original` gives an original as one for a block (in place on a
directory, streamed down to a temporary file from a bucket and removed after).

An original is kept a moment before its item's record names it. Bytes an upload kept and then
never recorded (the upload failed, its process was killed) are found by `stale_blobs`: what
lies under `blobs/` last written in a window of time, by the storage's own clock (`now`), for
the pruner to release those no item names (`upkeep`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

from headrace.pipelines.moderation.media.backend import Backend, Served, SignedUrl, scratch_file
from headrace.pipelines.moderation.media.errors import MissingMedia, TooLarge
from headrace.policy.errors import ConfigError
from headrace.runtime.calls import off_loop

CHUNK = 1 << 20
MANIFEST = "manifest.json"
PROBES = ".probe"  # where `check` writes its probe, removed at once
_MEDIA_ID = re.compile(r"[0-9a-f]{32}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_STAGE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_ATTEMPT = re.compile(r"attempt-[0-9a-f]{16}")
_TAKEN = re.compile(r"blobs/[0-9a-f]{2}/\.([0-9a-f]{64})\.[0-9a-f]{16}\.taken")
_BLOB = re.compile(r"blobs/[0-9a-f]{2}/([0-9a-f]{64})")
# A set as an item's record names it: an attempt's prefix (or, written before manifests, the
# set's own directory).
_SET_PREFIX = re.compile(
    r"derived/[0-9a-f]{32}/[a-z][a-z0-9_]{0,31}\.v[1-9][0-9]*(/attempt-[0-9a-f]{16})?"
)

Make = Callable[[Path], Awaitable[None]]


@dataclass(frozen=True)
class Blob:
    """An original as kept: its content's SHA-256 and size."""

    digest: str
    size: int


@dataclass(frozen=True)
class Derived:
    """The derivatives of one (media id, stage version) as kept: `files` under the key prefix
    `prefix` (a durable reference: never a URL). `created` is False when an earlier attempt had
    made them (they are reused, not made again)."""

    prefix: str
    files: tuple[str, ...]
    created: bool = False

    def key(self, name: str) -> str:
        return f"{self.prefix}/{check_name(name)}"


@dataclass(frozen=True)
class StaleBlobs:
    """What lies under `blobs/`, last written within a window: `originals` by digest; `taken`,
    originals a release moved out and never settled (`take_blob`), as (digest, key); and
    `leftovers`, the keys of anything else (a link a killed writer never put into place)."""

    originals: tuple[str, ...] = ()
    taken: tuple[tuple[str, str], ...] = ()
    leftovers: tuple[str, ...] = ()


class BlobWriter:
    """An original being written (`MediaStore.writer`) to a local spool file, `path`, and hashed
    on the way: its size is checked on every chunk, so no more than `limit` bytes are ever
    written. After `keep`, `path` still holds the bytes until the writer's block ends."""

    def __init__(self, media: MediaStore, handle: BinaryIO, path: Path, limit: int) -> None:
        self._media = media
        self._handle = handle
        self._digest = hashlib.sha256()
        self.path = path
        self.limit = limit
        self.size = 0

    def write(self, chunk: bytes) -> None:
        """Append a chunk; TooLarge once the whole would pass the limit."""
        self.size += len(chunk)
        if self.size > self.limit:
            raise TooLarge(self.limit)
        self._digest.update(chunk)
        self._handle.write(chunk)

    def write_from(self, source: BinaryIO) -> None:
        """Append what `source` holds, to its end (blocking: run off the event loop)."""
        while chunk := source.read(CHUNK):
            self.write(chunk)

    async def keep(self) -> Blob:
        """Keep the bytes under their digest (the same bytes twice: one object)."""
        await off_loop(self._handle.flush)
        blob = Blob(self._digest.hexdigest(), self.size)
        await self._media.keep_original(blob, self.path)
        return blob


class MediaStore:
    """The originals and derivatives of a moderation pipeline, kept by `backend`. `setting`:
    what named it (`--media`, `HEADRACE_MEDIA`), for a message that says what to change.
    `wall`: the clock objects' times are read against (seconds since the epoch, as a storage
    dates them)."""

    def __init__(
        self,
        backend: Backend,
        *,
        setting: str = "media",
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.setting = setting
        self.wall = wall

    def describe(self) -> str:
        return self.backend.describe()

    async def answers(self) -> None:
        """Prove the storage answers, with one cheap request (a probe's readiness check):
        MediaUnavailable when it does not."""
        await self.backend.exists(f"{PROBES}/ready")

    async def check(self) -> None:
        """Prove the storage answers and honours a conditional write, which keeps one
        derivative set per stage version: ConfigError when it ignores one, MediaUnavailable
        when it cannot be reached."""
        probe = f"{PROBES}/{secrets.token_hex(8)}"
        first = await self.backend.create(probe, b"probe")
        try:
            again = await self.backend.create(probe, b"probe")
        finally:
            await self.backend.delete(probe)
        if not first or again:
            raise ConfigError(
                f"media store {self.describe()}: a write with 'If-None-Match: *' replaced an "
                "object; use a server that honours conditional writes"
            )

    # -- originals

    @contextlib.asynccontextmanager
    async def writer(self, *, limit: int) -> AsyncIterator[BlobWriter]:
        """A blob written chunk by chunk as it arrives (an upload streamed from a socket):
        `keep()` makes it a blob; leaving the block without keeping it leaves nothing."""
        path = await off_loop(scratch_file, self.backend.scratch, "upload.")
        try:
            with path.open("wb") as handle:
                yield BlobWriter(self, handle, path, limit)
        finally:
            await off_loop(path.unlink, missing_ok=True)

    async def put(self, source: BinaryIO, *, limit: int) -> Blob:
        """Keep what `source` holds (read to its end, at most `limit` bytes: TooLarge past it,
        with nothing kept)."""
        async with self.writer(limit=limit) as writer:
            await off_loop(writer.write_from, source)
            return await writer.keep()

    async def put_bytes(self, data: bytes, *, limit: int) -> Blob:
        return await self.put(io.BytesIO(data), limit=limit)

    async def keep_original(self, blob: Blob, path: Path) -> None:
        """Keep the local file `path` as `blob`, unless it is kept already: a key is a content
        address, so what is there has the same bytes."""
        key = blob_key(blob.digest)
        if not await self.backend.exists(key):
            await self.backend.put_file(key, path)

    async def has_blob(self, digest: str) -> bool:
        return await self.backend.exists(blob_key(digest))

    @contextlib.asynccontextmanager
    async def original(self, digest: str) -> AsyncIterator[Path]:
        """An original as a local file for the block (decoders read files); MissingMedia when
        it is not kept."""
        key = blob_key(digest)
        async with self.backend.local(key) as path:
            if path is None:
                raise MissingMedia(key)
            yield path

    async def take_blob(self, digest: str) -> str | None:
        """Move a blob out of its place, to be deleted or put back (`settle_blob`); None when
        there is none. From here, an upload of the same bytes keeps a copy of its own."""
        taken = f"{blob_key(digest).rsplit('/', 1)[0]}/.{digest}.{secrets.token_hex(8)}.taken"
        return taken if await self.backend.move(blob_key(digest), taken) else None

    async def being_settled(self, digest: str) -> bool:
        """Whether a blob is out of its place for the moment (`take_blob`), to be deleted or put
        back: a read that finds it missing meanwhile may find it again shortly."""
        prefix = blob_key(digest).rsplit("/", 1)[0]
        return any(
            (found := _TAKEN.fullmatch(key)) and found[1] == digest
            for key in await self.backend.keys(prefix)
        )

    async def settle_blob(self, digest: str, taken: str, *, keep: bool) -> None:
        """Delete a taken blob, or (`keep`) put it back: unless an upload put the same bytes
        in place meanwhile, which then stand."""
        if not _TAKEN.fullmatch(taken):
            raise ConfigError(f"taken blob: expected a key take_blob gave, got {taken!r}")
        if keep:
            await self.backend.copy(taken, blob_key(digest))
        await self.backend.delete(taken)

    async def stale_blobs(self, *, before: float, since: float | None = None) -> StaleBlobs:
        """What lies under `blobs/` last written before `before` (and after `since`, when
        given), in seconds since the epoch by `wall`."""
        originals: list[str] = []
        taken: list[tuple[str, str]] = []
        leftovers: list[str] = []
        for listed in await self.backend.listing("blobs"):
            if listed.written >= before or (since is not None and listed.written <= since):
                continue
            if found := _BLOB.fullmatch(listed.key):
                originals.append(found[1])
            elif found := _TAKEN.fullmatch(listed.key):
                taken.append((found[1], listed.key))
            else:
                leftovers.append(listed.key)
        return StaleBlobs(tuple(originals), tuple(taken), tuple(leftovers))

    async def remove_leftover(self, key: str) -> bool:
        """Delete an object `stale_blobs` names a leftover."""
        if not key.startswith("blobs/") or _BLOB.fullmatch(key) or _TAKEN.fullmatch(key):
            raise ConfigError(f"leftover: expected a key stale_blobs gave, got {key!r}")
        return await self.backend.delete(key)

    async def remove_blob(self, digest: str) -> bool:
        """Delete an original; False when it was not there. Whether an item still names it is
        the caller's business."""
        return await self.backend.delete(blob_key(digest))

    # -- media ids and derivatives

    @staticmethod
    def new_media_id() -> str:
        return secrets.token_hex(16)

    async def derived(self, media_id: str, stage: str, version: int) -> Derived | None:
        """The derivatives (media id, stage version) has, as its manifest names them, or None."""
        where = set_key(media_id, stage, version)
        manifest = await self.backend.read(f"{where}/{MANIFEST}")
        return None if manifest is None else _from_manifest(where, manifest)

    async def derive_once(self, media_id: str, stage: str, version: int, make: Make) -> Derived:
        """(media id, stage version)'s derivatives: those kept already, or what `make(into)`
        writes into a local scratch directory, kept as a new set unless another attempt's set
        stood first (then that one is returned). Nothing of the scratch directory stays, nor,
        once a set stands, any other attempt's objects."""
        found = await self.derived(media_id, stage, version)
        if found is not None:
            # The attempt that wrote it may have died before removing the others' objects.
            await self._sweep(set_key(media_id, stage, version), found)
            return found
        async with self._scratch_directory() as made:
            await make(made)
            return await self.keep_derived(media_id, stage, version, made)

    async def keep_derived(self, media_id: str, stage: str, version: int, made: Path) -> Derived:
        """Keep the files of the local directory `made` as an attempt's set of (media id, stage
        version), then write the set's manifest if none stands: the first attempt to write it
        wins. Whichever set stands is returned, with every other attempt's objects removed."""
        where = set_key(media_id, stage, version)
        names = tuple(check_name(name) for name in await off_loop(_names, made))
        attempt = Derived(f"{where}/attempt-{secrets.token_hex(8)}", names, created=True)
        try:
            for name in names:
                await self.backend.put_file(attempt.key(name), made / name)
        except Exception:
            with contextlib.suppress(Exception):  # what is left goes with the set that stands
                await self.backend.delete_under(attempt.prefix)
            raise
        # Not cleaned up when this fails: the manifest may be written all the same (its answer
        # lost), and then it names these objects.
        won = await self.backend.create(f"{where}/{MANIFEST}", _manifest(attempt))
        standing = attempt if won else await self.derived(media_id, stage, version)
        if standing is None:  # removed (`remove_derived`) as it was written
            raise MissingMedia(f"{where}/{MANIFEST}")
        await self._sweep(where, standing)
        return standing

    async def read_derived(self, derived: Derived, name: str) -> bytes:
        """One derivative's bytes (a small one: metadata)."""
        key = derived.key(name)
        found = await self.backend.read(key)
        if found is None:
            raise MissingMedia(key)
        return found

    async def remove_derived(self, media_id: str) -> int:
        """Delete every derivative set of a media id (every stage version, manifests and what
        attempts left among them); how many objects there were."""
        return await self.backend.delete_under(f"derived/{check_media_id(media_id)}")

    async def derivative_sets(self, media_id: str) -> int:
        """How many sets' objects a media id has, a half-written or losing attempt's counted
        as one each: one per stage version once every attempt has ended."""
        where = f"derived/{check_media_id(media_id)}"
        sets = set()
        for key in await self.backend.keys(where):
            stage, _, rest = key.removeprefix(f"{where}/").partition("/")
            if rest != MANIFEST:
                sets.add((stage, rest.split("/")[0] if "/" in rest else ""))
        return len(sets)

    async def _sweep(self, where: str, standing: Derived) -> None:
        """Remove every object of a set's key but its manifest and the standing attempt's."""
        attempts: set[str] = set()
        for key in await self.backend.keys(where):
            if key == f"{where}/{MANIFEST}" or key.startswith(f"{standing.prefix}/"):
                continue
            head, _, rest = key.removeprefix(f"{where}/").partition("/")
            if rest:
                attempts.add(f"{where}/{head}")
            else:  # a set kept before manifests were written, with its files at its top
                await self.backend.delete(key)
        for prefix in attempts:
            await self.backend.delete_under(prefix)

    @contextlib.asynccontextmanager
    async def _scratch_directory(self) -> AsyncIterator[Path]:
        path = await off_loop(_temporary_directory, self.backend.scratch)
        try:
            yield path
        finally:
            await off_loop(shutil.rmtree, path, ignore_errors=True)

    # -- previews

    async def preview(self, prefix: str, name: str, *, signed: bool) -> Served | None:
        """How to send one derivative of the set an item's record names (`prefix`): a local
        file, a signed URL (`signed`, where the storage signs) or a stream; None when it is
        missing."""
        if not _SET_PREFIX.fullmatch(prefix):
            raise ConfigError(f"derivative set: expected a prefix the store made, got {prefix!r}")
        return await self.backend.serve(f"{prefix}/{check_name(name)}", signed=signed)

    async def signing_origin(self) -> str | None:
        """The origin (`scheme://host:port`) signed URLs point to, which a page must allow its
        images from; None when the storage signs none (a directory's files are served)."""
        served = await self.backend.serve(f"{PROBES}/origin", signed=True)
        if not isinstance(served, SignedUrl):
            return None
        parts = urlsplit(served.url)
        return f"{parts.scheme}://{parts.netloc}"


def blob_key(digest: str) -> str:
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ConfigError(f"media digest: expected 64 hex digits, got {digest!r}")
    return f"blobs/{digest[:2]}/{digest}"


def set_key(media_id: str, stage: str, version: int) -> str:
    """The key under which (media id, stage version)'s set and its manifest are."""
    if not _STAGE.fullmatch(stage):
        raise ConfigError(f"derivative stage: expected a short lower-case name, got {stage!r}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError(f"derivative version: expected a positive integer, got {version!r}")
    return f"derived/{check_media_id(media_id)}/{stage}.v{version}"


def check_media_id(media_id: str) -> str:
    if not isinstance(media_id, str) or not _MEDIA_ID.fullmatch(media_id):
        raise ConfigError(f"media id: expected 32 hex digits, got {media_id!r}")
    return media_id


def check_name(name: str) -> str:
    """A derivative's file name: chosen by the stage, never by a client."""
    if not _NAME.fullmatch(name) or ".." in name or name == MANIFEST:
        raise ConfigError(f"derivative name: expected a short lower-case file name, got {name!r}")
    return name


def _manifest(attempt: Derived) -> bytes:
    body = {"attempt": attempt.prefix.rsplit("/", 1)[1], "files": list(attempt.files)}
    return json.dumps(body, sort_keys=True).encode()


def _from_manifest(where: str, manifest: bytes) -> Derived:
    body = json.loads(manifest)
    attempt, files = body.get("attempt"), body.get("files")
    if not (isinstance(attempt, str) and _ATTEMPT.fullmatch(attempt) and isinstance(files, list)):
        raise ConfigError(f"derivative set {where}: its manifest is not one this store wrote")
    return Derived(f"{where}/{attempt}", tuple(check_name(name) for name in files))


def _names(made: Path) -> list[str]:
    return sorted(path.name for path in made.iterdir())


def _temporary_directory(scratch: Path) -> Path:
    scratch.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=scratch, prefix="headrace-derive."))
