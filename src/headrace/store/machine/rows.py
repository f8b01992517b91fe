"""Rows read from a SQL store into headrace's types, and gate states into parameters: one
mapping for SQLite and PostgreSQL. The two keep lists differently (an array, or a JSON array in
a text column), and each mapper reads either form."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from headrace.policy.errors import ErrorClass
from headrace.policy.gate import GateState
from headrace.policy.tiers import Tier
from headrace.store.protocol.ages import age
from headrace.store.protocol.types import Attempt, AttemptOutcome, StageStats, TaskRecord, TaskState

_new_record = object.__new__

# Enum members by value: a dict lookup, not an Enum call per column of every row read.
_STATES = {state.value: state for state in TaskState}
_TIERS = {tier.value: tier for tier in Tier}
_OUTCOMES = {outcome.value: outcome for outcome in AttemptOutcome}


class Row(Protocol):
    """A result row, read by column name (a dict, or a `sqlite3.Row`)."""

    def __getitem__(self, key: str, /) -> Any: ...


def task_of(row: Row) -> TaskRecord:
    """A task's row as its record. Built the way a frozen dataclass's `__init__` would (which
    sets each of the 31 fields through `object.__setattr__`), filled in at once: a worker reads
    two rows a task (its lease, its outcome's lock), and this is a third of the time."""
    record = _new_record(TaskRecord)
    record.__dict__.update(
        id=row["id"],
        kind=row["kind"],
        ref=row["ref"],
        gates=_gates(row["gates"]),
        flow=row["flow"],
        group=row["grp"],
        tier=_TIERS[row["tier"]],
        submitted_tier=_TIERS[row["submitted_tier"]],
        cost=row["cost"],
        key=row["key"],
        state=_STATES[row["state"]],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        tag=row["tag"],
        created_at=row["created_at"],
        run_at=row["run_at"],
        ready_since=row["ready_since"],
        promoted_at=row["promoted_at"],
        finished_at=row["finished_at"],
        worker=row["worker"],
        lease_until=row["lease_until"],
        lease_token=row["lease_token"],
        remote_id=row["remote_id"],
        poll_every=row["poll_every"],
        remote_deadline=row["remote_deadline"],
        error_code=row["error_code"],
        expiries=row["expiries"],
        attempt_base=row["attempt_base"],
        solo=bool(row["solo"]),
        remote_jobs=row["remote_jobs"],
        memory=row["memory"],
    )
    return record


def positions(columns: Sequence[str], names: Iterable[str]) -> list[int]:
    """Where each of `names` is among a result's `columns`, to read its rows by position."""
    at = {name: i for i, name in enumerate(columns)}
    return [at[name] for name in names]


# The columns a task's record is read from, in the order `tasks_of` takes them.
TASK_COLUMNS = (
    "id", "kind", "ref", "gates", "flow", "grp", "tier", "submitted_tier", "cost", "key",
    "state", "attempt", "max_attempts", "tag", "created_at", "run_at", "ready_since",
    "promoted_at", "finished_at", "worker", "lease_until", "lease_token", "remote_id",
    "poll_every", "remote_deadline", "error_code", "expiries", "attempt_base", "solo",
    "remote_jobs", "memory",
)  # fmt: skip


def tasks_of(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[TaskRecord]:
    """Rows of the tasks table, as tuples with these `columns` (in any order, others left
    out), as records, each value taken by its position: `task_of` looks each column up by
    name, in a dict made for the row first. The lease and the outcome batch read every task
    they hold this way (2.2 us a row, against 3.5 for a dict and `task_of`)."""
    (
        id_, kind, ref, gates, flow, grp, tier, submitted_tier, cost, key, state, attempt,
        max_attempts, tag, created_at, run_at, ready_since, promoted_at, finished_at, worker,
        lease_until, lease_token, remote_id, poll_every, remote_deadline, error_code,
        expiries, attempt_base, solo, remote_jobs, memory,
    ) = positions(columns, TASK_COLUMNS)  # fmt: skip
    records = []
    for row in rows:
        record = _new_record(TaskRecord)
        record.__dict__.update(
            {
                "id": row[id_],
                "kind": row[kind],
                "ref": row[ref],
                "gates": _gates(row[gates]),
                "flow": row[flow],
                "group": row[grp],
                "tier": _TIERS[row[tier]],
                "submitted_tier": _TIERS[row[submitted_tier]],
                "cost": row[cost],
                "key": row[key],
                "state": _STATES[row[state]],
                "attempt": row[attempt],
                "max_attempts": row[max_attempts],
                "tag": row[tag],
                "created_at": row[created_at],
                "run_at": row[run_at],
                "ready_since": row[ready_since],
                "promoted_at": row[promoted_at],
                "finished_at": row[finished_at],
                "worker": row[worker],
                "lease_until": row[lease_until],
                "lease_token": row[lease_token],
                "remote_id": row[remote_id],
                "poll_every": row[poll_every],
                "remote_deadline": row[remote_deadline],
                "error_code": row[error_code],
                "expiries": row[expiries],
                "attempt_base": row[attempt_base],
                "solo": bool(row[solo]),
                "remote_jobs": row[remote_jobs],
                "memory": row[memory],
            }
        )
        records.append(record)
    return records


@dataclass(frozen=True, slots=True)
class Candidate:
    """A ready task as a claim weighs it: only what order, turns and gates need (the leased
    task's whole record comes back with its lease)."""

    id: int
    kind: str
    tier: Tier
    tag: float
    flow: str
    lane: str  # its fair-queueing lane: its flow, or its flow at this stage (`fairness.lane`)
    gates: tuple[str, ...]
    solo: bool
    memory: int  # bytes charged against the claiming worker's memory budget


def candidates_of(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[Candidate]:
    """Rows as tuples with these `columns` as candidates, read by position as `tasks_of` reads
    tasks; rows without an id (a claim batch's edge row) are left out."""
    id_, kind, tier, tag, flow, lane, gates, solo, memory = positions(
        columns, ("id", "kind", "tier", "tag", "flow", "lane", "gates", "solo", "memory")
    )
    return [
        Candidate(
            row[id_],
            row[kind],
            _TIERS[row[tier]],
            row[tag],
            row[flow],
            row[lane],
            _gates(row[gates]),
            bool(row[solo]),
            row[memory],
        )
        for row in rows
        if row[id_] is not None
    ]


def attempt_of(row: Row) -> Attempt:
    error_class = row["error_class"]
    return Attempt(
        task_id=row["task_id"],
        number=row["number"],
        worker=row["worker"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        outcome=_OUTCOMES[row["outcome"]],
        error_class=ErrorClass(error_class) if error_class is not None else None,
        code=row["code"],
        message=row["message"],
    )


def gate_state_of(row: Row) -> GateState:
    penalized_until = row["penalized_until"]
    return GateState(
        in_flight=row["in_flight"],
        starts=tuple(float(start) for start in _listed(row["starts"])),
        penalized_until=-math.inf if penalized_until is None else penalized_until,
        granted=row["granted"],
        blocked_by_token=row["blocked_by_token"],
        blocked_by_concurrency=row["blocked_by_concurrency"],
        rate_limited=row["rate_limited"],
        peak_in_flight=row["peak_in_flight"],
        first_blocked_at=row["first_blocked_at"],
        unstarted=row["unstarted"],
    )


def gate_params(name: str, state: GateState) -> dict[str, object]:
    """A gate's state as `save_gate` takes it (`starts` a list: a driver passes lists as its
    database keeps them)."""
    penalized = state.penalized_until
    return {
        "name": name,
        "in_flight": state.in_flight,
        "starts": list(state.starts),
        "penalized_until": None if penalized == -math.inf else penalized,
        "granted": state.granted,
        "blocked_by_token": state.blocked_by_token,
        "blocked_by_concurrency": state.blocked_by_concurrency,
        "rate_limited": state.rate_limited,
        "peak_in_flight": state.peak_in_flight,
        "first_blocked_at": state.first_blocked_at,
        "unstarted": state.unstarted,
    }


def counts_by_state(rows: Iterable[Row]) -> dict[TaskState, int]:
    counts = dict.fromkeys(TaskState, 0)
    for found in rows:
        counts[_STATES[found["state"]]] = int(found["n"])
    return counts


def stage_of(row: Row, now: float) -> StageStats:
    oldest = row["oldest_ready"]
    return StageStats(
        row["kind"],
        pending=int(row["pending"]),
        ready=int(row["ready"]),
        running=int(row["running"]),
        waiting=int(row["waiting"]),
        oldest_ready_age=None if oldest is None else age(now, float(oldest)),
    )


def _gates(value: Any) -> tuple[str, ...]:
    """A task's gates: an array (PostgreSQL), or a JSON array in a text column (SQLite)."""
    return _gates_in(value) if isinstance(value, str) else tuple(value)


@functools.lru_cache(maxsize=4096)
def _gates_in(text: str) -> tuple[str, ...]:
    """The gates in a JSON array, parsed once for each distinct list: every row of a stage
    holds the same few, and `json.loads` took 7% of the SQLite store thread reading them."""
    return tuple(json.loads(text))


def _listed(value: Any) -> list[Any]:
    """A list column: an array (PostgreSQL), or a JSON array in a text column (SQLite)."""
    return json.loads(value) if isinstance(value, str) else list(value)


def holds(task: TaskRecord, token: int, now: float) -> bool:
    """Whether a lease with `token` still holds `task` at `now`."""
    return (
        task.state in (TaskState.RUNNING, TaskState.WAITING)
        and task.lease_token == token
        and task.lease_until is not None
        and task.lease_until > now
    )
