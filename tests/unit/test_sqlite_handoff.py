"""The switch interval while a SQLite store is open (store/sqlite/handoff.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.store.protocol.types import Settings
from headrace.store.sqlite import SQLiteStore, handoff


@pytest.fixture(autouse=True)
def default_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(handoff.DEFAULT)
    yield
    sys.setswitchinterval(before)


@pytest.mark.anyio
async def test_an_open_store_shortens_the_interval_until_the_last_one_closes(
    tmp_path: Path,
) -> None:
    first, second = SQLiteStore(tmp_path / "a.db"), SQLiteStore(tmp_path / "b.db")
    await first.open(Settings())
    assert sys.getswitchinterval() == pytest.approx(handoff.WHILE_OPEN)
    await second.open(Settings())
    await first.close()
    assert sys.getswitchinterval() == pytest.approx(handoff.WHILE_OPEN)  # one still open
    await second.close()
    assert sys.getswitchinterval() == pytest.approx(handoff.DEFAULT)


@pytest.mark.anyio
async def test_a_process_that_chose_its_interval_keeps_it(tmp_path: Path) -> None:
    sys.setswitchinterval(0.002)
    store = SQLiteStore(tmp_path / "a.db")
    await store.open(Settings())
    assert sys.getswitchinterval() == pytest.approx(0.002)
    await store.close()
    assert sys.getswitchinterval() == pytest.approx(0.002)


@pytest.mark.anyio
async def test_an_interval_changed_while_open_is_left_as_it_was_set(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "a.db")
    await store.open(Settings())
    sys.setswitchinterval(0.003)  # the application's own choice, after the store opened
    await store.close()
    assert sys.getswitchinterval() == pytest.approx(0.003)
