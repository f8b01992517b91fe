"""Records, their audit rows and the outbox (`store/protocol/records.py`) as transaction steps: a
change locks its record, decides (`records.decide`), and writes the record, the audit row and the
notice it owes together; the records a pipeline deletes, and those a pruner's batch does."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from headrace.policy.errors import UnknownRecord
from headrace.store.machine.core import Transaction
from headrace.store.machine.rows import Row
from headrace.store.protocol.records import (
    Age,
    Audit,
    AuditRow,
    Changed,
    Notice,
    OutboxRow,
    Record,
    decide,
    dump,
    load,
)


def to_number(tx: Transaction, record: Record) -> Record:
    tx.numbered.setdefault((record.kind, record.id), []).append(record)
    return record


async def put_record(
    tx: Transaction,
    kind: str,
    record_id: str,
    scope: str,
    state: str,
    body: str,
    audit: Audit | None,
) -> Changed:
    made = await tx.row(
        "insert_record", kind=kind, id=record_id, scope=scope, state=state, body=body
    )
    if made is None:  # it exists: the first writer's record stands
        return Changed(record_of(await tx.one("record_by_id", kind=kind, id=record_id)), False)
    record = to_number(tx, record_of(made))
    if audit is not None:
        await audit_row(tx, record, audit, "applied")
    return Changed(record, True)


async def change_record(
    tx: Transaction,
    kind: str,
    record_id: str,
    state: str | None,
    body: Mapping[str, Any] | None,
    when: Collection[str] | None,
    age: Age | None,
    audit: Audit | None,
    notice: Notice | None,
) -> Changed:
    found = await tx.row("lock_record", kind=kind, id=record_id)
    if found is None:
        raise UnknownRecord(kind, record_id)
    record = record_of(found)
    decision = decide(record, state, body, when, age, tx.now)
    if decision.applied:
        query = "move_record" if decision.moved else "rewrite_record"
        record = record_of(
            await tx.one(
                query, kind=kind, id=record_id, state=decision.state, body=dump(decision.body)
            )
        )
        if decision.moved or (record.kind, record.id) in tx.numbered:
            to_number(tx, record)
    if audit is not None:
        await audit_row(tx, record, audit, decision.outcome)
    if notice is not None and decision.applied:
        await tx.run(
            "insert_notice",
            topic=notice.topic,
            kind=kind,
            record_id=record_id,
            scope=record.scope,
            body=dump(notice.body),
        )
    return Changed(record, decision.applied)


async def audit_row(tx: Transaction, record: Record, audit: Audit, outcome: str) -> None:
    await write_audit(tx, record.kind, record.id, record.scope, audit, outcome)


async def write_audit(
    tx: Transaction, kind: str, record_id: str, scope: str, audit: Audit, outcome: str
) -> None:
    await tx.run(
        "insert_audit",
        kind=kind,
        record_id=record_id,
        scope=scope,
        action=audit.action,
        actor=audit.actor,
        outcome=outcome,
        detail=dump(audit.detail),
    )


async def get_record(tx: Transaction, kind: str, record_id: str) -> Record | None:
    found = await tx.row("record_by_id", kind=kind, id=record_id)
    return None if found is None else record_of(found)


async def list_records(
    tx: Transaction, kind: str, scope: str | None, state: str | None, after: int, limit: int
) -> list[Record]:
    found = await tx.rows(
        "list_records", kind=kind, scope=scope, state=state, after=after, limit=limit
    )
    return [record_of(row) for row in found]


async def count_records(
    tx: Transaction, kind: str, scope: str | None, state: str | None, after: int
) -> int:
    found = await tx.one("count_records", kind=kind, scope=scope, state=state, after=after)
    return int(found["n"])


async def audit_log(
    tx: Transaction, kind: str | None, record_id: str | None, scope: str | None, limit: int
) -> list[AuditRow]:
    found = await tx.rows("audit_rows", kind=kind, record_id=record_id, scope=scope, limit=limit)
    return [audit_of(row) for row in found]


async def outbox(tx: Transaction, after: int, pending: bool, limit: int) -> list[OutboxRow]:
    found = await tx.rows("outbox_rows", after=after, pending=pending, limit=limit)
    return [notice_of(row) for row in found]


async def mark_delivered(tx: Transaction, ids: Sequence[int]) -> int:
    found = await tx.rows("mark_delivered", ids=list(ids))
    return len(found)


async def delete_records(
    tx: Transaction, kind: str, ids: Sequence[str], states: Collection[str] | None
) -> int:
    """Delete records of `kind` among `ids` (those in `states`, when given); how many."""
    if not ids:
        return 0
    wanted = None if states is None else sorted(states)
    return len(await tx.rows("delete_records", kind=kind, ids=list(ids), states=wanted))


def record_of(row: Row) -> Record:
    return Record(
        kind=row["kind"],
        id=row["id"],
        scope=row["scope"],
        state=row["state"],
        body=load(row["body"]),
        seq=int(row["seq"]),
        created_at=float(row["created_at"]),
        changed_at=float(row["changed_at"]),
    )


def audit_of(row: Row) -> AuditRow:
    return AuditRow(
        id=int(row["id"]),
        at=float(row["at"]),
        kind=row["kind"],
        record_id=row["record_id"],
        scope=row["scope"],
        action=row["action"],
        actor=row["actor"],
        outcome=row["outcome"],
        detail=load(row["detail"]),
    )


def notice_of(row: Row) -> OutboxRow:
    delivered = row["delivered_at"]
    return OutboxRow(
        id=int(row["id"]),
        at=float(row["at"]),
        topic=row["topic"],
        kind=row["kind"],
        record_id=row["record_id"],
        scope=row["scope"],
        body=load(row["body"]),
        delivered_at=None if delivered is None else float(delivered),
    )
