"""`headrace status`'s snapshot and tables, on the memory store and the virtual clock."""

from __future__ import annotations

import asyncio
import io
import re

import pytest
from rich.console import Console

import headrace as hr
from headrace.service import status

pytestmark = pytest.mark.anyio


def printed(snapshot: status.Snapshot) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(status.render(snapshot))
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def make_app() -> hr.App:
    app = hr.App("memory://")
    app.gate("provider:image", concurrency=2, rate=hr.Rate(10, per="6s"))
    app.gate("session:*", concurrency=1)

    @app.task(gates=["provider:image"])
    async def render(ctx: hr.Context, ref: str) -> None:
        return None

    @app.task()
    async def publish(ctx: hr.Context, ref: str) -> None:
        return None

    return app


async def test_a_snapshot_counts_stages_and_shows_declared_gates() -> None:
    app = make_app()
    async with app:
        first = await app.definition("render").submit("a", group="ep1")
        await app.definition("publish").submit("a", group="ep1", after=[first])
        await asyncio.sleep(5.0)  # virtual time
        snapshot = await status.snapshot(app)
    assert [g.group for g in snapshot.groups] == ["ep1"]
    stages = {s.kind: s for s in snapshot.stages}
    assert (stages["render"].ready, stages["publish"].pending) == (1, 1)
    assert stages["render"].oldest_ready_age == pytest.approx(5.0)
    assert [g.name for g in snapshot.gates] == ["provider:image"]  # no row for a template
    shown = printed(snapshot)
    assert "│ provider:image │   2 │ 10/6s │    0 │" in shown
    assert re.search(r"│ render\s+│\s+0 │\s+1 │\s+0 │\s+0 │\s+5s │", shown), shown


async def test_the_app_s_idle_stages_are_listed_and_a_bare_store_says_where_gates_are() -> None:
    app = make_app()
    async with app:
        snapshot = await status.snapshot(app)
    assert [(s.kind, s.ready) for s in snapshot.stages] == [("publish", 0), ("render", 0)]
    plain = hr.App("memory://")
    plain.task(name="publish")(make_app().definition("publish").handler)
    async with plain:
        assert "Gates: the app declares none" in printed(await status.snapshot(plain))
    bare = hr.App("memory://")
    async with bare:
        shown = printed(await status.snapshot(bare))
    assert "give --app to see them" in shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, "-"), (-0.2, "0s"), (42.4, "42s"), (185, "3m05s"), (7620, "2h07m")],
)
def test_ages_read_at_a_glance(seconds: float | None, shown: str) -> None:
    assert status.age(seconds) == shown
