"""The studio scenario: five episodes at once, a low-tier batch, and a rush episode mid-run.

One runner serves the `headrace demo` command (real time, SQLite, the simulator over loopback
HTTP), the tests and the benchmarks (virtual time, memory store, the simulator in process).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from headrace.pipelines.providers import MiniMaxClient
from headrace.pipelines.providersim import Latency
from headrace.pipelines.studio import Studio, StudioConfig, build, lower_bound
from headrace.policy.errors import ConfigError, ErrorClass
from headrace.policy.gate import GateStatistics
from headrace.policy.redact import hide_passwords
from headrace.policy.tiers import Tier
from headrace.runtime.app import App
from headrace.runtime.worker import Worker, WorkerStats
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import Attempt, AttemptOutcome, GroupReport, TaskRecord

POSTERS = "posters"


@dataclass(frozen=True)
class Scenario:
    episodes: int = 5
    shots: int = 6
    low_batch: int = 8
    rush_after_windows: float = 1.5
    slots: int = 4
    aging_windows: float = 2.0
    window: float = 6.0
    hold_video_slot: bool = False
    seed: int = 0

    @property
    def config(self) -> StudioConfig:
        return StudioConfig(
            window=self.window, shots=self.shots, hold_video_slot=self.hold_video_slot
        )

    @property
    def rush_at(self) -> float:
        return self.rush_after_windows * self.window

    @property
    def rush_episode(self) -> str:
        return f"ep{self.episodes + 1}"

    def calls(self) -> dict[str, int]:
        shots = (self.episodes + 1) * self.shots
        return {"image": shots + self.low_batch, "speech": shots, "video": shots}


@dataclass(frozen=True)
class ScenarioReport:
    scenario: Scenario
    makespan: float
    lower_bound: float
    groups: tuple[GroupReport, ...]
    gates: tuple[GateStatistics, ...]
    rush_jumps: int
    promotions: int
    promoted_to_rush: int
    rate_limited_responses: int
    worker: WorkerStats
    first_jammed: str | None
    started_at: float = 0.0
    retry_delays: tuple[float, ...] = ()  # from each retried attempt's end to the next start

    @property
    def ratio(self) -> float:
        return self.makespan / self.lower_bound

    @property
    def all_succeeded(self) -> bool:
        return all(g.succeeded == g.total for g in self.groups)


Tick = Callable[[Sequence[GroupReport], float], Awaitable[None] | None]


async def run_scenario(
    scenario: Scenario,
    client: MiniMaxClient,
    *,
    url: str = "memory://",
    latency: Latency | None = None,
    on_tick: Tick | None = None,
    tick: float = 0.25,
) -> ScenarioReport:
    """Run the scenario to the end on a fresh app over `url`, calling providers via `client`."""
    app = App(url, aging_step=scenario.aging_windows * scenario.window)
    studio = build(app, client, scenario.config)
    async with app:
        await _require_empty(app.store, url)
        start = await app.store.now()
        worker = Worker(app, slots=scenario.slots, seed=scenario.seed, lease="30s")
        await _submit_opening(studio, scenario)
        running = asyncio.create_task(worker.drain(fail_fast=False))
        monitor = (
            asyncio.create_task(_monitor(app.store, on_tick, tick, start)) if on_tick else None
        )
        await _rush(studio, scenario, running)
        stats = await running
        if monitor is not None:
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
        return await _report(app.store, scenario, latency or Latency(), start, stats)


async def _require_empty(store: Store, url: str) -> None:
    """A report is about one run: its makespan, gate counters, peaks and first jam would mix
    with an earlier run's (or another app's) in a store that already holds tasks."""
    held = sum((await store.counts()).values())
    if held:
        raise ConfigError(
            f"store {hide_passwords(url)}: it already holds {held} tasks (an earlier run?); the "
            "studio scenario needs a store of its own: give a new file, schema or database"
        )


async def _submit_opening(studio: Studio, scenario: Scenario) -> None:
    for n in range(1, scenario.episodes + 1):
        await studio.script.submit(f"ep{n}", group=f"ep{n}", flow=f"ep{n}", key=f"ep{n}:script")
    for n in range(1, scenario.low_batch + 1):
        ref = f"{POSTERS}/p{n:02d}"
        await studio.poster.submit(ref, group=POSTERS, flow=POSTERS, tier=Tier.LOW, key=ref)


async def _rush(studio: Studio, scenario: Scenario, running: asyncio.Task[WorkerStats]) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(scenario.rush_at):
            await asyncio.shield(running)
    if running.done():
        return
    episode = scenario.rush_episode
    await studio.script.submit(
        episode, group=episode, flow=episode, tier=Tier.RUSH, key=f"{episode}:script"
    )


async def _monitor(store: Store, on_tick: Tick, tick: float, start: float) -> None:
    while True:
        reports = [await store.group_report(g) for g in await store.groups()]
        shown = on_tick(reports, await store.now() - start)
        if shown is not None:
            await shown
        await asyncio.sleep(tick)


async def _report(
    store: Store, scenario: Scenario, latency: Latency, start: float, stats: WorkerStats
) -> ScenarioReport:
    tasks = await store.tasks(limit=1_000_000)
    history = {t.id: await store.attempts(t.id) for t in tasks}
    first_start = {tid: runs[0].started_at for tid, runs in history.items() if runs}
    ended = [a.ended_at for runs in history.values() for a in runs if a.ended_at is not None]
    gates = tuple(await store.gate_statistics())
    jammed = [g for g in gates if g.first_blocked_at is not None]
    rate_limited = sum(
        1 for runs in history.values() for a in runs if a.error_class is ErrorClass.RATE_LIMITED
    )
    return ScenarioReport(
        scenario=scenario,
        makespan=max(ended, default=start) - start,
        lower_bound=lower_bound(
            scenario.config, latency, scenario.calls(), rush_at=scenario.rush_at
        ),
        groups=tuple([await store.group_report(g) for g in await store.groups()]),
        gates=gates,
        rush_jumps=rush_jumps(tasks, first_start),
        promotions=sum(1 for t in tasks if t.promoted_at is not None),
        promoted_to_rush=sum(
            1 for t in tasks if t.submitted_tier is not Tier.RUSH and t.tier is Tier.RUSH
        ),
        rate_limited_responses=rate_limited,
        worker=stats,
        first_jammed=min(jammed, key=lambda g: g.first_blocked_at or 0.0).name if jammed else None,
        started_at=start,
        retry_delays=retry_delays(history.values()),
    )


def retry_delays(histories: Iterable[Sequence[Attempt]]) -> tuple[float, ...]:
    delays = []
    for runs in histories:
        for failed, again in itertools.pairwise(runs):
            if failed.outcome is AttemptOutcome.RETRY and failed.ended_at is not None:
                delays.append(again.started_at - failed.ended_at)
    return tuple(delays)


def rush_jumps(tasks: Sequence[TaskRecord], first_start: dict[int, float]) -> int:
    """How many times a rush task started before a lower-tier task on the same gates that was
    queued before the rush task was: the line it jumped."""
    rush = [t for t in tasks if t.submitted_tier is Tier.RUSH and t.id in first_start]
    queued = [t for t in tasks if t.submitted_tier is not Tier.RUSH and t.ready_since is not None]
    return sum(
        1
        for r in rush
        for o in queued
        if o.gates == r.gates
        and (o.ready_since or 0.0) < (r.ready_since or r.created_at)
        and first_start[r.id] < first_start.get(o.id, math.inf)
    )
