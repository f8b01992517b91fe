"""A group's progress counts only succeeded tasks as complete; dead and cancelled stand apart."""

from __future__ import annotations

import io

from rich.console import Console

from headrace.service.demo import GroupBars
from headrace.service.tables import groups_table
from headrace.store.protocol.types import GroupReport, TaskState


def report(**counts: int) -> GroupReport:
    by_state = dict.fromkeys(TaskState, 0)
    by_state.update({TaskState(state): n for state, n in counts.items()})
    return GroupReport("ep1", sum(by_state.values()), by_state, {"image": 2.0})


def printed(renderable: object) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(renderable)
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def test_dead_and_cancelled_tasks_are_not_complete() -> None:
    group = report(succeeded=2, dead=1, cancelled=1)
    assert (group.total, group.done, group.succeeded) == (4, 4, 2)
    assert (group.dead, group.cancelled) == (1, 1)
    assert group.percent == 50.0
    assert report().percent == 100.0  # an empty group has nothing left to do


def test_the_groups_table_shows_the_succeeded_share_and_failures_apart() -> None:
    row = next(
        line
        for line in printed(groups_table([report(succeeded=2, dead=1, cancelled=1)])).splitlines()
        if "ep1" in line
    )
    cells = [cell.strip() for cell in row.strip("│ ").split("│")]
    assert cells == ["ep1", "4", "2", "1", "1", "50%", "image 2"]


def test_a_progress_bar_fills_only_with_succeeded_tasks() -> None:
    bars = GroupBars(Console(file=io.StringIO()), enabled=False)
    bars.update([report(succeeded=2, dead=1, cancelled=1)], 0.0)
    [row] = bars.progress.tasks
    assert (row.completed, row.total) == (2, 4)
    assert "dead 1" in row.fields["detail"] and "cancelled 1" in row.fields["detail"]
