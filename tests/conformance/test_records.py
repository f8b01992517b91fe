"""Records, the audit log and the outbox (the `RecordStore` protocol, `Store.records`), run
against every backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import pytest

from headrace.policy import ConfigError, ManualClock, UnknownRecord
from headrace.store.machine import Transaction
from headrace.store.machine import records as record_steps
from headrace.store.machine import submit as submit_steps
from headrace.store.machine.record_verbs import RecordVerbs
from headrace.store.machine.verbs import Transacts
from headrace.store.protocol.records import Age, Audit, Notice, RecordStore
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import NewTask, Settings

from .conftest import GATES

pytestmark = pytest.mark.anyio

APPROVE = Audit("review.approved", "mod-a")


async def item(
    records: RecordStore, media_id: str, state: str = "reviewable", event: str = "ev1"
) -> None:
    await records.put_record("item", media_id, scope=event, state=state, body={"size": 1})


async def test_a_record_is_created_once_and_the_first_writer_stands(
    records: RecordStore, clock: ManualClock
) -> None:
    clock.advance(5)
    at = clock.now()
    first = await records.put_record(
        "item", "m1", scope="ev1", state="accepted", body={"size": 10}, audit=Audit("upload", "s1")
    )
    again = await records.put_record("item", "m1", scope="ev2", state="other", body={"size": 99})
    assert first.applied and not again.applied
    assert again.record == first.record
    assert first.record.body == {"size": 10} and first.record.created_at == at
    assert await records.get_record("item", "m1") == first.record
    assert await records.get_record("item", "nope") is None
    [row] = await records.audit_log(record_id="m1")
    assert (row.action, row.actor, row.outcome, row.scope) == ("upload", "s1", "applied", "ev1")


async def test_a_change_applies_only_from_the_states_it_names_and_is_audited_either_way(
    records: RecordStore,
) -> None:
    await item(records, "m1")
    notice = Notice("item.approved", {"media_id": "m1"})
    done = await records.change_record(
        "item", "m1", state="approved", when={"reviewable"}, audit=APPROVE, notice=notice
    )
    late = await records.change_record(
        "item",
        "m1",
        state="rejected",
        when={"reviewable"},
        audit=Audit("review.rejected", "mod-b"),
        notice=Notice("item.rejected"),
    )
    assert done.applied and done.record.state == "approved"
    assert not late.applied and late.record.state == "approved"
    outcomes = [(row.actor, row.outcome) for row in await records.audit_log(kind="item")]
    assert outcomes == [("mod-a", "applied"), ("mod-b", "unchanged: approved")]
    [sent] = await records.outbox()
    assert (sent.topic, sent.record_id, sent.scope, sent.body) == (
        "item.approved",
        "m1",
        "ev1",
        {"media_id": "m1"},
    )


async def test_two_moderators_at_once_make_one_change_two_audit_rows_one_notice(
    records: RecordStore,
) -> None:
    await item(records, "m1")

    async def approve(by: str) -> bool:
        changed = await records.change_record(
            "item",
            "m1",
            state="approved",
            when={"reviewable"},
            audit=Audit("review.approved", by),
            notice=Notice("item.approved"),
        )
        return changed.applied

    results = await asyncio.gather(approve("mod-a"), approve("mod-b"))
    assert sorted(results) == [False, True]
    assert len(await records.audit_log(record_id="m1")) == 2
    assert len(await records.outbox(pending=False)) == 1


async def test_a_change_may_ask_how_long_ago_the_record_last_changed(
    records: RecordStore, clock: ManualClock
) -> None:
    """A claim nobody renewed for its TTL may be taken (`at_least`); a decision may be undone
    within its window only (`at_most`); the store's clock decides, and a refusal is audited."""
    await records.put_record("claim", "m1", scope="ev1", state="held:mod-a", body={})
    clock.advance(10)
    early = await records.change_record(
        "claim",
        "m1",
        state="held:mod-b",
        when={"held:mod-a"},
        age=Age(at_least=30),
        audit=Audit("claim.taken", "mod-b"),
    )
    assert not early.applied and early.record.state == "held:mod-a"
    renewed = await records.change_record("claim", "m1", body={"renewed": 1}, when={"held:mod-a"})
    clock.advance(25)  # 35 s after it was made, 25 s after it was renewed
    assert not (
        await records.change_record(
            "claim", "m1", state="held:mod-b", when={"held:mod-a"}, age=Age(at_least=30)
        )
    ).applied
    clock.advance(5)
    taken = await records.change_record(
        "claim", "m1", state="held:mod-b", when={"held:mod-a"}, age=Age(at_least=30)
    )
    assert renewed.applied and taken.applied and taken.record.state == "held:mod-b"
    [refused] = await records.audit_log(record_id="m1")
    assert refused.outcome == "unchanged: held:mod-a, changed 10 s before"

    await item(records, "m2")
    await records.change_record("item", "m2", state="approved", when={"reviewable"})
    clock.advance(31)
    late = await records.change_record(
        "item", "m2", state="reviewable", when={"approved"}, age=Age(at_most=30)
    )
    assert not late.applied and late.record.state == "approved"
    with pytest.raises(ConfigError, match=r"age\.at_most"):
        Age(at_most=-1)


async def test_a_body_change_merges_keys_and_keeps_the_record_in_its_place(
    records: RecordStore,
) -> None:
    await item(records, "m1", state="accepted")
    await item(records, "m2", state="accepted")
    kept = await records.change_record("item", "m1", body={"format": "jpeg"})
    assert kept.record.body == {"size": 1, "format": "jpeg"}
    listed = await records.list_records("item")
    assert [record.id for record in listed] == ["m1", "m2"]
    moved = await records.change_record("item", "m1", state="validated")
    assert moved.record.seq > listed[-1].seq
    assert [record.id for record in await records.list_records("item")] == ["m2", "m1"]


async def test_a_list_past_a_cursor_shows_only_what_changed_after_it(records: RecordStore) -> None:
    for media_id, event in (("a", "ev1"), ("b", "ev2"), ("c", "ev1")):
        await item(records, media_id, event=event)
    page = await records.list_records("item", scope="ev1", state="reviewable")
    assert [record.id for record in page] == ["a", "c"]
    cursor = page[-1].seq
    await item(records, "d", event="ev1")
    await item(records, "e", event="ev2")
    assert await records.count_records("item", scope="ev1", state="reviewable", after=cursor) == 1
    newer = await records.list_records("item", scope="ev1", after=cursor)
    assert [record.id for record in newer] == ["d"]
    assert [r.id for r in await records.list_records("item", limit=2)] == ["a", "b"]
    assert await records.count_records("item") == 5


async def test_a_change_to_a_record_that_is_not_there_is_refused(records: RecordStore) -> None:
    with pytest.raises(UnknownRecord, match="item 'm9': no such record"):
        await records.change_record("item", "m9", state="approved", audit=APPROVE)
    assert await records.audit_log() == []


async def test_bad_names_and_bodies_are_refused_at_the_edge(records: RecordStore) -> None:
    with pytest.raises(ConfigError, match=r"record\.id"):
        await records.put_record("item", "../etc", scope="ev1", state="accepted")
    with pytest.raises(ConfigError, match=r"record\.body"):
        await records.put_record("item", "m1", scope="ev1", state="a", body={"x": float("nan")})
    with pytest.raises(ConfigError, match=r"audit\.actor"):
        await records.put_record("item", "m1", scope="ev1", state="a", audit=Audit("upload", ""))
    with pytest.raises(ConfigError, match="limit"):
        await records.list_records("item", limit=0)
    assert await records.get_record("item", "m1") is None


async def test_denied_attempts_are_audited_without_a_record(records: RecordStore) -> None:
    await records.write_audit(
        "item",
        "m1",
        scope="ev2",
        audit=Audit("read", "mod-a", {"role": "moderator"}),
        outcome="denied",
    )
    [row] = await records.audit_log(scope="ev2")
    assert (row.outcome, row.detail) == ("denied", {"role": "moderator"})


async def test_the_outbox_keeps_a_notice_until_it_is_marked_delivered(
    records: RecordStore, clock: ManualClock
) -> None:
    for media_id in ("m1", "m2"):
        await item(records, media_id)
        await records.change_record(
            "item", media_id, state="approved", notice=Notice("item.approved")
        )
    first, second = await records.outbox()
    clock.advance(3)
    assert await records.mark_delivered([first.id]) == 1
    assert await records.mark_delivered([first.id]) == 0
    assert [row.id for row in await records.outbox()] == [second.id]
    [delivered, _] = await records.outbox(pending=False)
    assert delivered.delivered_at == clock.now()
    assert [row.id for row in await records.outbox(after=first.id, pending=False)] == [second.id]


async def test_records_outlive_the_process(store: Store, reopen: Callable[[], Store]) -> None:
    await item(store.records, "m1")
    await store.records.change_record("item", "m1", state="approved", audit=APPROVE)
    await store.close()
    again = reopen()
    await again.open(Settings(gates=GATES))
    try:
        found = await again.records.get_record("item", "m1")
        assert found is not None and found.state == "approved"
        assert len(await again.records.audit_log()) == 1
        await item(again.records, "m2")  # numbering goes on past what the first process wrote
        m2 = await again.records.get_record("item", "m2")
        assert m2 is not None and m2.seq > found.seq
    finally:
        await again.close()


class Undone(Exception):
    """Raised by a step to see its transaction rolled back."""


async def test_a_step_that_touches_tasks_and_records_commits_once(store: Store) -> None:
    """Records share their store's database and transactions: one step that submits a task and
    writes a record (a decision and the task it creates) commits both, or neither."""
    if not isinstance(store.records, RecordVerbs):
        pytest.skip("this store runs no machine steps")
    runner = cast(Transacts, store)

    async def both(tx: Transaction, fail: bool) -> None:
        await submit_steps.submit(tx, [NewTask(kind="work", ref="m1")], {})
        await record_steps.put_record(tx, "item", "m1", "ev1", "accepted", "{}", None)
        if fail:
            raise Undone

    with pytest.raises(Undone):
        await runner._write(lambda tx: both(tx, True), clock_first=False)
    assert await store.tasks() == [] and await store.records.get_record("item", "m1") is None
    await runner._write(lambda tx: both(tx, False), clock_first=False)
    [task] = await store.tasks()
    made = await store.records.get_record("item", "m1")
    assert task.ref == "m1" and made is not None and made.state == "accepted"
