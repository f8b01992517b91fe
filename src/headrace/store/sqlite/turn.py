"""The write turn: which of the processes sharing an SQLite file writes next.

SQLite lets one connection write at a time. A writer that finds the file locked retries on its
busy handler's schedule (1, 2, 5, 10, 15, 20, 25 ms and on), so with several worker processes
on one file each waiting claim slept far longer than the transaction it waited for took: four
processes drained fewer tasks a second than one. Writers of a store therefore queue for an
advisory lock (`flock`) on a file beside the database (`<database>-turn`) before they begin
their transaction: the kernel hands the lock to a waiter the moment its holder lets go, and
frees it when the holder's process ends, however it ends. SQLite's own lock still guards the
file against writers that do not take the turn (another program, the `sqlite3` shell); they
meet its busy handler as before.

A turn is waited for at most `timeout` seconds (the store's `busy_timeout`): the blocking wait
runs on a daemon thread of the turn's own, and a wait given up is handed back by that thread as
soon as it gets the lock, so a process stopped while holding the turn (SIGSTOP, a debugger)
costs the others an error after `timeout`, as a held SQLite lock does, not a silent hang.
"""

from __future__ import annotations

import fcntl
import os
import queue
import threading
from pathlib import Path

from headrace.policy.errors import StoreError

SUFFIX = "-turn"


def turn_path(database: Path) -> Path:
    """The file whose lock is the write turn of `database`."""
    return database.with_name(database.name + SUFFIX)


class _Wait:
    """One wait handed to the waiting thread: granted, or given up by the writer."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.granted = False
        self.abandoned = False


class WriteTurn:
    """The write turn of one SQLite file, for the writes of one store (one thread at a time:
    the store's own)."""

    def __init__(self, database: Path, timeout: float) -> None:
        self.path = turn_path(database)
        self.timeout = timeout
        self.waited = 0  # turns that were not free at once
        self._fd: int | None = None
        self._waits: queue.SimpleQueue[_Wait | None] | None = None

    def acquire(self) -> None:
        """Take the turn, waiting at most `timeout` seconds for another process to end its
        write; StoreError when it does not."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        except OSError as exc:
            raise StoreError(f"sqlite store: cannot lock {self.path}: {exc}") from exc
        self.waited += 1
        wait = _Wait()
        self._waiter().put(wait)
        wait.done.wait(self.timeout)
        with wait.lock:
            if wait.granted:
                return
            wait.abandoned = True  # the waiting thread hands it back once it has it
        raise StoreError(
            f"sqlite store: another process kept {self.path.name} (the write turn) past "
            f"busy_timeout ({self.timeout:g}s)"
        )

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def __enter__(self) -> WriteTurn:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def close(self) -> None:
        """Close the lock file; a wait still blocked keeps it open until it ends."""
        waits, self._waits = self._waits, None
        fd, self._fd = self._fd, None
        if waits is not None:
            waits.put(None)  # the waiting thread closes the file when it stops
        elif fd is not None:
            os.close(fd)

    def _open(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise StoreError(
                    f"sqlite store: cannot open {self.path} (the write turn): {exc.strerror}; "
                    "the database's directory must be writable"
                ) from exc
        return self._fd

    def _waiter(self) -> queue.SimpleQueue[_Wait | None]:
        if self._waits is None:
            assert self._fd is not None
            self._waits = queue.SimpleQueue()
            threading.Thread(
                target=_wait_for_turns,
                args=(self._fd, self._waits),
                name="headrace-sqlite-turn",
                daemon=True,
            ).start()
        return self._waits


def _wait_for_turns(fd: int, waits: queue.SimpleQueue[_Wait | None]) -> None:
    """Block on the lock for each wait in turn; hand back a turn its writer gave up on."""
    try:
        while (wait := waits.get()) is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with wait.lock:
                if wait.abandoned:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                else:
                    wait.granted = True
                    wait.done.set()
    finally:
        os.close(fd)
