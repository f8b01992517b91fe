"""Records, their audit rows and the outbox (`store/protocol/records.py`) as transaction steps: a
change
locks its record, decides (`records.decide`), and writes the record, the audit row and the
notice it owes together."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from headrace.policy.errors import UnknownRecord
from headrace.store.machine.core import Steps
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

# Held from numbering a transaction's records to its commit, so that seqs commit in the order
# they are taken: a reader that sees a record's seq has seen every smaller one that will ever be
# (a list past a cursor never gains an item before it). Taken as the transaction's last step
# (`number_records`), after every other lock, so a writer holds it for its commit alone, never
# while it waits on its client (a cut link, a stalled process would hold up every writer of
# records). SQLite's single writer gives the order without a lock.
SEQ_LOCK = "headrace.records.seq"


class RecordSteps(Steps):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Records this transaction made or moved, by key: numbered again at its end.
        self._numbered: dict[tuple[str, str], list[Record]] = {}

    async def conclude(self) -> None:
        await super().conclude()
        await self.number_records()

    async def number_records(self) -> None:
        """Give the records made or moved their seqs under SEQ_LOCK, as the transaction ends
        (the seqs they were written with hold their place until then), and set them on the
        records this transaction returns."""
        if not self._numbered:
            return
        await self.run("advisory_lock", lock=SEQ_LOCK)
        keys = sorted(self._numbered)
        found = await self.rows(
            "number_records", kinds=[kind for kind, _ in keys], ids=[i for _, i in keys]
        )
        for row in found:
            for record in self._numbered[(row["kind"], row["id"])]:
                object.__setattr__(record, "seq", int(row["seq"]))  # not yet handed out

    def _to_number(self, record: Record) -> Record:
        self._numbered.setdefault((record.kind, record.id), []).append(record)
        return record

    async def put_record(
        self, kind: str, record_id: str, scope: str, state: str, body: str, audit: Audit | None
    ) -> Changed:
        made = await self.row(
            "insert_record", kind=kind, id=record_id, scope=scope, state=state, body=body
        )
        if made is None:  # it exists: the first writer's record stands
            return Changed(
                record_of(await self.one("record_by_id", kind=kind, id=record_id)), False
            )
        record = self._to_number(record_of(made))
        if audit is not None:
            await self.audit_row(record, audit, "applied")
        return Changed(record, True)

    async def change_record(
        self,
        kind: str,
        record_id: str,
        state: str | None,
        body: Mapping[str, Any] | None,
        when: Collection[str] | None,
        age: Age | None,
        audit: Audit | None,
        notice: Notice | None,
    ) -> Changed:
        found = await self.row("lock_record", kind=kind, id=record_id)
        if found is None:
            raise UnknownRecord(kind, record_id)
        record = record_of(found)
        decision = decide(record, state, body, when, age, self.now)
        if decision.applied:
            query = "move_record" if decision.moved else "rewrite_record"
            record = record_of(
                await self.one(
                    query, kind=kind, id=record_id, state=decision.state, body=dump(decision.body)
                )
            )
            if decision.moved or (record.kind, record.id) in self._numbered:
                self._to_number(record)
        if audit is not None:
            await self.audit_row(record, audit, decision.outcome)
        if notice is not None and decision.applied:
            await self.run(
                "insert_notice",
                topic=notice.topic,
                kind=kind,
                record_id=record_id,
                scope=record.scope,
                body=dump(notice.body),
            )
        return Changed(record, decision.applied)

    async def audit_row(self, record: Record, audit: Audit, outcome: str) -> None:
        await self.write_audit(record.kind, record.id, record.scope, audit, outcome)

    async def write_audit(
        self, kind: str, record_id: str, scope: str, audit: Audit, outcome: str
    ) -> None:
        await self.run(
            "insert_audit",
            kind=kind,
            record_id=record_id,
            scope=scope,
            action=audit.action,
            actor=audit.actor,
            outcome=outcome,
            detail=dump(audit.detail),
        )

    async def get_record(self, kind: str, record_id: str) -> Record | None:
        found = await self.row("record_by_id", kind=kind, id=record_id)
        return None if found is None else record_of(found)

    async def list_records(
        self, kind: str, scope: str | None, state: str | None, after: int, limit: int
    ) -> list[Record]:
        found = await self.rows(
            "list_records", kind=kind, scope=scope, state=state, after=after, limit=limit
        )
        return [record_of(row) for row in found]

    async def count_records(
        self, kind: str, scope: str | None, state: str | None, after: int
    ) -> int:
        found = await self.one("count_records", kind=kind, scope=scope, state=state, after=after)
        return int(found["n"])

    async def audit_log(
        self, kind: str | None, record_id: str | None, scope: str | None, limit: int
    ) -> list[AuditRow]:
        found = await self.rows(
            "audit_rows", kind=kind, record_id=record_id, scope=scope, limit=limit
        )
        return [audit_of(row) for row in found]

    async def outbox(self, after: int, pending: bool, limit: int) -> list[OutboxRow]:
        found = await self.rows("outbox_rows", after=after, pending=pending, limit=limit)
        return [notice_of(row) for row in found]

    async def mark_delivered(self, ids: Sequence[int]) -> int:
        found = await self.rows("mark_delivered", ids=list(ids))
        return len(found)


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
