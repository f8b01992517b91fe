"""What the benchmark's tasks do, the same in every system.

A no-op stamps the wall-clock time it ran into its process's marks file: one fixed record (tasks
run, first stamp, last stamp) rewritten in place by each task, a write to the page cache of a
few microseconds. The harness reads the files to see the queue drained, and takes the time from
the first stamp to the last across every process. A no-op's start and end are the same moment
within a microsecond, so one stamp is both.

A timed task sends the time it started, and its ref, in a UDP datagram to the producer, which
waits for it before it enqueues the next one.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.peers.base import Site

RECORD = struct.Struct("<qdd")  # tasks run, first stamp, last stamp

_lock = threading.Lock()  # Dramatiq and Celery run tasks in threads


class _Marks:
    """This process's marks file."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._count = 0
        self._first = math.inf
        self._last = 0.0

    def stamp(self, at: float) -> None:
        self._count += 1
        self._first = min(self._first, at)
        self._last = max(self._last, at)
        os.pwrite(self._fd, RECORD.pack(self._count, self._first, self._last), 0)


_marks: dict[int, _Marks] = {}  # by process id: a forked worker opens a file of its own
_reporters: dict[int, tuple[socket.socket, int]] = {}


def ran() -> None:
    """The no-op's body."""
    at = time.time()
    with _lock:
        pid = os.getpid()
        if pid not in _marks:
            _marks[pid] = _Marks(Site.from_env().marks / str(pid))
        _marks[pid].stamp(at)


def started(ref: str) -> None:
    """The timed task's body."""
    at = time.time()
    with _lock:
        pid = os.getpid()
        if pid not in _reporters:
            _reporters[pid] = (
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
                Site.from_env().port,
            )
        reporter, port = _reporters[pid]
    reporter.sendto(f"{ref} {at!r}".encode(), ("127.0.0.1", port))


def report(datagram: bytes) -> tuple[str, float]:
    """A timed task's ref and start, from its datagram."""
    ref, at = datagram.decode().split()
    return ref, float(at)


@dataclass(frozen=True)
class Tally:
    """Every process's marks together."""

    ran: int
    first: float
    last: float
    processes: int  # that ran at least one task
    start_spread: float  # from the first process's first task to the last process's first


def tally(marks: Path) -> Tally:
    found = (path.read_bytes() for path in marks.iterdir())
    records = [RECORD.unpack(data) for data in found if len(data) == RECORD.size]
    if not records:
        return Tally(0, 0.0, 0.0, 0, 0.0)
    firsts = [first for _, first, _ in records]
    return Tally(
        ran=sum(count for count, _, _ in records),
        first=min(firsts),
        last=max(last for _, _, last in records),
        processes=len(records),
        start_spread=max(firsts) - min(firsts),
    )
