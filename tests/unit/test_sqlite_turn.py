"""The SQLite write turn: writers of every process queue on a lock beside the file, handed on
as soon as it is let go, freed when its holder's process ends, and waited for at most the
store's busy_timeout. Real time is the point here (locks between processes); each wait is
bounded."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from headrace.policy.errors import StoreError
from headrace.store.sqlite.turn import WriteTurn, turn_path


def acquiring(turn: WriteTurn) -> tuple[threading.Thread, threading.Event]:
    """A thread taking `turn`, started, and the event it sets once it has it."""
    got = threading.Event()

    def wait() -> None:
        turn.acquire()
        got.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    return waiter, got


def test_a_waiting_writer_gets_the_turn_when_it_is_let_go(tmp_path: Path) -> None:
    database = tmp_path / "h.db"
    first, second = WriteTurn(database, 5.0), WriteTurn(database, 5.0)
    first.acquire()
    waiter, got = acquiring(second)
    assert not got.wait(0.1)  # held by the first
    first.release()
    waiter.join(5.0)
    assert got.is_set() and second.waited == 1
    second.release()
    first.acquire()  # free again: taken at once
    assert first.waited == 0
    first.release()
    first.close()
    second.close()
    assert turn_path(database) == tmp_path / "h.db-turn" and turn_path(database).exists()


def test_a_turn_held_past_the_timeout_is_an_error_and_is_handed_back_later(
    tmp_path: Path,
) -> None:
    database = tmp_path / "h.db"
    holder, writer = WriteTurn(database, 5.0), WriteTurn(database, 0.1)
    holder.acquire()
    with pytest.raises(StoreError, match=r"h\.db-turn \(the write turn\) past busy_timeout"):
        writer.acquire()
    holder.release()
    # The wait given up took the turn once it was free and let it go: others get it.
    writer.timeout = 5.0
    writer.acquire()
    writer.release()
    holder.acquire()
    holder.release()
    holder.close()
    writer.close()


def test_the_turn_is_free_once_its_holders_process_ends(tmp_path: Path) -> None:
    database = tmp_path / "h.db"
    hold = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", hold, str(turn_path(database))], stdout=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None and process.stdout.readline() == "held\n"
            turn = WriteTurn(database, 10.0)
            waiter, got = acquiring(turn)
            assert not got.wait(0.1)
            process.kill()
            waiter.join(10.0)
            assert got.is_set()
            turn.release()
            turn.close()
        finally:
            process.kill()


def test_a_directory_it_cannot_write_is_named(tmp_path: Path) -> None:
    turn = WriteTurn(tmp_path / "missing" / "h.db", 1.0)
    with pytest.raises(StoreError, match=r"cannot open .*h\.db-turn \(the write turn\)"):
        turn.acquire()
