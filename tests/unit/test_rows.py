"""Rows read into records: every field filled, equal to a record built field by field."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from headrace.policy.tiers import Tier
from headrace.store.machine.rows import TASK_COLUMNS, Candidate, candidates_of, task_of, tasks_of
from headrace.store.protocol.types import TaskRecord, TaskState


def test_a_task_row_fills_every_field_of_its_record() -> None:
    row: dict[str, Any] = {
        "id": 7,
        "kind": "render",
        "ref": "ep1/s01",
        "gates": ["provider:video"],
        "flow": "ep1",
        "grp": "ep1",
        "tier": 1,
        "submitted_tier": 2,
        "cost": 1.5,
        "key": "k",
        "state": "running",
        "attempt": 2,
        "max_attempts": 5,
        "tag": 3.0,
        "created_at": 10.0,
        "run_at": 11.0,
        "ready_since": 11.0,
        "promoted_at": None,
        "finished_at": None,
        "worker": "w1",
        "lease_until": 40.0,
        "lease_token": 3,
        "remote_id": None,
        "poll_every": None,
        "remote_deadline": None,
        "error_code": "upstream_503",
        "expiries": 1,
        "attempt_base": 1,
        "solo": 0,
        "remote_jobs": 0,
        "memory": 1024,
    }
    record = task_of(row)
    assert set(vars(record)) == {field.name for field in dataclasses.fields(TaskRecord)}
    built = TaskRecord(
        **{
            **{k: v for k, v in row.items() if k not in ("grp", "tier", "submitted_tier")},
            "group": "ep1",
            "gates": ("provider:video",),
            "tier": Tier(1),
            "submitted_tier": Tier(2),
            "state": TaskState.RUNNING,
            "solo": False,
        }
    )
    assert record == built
    assert hash(record) == hash(built)
    assert dataclasses.replace(record, attempt=3).attempt == 3


# Task rows read by position (`tasks_of`) give the records read by name (`task_of`).


def _row(n: int, sqlite: bool) -> dict[str, object]:
    return {
        "id": n,
        "kind": "image",
        "ref": f"shot-{n}",
        "gates": '["openai", "local"]' if sqlite else ["openai", "local"],
        "flow": "ep-1",
        "grp": None if n % 2 else "ep-1",
        "tier": 1,
        "submitted_tier": 2,
        "cost": 0.5,
        "key": None,
        "state": "running",
        "attempt": 2,
        "max_attempts": 5,
        "tag": 1.25 * n,
        "created_at": 100.0,
        "run_at": 101.0,
        "ready_since": 101.0,
        "promoted_at": None,
        "finished_at": None,
        "worker": "w1",
        "lease_until": 130.0,
        "lease_token": 7,
        "remote_id": None,
        "poll_every": None,
        "remote_deadline": None,
        "error_code": None,
        "expiries": 1,
        "attempt_base": 0,
        "solo": n % 3 == 0,
        "remote_jobs": 0,
        "memory": 1 << 20,
        "lost_by": "w0",  # a column no field reads
        "unmet": 0,
    }


def test_any_column_order_reads_the_same_records_as_by_name() -> None:
    for sqlite in (False, True):
        rows = [_row(n, sqlite) for n in range(1, 8)]
        columns = list(rows[0])
        random.Random(7).shuffle(columns)
        tuples = [tuple(row[column] for column in columns) for row in rows]
        assert tasks_of(columns, tuples) == [task_of(row) for row in rows]


def test_every_field_of_a_task_is_read() -> None:
    assert len(TASK_COLUMNS) == len(set(TASK_COLUMNS)) == 31
    row = _row(6, sqlite=False)
    record = tasks_of(list(row), [tuple(row.values())])[0]
    assert record.group == "ep-1" and record.solo is True and record.gates == ("openai", "local")


def test_candidates_are_read_by_position_and_the_edge_row_left_out() -> None:
    columns = ["peeked", "gates", "id", "lane", "tier", "memory", "flow", "solo", "tag", "kind"]
    rows = [
        (3, None, None, None, None, None, None, None, None, None),  # a batch's edge row
        (None, ["openai"], 5, "ep-1/image", 2, 1024, "ep-1", 0, 1.5, "image"),
        (None, '["local"]', 6, "ep-2", 1, 0, "ep-2", 1, 2.0, "speech"),
    ]
    assert candidates_of(columns, rows) == [
        Candidate(5, "image", Tier.LOW, 1.5, "ep-1", "ep-1/image", ("openai",), False, 1024),
        Candidate(6, "speech", Tier.NORMAL, 2.0, "ep-2", "ep-2", ("local",), True, 0),
    ]
