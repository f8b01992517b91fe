"""Stage limits on waiting work, written once for every backend.

A stage may bound its waiting (pending or ready) tasks in all, per flow and per group
(`StageLimits`). A batch of new tasks, whether a producer submitted it or a completion made it,
must fit every limit it touches: `needs` lists the counts to check and `Need.check` refuses with
QueueFull. A stage that feeds a bounded one may start only as many tasks as that stage still has
room for, counting what the feeders already running may add: `backpressure` turns the counts into
claim limits, so upstream work stays ready (accepted, queued) instead of flooding downstream.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from headrace.policy.errors import QueueFull
from headrace.store.machine import idempotency
from headrace.store.protocol.types import KindLimit, NewTask, StageLimits


@dataclass(frozen=True)
class Need:
    """A count a batch must fit: `new` more tasks of `kind` (of one flow or group, `label`)."""

    kind: str
    scope: str  # "stage", "flow" or "group"
    label: str | None
    new: int
    cap: int

    def check(self, queued: int) -> None:
        """Refuse when `queued` (the tasks waiting now) and the new ones exceed the cap."""
        if queued + self.new > self.cap:
            raise QueueFull(self.kind, self.cap, self.scope, self.label)


def by_kind(
    stages: Iterable[StageLimits], bounds: Mapping[str, int] | None = None
) -> dict[str, StageLimits]:
    """The limited stages by name; `bounds` (a submit's own) replace their whole-stage bound."""
    merged = {stage.kind: stage for stage in stages if stage.limited}
    for kind, bound in (bounds or {}).items():
        merged[kind] = replace(merged.get(kind, StageLimits(kind)), bound=bound)
    return merged


def needs(
    tasks: Sequence[NewTask],
    planned: Sequence[idempotency.Planned],
    limits: Mapping[str, StageLimits],
) -> list[Need]:
    """What the tasks the batch creates (not those its keys name already) must fit, in kind
    order (the order every writer locks bounded kinds in)."""
    created = [t for t, p in zip(tasks, planned, strict=True) if p is None and t.kind in limits]
    found: list[Need] = []
    for kind in sorted({task.kind for task in created}):
        stage = limits[kind]
        ours = [task for task in created if task.kind == kind]
        if stage.bound is not None:
            found.append(Need(kind, "stage", None, len(ours), stage.bound))
        if stage.per_flow is not None:
            for flow in sorted({task.flow for task in ours}):
                new = sum(1 for task in ours if task.flow == flow)
                found.append(Need(kind, "flow", flow, new, stage.per_flow))
        if stage.per_group is not None:
            for group in sorted({task.group for task in ours if task.group}):
                new = sum(1 for task in ours if task.group == group)
                found.append(Need(kind, "group", group, new, stage.per_group))
    return found


@functools.cache
def counted_kinds(stages: tuple[StageLimits, ...]) -> tuple[str, ...]:
    """The kinds whose counts `backpressure` reads: bounded stages that something feeds, and
    the stages feeding them. Empty when no stage feeds a bounded one. Worked out once per set
    of stages: every claim and every outcome asks."""
    bounded = {stage.kind for stage in stages if stage.bound is not None}
    kinds: set[str] = set()
    for stage in stages:
        fed = bounded.intersection(stage.feeds)
        if fed:
            kinds.add(stage.kind)
            kinds.update(fed)
    return tuple(sorted(kinds))


def backpressure(
    stages: Iterable[StageLimits], queued: Mapping[str, int], active: Mapping[str, int]
) -> dict[str, KindLimit]:
    """A claim limit per bounded stage that others feed, by that stage: its feeders together may
    start no more than its room, its bound less its waiting tasks (`queued`) and the feeders'
    running or remote-waiting ones (`active`: each may still add a successor). A stage whose
    limit is 0 holds its feeders back: a claim that starts one of its tasks makes room."""
    listed = list(stages)
    bounds = {stage.kind: stage.bound for stage in listed if stage.bound is not None}
    limits: dict[str, KindLimit] = {}
    for kind in sorted(bounds):
        feeders = frozenset(stage.kind for stage in listed if kind in stage.feeds)
        if not feeders:
            continue
        busy = sum(active.get(feeder, 0) for feeder in feeders)
        room = bounds[kind] - queued.get(kind, 0) - busy
        limits[kind] = KindLimit(feeders, max(0, room))
    return limits


def holding_back(limits: Mapping[str, KindLimit]) -> frozenset[str]:
    """The stages (of `backpressure`'s limits) that hold their feeders back now."""
    return frozenset(kind for kind, limit in limits.items() if limit.limit == 0)
