"""`GET /metrics`: Prometheus text format, read at each scrape.

Two kinds of series. The store-wide ones (stage depths and ages, tasks by state, attempts, gates)
come from the store, so any API process would read the same figures: were each of M processes
to export them, `sum(...)` over what Prometheus scraped would read M times the truth, and an
alert on them would fire once per process. So exactly one process at a time exports them: the
holder of the store's named lease `metrics` (`Store.take_lease`), taken or renewed by each
scrape of a process and held for `ApiSettings.metrics_lease` seconds. The holder keeps it while
Prometheus scrapes it (the lease outlasts the scrape interval); when it stops being scraped (it
stopped, or its target went away), the first other process scraped after the lease ran out
takes over. Every process exports its own process-local series besides: the `process_*` ones
(CPU, memory, open files) and `headrace_metrics_exporter`, 1 on the process that exported the
store's series in that scrape, else 0. A scrape renews the lease rather than a timer: a process
nobody scrapes must not hold it, or nobody would see the figures.

So whatever the query (`sum`, `max`, `avg`) and however many processes are scraped, each
store-wide series exists once: its value is the store's. It carries the exporter's `instance`
label, which changes when another process takes over; the docs' rules aggregate it away.

Labels are stage names, cost classes, task states and gate names (gates made from a template,
one per session say, are summed under the template's name): never an id, a token or anything
a client sent.

| metric | type | labels |
| --- | --- | --- |
| `headrace_stage_tasks` | gauge | stage, class, state (pending, ready, running, waiting) |
| `headrace_stage_oldest_age_seconds` | gauge | stage, class: the oldest ready task's age |
| `headrace_stage_age_seconds` | histogram | stage, class: ready tasks' ages now (sampled) |
| `headrace_tasks` | gauge | state: every task by state (running, succeeded, dead, ...) |
| `headrace_attempts_total` | counter | outcome: attempts ended (the failed ones: retry, dead) |
| `headrace_remote_jobs_unresolved` | gauge | tasks waiting on a remote job |
| `headrace_gate_granted_total` | counter | gate |
| `headrace_gate_refused_total` | counter | gate, reason (token, cap) |
| `headrace_gate_rate_limited_total` | counter | gate: rate-limit answers that penalised it |
| `headrace_gate_in_flight` | gauge | gate: tickets out |
| `headrace_metrics_exporter` | gauge | none: this process exported the above (1) or not (0) |

Every stage the app declares has its series, 0 while it has no task; so has every gate it
declares. A ready task's age counts from when it last became ready to run (store/protocol/ages.py).

The age histogram describes the ready tasks at the scrape, as a gauge would: read it with
`histogram_quantile` over its buckets as they are, never through `rate()`. PromQL takes the
ages within a bucket as spread evenly over it, so its quantile is off the exact one `GET
/v1/stages` reports by at most the bucket's width: the bounds (`AGE_BUCKETS`) are at most 1.5
times apart from 5 s to an hour (at most 15 s apart up to 90 s).

The store keeps the counts in tallies and reads the ages from an index, so a scrape costs about the
same with a thousand tasks as with ten million. The age histogram is built from a bounded sample
(store/protocol/ages.py): every ready task is counted, and the ages of a stage's oldest and newest
250 are exact; when a stage has more ready tasks than that, those in between are taken as spread
evenly between the two ends, so a bucket's bound that falls among them is an estimate.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from headrace.policy.gate import GateConfig, GateStatistics
from headrace.runtime.app import App
from headrace.store.protocol.ages import ReadyAges
from headrace.store.protocol.types import AttemptOutcome, StageStats, TaskState

EXPORTER = "metrics"  # the named lease of the process that exports the store-wide series
LEASE = 120.0  # seconds: twice Prometheus's default scrape interval
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
AGE_BUCKETS = (
    *(1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 75.0, 90.0),
    *(120.0, 150.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0),
    *(2700.0, 3600.0),
)
STAGE_STATES = ("pending", "ready", "running", "waiting")


def process_name() -> str:
    """This process among those sharing a store, as it holds a lease: its host, its pid and a
    random part (a pid comes round again)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


async def scrape(app: App, holder: str, *, lease_for: float = LEASE) -> bytes:
    """One scrape's text: this process's own series, and the store's when `holder` (this
    process) holds the exporter's lease, which the scrape takes or renews."""
    exporting = await app.store.take_lease(EXPORTER, holder, lease_for=lease_for)
    return render(await snapshot(app) if exporting else None)


@dataclass(frozen=True)
class Snapshot:
    stages: Sequence[StageStats]
    ages: Mapping[str, ReadyAges]
    counts: Mapping[TaskState, int]
    attempts: Mapping[AttemptOutcome, int]
    gates: Sequence[GateStatistics]
    classes: Mapping[str, str]
    configs: Mapping[str, GateConfig]
    declared: Sequence[str] = ()  # the app's stages: each has its series, with tasks or not


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
        declared=sorted(app.definitions),
    )


class ExporterCollector(Collector):
    """This process's own series beside `process_*`: whether it exported the store's."""

    def __init__(self, exporting: bool) -> None:
        self.exporting = exporting

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "headrace_metrics_exporter",
            "1 when this process exported the store-wide series in this scrape, else 0",
            value=1.0 if self.exporting else 0.0,
        )


class StoreCollector(Collector):
    def __init__(self, taken: Snapshot) -> None:
        self.taken = taken

    def collect(self) -> Iterator[Metric]:
        yield from self._stages()
        yield from self._tasks()
        yield from self._gates()

    def _every_stage(self) -> list[StageStats]:
        """The stages with unfinished tasks, and the app's others with none (each at 0)."""
        found = {stage.kind: stage for stage in self.taken.stages}
        for kind in self.taken.declared:
            found.setdefault(kind, StageStats(kind, 0, 0, 0, 0))
        return [found[kind] for kind in sorted(found)]

    def _stages(self) -> Iterator[Metric]:
        taken = self.taken
        depth = GaugeMetricFamily(
            "headrace_stage_tasks",
            "Unfinished tasks of a stage, by state",
            labels=["stage", "class", "state"],
        )
        oldest = GaugeMetricFamily(
            "headrace_stage_oldest_age_seconds",
            "Seconds the oldest ready task of a stage has been ready to run",
            labels=["stage", "class"],
        )
        ages = HistogramMetricFamily(
            "headrace_stage_age_seconds",
            "Seconds each ready task of a stage has been ready to run, now (not cumulative)",
            labels=["stage", "class"],
        )
        for stage in self._every_stage():
            labels = [stage.kind, taken.classes.get(stage.kind, "")]
            for state in STAGE_STATES:
                depth.add_metric([*labels, state], getattr(stage, state))
            oldest.add_metric(labels, stage.oldest_ready_age or 0.0)
            waited = taken.ages.get(stage.kind, ReadyAges(0))
            ages.add_metric(labels, buckets(waited), sum_value=waited.total())
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
        for name in self.taken.configs:  # declared: each has its series, used or not
            totals[name] = defaultdict(int)
        for stats in self.taken.gates:
            found = totals[stats.declared or "other"]
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


def buckets(ages: ReadyAges) -> list[tuple[str, float]]:
    """Cumulative counts per upper bound, as a histogram's `le` buckets (whole tasks: a count
    among the unsampled ages is rounded)."""
    counted = [(f"{bound:g}", float(round(ages.at_most(bound)))) for bound in AGE_BUCKETS]
    return [*counted, ("+Inf", float(ages.count))]


def render(taken: Snapshot | None) -> bytes:
    """The text of a scrape: this process's series, and the store's when `taken` (this process
    exports them)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessCollector(registry=None))
    registry.register(ExporterCollector(taken is not None))
    if taken is not None:
        registry.register(StoreCollector(taken))
    return generate_latest(registry)
