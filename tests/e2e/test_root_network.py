"""Tests that change the root network namespace and tests that run a browser take turns
(tests/e2e/root_network.py): the lock is one file for every test process of the machine."""

from __future__ import annotations

import fcntl

from . import root_network


def try_lock(mode: int) -> bool:
    """Whether another open of the lock file (as another process would hold it) gets `mode`
    at once."""
    with root_network.LOCK.open("a") as file:
        try:
            fcntl.flock(file, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(file, fcntl.LOCK_UN)
        return True


def test_a_browser_waits_while_the_network_is_changed() -> None:
    with root_network.changing():
        assert not try_lock(fcntl.LOCK_SH)
        assert not try_lock(fcntl.LOCK_EX)
    assert try_lock(fcntl.LOCK_SH)


def test_browsers_share_it_and_changing_it_waits_for_them_all() -> None:
    with root_network.browsing():
        assert try_lock(fcntl.LOCK_SH)  # another browser test goes ahead
        with root_network.browsing():
            assert not try_lock(fcntl.LOCK_EX)
        assert not try_lock(fcntl.LOCK_EX)  # one still browsing
    assert try_lock(fcntl.LOCK_EX)
