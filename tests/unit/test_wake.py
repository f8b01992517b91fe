"""The wake-up channel beside an SQLite file: one process's notify wakes the others' listeners,
stale sockets go, closing cleans up, and where the channel cannot work the store's waits fall
back to polling the file, without an error. In real time: the channel is sockets and files."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from headrace.store.protocol.types import NewTask, Settings
from headrace.store.sqlite import SQLiteStore
from headrace.store.sqlite.wake import WakeChannel, channel_directory

pytestmark = [pytest.mark.anyio, pytest.mark.realtime]

BOUND = 1.0  # seconds a wake-up may take here: far above its cost, far below any poll
NOTIFY = (  # the body of another process: one notify on the file named by its argument
    "import sys, pathlib, headrace.store.sqlite.wake as wake\n"
    "channel = wake.WakeChannel(pathlib.Path(sys.argv[1]), print)\n"
    "channel.notify()\n"
    "channel.close()\n"
)


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {})


class Counter:
    """An `on_wake` that counts its calls and lets a test wait for the first."""

    def __init__(self) -> None:
        self.calls = 0
        self.called = asyncio.Event()

    def __call__(self) -> None:
        self.calls += 1
        self.called.set()


@contextmanager
def listening(database: Path, on_wake: Callable[[], None]) -> Iterator[WakeChannel]:
    channel = WakeChannel(database, on_wake)
    channel.listen()
    try:
        yield channel
    finally:
        channel.close()


def notify(database: Path) -> None:
    """A notify as from a process that does not listen."""
    channel = WakeChannel(database, print)
    channel.notify()
    channel.close()


def sockets(database: Path) -> list[str]:
    directory = channel_directory(database)
    return sorted(name for name in os.listdir(directory) if name.endswith(".sock"))


async def test_a_notify_in_another_process_wakes_a_listener(tmp_path: Path) -> None:
    database = tmp_path / "a.db"
    woken = Counter()
    with listening(database, woken):
        other = await asyncio.create_subprocess_exec(sys.executable, "-c", NOTIFY, str(database))
        assert await other.wait() == 0
        await asyncio.wait_for(woken.called.wait(), BOUND)


async def test_a_notify_wakes_the_others_once_and_never_its_sender(tmp_path: Path) -> None:
    database = tmp_path / "a.db"
    sender, other = Counter(), Counter()
    with listening(database, sender) as channel, listening(database, other):
        for _ in range(50):  # more than a socket's buffer holds: the rest are dropped
            channel.notify()
        await asyncio.wait_for(other.called.wait(), BOUND)
        await asyncio.sleep(0.1)
    assert (sender.calls, other.calls) == (0, 1)


async def test_a_socket_left_by_a_dead_process_is_removed(tmp_path: Path) -> None:
    database = tmp_path / "a.db"
    woken = Counter()
    with listening(database, woken):
        directory = channel_directory(database)
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        dead.bind(os.fspath(directory / "1-0123abcd.sock"))
        dead.close()  # its file stays, as after a crash
        (directory / "notes.txt").write_text("not a socket: left alone")
        [live] = [name for name in sockets(database) if not name.startswith("1-")]
        notify(database)
        assert sockets(database) == [live]
        assert (directory / "notes.txt").exists()
        await asyncio.wait_for(woken.called.wait(), BOUND)


async def test_closing_removes_the_socket_and_the_last_one_the_directory(tmp_path: Path) -> None:
    database = tmp_path / "a.db"
    first = WakeChannel(database, print)
    first.listen()
    first.listen()  # a second wait of the same process: the same socket
    with listening(database, print):
        assert len(sockets(database)) == 2
        first.close()
        assert len(sockets(database)) == 1
        assert channel_directory(database).exists()  # the other still listens
    assert not channel_directory(database).exists()


async def test_a_path_too_long_for_a_socket_meets_under_the_temp_directory(
    tmp_path: Path,
) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    database = deep / "a.db"
    directory = channel_directory(database)
    assert directory.parent == Path(tempfile.gettempdir())
    woken = Counter()
    with listening(database, woken):
        notify(database)
        await asyncio.wait_for(woken.called.wait(), BOUND)
    assert not directory.exists()


def socket_files(root: Path) -> list[Path]:
    return list(root.glob("**/*.sock"))


def occupied_by_a_file(directory: Path, scratch: Path) -> None:
    directory.write_text("")


def a_symlink_to_a_directory(directory: Path, scratch: Path) -> None:
    target = scratch / "elsewhere"  # the test's own: nothing left in the shared temp directory
    target.mkdir()
    directory.symlink_to(target)


def writable_by_others(directory: Path, scratch: Path) -> None:
    directory.mkdir()
    directory.chmod(0o777)


def spoiled(directory: Path) -> None:
    """Take away what a spoiling left in the system's temporary directory."""
    if directory.is_dir() and not directory.is_symlink():
        shutil.rmtree(directory)
    else:
        directory.unlink(missing_ok=True)


@pytest.mark.parametrize(
    "spoil", [occupied_by_a_file, a_symlink_to_a_directory, writable_by_others]
)
async def test_an_unusable_directory_leaves_waits_to_the_poll(
    tmp_path: Path, spoil: Callable[[Path, Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="headrace.store.sqlite.wake")
    database = tmp_path / "a.db"
    spoil(channel_directory(database), tmp_path)
    waiter, writer = SQLiteStore(database), SQLiteStore(database)
    await waiter.open(Settings())
    await writer.open(Settings())
    try:
        waiting = asyncio.create_task(waiter.wait_for_work(30.0))
        await asyncio.sleep(0.1)
        await writer.submit([NewTask("render", "r1")])
        await asyncio.wait_for(waiting, 5.0)  # the data version, looked at every 20 ms
    finally:
        await writer.close()
        await waiter.close()
        spoiled(channel_directory(database))
    assert "no wake-ups" in caplog.text
    assert not socket_files(tmp_path)


async def test_without_unix_sockets_there_is_no_channel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(socket, "AF_UNIX")
    database = tmp_path / "a.db"
    with listening(database, print) as channel:
        channel.notify()
    assert not channel_directory(database).exists()
