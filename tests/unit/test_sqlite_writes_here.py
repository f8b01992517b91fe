"""Where an SQLite store's writes run: on the event loop's thread when the write turn is free at
once, on the store's own thread when another process has it or when a program that takes no
turn holds the file; the loop goes on meanwhile. Real time is the point here (locks between
connections and threads); each wait is bounded."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from headrace.store.machine import Transaction
from headrace.store.sqlite import SQLiteStore
from headrace.store.sqlite.turn import WriteTurn
from headrace.store.types import NewTask, Settings, TaskState

pytestmark = pytest.mark.anyio

WAIT = 5.0  # the most any step here waits for


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {})


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = SQLiteStore(tmp_path / "h.db", busy_timeout=WAIT)
    await opened.open(Settings())
    yield opened
    await opened.close()


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread each of the store's transactions ran on."""
    seen: list[int] = []
    transact = SQLiteStore._transact

    def recorded(
        self: SQLiteStore, begin: str, verb: Callable[[Transaction], Awaitable[Any]]
    ) -> Any:
        seen.append(threading.get_ident())
        return transact(self, begin, verb)

    monkeypatch.setattr(SQLiteStore, "_transact", recorded)
    return seen


def task(ref: str) -> NewTask:
    return NewTask(kind="work", ref=ref)


async def ticking(stop: asyncio.Event) -> int:
    """Turns of the loop until `stop`: the loop went on if there were some."""
    ticks = 0
    while not stop.is_set():
        ticks += 1
        await asyncio.sleep(0.01)
    return ticks


async def test_a_write_with_the_turn_free_runs_on_the_loops_thread(
    store: SQLiteStore, threads: list[int]
) -> None:
    [sub] = await store.submit([task("a")])
    loop_thread = threading.get_ident()
    assert threads == [loop_thread]
    assert (await store.get(sub.id)).state is TaskState.READY  # a read: the store's thread
    assert threads[1] != loop_thread


async def test_a_write_waits_on_the_stores_thread_while_another_process_has_the_turn(
    store: SQLiteStore, threads: list[int], tmp_path: Path
) -> None:
    other = WriteTurn(tmp_path / "h.db", WAIT)
    other.acquire()
    stop = asyncio.Event()
    ticker = asyncio.create_task(ticking(stop))
    submit = asyncio.create_task(store.submit([task("a")]))
    await asyncio.sleep(0.2)
    assert not submit.done()  # waiting for the turn
    other.release()
    [sub] = await asyncio.wait_for(submit, WAIT)
    stop.set()
    assert await ticker > 5  # the loop went on while the write waited
    assert threads and threads[0] != threading.get_ident()
    assert (await store.get(sub.id)).state is TaskState.READY
    other.close()


async def test_a_program_holding_the_file_without_the_turn_does_not_hold_up_the_loop(
    store: SQLiteStore, threads: list[int], tmp_path: Path
) -> None:
    shell = sqlite3.connect(tmp_path / "h.db", isolation_level=None, check_same_thread=False)
    shell.execute("BEGIN IMMEDIATE")  # the write lock, as the sqlite3 shell would take it
    stop = asyncio.Event()
    ticker = asyncio.create_task(ticking(stop))
    submit = asyncio.create_task(store.submit([task("a")]))
    await asyncio.sleep(0.2)
    assert not submit.done()  # waiting for the lock, on the store's thread
    shell.execute("COMMIT")
    [sub] = await asyncio.wait_for(submit, WAIT)
    stop.set()
    assert await ticker > 5
    # Tried here first (meeting the lock, writing nothing), then on the store's thread.
    assert threads[0] == threading.get_ident() and threads[1] != threads[0]
    assert (await store.get(sub.id)).state is TaskState.READY
    assert await store._in_thread(lambda: busy_timeout(store)) == round(WAIT * 1000)
    shell.close()


def busy_timeout(store: SQLiteStore) -> int:
    """The connection's wait for another's lock, in milliseconds: as configured again."""
    assert store._connection is not None
    return int(store._connection.execute("PRAGMA busy_timeout").fetchone()[0])
