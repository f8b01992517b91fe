"""The worker on the virtual clock, over the memory store."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from typing import Any

import pytest

import headrace as hr
from headrace.policy.errors import StoreUnavailable
from headrace.policy.gate import default_guard
from headrace.store.protocol.types import (
    AttemptOutcome,
    ClaimResult,
    KindLimit,
    Lease,
    MemoryRoom,
    Outcome,
    TaskState,
)
from headrace.store.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio


def now() -> float:
    return asyncio.get_running_loop().time()


def max_in_any_window(starts: list[float], window: float) -> int:
    ordered = sorted(starts)
    return max(
        (sum(1 for t in ordered if s <= t < s + window) for s in ordered),
        default=0,
    )


async def test_drain_runs_a_fan_out_with_successors_once() -> None:
    app = hr.App("memory://")
    made: list[str] = []

    @app.task()
    async def script(ctx: hr.Context, ref: str) -> None:
        shots = [ctx.spawn(shot, f"{ref}/s{i}") for i in range(3)]
        ctx.spawn(assemble, ref, after=shots)

    @app.task()
    async def shot(ctx: hr.Context, ref: str) -> hr.Result:
        made.append(ref)
        return hr.Result(cost=2.0)

    @app.task()
    def assemble(ctx: hr.Context, ref: str) -> None:  # sync: runs in a thread
        made.append(f"assembled {ref}")

    async with app:
        await script.submit("ep1", group="ep1")
        await hr.Worker(app, slots=2, seed=1).drain()
        report = await app.store.group_report("ep1")
    assert made[-1] == "assembled ep1"
    assert sorted(made[:3]) == ["ep1/s0", "ep1/s1", "ep1/s2"]
    assert report.succeeded == report.total == 5
    assert report.cost == {"assemble": 1.0, "script": 1.0, "shot": 6.0}


async def test_gates_hold_their_cap_and_every_sliding_window() -> None:
    app = hr.App("memory://")
    app.gate("provider:image", concurrency=2, rate=hr.Rate(5, per="6s"))
    starts: list[float] = []
    active = peak = 0

    @app.task(gates=["provider:image"])
    async def image(ctx: hr.Context, ref: str) -> None:
        nonlocal active, peak
        await ctx.started()
        starts.append(now())
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.4)
        active -= 1

    async with app:
        for i in range(23):
            await image.submit(f"img{i}")
        began = now()
        await hr.Worker(app, slots=6).drain()
        [stats] = await app.store.gate_statistics()
    assert peak == 2
    assert max_in_any_window(starts, 6.0) == 5
    # the burst is kept: 5 per window from t=0, each window lengthened by the default guard
    assert now() - began < 4 * (6.0 + default_guard(hr.Rate(5, per="6s"))) + 1.0
    assert stats.blocked_by_token > 0
    assert stats.peak_in_flight == 2


async def test_a_refused_gate_never_blocks_a_task_whose_gate_has_room() -> None:
    """The head-of-line trap: every slot's candidates wait on an exhausted video gate."""
    app = hr.App("memory://")
    app.gate("provider:video", concurrency=3, rate=hr.Rate(3, per="60s"))
    app.gate("provider:image", concurrency=2, rate=hr.Rate(10, per="60s"))
    started: dict[str, float] = {}

    @app.task(gates=["provider:video"])
    async def video(ctx: hr.Context, ref: str) -> None:
        started[ref] = now()
        await asyncio.sleep(1.0)

    @app.task(gates=["provider:image"])
    async def image(ctx: hr.Context, ref: str) -> None:
        started[ref] = now()
        await asyncio.sleep(1.0)

    async with app:
        begin = now()
        for i in range(12):
            await video.submit(f"v{i}", tier="rush")
        await image.submit("img", tier="low")
        worker = hr.Worker(app, slots=3)
        run = asyncio.create_task(worker.run())
        await asyncio.sleep(2.0)
        assert started["img"] - begin < 1.5  # it ran as soon as a slot was free
        assert sorted(r for r in started if r.startswith("v")) == ["v0", "v1", "v2"]
        assert worker.stats.peak_busy == 3
        worker.stop()
        await run


async def test_retry_backoff_has_jitter_and_never_holds_a_slot() -> None:
    app = hr.App("memory://")
    attempts: dict[str, list[float]] = {}

    @app.task(max_attempts=4)
    async def flaky(ctx: hr.Context, ref: str) -> None:
        attempts.setdefault(ref, []).append(now())
        if ctx.attempt < 3:
            raise hr.Transient("try again", code="upstream_503")

    @app.task()
    async def steady(ctx: hr.Context, ref: str) -> None:
        attempts.setdefault(ref, []).append(now())
        await asyncio.sleep(0.05)

    async with app:
        for i in range(4):
            await flaky.submit(f"f{i}")
        for i in range(20):
            await steady.submit(f"s{i}")
        await hr.Worker(app, slots=1, seed=7).drain()
        history = await app.store.attempts(1)
    gaps = [b - a for a, b in zip(attempts["f0"], attempts["f0"][1:], strict=False)]
    assert 0.3 * 0.7 <= gaps[0] <= 0.3 * 1.3 + 0.1
    assert 0.6 * 0.7 <= gaps[1] <= 0.6 * 1.3 + 0.1
    first_gaps = {round(attempts[f"f{i}"][1] - attempts[f"f{i}"][0], 6) for i in range(4)}
    assert len(first_gaps) > 1  # jittered, not in lockstep
    steady_starts = sorted(attempts[f"s{i}"][0] for i in range(20))
    assert steady_starts[0] < attempts["f0"][1]  # the slot served others during the backoff
    assert [a.outcome for a in history] == [
        AttemptOutcome.RETRY,
        AttemptOutcome.RETRY,
        AttemptOutcome.SUCCEEDED,
    ]


async def test_a_rate_limited_attempt_penalises_its_gate_and_succeeds_later() -> None:
    app = hr.App("memory://")
    app.gate("provider:speech", concurrency=3, rate=hr.Rate(20, per="6s"))
    app.gate("session:*", concurrency=5)
    calls = 0

    @app.task(gates=["provider:speech", "session:{flow}"])
    async def speech(ctx: hr.Context, ref: str) -> None:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise hr.RateLimited("1002", code="minimax_1002")

    async with app:
        for i in range(5):
            await speech.submit(f"line{i}", flow="ep1")
        await hr.Worker(app, slots=3, seed=3).drain()
        stats = {s.name: s for s in await app.store.gate_statistics()}
        states = {t.state for t in await app.store.tasks()}
    assert stats["provider:speech"].rate_limited == 2
    assert stats["session:ep1"].rate_limited == 0
    assert states == {TaskState.SUCCEEDED}


async def test_a_never_retry_error_is_tried_once() -> None:
    app = hr.App("memory://")
    tries = 0

    @app.task(max_attempts=5)
    async def charge(ctx: hr.Context, ref: str) -> None:
        nonlocal tries
        tries += 1
        raise hr.Fatal("insufficient balance", code="minimax_1008")

    async with app:
        task_id = await charge.submit("x")
        await hr.Worker(app).drain()
        record = await app.store.get(task_id)
    assert tries == 1
    assert record.state is TaskState.DEAD
    assert record.error_code == "minimax_1008"


async def test_a_remote_wait_frees_the_slot_and_keeps_the_ticket() -> None:
    app = hr.App("memory://")
    app.gate("provider:video", concurrency=1)
    log: list[tuple[str, float]] = []
    polls = 0

    async def check(ctx: hr.Context, remote_id: str) -> hr.Result | hr.Pending:
        nonlocal polls
        polls += 1
        log.append((f"poll {remote_id}", now()))
        return hr.Result(cost=6.0) if polls % 3 == 0 else hr.Pending()

    @app.task(gates=["provider:video"], poll=check)
    async def clip(ctx: hr.Context, ref: str) -> hr.RemoteWait:
        log.append((f"submit {ref}", now()))
        return ctx.await_remote(f"job-{ref}", every="10s")

    @app.task()
    async def script(ctx: hr.Context, ref: str) -> None:
        log.append((f"script {ref}", now()))
        await asyncio.sleep(5.0)

    async with app:
        await clip.submit("a", group="ep")
        await clip.submit("b", group="ep")
        await script.submit("x")
        await hr.Worker(app, slots=1).drain()
        report = await app.store.group_report("ep")
    events = [name for name, _ in log]
    assert events[:2] == ["submit a", "script x"]  # the slot went to the script at once
    assert events.index("submit b") > events.index("poll job-a") > 0
    submit_b = dict(log)["submit b"]
    assert submit_b >= 30.0  # b's ticket waited for a's remote job, three polls of 10 s
    assert report.cost == {"clip": 12.0}


async def test_drain_reraises_a_handler_bug_after_recording_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = hr.App("memory://")

    @app.task(max_attempts=1)
    async def buggy(ctx: hr.Context, ref: str) -> None:
        raise ZeroDivisionError("oops")

    caplog.set_level(logging.CRITICAL, logger="headrace.worker")
    async with app:
        task_id = await buggy.submit("x")
        with pytest.raises(ZeroDivisionError):
            await hr.Worker(app).drain()
        record = await app.store.get(task_id)
    assert record.state is TaskState.DEAD
    assert record.error_code == "zerodivisionerror"


async def test_renewals_keep_a_long_task_its_lease() -> None:
    app = hr.App("memory://")

    @app.task()
    async def long(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(100.0)

    async with app:
        task_id = await long.submit("x")
        await hr.Worker(app, lease="3s").drain()
        record = await app.store.get(task_id)
    assert record.state is TaskState.SUCCEEDED
    assert record.attempt == 1


async def test_stop_lets_running_tasks_finish() -> None:
    app = hr.App("memory://")
    finished: list[str] = []

    @app.task()
    async def work(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(5.0)
        finished.append(ref)

    async with app:
        for i in range(4):
            await work.submit(f"w{i}")
        worker = hr.Worker(app, slots=2)
        run = asyncio.create_task(worker.run())
        await asyncio.sleep(1.0)
        worker.stop()
        await run
        counts = await app.store.counts()
    assert sorted(finished) == ["w0", "w1"]
    assert counts[TaskState.READY] == 2
    assert counts[TaskState.RUNNING] == 0


async def test_past_the_grace_period_running_tasks_are_released() -> None:
    app = hr.App("memory://")

    @app.task()
    async def stuck(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(3600.0)

    async with app:
        task_id = await stuck.submit("x")
        worker = hr.Worker(app, grace="2s")
        run = asyncio.create_task(worker.run())
        await asyncio.sleep(1.0)
        worker.stop()
        await run
        record = await app.store.get(task_id)
    assert record.state is TaskState.READY
    assert record.error_code == "interrupted"


async def test_a_bounded_stage_refuses_or_makes_the_producer_wait() -> None:
    app = hr.App("memory://")

    @app.task(bound=2, on_full="refuse")
    async def scan(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(1.0)

    @app.task(bound=2)
    async def derive(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(1.0)

    async with app:
        await scan.submit("a")
        await scan.submit("b")
        with pytest.raises(hr.QueueFull):
            await scan.submit("c")
        worker = asyncio.create_task(hr.Worker(app, slots=1).drain())
        submitted_at = []
        for i in range(5):
            await derive.submit(f"d{i}")
            submitted_at.append(now())
        await worker
    assert submitted_at[-1] >= 2.0  # the producer waited for the stage to drain


async def test_a_wrong_return_value_is_a_clear_error(caplog: pytest.LogCaptureFixture) -> None:
    app = hr.App("memory://")

    @app.task(max_attempts=1)
    async def odd(ctx: hr.Context, ref: str) -> hr.Result:
        return "done"  # type: ignore[return-value]

    caplog.set_level(logging.CRITICAL, logger="headrace.worker")
    async with app:
        await odd.submit("x")
        with pytest.raises(hr.ConfigError, match="returns None, Result"):
            await hr.Worker(app).drain()


async def test_a_handler_bug_is_logged_without_its_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = hr.App("memory://")

    @app.task(max_attempts=1)
    async def leaky(ctx: hr.Context, ref: str) -> None:
        raise RuntimeError("GET https://cdn.example/x.mp4?X-Amz-Signature=abc123 failed")

    caplog.set_level(logging.ERROR, logger="headrace.worker")
    async with app:
        task_id = await leaky.submit("x")
        await hr.Worker(app).drain(fail_fast=False)
        [attempt] = await app.store.attempts(task_id)
    assert "RuntimeError" in caplog.text
    assert "abc123" not in caplog.text
    assert attempt.message is not None
    assert "abc123" not in attempt.message


async def test_a_restarted_worker_polls_the_remote_job_instead_of_resubmitting() -> None:
    app = hr.App("memory://")
    submissions = 0
    polls = 0

    async def check(ctx: hr.Context, remote_id: str) -> hr.Result | hr.Pending:
        nonlocal polls
        polls += 1
        return hr.Result() if polls >= 2 else hr.Pending()

    @app.task(poll=check)
    async def clip(ctx: hr.Context, ref: str) -> hr.RemoteWait:
        nonlocal submissions
        submissions += 1
        return ctx.await_remote(f"job-{ref}", every="5s")

    async with app:
        task_id = await clip.submit("a")
        first = hr.Worker(app, name="first")
        running = asyncio.create_task(first.run())
        await asyncio.sleep(1.0)
        first.stop()
        await running
        assert (await app.store.get(task_id)).state is TaskState.WAITING
        await hr.Worker(app, name="second").drain()
        record = await app.store.get(task_id)
    assert record.state is TaskState.SUCCEEDED
    assert submissions == 1
    assert polls == 2


class FlakyStore(SQLiteStore):
    """An in-memory store that is unreachable for its first claims and outcome writes."""

    def __init__(self, claims_down: int, finishes_down: int) -> None:
        super().__init__(":memory:")
        self.claims_down = claims_down
        self.finishes_down = finishes_down

    async def claim(self, *args: Any, **kwargs: Any) -> ClaimResult:
        if self.claims_down:
            self.claims_down -= 1
            raise StoreUnavailable("connection refused")
        return await super().claim(*args, **kwargs)

    async def finish_many(self, outcomes: Sequence[tuple[Lease, Outcome]]) -> Any:
        if self.finishes_down:
            self.finishes_down -= 1
            raise StoreUnavailable("server closed the connection")
        return await super().finish_many(outcomes)


async def test_a_store_outage_delays_work_and_loses_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FlakyStore(claims_down=3, finishes_down=2)
    app = hr.App("memory://", store=store)
    done: list[str] = []

    @app.task()
    async def work(ctx: hr.Context, ref: str) -> None:
        done.append(ref)

    caplog.set_level(logging.CRITICAL, logger="headrace.worker")
    async with app:
        task_id = await work.submit("a")
        await hr.Worker(app).drain()
        record = await app.store.get(task_id)
    assert done == ["a"]
    assert record.state is TaskState.SUCCEEDED
    assert record.attempt == 1


class HeldOutcomes(SQLiteStore):
    """An in-memory store whose outcome writes wait until `written` is set."""

    def __init__(self) -> None:
        super().__init__(":memory:")
        self.written = asyncio.Event()

    async def finish_many(self, outcomes: Sequence[tuple[Lease, Outcome]]) -> Any:
        await self.written.wait()
        return await super().finish_many(outcomes)


async def test_a_slot_runs_its_next_task_while_the_outcome_is_written() -> None:
    store = HeldOutcomes()
    app = hr.App("memory://", store=store)
    started: list[str] = []

    @app.task(gates=["g"])
    async def work(ctx: hr.Context, ref: str) -> None:
        started.append(ref)

    app.gate("g", concurrency=3)
    async with app:
        await app.submit([work.spec(f"t{i}") for i in range(10)])
        worker = hr.Worker(app, slots=2)
        draining = asyncio.create_task(worker.drain())
        await asyncio.sleep(5)
        # Two handlers returned with none left running: their outcomes are written at once
        # (held here) while a slot takes the one task the gate still admits. Until written,
        # outcomes keep their leases, and their tickets hold the gate's cap.
        assert len(started) == 3
        counts = await app.store.counts()
        assert counts[TaskState.RUNNING] == 3
        assert worker.stats.peak_busy == 2
        store.written.set()
        stats = await draining
        [gate] = await app.store.gate_statistics()
    assert sorted(started) == sorted(f"t{i}" for i in range(10))
    assert stats.succeeded == 10
    assert stats.peak_busy == 2
    assert gate.peak_in_flight == 3


class CountedClaims(SQLiteStore):
    """An in-memory store that counts outcomes recorded by claims and on their own."""

    def __init__(self) -> None:
        super().__init__(":memory:")
        self.with_claims = 0
        self.alone = 0

    async def claim(
        self,
        worker: str,
        limit: int,
        *,
        lease_for: float,
        kinds: Collection[str] | None = None,
        alone: bool = True,
        finished: Sequence[tuple[Lease, Outcome]] = (),
        within: Sequence[KindLimit] = (),
        memory: MemoryRoom | None = None,
        ahead: int = 0,
    ) -> ClaimResult:
        self.with_claims += len(finished)
        return await super().claim(
            worker,
            limit,
            lease_for=lease_for,
            kinds=kinds,
            alone=alone,
            finished=finished,
            within=within,
            memory=memory,
            ahead=ahead,
        )

    async def finish_many(self, outcomes: Sequence[tuple[Lease, Outcome]]) -> Any:
        self.alone += len(outcomes)
        return await super().finish_many(outcomes)


async def test_a_busy_worker_records_outcomes_with_the_claims_that_refill_their_slots() -> None:
    store = CountedClaims()
    app = hr.App("memory://", store=store)

    @app.task()
    async def work(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(0.01 * (1 + int(ref[1:]) % 3))  # handlers end one by one

    async with app:
        await app.submit([work.spec(f"t{i}") for i in range(40)])
        stats = await hr.Worker(app, slots=4).drain()
        counts = await app.store.counts()
    assert stats.succeeded == counts[TaskState.SUCCEEDED] == 40
    # While other handlers run, an outcome waits for the claim that refills its slot; only
    # those written when none runs (the last ones) go on their own.
    assert store.with_claims >= 30
    assert store.alone <= 10


async def test_an_outcome_is_written_at_once_when_no_other_handler_runs() -> None:
    store = CountedClaims()
    app = hr.App("memory://", store=store)

    @app.task()
    async def work(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(0.01)  # all end together: the last one finds none running

    async with app:
        await app.submit([work.spec(f"t{i}") for i in range(8)])
        stats = await hr.Worker(app, slots=4).drain()
    assert stats.succeeded == 8
    assert store.with_claims == 0  # written beside the claims, not inside them
    assert store.alone == 8


async def test_a_bare_decorator_and_retry_options_keep_what_was_given() -> None:
    app = hr.App("memory://")

    @app.task
    async def plain(ctx: hr.Context, ref: str) -> None:
        return None

    @app.task(max_attempts=2, retry=hr.RetryPolicy(max_delay=5.0))
    async def capped(ctx: hr.Context, ref: str) -> None:
        return None

    assert app.definition("plain") is plain
    assert capped.options.retry.max_attempts == 2
    assert capped.options.retry.max_delay == 5.0


async def test_a_poller_may_say_when_to_look_again_in_words() -> None:
    app = hr.App("memory://")
    seen: list[float] = []

    async def check(ctx: hr.Context, remote_id: str) -> hr.Result | hr.Pending:
        seen.append(now())
        return hr.Result() if len(seen) == 2 else hr.Pending(after="30s")

    @app.task(poll=check)
    async def job(ctx: hr.Context, ref: str) -> hr.RemoteWait:
        return ctx.await_remote("r1", every="1s")

    async with app:
        await job.submit("x")
        await hr.Worker(app).drain()
    assert seen[1] - seen[0] == pytest.approx(30.0, abs=0.01)


def test_a_gate_template_needs_its_field() -> None:
    app = hr.App("memory://")
    app.gate("event:*", concurrency=2)

    @app.task(gates=["event:{group}"])
    async def upload(ctx: hr.Context, ref: str) -> None:
        return None

    assert upload.spec("u1", group="wedding").gates == ("event:wedding",)
    with pytest.raises(hr.ConfigError, match=r"event:\{group\}"):
        upload.spec("u1")
    with pytest.raises(hr.ConfigError, match="unknown field"):
        upload.spec("u1", group="wedding", gates=["event:{contributor}"])


async def test_drain_waits_only_for_its_own_kinds() -> None:
    store = SQLiteStore.in_memory()
    ours, theirs = hr.App("memory://", store=store), hr.App("memory://", store=store)

    @ours.task()
    async def mine(ctx: hr.Context, ref: str) -> None:
        return None

    @theirs.task()
    async def other(ctx: hr.Context, ref: str) -> None:
        return None

    async with ours, theirs:
        await mine.submit("a")
        await other.submit("b")
        await hr.Worker(ours).drain()
        counts = await store.counts()
    assert counts[TaskState.SUCCEEDED] == 1
    assert counts[TaskState.READY] == 1


class CountingStore(SQLiteStore):
    """An in-memory store that records when each claim happened."""

    def __init__(self) -> None:
        super().__init__(":memory:")
        self.claims: list[float] = []

    async def claim(self, *args: Any, **kwargs: Any) -> ClaimResult:
        self.claims.append(asyncio.get_running_loop().time())
        return await super().claim(*args, **kwargs)


async def test_an_outcome_that_frees_nothing_costs_no_claim_and_one_that_does_wakes_at_once() -> (
    None
):
    store = CountingStore()
    app = hr.App("memory://", store=store)
    started: dict[str, float] = {}

    @app.task()
    async def work(ctx: hr.Context, ref: str) -> None:
        started[ref] = now()
        await asyncio.sleep(1.0)

    async with app:
        first = await work.submit("alone")
        await work.submit("after", key="after", after=[first])
        worker = hr.Worker(app, slots=2, idle="10s")
        running = asyncio.create_task(worker.run())
        await asyncio.sleep(30.0)
        worker.stop()
        await running
    assert started == {"alone": 0.0, "after": 1.0}  # the dependent starts when it may
    # Claims: at the start, when "alone" made "after" ready, and on the idle timer; none for
    # the outcome of "after", which freed nothing.
    assert [t for t in store.claims if 2.0 <= t < 10.0] == []
