"""Backpressure between stages on the runtime: a fast upstream stage stops claiming while the
slow stage it feeds is full, successors made with `ctx.spawn` respect the bound, and nothing is
lost or done twice on the way."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import headrace as hr
from headrace.policy import ConfigError
from headrace.store.protocol.types import AttemptOutcome, TaskState

pytestmark = pytest.mark.anyio

SCAN_BOUND = 3


def pipeline(*, feeds: bool) -> tuple[hr.App, Counter[str]]:
    app = hr.App("memory://")
    ran: Counter[str] = Counter()

    @app.task(name="validate", feeds=["scan"] if feeds else [])
    async def validate(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(0.1)
        ran["validate"] += 1
        ctx.spawn("scan", ref)

    @app.task(name="scan", bound=SCAN_BOUND, cost_class="slow")
    async def scan(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(2.0)
        ran["scan"] += 1

    return app, ran


async def sample_depths(app: hr.App, samples: list[int], stop: asyncio.Event) -> None:
    waiting = (TaskState.PENDING, TaskState.READY)
    while not stop.is_set():
        counts = await app.store.counts(kinds=["scan"])
        samples.append(sum(counts[state] for state in waiting))
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("feeds", [True, False], ids=["declared", "undeclared"])
async def test_spawned_successors_never_exceed_a_full_stages_bound(feeds: bool) -> None:
    app, ran = pipeline(feeds=feeds)
    samples: list[int] = []
    stop = asyncio.Event()
    async with app:
        await app.submit([app.definition("validate").spec(f"m{i}") for i in range(20)])
        sampler = asyncio.create_task(sample_depths(app, samples, stop))
        # one scan at a time, four validations: scan is the narrow stage
        stats = await hr.Worker(app, classes={"slow": 1}).drain()
        stop.set()
        await sampler
        tasks = await app.store.tasks(limit=100)
        validated = [t for t in tasks if t.kind == "validate"]
        deferred = [
            attempt
            for t in validated
            for attempt in await app.store.attempts(t.id)
            if attempt.outcome is AttemptOutcome.DEFERRED
        ]
    assert max(samples) <= SCAN_BOUND
    assert max(samples) == SCAN_BOUND  # the stage was full: the case tested something
    assert all(t.state is TaskState.SUCCEEDED for t in tasks)
    assert sorted(t.ref for t in tasks if t.kind == "scan") == sorted(f"m{i}" for i in range(20))
    assert ran["scan"] == 20
    assert all(t.attempts_used == 1 for t in validated)  # a deferral is not an attempt
    if feeds:
        # Declared, the upstream stage waits before it runs: hardly any work is done twice.
        assert ran["validate"] - 20 == len(deferred) <= 3
    else:
        # Undeclared, it runs and finds no room: its work is deferred and done again.
        assert ran["validate"] - 20 == len(deferred) > 0
    assert stats.dead == stats.retried == 0


async def test_feeds_must_name_declared_stages() -> None:
    app = hr.App("memory://")

    @app.task(name="a", feeds=["nowhere"])
    async def a(ctx: hr.Context, ref: str) -> None:
        return None

    with pytest.raises(ConfigError, match="feeds names no declared stage: 'nowhere'"):
        await app.open()


@pytest.mark.parametrize(
    ("field", "value"),
    [("bound", 0), ("per_flow", -1), ("per_group", True), ("feeds", "scan")],
)
def test_bad_limits_are_refused_by_name(field: str, value: object) -> None:
    app = hr.App("memory://")
    with pytest.raises(ConfigError, match=f"task.{field}"):
        app.task(name="x", **{field: value})  # type: ignore[call-overload]
