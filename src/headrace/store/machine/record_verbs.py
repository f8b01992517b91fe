"""The `RecordStore` of the SQL stores (`store/protocol/records.py`): each verb one transaction
of the state machine (`store/machine/records.py`), run by the task store it sits beside, on the
same database and connections."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from headrace.store.machine import records as record_steps
from headrace.store.machine.verbs import Transacts
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
    dump,
    load,
)


class RecordVerbs:
    """The `RecordStore` of a store that `Transacts`: each verb one transaction of the store's
    own, its arguments checked at the edge."""

    def __init__(self, runner: Transacts) -> None:
        self._runner = runner

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
        text = dump(body or {})
        return await self._runner._write(
            lambda tx: record_steps.put_record(tx, kind, record_id, scope, state, text, audit)
        )

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
        states = None if when is None else frozenset(when)
        return await self._runner._write(
            lambda tx: record_steps.change_record(
                tx, kind, record_id, state, changes, states, age, audit, notice
            )
        )

    async def write_audit(
        self, kind: str, record_id: str, *, scope: str, audit: Audit, outcome: str
    ) -> None:
        check_record(kind, record_id, scope, None)
        check_audit(audit)
        await self._runner._write(
            lambda tx: record_steps.write_audit(tx, kind, record_id, scope, audit, outcome)
        )

    async def get_record(self, kind: str, record_id: str) -> Record | None:
        check_record(kind, record_id, None, None)
        return await self._runner._read(lambda tx: record_steps.get_record(tx, kind, record_id))

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
        return await self._runner._read(
            lambda tx: record_steps.list_records(tx, kind, scope, state, after, limit)
        )

    async def count_records(
        self,
        kind: str,
        *,
        scope: str | None = None,
        state: str | None = None,
        after: int = 0,
    ) -> int:
        check_page(after, 1)
        return await self._runner._read(
            lambda tx: record_steps.count_records(tx, kind, scope, state, after)
        )

    async def audit_log(
        self,
        *,
        kind: str | None = None,
        record_id: str | None = None,
        scope: str | None = None,
        limit: int = 1000,
    ) -> list[AuditRow]:
        check_page(0, limit)
        return await self._runner._read(
            lambda tx: record_steps.audit_log(tx, kind, record_id, scope, limit)
        )

    async def outbox(
        self, *, after: int = 0, pending: bool = True, limit: int = 100
    ) -> list[OutboxRow]:
        check_page(after, limit)
        return await self._runner._read(lambda tx: record_steps.outbox(tx, after, pending, limit))

    async def mark_delivered(self, ids: Collection[int]) -> int:
        wanted = sorted(ids)
        return await self._runner._write(lambda tx: record_steps.mark_delivered(tx, wanted))

    async def delete_records(
        self, kind: str, ids: Collection[str], *, when: Collection[str] | None = None
    ) -> int:
        check_name(kind, "record.kind")
        wanted, states = sorted(ids), None if when is None else frozenset(when)
        return await self._runner._write(
            lambda tx: record_steps.delete_records(tx, kind, wanted, states)
        )
