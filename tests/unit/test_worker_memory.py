"""A worker's memory budget on the virtual clock: what its running tasks are charged never
exceeds it, small tasks are not held behind big ones, and every task runs."""

from __future__ import annotations

import asyncio
import random

import pytest

import headrace as hr
from headrace.policy import ConfigError
from headrace.policy.errors import Transient
from headrace.runtime.memory import DEFAULT_MEMORY, GIB, MIB, parse_size

pytestmark = pytest.mark.anyio


def now() -> float:
    return asyncio.get_running_loop().time()


class Meter:
    """What the handlers running now were charged, by the handlers' own count."""

    def __init__(self) -> None:
        self.charged = 0
        self.peak = 0
        self.started: dict[str, float] = {}
        self.running: dict[str, int] = {}

    async def run(self, ref: str, memory: int, seconds: float) -> None:
        self.started[ref] = now()
        self.charged += memory
        self.running[ref] = memory
        self.peak = max(self.peak, self.charged)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.charged -= memory
            del self.running[ref]


async def test_the_charge_never_exceeds_the_budget_and_small_tasks_flow() -> None:
    app = hr.App("memory://")
    meter = Meter()
    sizes: dict[str, int] = {}

    @app.task(cost_class="image")
    async def decode(ctx: hr.Context, ref: str) -> None:
        await meter.run(ref, ctx.task.memory, 2.0 if ref.startswith("big") else 0.2)

    rng = random.Random(7)
    async with app:
        began = now()
        for i in range(40):  # big ones first: the small ones behind them must not wait for them
            sizes[f"big{i}"] = rng.randint(300, 700) * MIB
            await decode.submit(f"big{i}", memory=sizes[f"big{i}"])
        for i in range(60):
            sizes[f"small{i}"] = rng.randint(5, 40) * MIB
            await decode.submit(f"small{i}", memory=sizes[f"small{i}"])
        worker = hr.Worker(app, classes={"image": 6}, memory="1GiB")
        stats = await worker.drain()
        counts = await app.store.counts()
    assert counts[hr.TaskState.SUCCEEDED] == 100  # every task ran
    assert 0 < meter.peak <= GIB
    assert stats.memory_budget == GIB
    assert stats.peak_memory_charged == meter.peak
    assert stats.memory_charged == 0
    # The small ones ran beside the big ones, not after them: the last small one started long
    # before the big ones were done (40 big ones at most two at a time take 40 s or more).
    last_small = max(t for ref, t in meter.started.items() if ref.startswith("small"))
    last_big = max(t for ref, t in meter.started.items() if ref.startswith("big"))
    assert last_small - began < 10.0 < last_big - began


async def test_large_tasks_take_half_the_budget_and_the_photos_behind_them_start_at_once() -> None:
    """Large tasks (past an eighth of the budget) together take at most half of it: the
    photos queued behind a burst of them start while it runs, not after it."""
    app = hr.App("memory://")
    meter = Meter()
    large_running: list[int] = []

    @app.task(cost_class="image")
    async def decode(ctx: hr.Context, ref: str) -> None:
        if ref.startswith("png"):
            large_running.append(sum(m for m in meter.running.values() if m > 128 * MIB))
        await meter.run(ref, ctx.task.memory, 3.0 if ref.startswith("png") else 0.5)

    async with app:
        began = now()
        for i in range(10):
            await decode.submit(f"png{i}", memory=300 * MIB)
        for i in range(12):
            await decode.submit(f"photo{i}", memory=70 * MIB)
        await hr.Worker(app, classes={"image": 6}, memory="1GiB").drain()
    assert max(large_running) + 300 * MIB <= GIB // 2  # one at a time: two would be 600 MiB
    photos = [t - began for ref, t in meter.started.items() if ref.startswith("photo")]
    assert max(photos) < 2.0  # 12 photos in 5 slots, half a second each: no wait for the PNGs


async def test_a_task_larger_than_the_budget_runs_alone_and_is_not_stuck() -> None:
    app = hr.App("memory://")
    meter = Meter()
    beside: list[int] = []

    @app.task()
    async def decode(ctx: hr.Context, ref: str) -> None:
        if ref == "huge":
            beside.append(meter.charged)
        await meter.run(ref, ctx.task.memory, 1.0)

    async with app:
        for i in range(4):
            await decode.submit(f"s{i}", memory=200 * MIB)
        await decode.submit("huge", memory=3 * GIB)
        for i in range(4, 8):
            await decode.submit(f"s{i}", memory=200 * MIB)
        await decode.submit("free", memory=0)
        stats = await hr.Worker(app, slots=4, memory="768MiB").drain()
        counts = await app.store.counts()
    assert counts[hr.TaskState.SUCCEEDED] == 10
    assert beside == [0]  # nothing charged ran when it started
    assert stats.peak_memory_charged == 3 * GIB  # it alone went over the budget
    assert meter.peak == 3 * GIB


async def test_a_charge_is_freed_however_the_attempt_ends() -> None:
    """A failure retried, a remote wait (its slot freed) and a success each free their charge:
    later tasks that need the whole budget still run."""
    app = hr.App("memory://")
    tries: dict[str, int] = {}

    @app.task(retry=hr.RetryPolicy(max_attempts=3, base=0.1))
    async def decode(ctx: hr.Context, ref: str) -> hr.RemoteWait | None:
        tries[ref] = tries.get(ref, 0) + 1
        if ref == "flaky" and tries[ref] == 1:
            raise Transient("flaky")
        if ref == "remote":
            return ctx.await_remote("job-1", every="1s")
        return None

    @decode.poll
    async def check(ctx: hr.Context, ref: str) -> hr.Result:
        return hr.Result()

    async with app:
        for ref in ("flaky", "remote", "whole1", "whole2"):
            await decode.submit(ref, memory=512 * MIB)
        worker = hr.Worker(app, slots=4, memory="512MiB")
        stats = await worker.drain()
        counts = await app.store.counts()
    assert counts[hr.TaskState.SUCCEEDED] == 4
    assert tries["flaky"] == 2
    assert stats.peak_memory_charged == 512 * MIB  # one at a time, each freed at its end
    assert stats.memory_charged == 0


async def test_without_a_budget_nothing_is_held_back() -> None:
    app = hr.App("memory://")
    meter = Meter()

    @app.task()
    async def decode(ctx: hr.Context, ref: str) -> None:
        await meter.run(ref, ctx.task.memory, 1.0)

    async with app:
        for i in range(4):
            await decode.submit(f"t{i}", memory=GIB)
        stats = await hr.Worker(app, slots=4, memory=None).drain()
    assert meter.peak == 4 * GIB
    assert stats.memory_budget is None


async def test_borrowed_slots_share_the_memory_left() -> None:
    """A second claim into a slot another class left idle gets only the memory the first one
    left: the sum of both fits the budget."""
    app = hr.App("memory://")
    meter = Meter()

    @app.task(cost_class="image")
    async def image(ctx: hr.Context, ref: str) -> None:
        await meter.run(ref, ctx.task.memory, 1.0)

    @app.task(cost_class="video")
    async def video(ctx: hr.Context, ref: str) -> None:
        await meter.run(ref, ctx.task.memory, 1.0)

    async with app:
        for i in range(8):
            await image.submit(f"i{i}", memory=200 * MIB)
        # Two image slots, then the idle video slot borrowed: room for two images, not three
        # (large tasks, past an eighth of the budget: half of it is theirs).
        tight = hr.Worker(app, classes={"image": 2, "video": 1}, memory="1000MiB")
        stats = await tight.drain()
        assert meter.peak == stats.peak_memory_charged == 400 * MIB
        for i in range(3):
            await image.submit(f"j{i}", memory=200 * MIB)
        roomy = hr.Worker(app, classes={"image": 2, "video": 1}, memory="1200MiB")
        stats = await roomy.drain()
    assert stats.borrowed > 0
    assert stats.peak_memory_charged == 600 * MIB  # three at once: two own, one borrowed


def test_sizes_parse_in_their_units() -> None:
    assert parse_size("1GiB", field="f") == GIB
    assert parse_size("512MiB", field="f") == 512 * MIB
    assert parse_size("1.5Gi", field="f") == 3 * GIB // 2
    assert parse_size("800M", field="f") == 800_000_000
    assert parse_size("2gb", field="f") == 2_000_000_000
    assert parse_size("65536", field="f") == parse_size(65536, field="f") == 65536
    assert DEFAULT_MEMORY == 768 * MIB


@pytest.mark.parametrize("bad", ["", "lots", "1XB", "-5MiB", "0", "1 2", True, 1.5])
def test_a_bad_size_names_its_field(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"worker\.memory"):
        hr.Worker(hr.App("memory://"), memory=bad)  # type: ignore[arg-type]


async def test_a_successor_carries_the_memory_it_was_spawned_with() -> None:
    app = hr.App("memory://")
    seen: dict[str, int] = {}

    @app.task()
    async def probe(ctx: hr.Context, ref: str) -> None:
        ctx.spawn(decode, ref, memory=300 * MIB)

    @app.task()
    async def decode(ctx: hr.Context, ref: str) -> None:
        seen[ref] = ctx.task.memory

    async with app:
        await probe.submit("photo")
        await hr.Worker(app, memory="512MiB").drain()
    assert seen == {"photo": 300 * MIB}
