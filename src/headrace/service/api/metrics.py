"""`GET /metrics`: the store's view in Prometheus text format, read at each scrape.

Every figure comes from the store, so one scrape of any API process says the same as another,
whatever process ran the work. Labels are stage names, cost classes, task states and gate
names (gates made from a template, one per session say, are summed under the template's name):
never an id, a token or anything a client sent.

| metric | type | labels |
| --- | --- | --- |
| `headrace_stage_tasks` | gauge | stage, class, state (pending, ready, running, waiting) |
| `headrace_stage_oldest_age_seconds` | gauge | stage, class: the oldest ready task's age |
| `headrace_stage_age_seconds` | gauge histogram | stage, class: ready tasks' ages (sampled) |
| `headrace_tasks` | gauge | state: every task by state (running, succeeded, dead, ...) |
| `headrace_attempts_total` | counter | outcome: attempts ended (the failed ones: retry, dead) |
| `headrace_remote_jobs_unresolved` | gauge | tasks waiting on a remote job |
| `headrace_gate_granted_total` | counter | gate |
| `headrace_gate_refused_total` | counter | gate, reason (token, cap) |
| `headrace_gate_rate_limited_total` | counter | gate: rate-limit answers that penalised it |
| `headrace_gate_in_flight` | gauge | gate: tickets out |

The store keeps the counts in tallies and reads the ages from an index, so a scrape costs about
the same with a thousand tasks as with ten million. The age histogram is built from a bounded
sample (store/ages.py): every ready task is counted, and the ages of a stage's oldest and newest
250 are exact; when a stage has more ready tasks than that, those in between are taken as spread
evenly between the two ends, so a bucket's bound that falls among them is an estimate.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from headrace.policy import gate as gating
from headrace.policy.gate import GateConfig, GateStatistics
from headrace.runtime.app import App
from headrace.store.ages import ReadyAges
from headrace.store.types import AttemptOutcome, StageStats, TaskState

AGE_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
STAGE_STATES = ("pending", "ready", "running", "waiting")


@dataclass(frozen=True)
class Snapshot:
    stages: Sequence[StageStats]
    ages: Mapping[str, ReadyAges]
    counts: Mapping[TaskState, int]
    attempts: Mapping[AttemptOutcome, int]
    gates: Sequence[GateStatistics]
    classes: Mapping[str, str]
    configs: Mapping[str, GateConfig]


async def snapshot(app: App) -> Snapshot:
    """The store's reads at once (a store with a pool of connections runs them side by side)."""
    store = app.store
    stages, ages, counts, attempts, gates = await asyncio.gather(
        store.stages(),
        store.ready_ages(),
        store.counts(),
        store.attempt_counts(),
        store.gate_statistics(),
    )
    return Snapshot(
        stages=stages,
        ages=ages,
        counts=counts,
        attempts=attempts,
        gates=gates,
        classes=app.cost_classes(),
        configs=dict(app.gates),
    )


class StoreCollector(Collector):
    def __init__(self, taken: Snapshot) -> None:
        self.taken = taken

    def collect(self) -> Iterator[Metric]:
        yield from self._stages()
        yield from self._tasks()
        yield from self._gates()

    def _stages(self) -> Iterator[Metric]:
        taken = self.taken
        depth = GaugeMetricFamily(
            "headrace_stage_tasks",
            "Unfinished tasks of a stage, by state",
            labels=["stage", "class", "state"],
        )
        oldest = GaugeMetricFamily(
            "headrace_stage_oldest_age_seconds",
            "Seconds the oldest ready task of a stage has waited",
            labels=["stage", "class"],
        )
        ages = GaugeHistogramMetricFamily(
            "headrace_stage_age_seconds",
            "Seconds each ready task of a stage has waited",
            labels=["stage", "class"],
        )
        for stage in taken.stages:
            labels = [stage.kind, taken.classes.get(stage.kind, "")]
            for state in STAGE_STATES:
                depth.add_metric([*labels, state], getattr(stage, state))
            oldest.add_metric(labels, stage.oldest_ready_age or 0.0)
            waited = taken.ages.get(stage.kind, ReadyAges(0))
            ages.add_metric(labels, buckets(waited), gsum_value=waited.total())
        yield depth
        yield oldest
        yield ages

    def _tasks(self) -> Iterator[Metric]:
        tasks = GaugeMetricFamily("headrace_tasks", "Tasks by state", labels=["state"])
        for state in TaskState:
            tasks.add_metric([state.value], self.taken.counts.get(state, 0))
        yield tasks
        attempts = CounterMetricFamily(
            "headrace_attempts",
            "Attempts ended, by outcome (failed: retry and dead)",
            labels=["outcome"],
        )
        for outcome in AttemptOutcome:
            if outcome is not AttemptOutcome.RUNNING:
                attempts.add_metric([outcome.value], self.taken.attempts.get(outcome, 0))
        yield attempts
        yield GaugeMetricFamily(
            "headrace_remote_jobs_unresolved",
            "Tasks waiting on a remote job whose outcome is not known yet",
            value=self.taken.counts.get(TaskState.WAITING, 0),
        )

    def _gates(self) -> Iterator[Metric]:
        totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for stats in self.taken.gates:
            name = template_of(stats.name, self.taken.configs)
            found = totals[name]
            found["granted"] += stats.granted
            found["token"] += stats.blocked_by_token
            found["cap"] += stats.blocked_by_concurrency
            found["rate_limited"] += stats.rate_limited
            found["in_flight"] += stats.in_flight
        granted = CounterMetricFamily(
            "headrace_gate_granted", "Tickets a gate granted", labels=["gate"]
        )
        refused = CounterMetricFamily(
            "headrace_gate_refused",
            "Starts a gate refused, by reason (token: its rate; cap: its concurrency)",
            labels=["gate", "reason"],
        )
        limited = CounterMetricFamily(
            "headrace_gate_rate_limited",
            "Rate-limit answers from the provider behind a gate (each one penalises it)",
            labels=["gate"],
        )
        in_flight = GaugeMetricFamily(
            "headrace_gate_in_flight", "Tickets a gate has out", labels=["gate"]
        )
        for name, found in sorted(totals.items()):
            granted.add_metric([name], found["granted"])
            refused.add_metric([name, "token"], found["token"])
            refused.add_metric([name, "cap"], found["cap"])
            limited.add_metric([name], found["rate_limited"])
            in_flight.add_metric([name], found["in_flight"])
        yield from (granted, refused, limited, in_flight)


def template_of(name: str, configs: Mapping[str, GateConfig]) -> str:
    """The declared gate a gate's statistics count under (`session:*` for `session:s1`)."""
    if name in configs:
        return name
    prefix, sep, _ = name.rpartition(":")
    while sep:
        if prefix + gating.TEMPLATE_SUFFIX in configs:
            return prefix + gating.TEMPLATE_SUFFIX
        prefix, sep, _ = prefix.rpartition(":")
    return "other"


def buckets(ages: ReadyAges) -> list[tuple[str, float]]:
    """Cumulative counts per upper bound, as a histogram's `le` buckets (whole tasks: a count
    among the unsampled ages is rounded)."""
    counted = [(f"{bound:g}", float(round(ages.at_most(bound)))) for bound in AGE_BUCKETS]
    return [*counted, ("+Inf", float(ages.count))]


def render(taken: Snapshot) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(taken))
    return generate_latest(registry)
