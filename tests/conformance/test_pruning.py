"""Retention (store/machine/plans.py), run against every backend: what goes, what never does, in
batches, the group rollup, and one pruner at a time across store instances."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from headrace.policy import ErrorClass, ManualClock
from headrace.policy.retention import DAY, Retention
from headrace.store.protocol.pruning import (
    ATTEMPTS,
    CANCELLED_TASKS,
    DEAD_TASKS,
    DELIVERIES,
    NOTICES,
    SIGN_INS,
    SUCCEEDED_TASKS,
    UPSTREAM_PRUNED,
)
from headrace.store.protocol.records import Audit, Notice
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import (
    AttemptError,
    AwaitRemote,
    Dead,
    NewTask,
    Settings,
    Succeeded,
    TaskState,
)

from .conftest import GATES

pytestmark = pytest.mark.anyio

LEASE = 30.0
KEEP_ALL = Retention(
    succeeded=None,
    cancelled=None,
    dead=None,
    delivered=None,
    audit=None,
    deliveries=None,
    sign_ins=None,
    turned_away=None,
    closed_events=None,
)


def task(ref: str, **fields: object) -> NewTask:
    """A task of a kind of its own, so a claim of that kind takes it and nothing else."""
    return NewTask(kind=str(fields.pop("kind", ref)), ref=ref, **fields)  # type: ignore[arg-type]


async def submit(store: Store, ref: str, **fields: object) -> int:
    [made] = await store.submit([task(ref, **fields)])
    return made.id


async def run(store: Store, ref: str) -> None:
    """Claim the task `ref` and make it succeed."""
    await finish(store, ref, Succeeded())


async def finish(store: Store, ref: str, outcome: Succeeded | Dead | AwaitRemote) -> None:
    [lease] = (await store.claim("w1", 1, lease_for=LEASE, kinds=[ref])).leases
    await store.finish(lease, outcome)


def dies() -> Dead:
    return Dead(AttemptError.of(ErrorClass.FATAL, "boom"))


async def states(store: Store) -> dict[str, TaskState]:
    return {t.ref: t.state for t in await store.tasks(limit=10_000)}


# -- what goes and what never does


async def test_final_tasks_go_after_their_age_and_unfinished_ones_never(
    store: Store, clock: ManualClock
) -> None:
    for ref in ("done", "failed", "stopped", "queued", "held", "remote"):
        await submit(store, ref)
    await run(store, "done")
    await finish(store, "failed", dies())
    await store.cancel(await _id(store, "stopped"))
    await finish(store, "remote", AwaitRemote("job-1", poll_every=3600.0))
    [held] = (await store.claim("w1", 1, lease_for=100 * DAY, kinds=["held"])).leases
    later = await submit(store, "later", after=(held.task_id,))  # waits on a running task
    await submit(store, "newest")
    clock.advance(2 * DAY)

    pruned = await store.prune(Retention())

    left = await states(store)
    assert "done" not in left and "stopped" not in left
    assert left == {
        "failed": TaskState.DEAD,  # dead letters stay 30 days
        "queued": TaskState.READY,
        "held": TaskState.RUNNING,
        "remote": TaskState.WAITING,
        "later": TaskState.PENDING,
        "newest": TaskState.READY,
    }
    assert (await store.get(later)).state is TaskState.PENDING
    assert pruned.removed[SUCCEEDED_TASKS] == 1
    assert pruned.removed[CANCELLED_TASKS] == 1
    assert pruned.removed[DEAD_TASKS] == 0
    assert pruned.removed[ATTEMPTS] == 1  # the succeeded task's one attempt

    clock.advance(30 * DAY)
    again = await store.prune(Retention())
    assert again.removed[DEAD_TASKS] == 1
    assert "failed" not in await states(store)


async def _id(store: Store, ref: str) -> int:
    [found] = [t.id for t in await store.tasks(limit=10_000) if t.ref == ref]
    return found


async def test_a_dry_run_counts_what_a_run_removes_and_changes_nothing(
    store: Store, clock: ManualClock
) -> None:
    for ref in ("a", "b", "c"):
        await submit(store, ref, group="ep1")
        await run(store, ref)
    await submit(store, "newest")
    clock.advance(2 * DAY)
    before = await store.tasks()

    would = await store.prune(Retention(), dry_run=True)

    assert await store.tasks() == before
    assert await store.attempts(before[0].id) != []
    done = await store.prune(Retention())
    assert would.removed == done.removed
    assert done.removed[SUCCEEDED_TASKS] == 3 and done.removed[ATTEMPTS] == 3


async def test_a_run_removes_in_batches_of_its_size(store: Store, clock: ManualClock) -> None:
    for n in range(5):
        await submit(store, f"t{n}")
        await run(store, f"t{n}")
    await submit(store, "newest")
    clock.advance(2 * DAY)

    pruned = await store.prune(Retention(batch=2))

    assert pruned.removed[SUCCEEDED_TASKS] == 5
    assert pruned.batches == 3  # 2 + 2 + 1, with their attempts
    assert list(await states(store)) == ["newest"]


async def test_the_newest_task_stays_and_ids_are_never_used_twice(
    store: Store, clock: ManualClock
) -> None:
    first = await submit(store, "a")
    await run(store, "a")
    last = await submit(store, "b")
    await run(store, "b")
    clock.advance(2 * DAY)
    await store.prune(Retention())
    assert [t.id for t in await store.tasks()] == [last]
    assert await submit(store, "c") > last > first


async def test_a_task_a_task_still_to_finish_waits_on_stays(
    store: Store, clock: ManualClock
) -> None:
    first = await submit(store, "first")
    other = await submit(store, "other")
    await submit(store, "then", after=(first, other))
    await run(store, "first")
    clock.advance(2 * DAY)
    await store.prune(Retention())
    assert "first" in await states(store)  # "then" still waits (on "other")
    await run(store, "other")
    await run(store, "then")
    await submit(store, "newest")
    clock.advance(2 * DAY)
    await store.prune(Retention())
    assert list(await states(store)) == ["newest"]


async def test_what_a_redrive_would_bring_back_stays_with_its_dead_letter(
    store: Store, clock: ManualClock
) -> None:
    root = await submit(store, "root")
    child = await submit(store, "child", after=(root,))
    await submit(store, "grandchild", after=(child,))
    await finish(store, "root", dies())
    await submit(store, "newest")
    clock.advance(2 * DAY)  # past the cancelled age, not the dead one

    await store.prune(Retention())

    assert set(await states(store)) == {"root", "child", "grandchild", "newest"}
    assert await store.redrive(task_ids=[root]) == [root]
    assert (await store.get(child)).state is TaskState.PENDING


async def test_once_a_dead_letter_goes_what_it_failed_goes_after_it(
    store: Store, clock: ManualClock
) -> None:
    root = await submit(store, "root")
    child = await submit(store, "child", after=(root,))
    await finish(store, "root", dies())
    await submit(store, "newest")
    clock.advance(31 * DAY)

    first = await store.prune(Retention())
    # The dead letter went; what it failed can no longer be restored by a redrive, and says so.
    assert first.removed[DEAD_TASKS] == 1 and first.removed[CANCELLED_TASKS] == 0
    found = await store.get(child)
    assert (found.state, found.error_code) == (TaskState.CANCELLED, UPSTREAM_PRUNED)
    second = await store.prune(Retention())
    assert second.removed[CANCELLED_TASKS] == 1
    assert list(await states(store)) == ["newest"]


async def test_a_redrive_does_not_restore_a_task_whose_other_failed_dependency_went(
    store: Store, clock: ManualClock
) -> None:
    dead = await submit(store, "dead")
    stopped = await submit(store, "stopped")
    both = await submit(store, "both", after=(dead, stopped))
    await finish(store, "dead", dies())
    await store.cancel(stopped)
    await submit(store, "newest")
    clock.advance(2 * DAY)

    await store.prune(Retention())  # "stopped" goes; "both" waits on a dead letter: stays

    assert set(await states(store)) == {"dead", "both", "newest"}
    assert (await store.get(both)).error_code == UPSTREAM_PRUNED
    await store.redrive(task_ids=[dead])
    assert (await store.get(both)).state is TaskState.CANCELLED  # never left pending for ever


async def test_a_pruned_key_names_no_task_and_may_be_used_again(
    store: Store, clock: ManualClock
) -> None:
    first = await submit(store, "a", key="k1")
    await run(store, "a")
    await submit(store, "newest")
    clock.advance(2 * DAY)
    await store.prune(Retention())
    assert await store.find("k1") is None
    again = await submit(store, "a", key="k1")
    assert again != first and (await store.get(again)).state is TaskState.READY


# -- group reports


async def test_a_groups_report_is_the_same_before_and_after_its_succeeded_tasks_go(
    store: Store, clock: ManualClock
) -> None:
    for n in range(4):
        await submit(store, f"ok{n}", kind="work", group="ep1", cost=2.0)
        await run(store, "work")
    await submit(store, "bad", group="ep1")
    await finish(store, "bad", dies())
    await submit(store, "todo", group="ep1")
    await submit(store, "other", group="ep2")
    await run(store, "other")
    await submit(store, "newest")
    clock.advance(2 * DAY)
    before = {group: await store.group_report(group) for group in ("ep1", "ep2")}

    pruned = await store.prune(Retention())

    assert pruned.removed[SUCCEEDED_TASKS] == 5
    assert [t.ref for t in await store.tasks(group="ep1")] == ["bad", "todo"]
    assert await store.groups() == ["ep1", "ep2"]
    for group, report in before.items():
        assert await store.group_report(group) == report
    assert before["ep1"].by_state[TaskState.SUCCEEDED] == 4
    assert dict(before["ep1"].cost) == {"work": 8.0}


async def test_a_group_whose_tasks_all_went_still_reports_them(
    store: Store, clock: ManualClock
) -> None:
    for ref in ("a", "b"):
        await submit(store, ref, group="gone")
        await run(store, ref)
    await submit(store, "newest")
    clock.advance(2 * DAY)
    before = await store.group_report("gone")
    await store.prune(Retention())
    assert await store.tasks(group="gone") == []
    assert await store.groups() == ["gone"]
    assert await store.group_report("gone") == before
    assert before.total == 2 and before.percent == 100.0


# -- records, the audit log and the outbox


async def test_notices_go_once_delivered_and_old_and_pending_ones_stay(
    store: Store, clock: ManualClock
) -> None:
    await store.records.put_record("item", "m1", scope="ev1", state="reviewable")
    for state in ("approved", "rejected", "approved"):
        await store.records.change_record("item", "m1", state=state, notice=Notice(f"item.{state}"))
    [first, second, third] = await store.records.outbox()
    await store.records.mark_delivered([first.id, third.id])
    clock.advance(2 * DAY)

    pruned = await store.prune(Retention())

    assert pruned.removed[NOTICES] == 1  # the newest notice stays, delivered or not
    assert [row.id for row in await store.records.outbox(pending=False)] == [second.id, third.id]


async def test_audit_rows_sign_ins_and_deliveries_go_by_their_own_ages(
    store: Store, clock: ManualClock
) -> None:
    await store.records.put_record(
        "login", "l1", scope="mod", state="active", audit=Audit("login", "mod")
    )
    await store.records.put_record("delivery", "d1", scope="minimax", state="received")
    await store.records.put_record("remote", "r1", scope="minimax", state="succeeded")
    await store.records.put_record("item", "m1", scope="ev1", state="rejected")
    clock.advance(2 * DAY)
    await store.records.put_record("login", "l2", scope="mod", state="active")  # the newest: stays

    first = await store.prune(Retention())
    assert first.removed[SIGN_INS] == 1 and first.removed[DELIVERIES] == 0
    assert await store.records.get_record("login", "l1") is None
    assert await store.records.get_record("item", "m1") is not None  # items are the pipeline's
    clock.advance(6 * DAY)
    second = await store.prune(Retention())
    assert second.removed[DELIVERIES] == 2
    assert len(await store.records.audit_log()) == 1
    clock.advance(366 * DAY)
    await store.records.put_record(
        "login", "l3", scope="mod", state="active", audit=Audit("login", "m")
    )
    await store.prune(Retention())
    assert [row.record_id for row in await store.records.audit_log()] == ["l3"]


async def test_delete_records_takes_only_the_states_given(store: Store) -> None:
    for media_id, state in (("m1", "rejected"), ("m2", "reviewable"), ("m3", "rejected")):
        await store.records.put_record("item", media_id, scope="ev1", state=state)
    await store.records.put_record("login", "newest", scope="mod", state="active")
    assert await store.records.delete_records("item", ["m1", "m2", "m9"], when={"rejected"}) == 1
    assert await store.records.get_record("item", "m2") is not None
    assert await store.records.delete_records("login", ["newest"]) == 0  # the newest record stays
    assert [r.id for r in await store.records.list_records("item")] == ["m2", "m3"]


async def test_nothing_is_pruned_whose_age_is_off(store: Store, clock: ManualClock) -> None:
    await submit(store, "a")
    await run(store, "a")
    await submit(store, "newest")
    clock.advance(1000 * DAY)
    pruned = await store.prune(KEEP_ALL)
    assert pruned.total == 0 and pruned.batches == 0
    assert "a" in await states(store)


# -- one pruner at a time


async def test_one_pruner_holds_the_lease_and_the_next_run_waits_its_turn(
    store: Store, clock: ManualClock
) -> None:
    assert await store.pruner_state() is None
    assert await store.take_pruner("a", lease_for=60.0, every=300.0)
    assert not await store.take_pruner("b", lease_for=60.0)
    assert await store.take_pruner("a", lease_for=60.0)  # renewed by its holder
    await store.release_pruner("a", removed=7)
    state = await store.pruner_state()
    assert state is not None and (state.holder, state.removed) == ("a", 7)
    assert state.done_at == clock.now()
    assert not await store.take_pruner("b", lease_for=60.0, every=300.0)  # not due yet
    clock.advance(300.0)
    assert await store.take_pruner("b", lease_for=60.0, every=300.0)
    clock.advance(61.0)  # b died holding it: its lease ran out
    assert await store.take_pruner("a", lease_for=60.0, every=300.0)


async def test_a_failed_run_leaves_the_next_one_due_at_once(
    store: Store, clock: ManualClock
) -> None:
    assert await store.take_pruner("a", lease_for=60.0)
    await store.release_pruner("a", removed=None)
    assert await store.take_pruner("b", lease_for=60.0, every=300.0)


async def test_two_store_instances_share_one_pruner_lease(
    store: Store, reopen: Callable[[], Store], clock: ManualClock
) -> None:
    other = reopen()
    await other.open(Settings(gates=GATES))
    try:
        assert await store.take_pruner("process-1", lease_for=60.0, every=300.0)
        assert not await other.take_pruner("process-2", lease_for=60.0, every=300.0)
        await store.release_pruner("process-1", removed=0)
        clock.advance(300.0)
        assert await other.take_pruner("process-2", lease_for=60.0, every=300.0)
        assert not await store.take_pruner("process-1", lease_for=60.0, every=300.0)
    finally:
        await other.close()


async def test_a_second_store_sees_what_the_first_pruned(
    store: Store, reopen: Callable[[], Store], clock: ManualClock
) -> None:
    await submit(store, "a", group="ep1")
    await run(store, "a")
    await submit(store, "newest")
    clock.advance(2 * DAY)
    await store.prune(Retention())
    other = reopen()
    await other.open(Settings(gates=GATES))
    try:
        assert [t.ref for t in await other.tasks()] == ["newest"]
        assert (await other.group_report("ep1")).succeeded == 1
    finally:
        await other.close()
