"""`headrace dlq`: look at dead letters and redrive them."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from headrace.service.tables import plain
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import Attempt, TaskRecord, TaskState


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


async def dead_letters(
    store: Store, *, group: str | None, kind: str | None, limit: int
) -> list[TaskRecord]:
    return await store.tasks(state=TaskState.DEAD, group=group, kind=kind, limit=limit)


def letters_table(tasks: Sequence[TaskRecord]) -> Table:
    table = Table(title=f"Dead letters ({len(tasks)})", title_justify="left")
    for column in ("id", "kind", "ref", "group", "code", "attempts", "died at"):
        table.add_column(column, justify="right" if column in ("id", "attempts") else "left")
    for task in tasks:
        table.add_row(
            str(task.id),
            plain(task.kind),
            plain(task.ref),
            plain(task.group),
            plain(task.error_code),
            str(task.attempt),
            _when(task.finished_at),
        )
    return table


def task_table(task: TaskRecord) -> Table:
    table = Table(title=f"Task {task.id}", title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value")
    rows = [
        ("kind", task.kind),
        ("ref", task.ref),
        ("state", task.state.value),
        ("group / flow", f"{task.group or '-'} / {task.flow}"),
        ("tier", f"{task.tier.name.lower()} (submitted {task.submitted_tier.name.lower()})"),
        ("gates", " ".join(task.gates)),
        ("key", task.key),
        ("attempts", f"{task.attempt} (budget {task.max_attempts} since {task.attempt_base})"),
        ("error code", task.error_code),
        ("remote job", task.remote_id),
    ]
    for name, value in rows:
        table.add_row(name, plain(value))
    return table


def attempts_table(attempts: Sequence[Attempt]) -> Table:
    table = Table(title="Attempts", title_justify="left")
    for column in ("#", "worker", "started", "ended", "outcome", "class", "code", "message"):
        table.add_column(column)
    for a in attempts:
        table.add_row(
            str(a.number),
            plain(a.worker),
            _when(a.started_at),
            _when(a.ended_at),
            a.outcome.value,
            a.error_class.value if a.error_class else "-",
            plain(a.code),
            plain(a.message, empty=""),
        )
    return table


async def show(store: Store, task_id: int, console: Console) -> None:
    console.print(task_table(await store.get(task_id)))
    console.print(attempts_table(await store.attempts(task_id)))
