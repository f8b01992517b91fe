"""What one scrape costs against the size of the store: the reads behind `GET /metrics` and
`headrace status`, and a real `GET /metrics` through the API (in process, over ASGI), with
10^3, 10^6 and 10^7 tasks on SQLite and on PostgreSQL.

Half the tasks are ready (a backlog that has waited up to an hour, across the nine moderation
stages) and half succeeded, each with its attempt; they belong to ten events. Each store is
filled by bulk SQL at the schema version before the tallies, with rows shaped as the store
writes them, and then upgraded: the migration's backfill counts them, as it would for a store
upgraded in place, and the upgrade's time is in the table. Once per size, every figure the
reads give is checked against a full count by plain SQL, whose time is in the table too: it is
what those reads cost before the tallies.

`python -m bench.scrape [--quick] [--size N ...] [--no-postgres]` prints the table and saves
bench/results/scrape.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import psycopg
from rich.console import Console
from rich.table import Table

from bench.claims import FreshDatabase
from headrace.pipelines.moderation.deploy import make_moderation
from headrace.service import status
from headrace.service.api import metrics
from headrace.service.api.app import create_api
from headrace.service.api.auth import Role, create_token
from headrace.store.machine import sql
from headrace.store.postgres import PostgresStore
from headrace.store.postgres.connection import MIGRATIONS as POSTGRES_MIGRATIONS
from headrace.store.postgres.connection import QUERIES as POSTGRES_QUERIES
from headrace.store.protocol.types import TaskState
from headrace.store.sqlite import SQLiteStore
from headrace.store.sqlite.connection import MIGRATIONS as SQLITE_MIGRATIONS
from headrace.store.sqlite.connection import QUERIES as SQLITE_QUERIES
from headrace.store.sqlite.connection import connect

DEFAULT_OUT = Path(__file__).parent / "results" / "scrape.json"
SIZES = (1_000, 1_000_000, 10_000_000)
QUICK_SIZES = (1_000, 100_000)
KINDS = tuple(
    f"moderation.{stage}.{media}"
    for stage in ("validate", "scan", "derive")
    for media in ("image", "audio", "video")
)
GROUPS = 10  # events
SPAN = 3600.0  # seconds over which the tasks were created: the backlog's oldest waited this
CHUNK = 1_000_000  # rows a statement inserts
REPEAT = 9  # timed runs of each read, after one not timed; the median is kept
GOAL_MS = 50.0


@dataclass(frozen=True)
class ScrapeCost:
    store: str
    tasks: int
    ready: int
    fill_s: float  # bulk SQL at the version before the tallies
    upgrade_s: float  # the migration: the new index, the tallies' backfill
    metrics_ms: float  # the store reads behind GET /metrics (metrics.snapshot)
    status_ms: float  # the store reads behind `headrace status` (status.snapshot)
    get_metrics_ms: float  # GET /metrics through the API: auth, reads, rendering
    full_count_ms: float  # counting every task and attempt by plain SQL, as the reads did
    equal: bool  # every figure read equals the full count


@dataclass(frozen=True)
class FullCount:
    """What a plain count over every row says."""

    kinds: dict[tuple[str, str], int]  # tasks by (kind, state)
    groups: dict[tuple[str, str], int]  # tasks by (group, state)
    attempts: dict[str, int]  # attempts by outcome
    oldest: dict[str, float]  # each kind's oldest ready task: when it became ready


# -- filling, in each dialect: task i of n is ready when even, else succeeded with an attempt

SQLITE_FILL = """
WITH RECURSIVE seq (i) AS (SELECT :first UNION ALL SELECT i + 1 FROM seq WHERE i < :last)
INSERT INTO tasks (
    id, kind, ref, gates, gate_key, flow, grp, tier, submitted_tier, cost, state, attempt,
    max_attempts, tag, created_at, run_at, ready_since, finished_at, worker, lease_token
)
SELECT i, json_extract(:kinds, '$[' || (i % 9) || ']'), 'item-' || i, '[]', '',
       'session-' || (i % 1000), 'ev' || (i % :groups), 1, 1, 1.0,
       CASE WHEN i % 2 = 0 THEN 'ready' ELSE 'succeeded' END, i % 2, 5, i / 1000,
       :start + i * :step, :start + i * :step, :start + i * :step,
       CASE WHEN i % 2 = 1 THEN :start + i * :step + 1 END,
       CASE WHEN i % 2 = 1 THEN 'worker-1' END, i % 2
FROM seq
"""
POSTGRES_FILL = """
INSERT INTO tasks (
    id, kind, ref, gates, gate_key, flow, grp, tier, submitted_tier, cost, state, attempt,
    max_attempts, tag, created_at, run_at, ready_since, finished_at, worker, lease_token
)
SELECT i, (%(kinds)s::text[])[i %% 9 + 1], 'item-' || i, '{}', '',
       'session-' || (i %% 1000), 'ev' || (i %% %(groups)s), 1, 1, 1.0,
       CASE WHEN i %% 2 = 0 THEN 'ready' ELSE 'succeeded' END, i %% 2, 5, i / 1000,
       %(start)s + i * %(step)s, %(start)s + i * %(step)s, %(start)s + i * %(step)s,
       CASE WHEN i %% 2 = 1 THEN %(start)s + i * %(step)s + 1 END,
       CASE WHEN i %% 2 = 1 THEN 'worker-1' END, i %% 2
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
"""
ATTEMPTS_FILL = """
INSERT INTO attempts (task_id, number, worker, started_at, ended_at, outcome)
SELECT id, 1, worker, created_at, finished_at, 'succeeded' FROM tasks
WHERE state = 'succeeded' AND id BETWEEN {first} AND {last}
"""
SIDE_ROWS = (  # each session's flow row, each event's cost ledger
    "INSERT INTO flows (flow, finish_tag, served)"
    " SELECT DISTINCT flow, 0, 0 FROM tasks WHERE id <= 1000",
    "INSERT INTO ledger (grp, kind, units)"
    " SELECT grp, kind, count(*) FROM tasks WHERE state = 'succeeded' GROUP BY grp, kind",
)
FULL_COUNT = (
    "SELECT kind, state, count(*) FROM tasks GROUP BY kind, state",
    "SELECT grp, state, count(*) FROM tasks WHERE grp IS NOT NULL GROUP BY grp, state",
    "SELECT outcome, count(*) FROM attempts GROUP BY outcome",
    "SELECT kind, min(coalesce(ready_since, created_at)) FROM tasks WHERE state = 'ready'"
    " GROUP BY kind",
)


def before_tallies(folder: str) -> list[sql.Migration]:
    """The migrations up to the one that adds the tallies, which the upgrade then runs."""
    migrations = sql.load_migrations(folder)
    tallies = next(m.version for m in migrations if m.name == "counters")
    return [m for m in migrations if m.version < tallies]


def chunks(tasks: int) -> list[tuple[int, int]]:
    return [(first, min(tasks, first + CHUNK - 1)) for first in range(1, tasks + 1, CHUNK)]


def full_count(rows: Sequence[Sequence[Sequence[Any]]]) -> FullCount:
    kinds, groups, attempts, oldest = rows
    return FullCount(
        {(k, s): int(n) for k, s, n in kinds},
        {(g, s): int(n) for g, s, n in groups},
        {o: int(n) for o, n in attempts},
        {k: float(since) for k, since in oldest},
    )


class Filled(Protocol):
    url: str

    def fill(self, tasks: int, start: float) -> None: ...

    async def upgrade(self) -> None: ...

    def count(self) -> FullCount: ...


class SQLiteFilled:
    def __init__(self, directory: Path) -> None:
        self.path = directory / "scrape.db"
        self.url = f"sqlite:///{self.path}"

    def fill(self, tasks: int, start: float) -> None:
        queries = sql.load_queries(SQLITE_QUERIES)
        connection = connect(self.path, 10.0, queries)
        try:
            older = before_tallies(SQLITE_MIGRATIONS)
            for migration in older:
                for statement in migration.statements:
                    connection.execute(statement)
            connection.execute(f"PRAGMA user_version = {older[-1].version}")
            values = {"kinds": json.dumps(KINDS), "groups": GROUPS, "start": start}
            for first, last in chunks(tasks):
                with connection:
                    connection.execute("BEGIN")
                    bounds = {"first": first, "last": last, "step": SPAN / tasks}
                    connection.execute(SQLITE_FILL, {**values, **bounds})
                    connection.execute(ATTEMPTS_FILL.format(first=first, last=last))
            with connection:
                connection.execute("BEGIN")
                for statement in SIDE_ROWS:
                    connection.execute(statement)
        finally:
            connection.close()

    async def upgrade(self) -> None:
        await SQLiteStore(self.path).upgrade()

    def count(self) -> FullCount:
        connection = sqlite3.connect(self.path)
        try:
            return full_count([connection.execute(q).fetchall() for q in FULL_COUNT])
        finally:
            connection.close()


class PostgresFilled:
    def __init__(self, url: str) -> None:
        self.url = url

    def fill(self, tasks: int, start: float) -> None:
        queries = sql.load_queries(POSTGRES_QUERIES)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA headrace")
            conn.execute(queries["set_search_path"].text, {"schema": "headrace"})
            conn.execute(queries["create_migrations_table"].text)
            for migration in before_tallies(POSTGRES_MIGRATIONS):
                with conn.transaction():
                    for statement in migration.statements:
                        conn.execute(statement)
                    conn.execute(queries["record_migration"].text, {"version": migration.version})
            values = {"kinds": list(KINDS), "groups": GROUPS, "start": start}
            for first, last in chunks(tasks):
                with conn.transaction():
                    bounds = {"first": first, "last": last, "step": SPAN / tasks}
                    conn.execute(POSTGRES_FILL, {**values, **bounds})
                    conn.execute(ATTEMPTS_FILL.format(first=first, last=last))
            for statement in SIDE_ROWS:
                conn.execute(statement)
            conn.execute("VACUUM ANALYZE")  # as autovacuum leaves a table that stopped growing

    async def upgrade(self) -> None:
        await PostgresStore.from_url(self.url).upgrade()

    def count(self) -> FullCount:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("SET search_path = headrace")
            return full_count([conn.execute(q).fetchall() for q in FULL_COUNT])


# -- reading


async def median_ms(read: Callable[[], Awaitable[object]]) -> float:
    await read()  # not timed: connections, prepared statements, caches
    times = []
    for _ in range(REPEAT):
        began = time.perf_counter()
        await read()
        times.append((time.perf_counter() - began) * 1000)
    return round(statistics.median(times), 2)


async def agrees(app: Any, full: FullCount) -> bool:
    """Whether every figure the reads give equals the full count."""
    store = app.store
    by_state = {state: 0 for state in TaskState}
    for (_, state), n in full.kinds.items():
        by_state[TaskState(state)] += n
    now = await store.now()
    stages = {stage.kind: stage for stage in await store.stages()}
    for kind in {kind for kind, _ in full.kinds}:
        found = stages.get(kind)
        ready = full.kinds.get((kind, "ready"), 0)
        if found is None or found.ready != ready or found.oldest_ready_age is None:
            return False
        if abs(now - found.oldest_ready_age - full.oldest[kind]) > 1.0:
            return False
    groups = {
        (name, state.value): n
        for name in await store.groups()
        for state, n in (await store.group_report(name)).by_state.items()
        if n
    }
    attempts = {o.value: n for o, n in (await store.attempt_counts()).items()}
    ages = await store.ready_ages()
    return (
        await store.counts() == by_state
        and groups == full.groups
        and attempts == full.attempts
        and all(ages[kind].count == stages[kind].ready for kind in ages)
    )


async def measure(filled: Filled, store: str, tasks: int, media: Path) -> ScrapeCost:
    start = time.time() - SPAN
    began = time.perf_counter()
    await asyncio.to_thread(filled.fill, tasks, start)
    fill_s = time.perf_counter() - began
    began = time.perf_counter()
    await filled.upgrade()
    upgrade_s = time.perf_counter() - began
    counted = time.perf_counter()
    full = await asyncio.to_thread(filled.count)
    full_count_ms = (time.perf_counter() - counted) * 1000
    moderation = make_moderation(filled.url, str(media))
    api = create_api(moderation)
    async with api.router.lifespan_context(api):
        app = moderation.app
        equal = await agrees(app, full)
        token = await create_token(app.store, name="bench", role=Role.ADMIN, events=["*"])
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            headers = {"Authorization": f"Bearer {token}"}

            async def get_metrics() -> None:
                answer = await client.get("/metrics", headers=headers)
                answer.raise_for_status()

            return ScrapeCost(
                store,
                tasks,
                tasks // 2,
                round(fill_s, 1),
                round(upgrade_s, 1),
                await median_ms(lambda: metrics.snapshot(app)),
                await median_ms(lambda: status.snapshot(app)),
                await median_ms(get_metrics),
                round(full_count_ms, 1),
                equal,
            )


async def measure_sqlite(tasks: int) -> ScrapeCost:
    with tempfile.TemporaryDirectory(prefix="headrace-scrape-") as scratch:
        directory = Path(scratch)
        return await measure(SQLiteFilled(directory), "sqlite", tasks, directory / "media")


async def measure_postgres(tasks: int) -> ScrapeCost:
    with tempfile.TemporaryDirectory(prefix="headrace-scrape-") as scratch:
        async with FreshDatabase("hr_scrape") as url:
            media = Path(scratch) / "media"
            return await measure(PostgresFilled(url), "postgres", tasks, media)


def scrape_figures(
    sizes: Sequence[int], *, postgres: bool = True, log: Callable[[str], None] = print
) -> list[ScrapeCost]:
    figures = []
    for tasks in sizes:
        for name, run in (("sqlite", measure_sqlite), ("postgres", measure_postgres)):
            if name == "postgres" and not postgres:
                continue
            cost = asyncio.run(run(tasks))
            log(f"{name}, {tasks:,} tasks: /metrics reads {cost.metrics_ms} ms")
            figures.append(cost)
    return figures


def scrape_table(figures: Sequence[ScrapeCost]) -> Table:
    table = Table(
        title=f"One scrape against the size of the store: the reads behind /metrics and headrace "
        f"status, and GET /metrics (median of {REPEAT}; goal: under {GOAL_MS:g} ms), against a "
        "full count of every task and attempt"
    )
    columns = ("store", "tasks", "ready", "fill", "upgrade", "metrics", "status", "GET")
    for column in (*columns, "full count", "equal"):
        table.add_column(column, justify="left" if column == "store" else "right")
    for f in figures:
        table.add_row(
            f.store,
            f"{f.tasks:,}",
            f"{f.ready:,}",
            f"{f.fill_s:g} s",
            f"{f.upgrade_s:g} s",
            f"{f.metrics_ms:.1f} ms",
            f"{f.status_ms:.1f} ms",
            f"{f.get_metrics_ms:.1f} ms",
            f"{f.full_count_ms:,.0f} ms",
            "yes" if f.equal else "NO",
        )
    return table


def save(figures: Sequence[ScrapeCost], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "goal_ms": GOAL_MS,
        "scrape": [asdict(f) for f in figures],
    }
    out.write_text(json.dumps(results, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scrape", description=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES}")
    parser.add_argument("--size", type=int, action="append", help="tasks in the store")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to save the JSON")
    args = parser.parse_args()
    console = Console(width=130)
    sizes = args.size or (QUICK_SIZES if args.quick else SIZES)
    figures = scrape_figures(sizes, postgres=not args.no_postgres, log=console.log)
    console.print(scrape_table(figures))
    save(figures, args.out)
    console.print(f"saved {args.out}")


if __name__ == "__main__":
    main()
