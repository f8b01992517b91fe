"""`headrace submit` and `headrace cancel`: one task in, one task out, each told in a line."""

from __future__ import annotations

from dataclasses import dataclass

from headrace.runtime.app import App
from headrace.service.failures import WrongInput
from headrace.store.protocol.types import TaskRecord, TaskState


@dataclass(frozen=True)
class SubmitFields:
    """What the command line may set on a submitted task; None keeps the definition's own."""

    group: str | None = None
    flow: str | None = None
    tier: str | None = None
    key: str | None = None
    after: tuple[int, ...] = ()
    delay: float = 0.0


async def submit(app: App, kind: str, ref: str, fields: SubmitFields) -> str:
    """Enqueue one task through the app's definition of `kind` (its gates, retry policy, bound
    and cost); say which task it is, and whether its key named one that already existed."""
    if kind not in app.definitions:
        known = ", ".join(sorted(app.definitions)) or "none"
        raise WrongInput(f"the app has no task named {kind!r} (it has: {known})")
    spec = app.definition(kind).spec(
        ref,
        group=fields.group,
        flow=fields.flow,
        tier=fields.tier,
        key=fields.key,
        after=fields.after,
        delay=fields.delay,
    )
    async with app:
        [submitted] = await app.enqueue([spec])
        task = await app.store.get(submitted.id)
    if submitted.created:
        return f"submitted task {task.id}: {_named(task)}, {task.state.value}"
    return (
        f"task {task.id} already has the key {fields.key!r}: {_named(task)}, "
        f"{task.state.value}; nothing new submitted"
    )


async def cancel(app: App, task_id: int) -> str:
    """Cancel a task without an outcome and the tasks that wait on it; say what happened."""
    async with app:
        before = await app.store.get(task_id)
        cancelled = await app.store.cancel(task_id)
        after = await app.store.get(task_id)
    if not cancelled:
        return f"task {task_id} ({_named(after)}) is already {after.state.value}: nothing to cancel"
    return (
        f"cancelled task {task_id} ({_named(before)}, was {before.state.value}) and the tasks "
        f"that wait on it{_holder_note(before)}"
    )


def _named(task: TaskRecord) -> str:
    return f"{task.kind} {task.ref}"


def _holder_note(task: TaskRecord) -> str:
    if task.state is TaskState.RUNNING:
        return f"; worker {task.worker} lost its lease, and its outcome will be refused"
    if task.state is TaskState.WAITING:
        return f"; its gate tickets are returned (remote job {task.remote_id} is not cancelled)"
    return ""
