"""The seed lab's checks on the studio scenario, on the virtual clock with the simulator as
referee: the adapters speak HTTP to it in process, exactly as they would to the vendor."""

from __future__ import annotations

import pytest

from headrace.pipelines.providers import MiniMaxClient, in_process
from headrace.pipelines.providersim import STUDIO_QUOTAS, ProviderSimulator
from headrace.pipelines.studio_scenario import Scenario, ScenarioReport, run_scenario

pytestmark = pytest.mark.anyio

PROVIDER_GATES = ("provider:image", "provider:speech", "provider:video")


async def run(
    scenario: Scenario, inject: frozenset[str] = frozenset()
) -> tuple[ScenarioReport, ProviderSimulator]:
    sim = ProviderSimulator(scenario.window, inject=inject, seed=scenario.seed)
    async with in_process(sim) as http:
        report = await run_scenario(scenario, MiniMaxClient(http, "sim-key"))
    return report, sim


async def test_gates_block_by_token_and_hold_their_caps() -> None:
    report, sim = await run(Scenario())
    gates = {g.name: g for g in report.gates}
    for name in PROVIDER_GATES:
        gate = gates[name]
        assert gate.concurrency is not None
        assert 0 < gate.peak_in_flight <= gate.concurrency
        assert gate.rate_limited == 0
    assert gates["provider:image"].blocked_by_token > 0
    assert gates["provider:speech"].blocked_by_token > 0
    for provider, stats in sim.stats().items():
        quota = STUDIO_QUOTAS[provider]
        assert stats.rejected == 0
        assert stats.max_in_window <= quota.rpm
        assert stats.max_concurrent <= quota.concurrency
    assert report.rate_limited_responses == 0
    assert report.all_succeeded
    assert report.makespan >= report.lower_bound


async def test_with_five_episodes_the_image_gate_jams_first() -> None:
    report, _ = await run(Scenario(episodes=5))
    assert report.first_jammed == "provider:image"


async def test_rate_limit_injection_backs_off_with_jitter_penalises_and_recovers() -> None:
    report, sim = await run(Scenario(), frozenset({"ratelimit"}))
    assert sim.stats()["image"].injected == 1
    assert sim.stats()["speech"].injected == 2
    gates = {g.name: g for g in report.gates}
    assert gates["provider:image"].rate_limited == 1
    assert gates["provider:speech"].rate_limited == 2
    assert report.rate_limited_responses == 3
    backoffs = list(report.worker.backoffs)
    assert len(backoffs) == 3
    assert len(set(backoffs)) == 3  # jitter: no two retries in lockstep
    assert all(0.3 * 0.7 <= d <= 0.3 * 1.3 for d in backoffs)
    assert all(d >= 0.3 * 0.7 for d in report.retry_delays)  # no retry started early
    assert report.all_succeeded


async def test_rush_jumps_the_line_and_aging_stops_at_normal() -> None:
    report, _ = await run(Scenario())
    assert report.rush_jumps > 0
    assert report.promotions == Scenario().low_batch
    assert report.promoted_to_rush == 0
    posters = next(g for g in report.groups if g.group == "posters")
    assert posters.succeeded == posters.total


async def test_returning_the_video_slot_beats_holding_it() -> None:
    returned, _ = await run(Scenario(slots=2))
    held, _ = await run(Scenario(slots=2, hold_video_slot=True))
    ratio = held.makespan / returned.makespan
    print(
        f"\nvideo slot returned: {returned.makespan:.1f}s, held: {held.makespan:.1f}s, "
        f"held/returned = {ratio:.2f}"
    )
    assert returned.all_succeeded
    assert held.all_succeeded
    assert ratio > 1.1
