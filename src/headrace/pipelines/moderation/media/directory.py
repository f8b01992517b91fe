"""A media store's objects as files under one directory (`--media DIR`, `file:///DIR`): every
process of a deployment must share it (one host, or a network filesystem).

An object is written to a temporary file under `root/tmp` first (the scratch directory, on the
same filesystem), flushed to disk, then hard-linked into place: a reader never sees half a file,
and a conditional write (`create`) is a link that fails when its name is taken. Every verb runs
in a thread of its own (`off_loop`), so the event loop never waits on the disk.

The directory failing (an I/O error, a stale handle, a permission taken away), or missing (a
network filesystem not mounted, a volume moved) when an original is read, is
`MediaUnavailable`: an outage, not a missing object.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

from headrace.pipelines.moderation.media.backend import Listed, LocalFile, Served, scratch_file
from headrace.pipelines.moderation.media.errors import MediaUnavailable
from headrace.policy.errors import ConfigError
from headrace.runtime.calls import off_loop

T = TypeVar("T")

# Times a write makes its directory again when another attempt's sweep removed it meanwhile.
PLACE_TRIES = 5


class DirectoryBackend:
    """Objects as files under `root` (`Backend`)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def scratch(self) -> Path:
        return self.root / "tmp"

    def describe(self) -> str:
        return str(self.root)

    def path(self, key: str) -> Path:
        """The file of `key` (which the store made: checked all the same)."""
        parts = key.split("/")
        if not key or any(part in ("", ".", "..") for part in parts):
            raise ConfigError(f"media key: expected a relative '/'-separated name, got {key!r}")
        return self.root.joinpath(*parts)

    async def exists(self, key: str) -> bool:
        with _translated("head", key):
            return await off_loop(self.path(key).is_file)

    async def read(self, key: str) -> bytes | None:
        with _translated("get", key):
            return await off_loop(_read, self.path(key))

    async def put_file(self, key: str, path: Path) -> None:
        with _translated("put", key):
            await off_loop(_link_into_place, path, self.path(key))

    async def create(self, key: str, data: bytes) -> bool:
        with _translated("put (if none match)", key):
            return await off_loop(_create, self.path(key), data, self.scratch)

    @contextlib.asynccontextmanager
    async def local(self, key: str) -> AsyncIterator[Path | None]:
        path = self.path(key)
        yield path if await self._found("get", key, off_loop(path.is_file)) else None

    async def move(self, key: str, to: str) -> bool:
        with _translated("move", key):
            return await off_loop(_rename, self.path(key), self.path(to))

    async def copy(self, key: str, to: str) -> None:
        with _translated("copy", key):
            await off_loop(_link_unless_there, self.path(key), self.path(to))

    async def delete(self, key: str) -> bool:
        with _translated("delete", key):
            return await off_loop(_unlink, self.path(key))

    async def delete_under(self, prefix: str) -> int:
        with _translated("delete", f"{prefix}/"):
            return await off_loop(_remove_tree, self.path(prefix))

    async def keys(self, prefix: str) -> list[str]:
        with _translated("list", f"{prefix}/"):
            return await off_loop(self._keys, prefix)

    async def listing(self, prefix: str) -> list[Listed]:
        return await off_loop(self._listing, prefix)

    async def serve(self, key: str, *, signed: bool) -> Served | None:
        path = self.path(key)
        with _translated("get", key):
            return LocalFile(path) if await off_loop(path.is_file) else None

    async def _found(self, operation: str, key: str, looked: Awaitable[T]) -> T:
        """What a read of an object that must be there (an original) found; when it found
        nothing, MediaUnavailable if the directory itself is not there: an object of a
        directory that is gone is not known to be missing. (A directory never written to has
        none either, which reads of what may not exist yet, a manifest, must allow.)"""
        with _translated(operation, key):
            found = await looked
            if not found and not await off_loop(self.root.is_dir):
                raise FileNotFoundError(0, "the directory is not there (not mounted, or moved?)")
        return found

    def _keys(self, prefix: str) -> list[str]:
        """The files under `prefix`. A directory that another attempt's sweep removes while
        the listing walks is left out of it rather than failing it (`os.walk` passes over a
        directory it can no longer read), as an object store's listing would."""
        keys: list[str] = []
        for folder, _, names in os.walk(self.path(prefix)):
            base = Path(folder).relative_to(self.root)
            keys.extend((base / name).as_posix() for name in names)
        return sorted(keys)

    def _listing(self, prefix: str) -> list[Listed]:
        """The files under `prefix` with their change time: a link into place (an original
        kept, put back) changes it where the contents' time would not."""
        found = []
        for key in self._keys(prefix):
            with contextlib.suppress(FileNotFoundError):  # removed since the walk
                found.append(Listed(key, self.path(key).stat().st_ctime))
        return found


@contextlib.contextmanager
def _translated(operation: str, key: str) -> Iterator[None]:
    """The file system's failures as MediaUnavailable, naming the operation and the key (a
    verb that expects an object to be missing handles that itself, before this)."""
    try:
        yield
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise MediaUnavailable(operation, key, reason) from error


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _flush(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def _in_directory(target: Path, act: Callable[[], T]) -> T:
    """`act()` once `target`'s directory exists, and again with the directory made anew when it
    went away before `act` used it: an attempt that lost a set's race is still writing under
    its own prefix while the winner's sweep removes that prefix."""
    for _ in range(PLACE_TRIES - 1):
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            return act()
        except FileNotFoundError:
            if target.parent.is_dir():  # not the directory: what was to be linked is missing
                raise
    target.parent.mkdir(parents=True, exist_ok=True)
    return act()


def _link_into_place(path: Path, target: Path) -> None:
    """`target` becomes a name of `path`'s file (flushed first), replacing what had the name."""
    _flush(path)

    def link() -> None:
        linked = target.with_name(f".{target.name}.{secrets.token_hex(8)}.new")
        os.link(path, linked)
        try:
            os.replace(linked, target)
        finally:
            linked.unlink(missing_ok=True)

    _in_directory(target, link)


def _create(target: Path, data: bytes, scratch: Path) -> bool:
    written = scratch_file(scratch, "create.")
    try:
        with written.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:  # a link fails when the name is taken: the conditional write
            _in_directory(target, lambda: os.link(written, target))
        except FileExistsError:
            return False
        return True
    finally:
        written.unlink(missing_ok=True)


def _rename(path: Path, target: Path) -> bool:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(path, target)
    except FileNotFoundError:
        return False
    return True


def _link_unless_there(path: Path, target: Path) -> None:
    with contextlib.suppress(FileExistsError):
        os.link(path, target)


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _remove_tree(path: Path) -> int:
    if not path.is_dir():
        return 0
    count = sum(1 for found in path.rglob("*") if found.is_file())
    shutil.rmtree(path, ignore_errors=True)
    return count
