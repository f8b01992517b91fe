"""The memory store's records, audit rows and outbox (`store/protocol/records.py`), with the
semantics of the SQL stores' (`store/machine/records.py`): the conformance suite holds them to
one."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from headrace.policy.clock import Clock
from headrace.policy.errors import UnknownRecord
from headrace.store.machine.plans import AuditPlan, Mark, NoticePlan, RecordPlan
from headrace.store.protocol.records import (
    Age,
    Audit,
    AuditRow,
    Changed,
    Notice,
    OutboxRow,
    Record,
    check_audit,
    check_name,
    check_notice,
    check_page,
    check_record,
    decide,
    dump,
    load,
)


class MemoryRecords:
    """Mixed into `MemoryStore`, whose clock it reads."""

    clock: Clock

    def __init__(self) -> None:
        self._records: dict[tuple[str, str], Record] = {}
        self._record_seq = itertools.count(1)
        self._audit: list[AuditRow] = []
        self._audit_ids = itertools.count(1)
        self._outbox: list[OutboxRow] = []
        self._outbox_ids = itertools.count(1)

    async def put_record(
        self,
        kind: str,
        record_id: str,
        *,
        scope: str,
        state: str,
        body: Mapping[str, Any] | None = None,
        audit: Audit | None = None,
    ) -> Changed:
        check_record(kind, record_id, scope, state)
        check_audit(audit)
        copy = load(dump(body or {}))
        found = self._records.get((kind, record_id))
        if found is not None:
            return Changed(found, False)
        now = self.clock.now()
        record = Record(kind, record_id, scope, state, copy, next(self._record_seq), now, now)
        self._records[kind, record_id] = record
        if audit is not None:
            self._write_audit(record, audit, "applied", now)
        return Changed(record, True)

    async def change_record(
        self,
        kind: str,
        record_id: str,
        *,
        state: str | None = None,
        body: Mapping[str, Any] | None = None,
        when: Collection[str] | None = None,
        age: Age | None = None,
        audit: Audit | None = None,
        notice: Notice | None = None,
    ) -> Changed:
        check_record(kind, record_id, None, state)
        check_audit(audit)
        check_notice(notice)
        changes = None if body is None else load(dump(body))
        record = self._records.get((kind, record_id))
        if record is None:
            raise UnknownRecord(kind, record_id)
        now = self.clock.now()
        states = None if when is None else frozenset(when)
        decision = decide(record, state, changes, states, age, now)
        if decision.applied:
            seq = next(self._record_seq) if decision.moved else record.seq
            record = replace(
                record, state=decision.state, body=decision.body, seq=seq, changed_at=now
            )
            self._records[kind, record_id] = record
        if audit is not None:
            self._write_audit(record, audit, decision.outcome, now)
        if notice is not None and decision.applied:
            body_copy = load(dump(notice.body))
            self._outbox.append(
                OutboxRow(
                    next(self._outbox_ids),
                    now,
                    notice.topic,
                    kind,
                    record_id,
                    record.scope,
                    body_copy,
                    None,
                )
            )
        return Changed(record, decision.applied)

    def _write_audit(self, record: Record, audit: Audit, outcome: str, now: float) -> None:
        self._audit.append(
            AuditRow(
                next(self._audit_ids),
                now,
                record.kind,
                record.id,
                record.scope,
                audit.action,
                audit.actor,
                outcome,
                load(dump(audit.detail)),
            )
        )

    async def write_audit(
        self, kind: str, record_id: str, *, scope: str, audit: Audit, outcome: str
    ) -> None:
        check_record(kind, record_id, scope, None)
        check_audit(audit)
        now = self.clock.now()
        self._write_audit(Record(kind, record_id, scope, "", {}, 0, now, now), audit, outcome, now)

    async def get_record(self, kind: str, record_id: str) -> Record | None:
        check_record(kind, record_id, None, None)
        return self._records.get((kind, record_id))

    def _matching(
        self, kind: str, scope: str | None, state: str | None, after: int
    ) -> list[Record]:
        found = [
            record
            for record in self._records.values()
            if record.kind == kind
            and (scope is None or record.scope == scope)
            and (state is None or record.state == state)
            and record.seq > after
        ]
        return sorted(found, key=lambda record: record.seq)

    async def list_records(
        self,
        kind: str,
        *,
        scope: str | None = None,
        state: str | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> list[Record]:
        check_page(after, limit)
        return self._matching(kind, scope, state, after)[:limit]

    async def count_records(
        self,
        kind: str,
        *,
        scope: str | None = None,
        state: str | None = None,
        after: int = 0,
    ) -> int:
        check_page(after, 1)
        return len(self._matching(kind, scope, state, after))

    async def audit_log(
        self,
        *,
        kind: str | None = None,
        record_id: str | None = None,
        scope: str | None = None,
        limit: int = 1000,
    ) -> list[AuditRow]:
        check_page(0, limit)
        found = [
            row
            for row in self._audit
            if (kind is None or row.kind == kind)
            and (record_id is None or row.record_id == record_id)
            and (scope is None or row.scope == scope)
        ]
        return found[:limit]

    async def outbox(
        self, *, after: int = 0, pending: bool = True, limit: int = 100
    ) -> list[OutboxRow]:
        check_page(after, limit)
        found = [
            row
            for row in self._outbox
            if row.id > after and (not pending or row.delivered_at is None)
        ]
        return found[:limit]

    async def mark_delivered(self, ids: Collection[int]) -> int:
        now, marked = self.clock.now(), 0
        for index, row in enumerate(self._outbox):
            if row.id in ids and row.delivered_at is None:
                self._outbox[index] = replace(row, delivered_at=now)
                marked += 1
        return marked

    # -- retention (store/protocol/pruning.py), as the SQL stores' named statements say it

    def _prune_rows(
        self, plan: NoticePlan | AuditPlan, now: float, after: Mark, limit: int
    ) -> list[Mark]:
        """The notices or audit rows `plan` would take next, after `after`, oldest first;
        never the newest row."""
        cutoff = now - plan.age
        if isinstance(plan, NoticePlan):
            rows = [
                (row.delivered_at, row.id) for row in self._outbox if row.delivered_at is not None
            ]
            newest = max((row.id for row in self._outbox), default=0)
        else:
            rows = [(row.at, row.id) for row in self._audit]
            newest = max((row.id for row in self._audit), default=0)
        found = sorted(
            (at, number)
            for at, number in rows
            if at < cutoff and (at, number) > (after.at, after.number) and number < newest
        )
        return [Mark(at, number) for at, number in found[:limit]]

    def _delete_rows(self, plan: NoticePlan | AuditPlan, numbers: Collection[int]) -> int:
        if isinstance(plan, NoticePlan):
            kept = [
                row for row in self._outbox if row.id not in numbers or row.delivered_at is None
            ]
            gone, self._outbox = len(self._outbox) - len(kept), kept
        else:
            audit = [row for row in self._audit if row.id not in numbers]
            gone, self._audit = len(self._audit) - len(audit), audit
        return gone

    def _prunable_records(
        self, plan: RecordPlan, now: float, after: Mark, limit: int
    ) -> list[Record]:
        """Records of the plan's kind last changed before its cutoff, after a seq, in seq
        order; never the newest record."""
        newest = max((record.seq for record in self._records.values()), default=0)
        found = sorted(
            (
                record
                for record in self._records.values()
                if record.kind == plan.kind
                and record.changed_at < now - plan.age
                and after.number < record.seq < newest
            ),
            key=lambda record: record.seq,
        )
        return found[:limit]

    async def delete_records(
        self, kind: str, ids: Collection[str], *, when: Collection[str] | None = None
    ) -> int:
        check_name(kind, "record.kind")
        newest = max((record.seq for record in self._records.values()), default=0)
        gone = 0
        for record_id in set(ids):
            record = self._records.get((kind, record_id))
            if record is None or record.seq >= newest:
                continue
            if when is None or record.state in when:
                del self._records[kind, record_id]
                gone += 1
        return gone
