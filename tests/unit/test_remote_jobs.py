"""Remote jobs whose outcome is unknown are never submitted again blindly; attempt time limits;
what the worker does when the store refuses an outcome or a renewal races one. On the virtual
clock, over the memory store."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

import headrace as hr
from headrace.pipelines.providers import MiniMaxClient, in_process
from headrace.pipelines.providersim import ProviderSimulator
from headrace.runtime import remote
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import ACTIVE, AttemptOutcome, Lease, Outcome, TaskState
from headrace.store.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio


def now() -> float:
    return asyncio.get_running_loop().time()


@dataclass
class Vendor:
    """A remote service whose jobs run until told: it counts submissions and cancels."""

    submitted: list[str] = field(default_factory=list)  # the idempotency keys sent
    running: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    cancelled: list[str] = field(default_factory=list)
    status_errors: int = 0  # the next status calls that fail (a 503)

    def submit(self, key: str) -> str:
        self.submitted.append(key)
        job = f"job-{len(self.submitted)}"
        self.running.add(job)
        return job

    def status(self, job: str) -> str:
        if self.status_errors:
            self.status_errors -= 1
            raise hr.Transient("status call answered 503", code="http_503")
        if job in self.failed:
            raise hr.RemoteFailed("the vendor failed the job", code="job_failed")
        return "done" if job in self.done else "running"


def remote_app(vendor: Vendor, *, cancel: bool = False, timeout: str = "10s") -> hr.App:
    app = hr.App("memory://")
    app.gate("provider:video", concurrency=1)

    async def check(ctx: hr.Context, job: str) -> hr.Result | hr.Pending:
        return hr.Result() if vendor.status(job) == "done" else hr.Pending()

    async def stop(ctx: hr.Context, job: str) -> None:
        vendor.running.discard(job)
        vendor.cancelled.append(job)

    @app.task(gates=["provider:video"], poll=check, cancel=stop if cancel else None)
    async def render(ctx: hr.Context, ref: str) -> hr.RemoteWait:
        job = vendor.submit(ctx.idempotency_key)
        return ctx.await_remote(job, every="1s", timeout=timeout)

    return app


async def wait_for(condition: object, *, within: float = 600.0) -> None:
    deadline = now() + within
    while not condition():  # type: ignore[operator]
        assert now() < deadline, "timed out"
        await asyncio.sleep(0.5)


async def active(store: Store) -> int:
    """Tasks not yet finished."""
    counts = await store.counts()
    return sum(counts[state] for state in ACTIVE)


async def test_a_job_past_its_timeout_without_a_cancel_hook_is_polled_on_never_resubmitted() -> (
    None
):
    vendor = Vendor()
    app = remote_app(vendor)
    async with app:
        task_id = await app.definition("render").submit("clip")
        worker = hr.Worker(app, slots=1)
        running = asyncio.create_task(worker.run())
        await asyncio.sleep(60.0)  # six times the job's timeout
        record = await app.store.get(task_id)
        [gate] = await app.store.gate_statistics()
        assert (record.state, record.error_code, record.remote_id) == (
            TaskState.WAITING,
            "remote_timeout",
            "job-1",
        )
        assert gate.in_flight == 1  # the job may still run: its ticket is kept
        vendor.done.add("job-1")
        await wait_for(lambda: worker.stats.succeeded == 1)
        worker.stop()
        await running
    assert vendor.submitted == [vendor.submitted[0]]  # one submission, ever


async def test_a_cancel_hook_settles_an_overdue_job_and_the_next_job_has_a_new_key() -> None:
    vendor = Vendor()
    app = remote_app(vendor, cancel=True)
    async with app:
        task_id = await app.definition("render").submit("clip")
        worker = hr.Worker(app, slots=1, seed=1)
        running = asyncio.create_task(worker.run())
        await wait_for(lambda: len(vendor.submitted) == 2)
        assert vendor.cancelled == ["job-1"]  # cancelled before the second was submitted
        vendor.done.add("job-2")
        await wait_for(lambda: worker.stats.succeeded == 1)
        worker.stop()
        await running
        attempts = await app.store.attempts(task_id)
    first, second = vendor.submitted
    assert first != second and first.rsplit("-", 1)[0] == second.rsplit("-", 1)[0]
    assert [a.outcome for a in attempts] == [AttemptOutcome.RETRY, AttemptOutcome.SUCCEEDED]
    assert attempts[0].code == "remote_timeout"


async def test_a_failed_check_keeps_the_job_and_its_ticket() -> None:
    vendor = Vendor(status_errors=3)
    app = remote_app(vendor)
    async with app:
        task_id = await app.definition("render").submit("clip")
        worker = hr.Worker(app, slots=1)
        running = asyncio.create_task(worker.run())
        await wait_for(lambda: vendor.status_errors == 0)
        record = await app.store.get(task_id)
        assert (record.state, record.error_code) == (TaskState.WAITING, "http_503")
        vendor.done.add("job-1")
        await wait_for(lambda: worker.stats.succeeded == 1)
        worker.stop()
        await running
    assert len(vendor.submitted) == 1


async def test_a_job_the_poller_says_failed_is_followed_by_a_new_one() -> None:
    vendor = Vendor()
    app = remote_app(vendor)
    vendor.failed.add("job-1")
    async with app:
        await app.definition("render").submit("clip")
        worker = hr.Worker(app, slots=1, seed=1)
        running = asyncio.create_task(worker.run())
        await wait_for(lambda: len(vendor.submitted) == 2)
        vendor.done.add("job-2")
        await wait_for(lambda: worker.stats.succeeded == 1)
        worker.stop()
        await running
    assert len(set(vendor.submitted)) == 2  # a known failure: a new job, under a new key


async def test_a_submission_whose_answer_never_came_is_found_again_by_its_key() -> None:
    """The vendor made the job but its answer came too late: the attempt ran past its time
    limit and the next one sends the same idempotency key, so the vendor names the same job."""
    sim = ProviderSimulator(inject="slowsubmit")
    app = hr.App("memory://")
    async with in_process(sim) as http:
        client = MiniMaxClient(http, "sim-key")

        async def check(ctx: hr.Context, job: str) -> hr.Result | hr.Pending:
            status = await client.query_video(job)
            return hr.Result() if status.done else hr.Pending()

        @app.task(poll=check, timeout="2s")
        async def video(ctx: hr.Context, ref: str) -> hr.RemoteWait:
            job = await client.submit_video(ref, idempotency_key=ctx.idempotency_key)
            return ctx.await_remote(job, every="1s")

        async with app:
            task_id = await video.submit("a harbour at dawn")
            await hr.Worker(app, slots=1, seed=1).drain()
            attempts = await app.store.attempts(task_id)
            record = await app.store.get(task_id)
    stats = sim.stats()["video"]
    assert record.state is TaskState.SUCCEEDED
    assert [a.code for a in attempts] == ["timeout", None]
    assert (sim.jobs, stats.accepted, stats.replayed) == (1, 2, 1)


async def test_an_attempt_past_its_time_limit_is_retried_and_returns_its_ticket() -> None:
    app = hr.App("memory://")
    app.gate("provider:image", concurrency=1)
    starts: list[float] = []

    @app.task(gates=["provider:image"], timeout="5s", max_attempts=3)
    async def slow(ctx: hr.Context, ref: str) -> None:
        starts.append(now())
        await asyncio.sleep(60.0 if ctx.attempt < 3 else 1.0)

    async with app:
        task_id = await slow.submit("a")
        await hr.Worker(app, slots=2).drain()
        attempts = await app.store.attempts(task_id)
        [gate] = await app.store.gate_statistics()
    assert [a.code for a in attempts] == ["timeout", "timeout", None]
    assert all(later - earlier < 10.0 for earlier, later in itertools.pairwise(starts))
    assert gate.in_flight == 0


async def test_a_workers_default_time_limit_applies_where_a_stage_sets_none() -> None:
    app = hr.App("memory://")

    @app.task(max_attempts=1)
    async def slow(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(3600.0)

    async with app:
        task_id = await slow.submit("a")
        await hr.Worker(app, timeout="30s").drain(fail_fast=False)
        record = await app.store.get(task_id)
    assert (record.state, record.error_code) == (TaskState.DEAD, "timeout")


async def test_an_outcome_the_store_refuses_leaves_the_task_dead_saying_why() -> None:
    """A handler spawns a successor under a key that already names another task: the store
    refuses the whole outcome. No later attempt can do better, so the task is dead at once,
    with the reason."""
    app = hr.App("memory://")

    @app.task()
    async def next_stage(ctx: hr.Context, ref: str) -> None:
        return None

    @app.task(max_attempts=5)
    async def parent(ctx: hr.Context, ref: str) -> None:
        ctx.spawn(next_stage, "mine", key="taken")

    async with app:
        await next_stage.submit("someone else's", key="taken")
        task_id = await parent.submit("p")
        await hr.Worker(app).drain(fail_fast=False)
        record = await app.store.get(task_id)
        attempts = await app.store.attempts(task_id)
    assert record.state is TaskState.DEAD
    assert record.error_code == "outcome_refused:key_conflict"
    assert len(attempts) == 1


class RenewAfterFinish(SQLiteStore):
    """A store where a renewal sent while an outcome is being written runs after that outcome
    commits, and its answer comes back before the writer hears of its commit."""

    def __init__(self) -> None:
        super().__init__(":memory:")
        self.finishing = asyncio.Event()
        self.committed = asyncio.Event()

    async def finish_many(
        self, outcomes: Sequence[tuple[Lease, Outcome]]
    ) -> list[hr.HeadraceError | None]:
        self.finishing.set()
        results = await super().finish_many(outcomes)
        self.committed.set()
        await asyncio.sleep(0.2)  # the commit's answer is slow to arrive
        return results

    async def renew(self, leases: Sequence[Lease], *, lease_for: float) -> list[Lease | None]:
        if self.finishing.is_set():
            await self.committed.wait()
        return await super().renew(leases, lease_for=lease_for)


async def test_a_renewal_racing_a_committed_outcome_is_not_a_lost_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RenewAfterFinish()
    app = hr.App("memory://", store=store)

    @app.task()
    async def work(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(2.9)  # the outcome is written as the renewal at 3 s goes out

    async with app:
        await work.submit("a")
        with caplog.at_level(logging.WARNING, logger="headrace"):
            stats = await hr.Worker(app, lease="9s").drain()
    assert stats.leases_lost == 0
    assert "lease lost" not in caplog.text


async def test_a_refused_stamp_abandons_the_attempt_before_its_call() -> None:
    app = hr.App("memory://")
    app.gate("provider:image", concurrency=1, rate="10/1m")
    calls: list[str] = []

    @app.task(gates=["provider:image"])
    async def image(ctx: hr.Context, ref: str) -> None:
        await app.store.cancel(ctx.task.id)  # someone cancels it while it starts
        await ctx.started()
        calls.append(ref)

    async with app:
        await image.submit("a")
        stats = await hr.Worker(app).drain()
    assert calls == [] and stats.leases_lost == 1


async def test_a_retry_is_an_info_line_a_success_a_debug_one_and_the_end_a_progress_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = hr.App("memory://")

    @app.task(max_attempts=2)
    async def flaky(ctx: hr.Context, ref: str) -> None:
        if ctx.attempt == 1:
            raise hr.Transient("try again", code="blip")

    async with app:
        await flaky.submit("a")
        with caplog.at_level(logging.DEBUG, logger="headrace"):
            worker = hr.Worker(app, seed=1, name="w1")
            await worker.drain()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "headrace.worker"]
    assert len(lines) == 3
    assert lines[0][0] == logging.INFO
    assert lines[0][1].startswith("task 1 flaky a attempt 1: blip (transient), retry in")
    assert lines[1][0] == logging.DEBUG
    assert lines[1][1].startswith("task 1 flaky a: succeeded in") and "(attempt 2)" in lines[1][1]
    assert lines[2][0] == logging.INFO
    assert lines[2][1].startswith("worker w1: 2 tasks in its last ")
    assert lines[2][1].endswith(": 1 succeeded, 1 retried; 0 running")


async def test_a_cancel_hook_that_fails_leaves_the_job_checked_on() -> None:
    """Whatever a cancel hook raises (here: the vendor refuses to cancel), the job may still
    run: the task keeps waiting with its ticket, and no second job is submitted."""
    vendor = Vendor()
    app = remote_app(vendor)

    @app.definition("render").cancel
    async def refuse(ctx: hr.Context, job: str) -> None:
        raise hr.Fatal("this vendor cannot cancel a job", code="cannot_cancel")

    async with app:
        task_id = await app.definition("render").submit("clip")
        worker = hr.Worker(app, slots=1)
        running = asyncio.create_task(worker.run())
        await asyncio.sleep(30.0)
        record = await app.store.get(task_id)
        assert (record.state, record.error_code) == (TaskState.WAITING, "remote_timeout")
        vendor.done.add("job-1")
        await wait_for(lambda: worker.stats.succeeded == 1)
        worker.stop()
        await running
    assert len(vendor.submitted) == 1


async def test_only_a_poller_saying_the_job_failed_leads_to_a_new_job() -> None:
    """A check failing with any code, even one that reads like a timeout, keeps the job."""
    vendor = Vendor()
    app = hr.App("memory://")
    checks: list[float] = []

    async def flaky_check(ctx: hr.Context, job: str) -> hr.Result | hr.Pending:
        checks.append(now())
        if len(checks) < 3:
            raise hr.Transient("status call timed out", code="remote_timeout")
        return hr.Result()

    @app.task(poll=flaky_check)
    async def render(ctx: hr.Context, ref: str) -> hr.RemoteWait:
        return ctx.await_remote(vendor.submit(ctx.idempotency_key), every="1s")

    async with app:
        await render.submit("clip")
        stats = await hr.Worker(app).drain()
    assert len(vendor.submitted) == 1 and stats.succeeded == 1 and len(checks) == 3


async def test_a_delivered_outcome_resolves_a_stage_without_a_poller() -> None:
    app = hr.App("memory://")
    submitted: list[str] = []

    @app.task(max_attempts=2)
    async def render(ctx: hr.Context, ref: str) -> hr.RemoteWait:
        submitted.append(ref)
        return ctx.await_remote(f"job-{ref}-{len(submitted)}", every="1h")

    async with app:
        [ok, bad] = [await render.submit(ref) for ref in ("a", "b")]
        worker = hr.Worker(app, idle="0.1s")
        running = asyncio.create_task(worker.run())
        await wait_for(lambda: len(submitted) == 2)
        await asyncio.sleep(1)
        assert (await app.store.get(ok)).state is TaskState.WAITING
        woken = await remote.deliver(app.store, "vidgen", "job-a-1", succeeded=True)
        assert woken == 1
        await remote.deliver(app.store, "vidgen", "job-b-2", succeeded=False)
        began = now()
        while await active(app.store) > 1:
            assert now() - began < 600, "timed out"
            await asyncio.sleep(0.5)
        assert now() - began < 5  # within the worker's idle, not the hour between checks
        assert (await app.store.get(ok)).state is TaskState.SUCCEEDED
        # b's job failed: a new job is submitted (its second attempt), left waiting.
        await wait_for(lambda: len(submitted) == 3)
        worker.stop()
        await running
        record = await app.store.get(bad)
        assert (record.state, record.remote_id) == (TaskState.WAITING, "job-b-3")


async def test_a_poller_reads_the_delivery_instead_of_asking_the_provider() -> None:
    app = hr.App("memory://")
    asked: list[str] = []
    seen: list[remote.Delivery | None] = []

    async def check(ctx: hr.Context, job: str) -> hr.Result | hr.Pending:
        seen.append(ctx.delivery)
        if ctx.delivery is not None:
            return hr.Result(cost=float(ctx.delivery.result["seconds"]))
        asked.append(job)
        return hr.Pending()

    @app.task(poll=check)
    async def render(ctx: hr.Context, ref: str) -> hr.RemoteWait:
        return ctx.await_remote("job-1", every="30s")

    async with app:
        task_id = await render.submit("a")
        worker = hr.Worker(app, idle="0.1s")
        running = asyncio.create_task(worker.run())
        await wait_for(lambda: len(asked) == 1, within=60)
        await remote.deliver(app.store, "vidgen", "job-1", succeeded=True, result={"seconds": 6})
        await wait_for(lambda: any(seen), within=5)
        worker.stop()
        await running
        record = await app.store.get(task_id)
    assert record.state is TaskState.SUCCEEDED and asked == ["job-1"]
    assert seen[-1] == remote.Delivery("vidgen", True, {"seconds": 6})
