"""Rows read into records: every field filled, equal to a record built field by field."""

from __future__ import annotations

import dataclasses
from typing import Any

from headrace.policy.tiers import Tier
from headrace.store.rows import task_of
from headrace.store.types import TaskRecord, TaskState


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
