"""The SQLite store checkpoints its log on a thread of its own, not inside its commits."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from headrace.store.machine import sql
from headrace.store.protocol.types import NewTask, Settings
from headrace.store.sqlite import SQLiteStore
from headrace.store.sqlite.checkpoint import Checkpointer
from headrace.store.sqlite.connection import QUERIES, connect

pytestmark = pytest.mark.anyio

THREAD = "headrace-sqlite-checkpoint"


def checkpointers() -> int:
    return sum(thread.name == THREAD for thread in threading.enumerate())


def copied_into_the_file(path: Path) -> bool:
    """Whether every page the database has is in its main file (none only in the log)."""
    with sqlite3.connect(path) as conn:
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    return path.stat().st_size >= pages * size


def test_a_commit_leaves_the_checkpoint_to_the_checkpointer(tmp_path: Path) -> None:
    queries = sql.load_queries(QUERIES)
    conn = connect(tmp_path / "s.db", 1.0, queries)
    try:
        # SQLite's own threshold is 1,000 pages: raised to a backstop only.
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 20_000
    finally:
        conn.close()


async def test_the_checkpointer_copies_the_log_into_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Checkpointer, "start", lambda self: None)  # the store's own stays idle
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    await store.open(Settings())
    try:
        await store.submit([NewTask(kind="work", ref=f"r{i}" * 50) for i in range(2000)])
        assert not copied_into_the_file(path)  # in the log only, so far
        checkpointer = Checkpointer(path, sql.load_queries(QUERIES)["checkpoint"].text)
        with sqlite3.connect(path, isolation_level=None) as conn:
            checkpointer.checkpoint(conn)
        assert checkpointer.checkpoints == 1
        assert copied_into_the_file(path)
    finally:
        await store.close()


async def test_a_store_runs_one_checkpointer_while_it_is_open(tmp_path: Path) -> None:
    before = checkpointers()
    store = SQLiteStore(tmp_path / "s.db")
    await store.open(Settings())
    await store.open(Settings())  # opened again: still one
    assert checkpointers() == before + 1
    await store.close()
    assert checkpointers() == before


def test_a_checkpointer_on_a_file_it_cannot_open_stops_quietly(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path / "missing" / "s.db", "PRAGMA wal_checkpoint(PASSIVE)")
    checkpointer.start()
    checkpointer.stop()
    assert checkpointer.checkpoints == 0
