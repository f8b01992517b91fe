"""Checkpoints of an SQLite store's write-ahead log, off the path of its claims and outcomes.

Left to itself, SQLite checkpoints inside the commit that takes the log past
`wal_autocheckpoint` pages: that commit, often a worker's claim, then copies the log into the
database and syncs the file, which on a busy disk costs it tens of milliseconds. A store's
connections raise that threshold to a backstop (`checkpoint_backstop` in queries.sql), and a
thread of the store's own, on a connection of its own, checkpoints every CHECKPOINT_EVERY
seconds in PASSIVE mode: it copies what no reader still needs and waits for no one. With
several processes on one file each runs one; a checkpoint that finds another under way does
nothing.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger(__name__)

# Seconds between checkpoints. At a few thousand commits a second the log grows by a few
# thousand pages meanwhile (well under the backstop), and the next writer starts it afresh.
CHECKPOINT_EVERY = 0.25


class Checkpointer:
    """A daemon thread that checkpoints the log of the file at `path` until `stop()`."""

    def __init__(self, path: Path, statement: str, every: float = CHECKPOINT_EVERY) -> None:
        self.path = path
        self.every = every
        self.checkpoints = 0
        self._statement = statement
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="headrace-sqlite-checkpoint", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        try:
            # No busy wait: a PASSIVE checkpoint that meets a lock skips what it cannot copy.
            connection = sqlite3.connect(self.path, timeout=0, isolation_level=None)
        except sqlite3.Error as exc:
            log.info("headrace sqlite checkpointer not started for %s: %s", self.path, exc)
            return
        try:
            while not self._stopped.wait(self.every):
                self.checkpoint(connection)
        finally:
            connection.close()

    def checkpoint(self, connection: sqlite3.Connection) -> None:
        try:
            connection.execute(self._statement).fetchall()
        except sqlite3.Error as exc:  # busy, or the file went away: the next one tries again
            log.debug("headrace sqlite checkpoint of %s skipped: %s", self.path, exc)
        else:
            self.checkpoints += 1
