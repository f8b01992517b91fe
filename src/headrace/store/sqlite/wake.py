"""Wake-ups between the processes of one host that share an SQLite file.

SQLite tells no one of a commit. So a process that waits for work binds a Unix datagram socket
in a directory beside the file (`<file>-wake/`, only its user's), from its first wait until it
closes the store; and a process whose commit made work claimable sends one byte to every other
socket there. The byte carries nothing but "look again": the receiver drains its socket and
wakes its waiters, who claim. Many bytes are one wake-up, and a socket whose buffer is full
already holds one, so a send never blocks. A process that never waits (a producer) has no
socket, and with nobody listening a notice costs one directory listing.

The socket stays bound between waits: binding one per wait creates and removes a file each
time, and a worker whose slots are all busy waits too.

A lost byte costs latency, never work: the store still looks at the file's data version, which
also covers processes that cannot use the channel. The channel stays off where it cannot work:
no AF_UNIX, an event loop without `add_reader`, a directory that cannot be made or is not this
user's own. A socket path too long for AF_UNIX moves the directory under the temp directory,
named by the file's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import socket
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DIRECTORY_SUFFIX = "-wake"
SOCKET_SUFFIX = ".sock"
# An AF_UNIX path holds 107 bytes on Linux and 103 on macOS and the BSDs (and a NUL); a
# socket's name, "<pid>-<8 hex>.sock", takes at most this many of them with its slash.
MAX_SOCKET_PATH = 103
MAX_DIRECTORY_PATH = MAX_SOCKET_PATH - len("/4194304-0123abcd.sock")
WAKE = b"\x01"
# Tries to bind when a closing process removes the empty directory in between.
BIND_TRIES = 3

log = logging.getLogger(__name__)


class WakeChannel:
    """Wake-ups for the processes sharing `database`: `notify` after a commit that made work
    claimable; once `listen` was called, `on_wake` runs on the event loop when another process
    did; `close` when done with the file."""

    def __init__(self, database: Path, on_wake: Callable[[], None]) -> None:
        self._database = os.path.abspath(database)
        self._on_wake = on_wake
        self._directory: str | None = None  # resolved on first use
        self._sender: socket.socket | None = None
        self._receiving: _Receiving | None = None
        self._off = not supported()
        self._deaf = False  # listening failed once: not tried again by every wait

    def listen(self) -> None:
        """Receive wake-ups from now on, until `close` (nothing to do when already so)."""
        if self._receiving is not None or self._off or self._deaf:
            return
        try:
            self._receiving = _receive(self._where(), self._drain)
        except (OSError, NotImplementedError) as exc:
            log.info("headrace: no wake-ups for %s (%s): idle workers poll it", self._database, exc)
            self._deaf = True

    def notify(self) -> None:
        """Wake every other process listening on this file: one byte to each socket but this
        one's, never waiting."""
        if self._off:
            return
        directory = self._where()
        if not os.access(directory, os.F_OK):
            return  # nobody listens (asked without raising: every write that frees work asks)
        try:
            names = os.listdir(directory)
        except OSError:
            return  # removed meanwhile
        own = self._receiving.name if self._receiving is not None else None
        for name in names:
            if name.endswith(SOCKET_SUFFIX) and name != own:
                self._send(os.path.join(directory, name))

    def close(self) -> None:
        """Stop listening and sending: remove this process's socket, and the directory if no
        other process listens."""
        receiving, self._receiving = self._receiving, None
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.close()
        if receiving is None:
            return
        receiving.loop.remove_reader(receiving.receiver.fileno())
        receiving.receiver.close()
        _unlink(os.path.join(receiving.directory, receiving.name))
        with contextlib.suppress(OSError):
            os.rmdir(receiving.directory)  # only when empty

    def _where(self) -> str:
        if self._directory is None:
            self._directory = os.fspath(channel_directory(Path(self._database)))
        return self._directory

    def _send(self, path: str) -> None:
        """Never raises: the write it follows has committed."""
        try:
            self._open_sender().sendto(WAKE, path)
        except ConnectionRefusedError:
            _unlink(path)  # nothing bound there: its process died without closing
        except OSError:
            pass  # a full buffer already holds a wake-up; a socket gone meanwhile wants none

    def _open_sender(self) -> socket.socket:
        if self._sender is None:
            sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sender.setblocking(False)
            self._sender = sender
        return self._sender

    def _drain(self, receiver: socket.socket) -> None:
        """Read every pending byte, then wake this process's waiters once."""
        with contextlib.suppress(OSError):  # BlockingIOError: drained
            while True:
                receiver.recv(64)
        self._on_wake()


@dataclass(frozen=True)
class _Receiving:
    receiver: socket.socket
    directory: str
    name: str
    loop: asyncio.AbstractEventLoop


def supported() -> bool:
    """AF_UNIX datagram sockets and POSIX file owners: not on Windows."""
    return hasattr(socket, "AF_UNIX") and hasattr(os, "geteuid")


def channel_directory(database: Path) -> Path:
    """Where the processes sharing `database` meet: `<file>-wake` beside the file (its symlinks
    resolved, so every name of it meets there), or, when a socket path there would be too long
    for AF_UNIX, a directory of this user's under the temp directory named by the file's path."""
    real = Path(os.path.realpath(database))
    beside = real.with_name(real.name + DIRECTORY_SUFFIX)
    if len(os.fsencode(beside)) <= MAX_DIRECTORY_PATH:
        return beside
    digest = hashlib.sha256(os.fsencode(real)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"headrace-{os.geteuid()}-{digest}{DIRECTORY_SUFFIX}"


def _receive(directory: str, on_readable: Callable[[socket.socket], None]) -> _Receiving:
    """A socket bound in `directory`, which the running event loop watches."""
    loop = asyncio.get_running_loop()
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = None
    try:
        receiver.setblocking(False)
        name = _bind(receiver, directory)
        loop.add_reader(receiver.fileno(), on_readable, receiver)
    except BaseException:
        receiver.close()
        if name is not None:
            _unlink(os.path.join(directory, name))
        raise
    return _Receiving(receiver, directory, name, loop)


def _bind(receiver: socket.socket, directory: str) -> str:
    """Bind `receiver` under a fresh name in `directory`, made if needed; the name."""
    name = f"{os.getpid()}-{secrets.token_hex(4)}{SOCKET_SUFFIX}"
    tries = 1
    while True:
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
        _check_own(directory)
        try:
            receiver.bind(os.path.join(directory, name))
        except FileNotFoundError:
            # A closing process removed the empty directory after it was made.
            if tries == BIND_TRIES:
                raise
            tries += 1
        else:
            return name


def _check_own(directory: str) -> None:
    """Refuse a directory that is a symlink, not this user's, or writable by others: another
    user could plant sockets in it or remove this one's."""
    found = os.lstat(directory)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise PermissionError(f"{directory} is not a directory of this user's")
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{directory} is writable by other users")


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


__all__ = ["WakeChannel", "channel_directory", "supported"]
