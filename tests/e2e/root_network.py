"""The root network namespace, shared by tests that change it and tests that run a browser.

`hosts.network` adds a bridge and veth pairs to the root namespace and sets links down and up;
Chromium watches the host's interfaces and fails every request it has in flight with
`net::ERR_NETWORK_CHANGED` when they change. Run side by side by pytest-xdist, the multi-host
test failed a moderator's media loads in the burst test. They take turns on a lock file in the
system's temporary directory, one for every test process of the machine: exclusive while the
network is changed (`changing`), shared while a browser runs (`browsing`). Each waits for the
other kind to finish; a browser test may wait for the whole multi-host test (about a minute).
"""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "headrace-tests-root-network.lock"


@contextmanager
def changing() -> Iterator[None]:
    """While this test adds, cuts or removes links in the root namespace."""
    with _held(fcntl.LOCK_EX):
        yield


@contextmanager
def browsing() -> Iterator[None]:
    """While this test's browser has requests in flight."""
    with _held(fcntl.LOCK_SH):
        yield


@contextmanager
def _held(mode: int) -> Iterator[None]:
    with LOCK.open("a") as file:
        fcntl.flock(file, mode)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)
