"""Progress and operations: a task, a group (an event: counts by state, % complete, the cost
ledger), the stages (depth, oldest age, p95 age by class: from the store's age sample, see
store/protocol/ages.py), the gates, and the dead letters (list, show, redrive: admin only)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel

from headrace.policy.errors import UnknownTask
from headrace.service.api.auth import Principal, Role
from headrace.service.api.deps import (
    Caller,
    Service,
    StoredText,
    TheService,
    deny,
    not_found,
    require,
)
from headrace.service.api.edge import EdgeRoute
from headrace.store.protocol.ages import ReadyAges, quantile
from headrace.store.protocol.types import Attempt, TaskRecord, TaskState

router = APIRouter(tags=["status"], route_class=EdgeRoute)

TaskId = Annotated[int, Path(ge=1, le=2**62, description="the task's id")]
Group = Annotated[
    str, Path(min_length=1, max_length=200, description="the group's name"), StoredText
]


class TaskView(BaseModel):
    id: int
    kind: str
    ref: str
    group: str | None
    flow: str
    tier: str
    state: str
    phase: str  # queued (accepted, waiting) / processing / done
    attempt: int
    max_attempts: int
    error_code: str | None
    created_at: float
    finished_at: float | None


class AttemptView(BaseModel):
    number: int
    worker: str
    started_at: float
    ended_at: float | None
    outcome: str
    code: str | None
    message: str | None  # redacted when it was written


class DeadLetter(BaseModel):
    task: TaskView
    attempts: list[AttemptView]


class GroupView(BaseModel):
    group: str
    total: int
    by_state: dict[str, int]
    percent: float
    cost: dict[str, float]
    failures: list[dict[str, Any]]


class StageView(BaseModel):
    kind: str
    cost_class: str | None
    pending: int
    ready: int
    running: int
    waiting: int
    oldest_age: float | None
    p95_age: float | None


class StagesView(BaseModel):
    stages: list[StageView]
    p95_age_by_class: dict[str, float | None]


class GateView(BaseModel):
    name: str
    concurrency: int | None
    rate: str | None
    granted: int
    refused_by_token: int
    refused_by_cap: int
    rate_limited: int
    in_flight: int
    peak_in_flight: int
    penalized_until: float | None


PHASES = {
    TaskState.PENDING: "queued",
    TaskState.READY: "queued",
    TaskState.RUNNING: "processing",
    TaskState.WAITING: "processing",
}


def task_view(task: TaskRecord) -> TaskView:
    return TaskView(
        id=task.id,
        kind=task.kind,
        ref=task.ref,
        group=task.group,
        flow=task.flow,
        tier=task.tier.name.lower(),
        state=task.state.value,
        phase=PHASES.get(task.state, "done"),
        attempt=task.attempt,
        max_attempts=task.max_attempts,
        error_code=task.error_code,
        created_at=task.created_at,
        finished_at=task.finished_at,
    )


def attempt_view(attempt: Attempt) -> AttemptView:
    return AttemptView(
        number=attempt.number,
        worker=attempt.worker,
        started_at=attempt.started_at,
        ended_at=attempt.ended_at,
        outcome=attempt.outcome.value,
        code=attempt.code,
        message=attempt.message,
    )


def p95(stages: Sequence[ReadyAges]) -> float | None:
    """The nearest-rank 95th percentile of the ready tasks of `stages`."""
    return quantile(stages, 0.95)


async def visible_task(svc: Service, who: Principal, task_id: int) -> TaskRecord:
    await require(svc, who, Role.MODERATOR, action="task.read")
    try:
        task = await svc.store.get(task_id)
    except UnknownTask:
        raise not_found("task") from None
    if who.role is not Role.ADMIN and (task.group is None or not who.sees(task.group)):
        raise await deny(
            svc, who, kind="task", record_id=str(task_id), scope=task.group or "all", action="read"
        )
    return task


@router.get("/v1/tasks/{task_id}", response_model=TaskView, summary="One task")
async def get_task(task_id: TaskId, svc: TheService, who: Caller) -> TaskView:
    return task_view(await visible_task(svc, who, task_id))


@router.get("/v1/groups/{group}", response_model=GroupView, summary="A group's progress")
async def get_group(group: Group, svc: TheService, who: Caller) -> GroupView:
    """An event's (or an episode's) tasks by state, % complete, the cost ledger, failures."""
    await require(svc, who, Role.MODERATOR, event=group, kind="group")
    report = await svc.store.group_report(group)
    if report.total == 0:
        raise not_found("group")
    return GroupView(
        group=group,
        total=report.total,
        by_state={state.value: n for state, n in report.by_state.items()},
        percent=round(report.percent, 2),
        cost=dict(report.cost),
        failures=[
            {"task_id": f.task_id, "kind": f.kind, "code": f.code, "attempts": f.attempts}
            for f in report.failures
        ],
    )


@router.get("/v1/stages", response_model=StagesView, summary="Stages: depth and queue age")
async def get_stages(svc: TheService, who: Caller) -> StagesView:
    await require(svc, who, Role.MODERATOR, action="stages.read")
    classes = svc.moderation.app.cost_classes()
    ages, found = await asyncio.gather(svc.store.ready_ages(), svc.store.stages())
    by_class: dict[str, list[ReadyAges]] = {name: [] for name in sorted(set(classes.values()))}
    stages = []
    for stage in found:
        waited = ages.get(stage.kind, ReadyAges(0))
        cost_class = classes.get(stage.kind)
        if cost_class is not None:
            by_class[cost_class].append(waited)
        stages.append(
            StageView(
                kind=stage.kind,
                cost_class=cost_class,
                pending=stage.pending,
                ready=stage.ready,
                running=stage.running,
                waiting=stage.waiting,
                oldest_age=stage.oldest_ready_age,
                p95_age=p95([waited]),
            )
        )
    return StagesView(
        stages=stages, p95_age_by_class={name: p95(found) for name, found in by_class.items()}
    )


@router.get("/v1/gates", response_model=list[GateView], summary="Gates: statistics")
async def get_gates(svc: TheService, who: Caller) -> list[GateView]:
    await require(svc, who, Role.ADMIN, action="gates.read")
    return [
        GateView(
            name=g.name,
            concurrency=g.concurrency,
            rate=None if g.rate is None else f"{g.rate.n}/{g.rate.window:g}s",
            granted=g.granted,
            refused_by_token=g.blocked_by_token,
            refused_by_cap=g.blocked_by_concurrency,
            rate_limited=g.rate_limited,
            in_flight=g.in_flight,
            peak_in_flight=g.peak_in_flight,
            penalized_until=g.penalized_until,
        )
        for g in await svc.store.gate_statistics()
    ]


@router.get("/v1/dead-letters", response_model=list[TaskView], summary="Dead letters")
async def list_dead_letters(
    svc: TheService,
    who: Caller,
    group: Annotated[str | None, Query(max_length=200), StoredText] = None,
    kind: Annotated[str | None, Query(max_length=200), StoredText] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[TaskView]:
    await require(svc, who, Role.ADMIN, action="dlq.read")
    found = await svc.store.tasks(state=TaskState.DEAD, group=group, kind=kind, limit=limit)
    return [task_view(task) for task in found]


async def dead_task(svc: Service, task_id: int) -> TaskRecord:
    try:
        task = await svc.store.get(task_id)
    except UnknownTask:
        raise not_found("dead letter") from None
    if task.state is not TaskState.DEAD:
        raise not_found("dead letter")
    return task


@router.get("/v1/dead-letters/{task_id}", response_model=DeadLetter, summary="One dead letter")
async def show_dead_letter(task_id: TaskId, svc: TheService, who: Caller) -> DeadLetter:
    await require(svc, who, Role.ADMIN, action="dlq.read")
    task = await dead_task(svc, task_id)
    attempts = await svc.store.attempts(task_id)
    return DeadLetter(task=task_view(task), attempts=[attempt_view(a) for a in attempts])


@router.post(
    "/v1/dead-letters/{task_id}/redrive",
    response_model=TaskView,
    summary="Run a dead letter again, with a fresh attempt budget",
)
async def redrive(task_id: TaskId, svc: TheService, who: Caller) -> TaskView:
    await require(svc, who, Role.ADMIN, action="dlq.redrive")
    await dead_task(svc, task_id)
    await svc.store.redrive(task_ids=[task_id])
    return task_view(await svc.store.get(task_id))
