"""Each store's rows read plainly, past its tallies, and finished tasks deleted the way retention
deletes them: what `test_tallies.py` holds the tallied reads to.

These are plain statements on a connection of their own (the DELETEs are the ones retention
runs: a finished task's dependency edges, tickets, attempts, then the task); on `memory://`,
whose database lives in the store's connection, the same statements on that connection.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psycopg
from psycopg import sql

from headrace.store.protocol.types import AttemptOutcome, TaskState
from headrace.store.sqlite import SQLiteStore
from headrace.store.sqlite.running import Inline

from .conftest import POSTGRES_DSN, postgres_schema

TASKS = "SELECT id, kind, grp, state, coalesce(ready_since, created_at) AS since FROM tasks"
ATTEMPTS = "SELECT outcome, count(*) FROM attempts GROUP BY outcome"
SQLITE_DELETES = (
    "DELETE FROM task_deps WHERE dep_id IN ({ids}) OR task_id IN ({ids})",
    "DELETE FROM tickets WHERE task_id IN ({ids})",
    "DELETE FROM attempts WHERE task_id IN ({ids})",
    "DELETE FROM tasks WHERE id IN ({ids})",
)
POSTGRES_DELETES = (
    "DELETE FROM task_deps WHERE dep_id = ANY(%(ids)s) OR task_id = ANY(%(ids)s)",
    "DELETE FROM tickets WHERE task_id = ANY(%(ids)s)",
    "DELETE FROM attempts WHERE task_id = ANY(%(ids)s)",
    "DELETE FROM tasks WHERE id = ANY(%(ids)s)",
)


@dataclass(frozen=True)
class Row:
    """What the tallies count of a task."""

    id: int
    kind: str
    group: str | None
    state: TaskState
    since: float  # when it last became ready to run (store/protocol/ages.py), or was created


class Plain(Protocol):
    def tasks(self) -> list[Row]: ...

    def attempts(self) -> Counter[AttemptOutcome]: ...

    def delete(self, task_ids: Sequence[int]) -> None:
        """Delete finished tasks with their attempts, as retention does."""
        ...

    def close(self) -> None: ...


def plain_for(backend: str, directory: Path, store: object) -> Plain:
    if backend == "sqlite":
        connection = sqlite3.connect(directory / "conformance.db", isolation_level=None, timeout=5)
        connection.execute("PRAGMA foreign_keys = ON")
        return SQLiteRows(connection, owned=True)
    if backend == "postgres":
        return PostgresRows(postgres_schema(directory))
    assert isinstance(store, SQLiteStore) and isinstance(store._running, Inline)
    assert store._running.connection is not None
    return SQLiteRows(store._running.connection, owned=False)  # the store's own database


def _row(found: Sequence[object]) -> Row:
    task_id, kind, group, state, since = found
    assert isinstance(task_id, int) and isinstance(kind, str) and isinstance(state, str)
    assert group is None or isinstance(group, str)
    assert isinstance(since, float)
    return Row(task_id, kind, group, TaskState(state), since)


class SQLiteRows:
    def __init__(self, connection: sqlite3.Connection, *, owned: bool) -> None:
        self.connection = connection
        self.owned = owned  # closed with these rows (not the store's own)

    def tasks(self) -> list[Row]:
        return [_row(found) for found in self.connection.execute(TASKS)]

    def attempts(self) -> Counter[AttemptOutcome]:
        found = self.connection.execute(ATTEMPTS)
        return Counter({AttemptOutcome(outcome): n for outcome, n in found})

    def delete(self, task_ids: Sequence[int]) -> None:
        ids = ", ".join(str(int(task_id)) for task_id in task_ids)
        self.connection.execute("BEGIN IMMEDIATE")
        for statement in SQLITE_DELETES:
            self.connection.execute(statement.format(ids=ids))
        self.connection.execute("COMMIT")

    def close(self) -> None:
        if self.owned:
            self.connection.close()


class PostgresRows:
    def __init__(self, schema: str) -> None:
        self.connection = psycopg.connect(POSTGRES_DSN, autocommit=True)
        path = sql.SQL("SET search_path = {}").format(sql.Identifier(schema))
        self.connection.execute(path)

    def tasks(self) -> list[Row]:
        return [_row(found) for found in self.connection.execute(TASKS)]

    def attempts(self) -> Counter[AttemptOutcome]:
        found = self.connection.execute(ATTEMPTS)
        return Counter({AttemptOutcome(outcome): n for outcome, n in found})

    def delete(self, task_ids: Sequence[int]) -> None:
        with self.connection.transaction():
            for statement in POSTGRES_DELETES:
                self.connection.execute(statement, {"ids": list(task_ids)})

    def close(self) -> None:
        self.connection.close()
