"""How soon the store's thread gets the interpreter back after each statement.

The store runs every statement on its own thread, and SQLite lets go of the interpreter lock
(the GIL) while it steps a statement. Taking the lock back waits for the thread that holds it
meanwhile, the event loop's, to hand it over: at once if that thread waits on something, and
otherwise after the interpreter's switch interval, 5 ms by default. A claim or an outcome batch
is about ten statements, each of which may wait so, inside the write transaction that every
other process sharing the file queues behind. While a store is open its process switches
every 0.5 ms instead: `python -m bench --only peers --system headrace-sqlite`, three runs of
each, drained 11,067 -> 12,215 tasks a second with one process and 14,222 -> 15,014 with four
(medians), at 91 -> 82 microseconds of CPU a task. A process whose interval is set already (not
the default) keeps its own; the default comes back when the last store closes.
"""

from __future__ import annotations

import sys
import threading

DEFAULT = 0.005  # the interpreter's own
WHILE_OPEN = 0.0005

_lock = threading.Lock()
_open = 0
_changed = False


def shorten() -> None:
    """A store opened: switch every `WHILE_OPEN` seconds unless the process chose its own."""
    global _open, _changed
    with _lock:
        _open += 1
        if _open == 1 and sys.getswitchinterval() == DEFAULT:
            sys.setswitchinterval(WHILE_OPEN)
            _changed = True


def restore() -> None:
    """A store closed: the last one puts back the default if `shorten` changed it (and nothing
    changed it since)."""
    global _open, _changed
    with _lock:
        _open = max(0, _open - 1)
        if _open == 0 and _changed:
            if abs(sys.getswitchinterval() - WHILE_OPEN) < 1e-9:
                sys.setswitchinterval(DEFAULT)
            _changed = False
