"""Idempotency keys: one payload digest and one plan for every backend."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import headrace as hr
from headrace.policy.errors import ConfigError, KeyConflict
from headrace.policy.tiers import Tier
from headrace.store.machine import idempotency
from headrace.store.machine.idempotency import (
    FIELDS,
    KnownKey,
    first_difference,
    payload_digest,
    plan,
)
from headrace.store.protocol.types import NewTask, Sibling, Submitted

GATES = ("free", "provider:image", "provider:video", "session:a")


@st.composite
def payloads(draw: st.DrawFn) -> tuple[NewTask, tuple[int, ...]]:
    """A keyed task and the ids it waits on, drawn from small sets so that two often agree."""
    gates = draw(st.lists(st.sampled_from(GATES), unique=True, max_size=3))
    task = NewTask(
        kind=draw(st.sampled_from(["scan", "render"])),
        ref=draw(st.sampled_from(["ep6-s01", "ep6-s02"])),
        gates=tuple(gates),
        flow=draw(st.sampled_from(["ep6", "ep7"])),
        group=draw(st.sampled_from([None, "ep6", "ep7"])),
        tier=draw(st.sampled_from(Tier)),
        cost=draw(st.sampled_from([0.0, 1.0, 1, 2.5])),
        key="k",
        max_attempts=draw(st.sampled_from([1, 5])),
        delay=draw(st.sampled_from([0.0, 30.0])),
        weight=draw(st.sampled_from([1.0, 2.0])),
    )
    return task, tuple(draw(st.lists(st.integers(1, 4), max_size=3)))


def normalized(task: NewTask, after: tuple[int, ...]) -> dict[str, Any]:
    """The payload as the digest means it: gates and dependencies as sets, numbers as floats."""
    return {
        "kind": task.kind,
        "ref": task.ref,
        "gates": frozenset(task.gates),
        "flow": task.flow,
        "group": task.group,
        "tier": task.tier,
        "cost": float(task.cost),
        "max_attempts": task.max_attempts,
        "weight": float(task.weight),
        "after": frozenset(after),
    }


@given(payloads(), payloads())
@settings(max_examples=500, deadline=None)
def test_two_digests_differ_first_where_the_payloads_do(
    one: tuple[NewTask, tuple[int, ...]], other: tuple[NewTask, tuple[int, ...]]
) -> None:
    a, b = normalized(*one), normalized(*other)
    expected = next((name for name in FIELDS if a[name] != b[name]), None)
    assert first_difference(payload_digest(*one), payload_digest(*other)) == expected
    assert (payload_digest(*one) == payload_digest(*other)) == (expected is None)


@given(payloads())
@settings(max_examples=100, deadline=None)
def test_a_digest_is_short_and_ignores_delay_and_the_key_itself(
    drawn: tuple[NewTask, tuple[int, ...]],
) -> None:
    task, after = drawn
    digest = payload_digest(task, after)
    assert len(digest) == 2 + 8 * len(FIELDS) + len(FIELDS) - 1
    later = NewTask(**{**task.__dict__, "delay": task.delay + 60.0, "key": "another"})
    assert payload_digest(later, after) == digest


def test_a_digest_of_another_version_or_none_is_not_compared() -> None:
    task = NewTask("render", "ep6-s01", key="k")
    other = NewTask("render", "ep6-s02", key="k")
    assert first_difference("0:" + payload_digest(task, ())[2:], payload_digest(other, ())) is None
    assert first_difference("1:garbled", payload_digest(other, ())) is None
    assert plan([other], {"k": KnownKey(7, None)}) == [7]  # stored before digests were kept


def keyed(ref: str, key: str = "k", **fields: Any) -> NewTask:
    return NewTask("render", ref, key=key, **fields)


def test_a_plan_names_stored_tasks_and_earlier_siblings() -> None:
    stored = keyed("a", after=(3,))
    known = {"k": KnownKey(12, payload_digest(stored, (3,)))}
    batch = [
        NewTask("render", "free"),  # no key: created
        keyed("a", after=(3,)),  # the stored task
        keyed("b", key="new"),  # a new key: created
        keyed("b", key="new"),  # the task two before it
        keyed("c", key="waits", after=(Sibling(1), Sibling(3))),  # waits on known tasks
    ]
    planned = plan(batch, known)
    assert planned == [None, 12, None, Sibling(2), None]
    results: list[Submitted] = []
    for index, step in enumerate(planned):
        new = Submitted(100 + index, created=True)
        results.append(new if step is None else idempotency.reused(step, results))
    assert [r.id for r in results] == [100, 12, 102, 102, 104]


@pytest.mark.parametrize(
    ("changed", "field"),
    [({"ref": "z"}, "ref"), ({"cost": 9.0}, "cost"), ({"after": (4,)}, "after")],
)
def test_a_plan_refuses_a_key_with_another_payload(changed: dict[str, Any], field: str) -> None:
    known = {"k": KnownKey(12, payload_digest(keyed("a", after=(3,)), (3,)))}
    with pytest.raises(KeyConflict) as refused:
        plan([keyed(**{"ref": "a", "after": (3,), **changed})], known)
    assert (refused.value.key, refused.value.field, refused.value.task_id) == ("k", field, 12)
    assert isinstance(refused.value, ConfigError)
    assert str(refused.value).startswith("task.key: 'k' already names task 12, whose")


def test_a_task_waiting_on_a_sibling_created_now_is_never_a_stored_task() -> None:
    # Stored: "joined" waits on task 5. Submitted: "joined" waits on a task created with it.
    known = {"joined": KnownKey(6, payload_digest(keyed("j", key="joined"), (5,)))}
    batch = [NewTask("render", "s0"), keyed("j", key="joined", after=(Sibling(0),))]
    with pytest.raises(KeyConflict, match="whose after differs"):
        plan(batch, known)
    # The same key twice in one batch, both waiting on the same new sibling: one task.
    batch = [NewTask("render", "s0"), *[keyed("j", key="new", after=(Sibling(0),))] * 2]
    assert plan(batch, {}) == [None, None, Sibling(1)]


@pytest.mark.anyio
async def test_spawned_successors_are_made_once_and_their_keys_kept_to_the_payload() -> None:
    app = hr.App("memory://")

    @app.task()
    async def script(ctx: hr.Context, ref: str) -> None:
        for shot_ref in ("s1", "s2", "s1"):  # s1 twice: one derived key, one payload
            ctx.spawn(shot, f"{ref}/{shot_ref}")

    @app.task()
    async def shot(ctx: hr.Context, ref: str) -> None: ...

    async with app:
        first = await script.submit("ep1", group="ep1", key="ep1:v1")
        await hr.Worker(app).drain()
        assert await script.submit("ep1", group="ep1", key="ep1:v1") == first
        shots = {str(t.key): t.id for t in await app.store.tasks(kind="shot")}
        assert sorted(shots) == ["ep1:v1>shot:ep1/s1", "ep1:v1>shot:ep1/s2"]
        # The successor made again by hand, as spawn made it: the same task.
        again = shot.spec("ep1/s1", group="ep1", key="ep1:v1>shot:ep1/s1")
        assert await app.submit([again]) == [shots["ep1:v1>shot:ep1/s1"]]
        with pytest.raises(hr.KeyConflict, match="whose tier differs"):
            await app.submit([replace(again, tier=Tier.RUSH)])
        with pytest.raises(hr.KeyConflict, match="whose ref differs"):
            await script.submit("ep2", group="ep1", key="ep1:v1")
        assert len(await app.store.tasks()) == 3
