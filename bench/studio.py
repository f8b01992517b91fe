"""Studio makespan against its quota lower bound, on the virtual clock (memory store, the
simulator in process); and what holding the video slot costs against returning it."""

from __future__ import annotations

from dataclasses import dataclass

from headrace.pipelines.providers import MiniMaxClient, in_process
from headrace.pipelines.providersim import ProviderSimulator
from headrace.pipelines.studio_scenario import Scenario, ScenarioReport, run_scenario
from headrace.sim.loop import run


@dataclass(frozen=True)
class StudioFigure:
    case: str
    episodes: int
    slots: int
    makespan_s: float
    lower_bound_s: float
    ratio: float
    rate_limited: int
    all_succeeded: bool


async def _scenario(scenario: Scenario, inject: frozenset[str]) -> ScenarioReport:
    sim = ProviderSimulator(scenario.window, inject=inject, seed=scenario.seed)
    async with in_process(sim) as http:
        return await run_scenario(scenario, MiniMaxClient(http, "bench-key"))


def measure(case: str, scenario: Scenario, inject: frozenset[str] = frozenset()) -> StudioFigure:
    report = run(_scenario(scenario, inject), debug=False)
    return StudioFigure(
        case=case,
        episodes=scenario.episodes + 1,
        slots=scenario.slots,
        makespan_s=round(report.makespan, 2),
        lower_bound_s=round(report.lower_bound, 2),
        ratio=round(report.ratio, 3),
        rate_limited=report.rate_limited_responses,
        all_succeeded=report.all_succeeded,
    )


def studio_figures(quick: bool) -> list[StudioFigure]:
    figures = [
        measure("demo scenario", Scenario()),
        measure("demo, ratelimit injected", Scenario(), frozenset({"ratelimit"})),
        measure("2 slots, video slot returned", Scenario(slots=2)),
        measure("2 slots, video slot held", Scenario(slots=2, hold_video_slot=True)),
    ]
    if not quick:
        figures.append(measure("20 episodes, 8 slots", Scenario(episodes=19, slots=8)))
        figures.append(measure("20 episodes, 60 s window", Scenario(episodes=19, window=60.0)))
    return figures
