"""Expected failures of a command, told in one line.

A store that cannot be opened or written, a server that does not answer, a port in use, an app
that cannot be loaded: the user can fix each of them, so the command prints one line to stderr
that names the path, URL or address and says what to do, and exits non-zero (2 when the command
line names something wrong or missing, 1 when what it names failed). Anything else is a bug
and keeps its traceback.

Every command runs inside `CommandGroup.invoke`, the one place that turns these errors into
that line; a command names the store it uses with `use_store(url)` so the line can name it.
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path
from typing import Any

import click

from headrace.policy.errors import (
    ConfigError,
    HeadraceError,
    PrunerBusy,
    QueueFull,
    SchemaTooNew,
    StoreError,
    StoreUnavailable,
    UnknownTask,
)
from headrace.policy.redact import hide_passwords
from headrace.store.sqlite import path_from_url

STORE_URL = "headrace.store_url"  # the store the running command uses, in click's ctx.meta

_SQLITE_HINTS = {
    sqlite3.SQLITE_READONLY: "it is read-only for this user: make the file and its directory "
    "writable (SQLite writes -wal and -shm files beside it)",
    sqlite3.SQLITE_NOTADB: "it is not an SQLite database: give the path of a headrace store, "
    "or of a file that does not exist yet",
    sqlite3.SQLITE_CORRUPT: "the database is corrupt: restore it from a backup",
    sqlite3.SQLITE_BUSY: "another process kept it locked: try again",
    sqlite3.SQLITE_LOCKED: "another process kept it locked: try again",
    sqlite3.SQLITE_FULL: "the disk is full: free some space",
    sqlite3.SQLITE_PERM: "this user may not open it: check its permissions",
}
_OS_HINTS = {
    errno.EADDRINUSE: "another process listens there: stop it, or choose another port",
    errno.EADDRNOTAVAIL: "this host has no such address: choose another host",
    errno.EACCES: "this user may not use it: check its permissions",
    errno.EPERM: "this user may not use it: check its permissions",
    errno.EROFS: "the file system is read-only: choose another place",
    errno.ENOENT: "it does not exist: check the path",
    errno.ENOSPC: "the disk is full: free some space",
}


class CommandFailed(click.ClickException):
    """An expected failure: one line on stderr (passwords hidden), then exit status 1."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(hide_passwords(message).split()))


class WrongInput(CommandFailed):
    """The command line names something wrong or missing: exit status 2, as for bad usage."""

    exit_code = 2


class CommandGroup(click.Group):
    """A click group whose commands report expected failures in one line (see the module)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (HeadraceError, OSError, sqlite3.Error) as error:
            if isinstance(error, OSError) and error.errno == errno.EPIPE:
                raise  # a closed pipe on stdout: click's own handling says nothing
            raise one_line(error, ctx.meta.get(STORE_URL)) from error


def use_store(url: str) -> None:
    """Name the store the running command uses, for its failure line."""
    click.get_current_context().meta[STORE_URL] = url


def one_line(error: BaseException, url: str | None) -> CommandFailed:
    """The line that tells the user what failed and what to do."""
    if isinstance(error, ConfigError):
        return WrongInput(str(error))
    if isinstance(error, UnknownTask):
        return WrongInput(f"{error} in the store {url}")
    if isinstance(error, QueueFull):
        return CommandFailed(f"{error} in the store {url}: try again later")
    if isinstance(error, PrunerBusy):
        return CommandFailed(f"{error} (store {url})")
    if isinstance(error, SchemaTooNew):
        return CommandFailed(f"cannot use the store {url}: {error}")
    if isinstance(error, StoreUnavailable):
        return CommandFailed(
            f"cannot reach the store {url}: {error}; check that the server is running and that "
            "the URL's host, port, database and user are right",
        )
    cause = _sqlite_error(error)
    if cause is not None:
        return _sqlite_failure(cause, url)
    if isinstance(error, OSError):
        return _os_failure(error)
    if isinstance(error, StoreError):
        return CommandFailed(f"the store {url} failed: {error}")
    return CommandFailed(str(error))


def _sqlite_error(error: BaseException) -> sqlite3.Error | None:
    """The SQLite error behind `error` (the store raises StoreError from it)."""
    for candidate in (error, error.__cause__):
        if isinstance(candidate, sqlite3.Error):
            return candidate
    return None


def _sqlite_failure(error: sqlite3.Error, url: str | None) -> CommandFailed:
    path = _sqlite_path(url)
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF
    if code == sqlite3.SQLITE_CANTOPEN:
        return WrongInput(_cannot_open(path))
    hint = _SQLITE_HINTS.get(code, f"SQLite said: {error}")
    return CommandFailed(f"cannot use the SQLite store {path}: {hint}")


def _cannot_open(path: Path | str) -> str:
    if isinstance(path, Path) and not path.parent.is_dir():
        return (
            f"cannot open the SQLite store {path}: the directory {path.parent} does not exist; "
            "create it, or give another path"
        )
    return f"cannot open the SQLite store {path}: check that this user can read and write it"


def _sqlite_path(url: str | None) -> Path | str:
    if url is None:
        return "(unknown file)"
    try:
        return path_from_url(url).resolve()
    except ConfigError:
        return url


def _os_failure(error: OSError) -> CommandFailed:
    where = f"{error.filename}: " if error.filename is not None else ""
    reason = error.strerror or str(error)
    hint = _OS_HINTS.get(error.errno or 0)
    return CommandFailed(f"{where}{reason}" + (f"; {hint}" if hint else ""))
