"""`headrace prune`, `headrace event close` and the retention `status` shows, against a real
SQLite file, in subprocesses."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import headrace as hr
from headrace.store.protocol.types import Settings
from headrace.store.sqlite import SQLiteStore

from .commands import failure_line, headrace

AGED = ("--retention", "succeeded=0s")  # what finished before now is old enough


def finished_work(db: Path) -> None:
    """Three tasks of group ep1 succeeded, and one still ready."""

    async def run() -> None:
        app = hr.App(f"sqlite:///{db}")

        @app.task()
        async def render(ctx: hr.Context, ref: str) -> hr.Result:
            return hr.Result(cost=2.0)

        async with app:
            for n in range(3):
                await render.submit(f"ep1/s{n}", group="ep1")
            await hr.Worker(app).drain()
            await render.submit("ep1/later", group="ep1", delay=3600)

    asyncio.run(run())


def rows(out: str) -> dict[str, int]:
    """The per-kind lines a prune prints."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^  (\S.*?)\s{2,}(\d+)$", out, re.MULTILINE)}


def test_a_dry_run_says_per_kind_what_would_go_and_a_run_removes_it(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    finished_work(db)

    dry = headrace("prune", "--db", str(db), *AGED, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    head, *_ = dry.stdout.splitlines()
    assert head == f"dry run: would remove 6 from sqlite:///{db}; nothing was changed"
    assert rows(dry.stdout) == {
        "succeeded tasks": 3,
        "cancelled tasks": 0,
        "dead tasks": 0,
        "attempts": 3,
        "delivered notices": 0,
        "audit rows": 0,
        "sign-ins": 0,
        "webhook deliveries": 0,
    }
    shown = headrace("status", "--db", str(db))
    assert re.search(r"│ ep1\s+│\s+4 │\s+3 │", shown.stdout), shown.stdout
    assert "Pruner: no run yet" in shown.stdout

    done = headrace("prune", "--db", str(db), *AGED)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"removed 6 from sqlite:///{db} in 1 store batch"
    assert rows(done.stdout) == rows(dry.stdout)
    again = headrace("prune", "--db", str(db), *AGED)
    assert again.stdout.splitlines()[0].startswith("removed 0 ")


def test_status_shows_the_retention_and_the_last_run_and_reports_stay_whole(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    finished_work(db)
    assert headrace("prune", "--db", str(db), *AGED).returncode == 0

    shown = headrace("status", "--db", str(db), "--retention", "dead=14d")

    assert shown.returncode == 0, shown.stderr
    assert re.search(r"│ ep1\s+│\s+4 │\s+3 │\s+0 │\s+0 │\s+75% │ render 6", shown.stdout)
    flat = " ".join(shown.stdout.split())
    assert (
        "Retention (headrace prune; --retention NAME=AGE): succeeded 1d, cancelled 1d, dead 14d,"
        " delivered 1d, audit 365d, deliveries 7d, sign_ins 1d, turned_away 7d,"
        " closed_events 30d, orphans 1h, upload_grace 2m, every 5m, batch 500"
    ) in flat
    assert re.search(r"Pruner: last run \d+s ago \(\S+:\d+:prune\), removed 6 rows", flat), flat


def test_the_pipelines_kinds_come_with_the_app(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    finished_work(db)
    app = "headrace.pipelines.moderation.deploy:make_app"
    env = {"HEADRACE_MEDIA": str(tmp_path / "media")}
    done = headrace("prune", "--app", app, "--db", str(db), "--dry-run", env=env)
    assert done.returncode == 0, done.stderr
    found = rows(done.stdout)
    assert found["succeeded tasks"] == 0  # a day has not passed
    assert {"items", "derivative sets", "originals", "uploads queued", "uploads lost"} <= set(found)


def test_a_bad_setting_or_a_busy_pruner_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    finished_work(db)
    bad = headrace("prune", "--db", str(db), "--retention", "dead=soon")
    assert bad.returncode == 2
    assert "--retention: retention.dead: cannot read 'soon'" in failure_line(bad)
    env = headrace("prune", "--db", str(db), env={"HEADRACE_RETENTION": "sign_ins=1h"})
    assert "retention.sign_ins: expected at least 12h" in failure_line(env)

    async def hold() -> None:
        store = SQLiteStore(db)
        await store.open(Settings())
        try:
            assert await store.take_pruner("worker-7", lease_for=600.0)
        finally:
            await store.close()

    asyncio.run(hold())
    busy = headrace("prune", "--db", str(db))
    assert busy.returncode == 1
    line = failure_line(busy)
    assert "another pruner is running (worker-7, its lease ends in" in line
    assert f"sqlite:///{db}" in line
    assert headrace("prune", "--db", str(db), "--dry-run").returncode == 0  # takes no lease


def test_an_event_is_closed_once(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    finished_work(db)
    first = headrace("event", "close", "gala", "--db", str(db), "--by", "ops")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == (
        "closed event gala: it takes no more uploads; its settled items go with their media "
        "30d from now"
    )
    again = headrace("event", "close", "gala", "--db", str(db))
    assert again.stdout.strip() == "event gala was closed already: nothing changed"
    bad = headrace("event", "close", "no/such", "--db", str(db))
    assert bad.returncode == 2 and "event: expected 1 to 64 letters" in failure_line(bad)
    missing = headrace("event", "close", "gala", "--db", str(tmp_path / "nope.db"))
    assert missing.returncode == 2 and "no store at" in failure_line(missing)
