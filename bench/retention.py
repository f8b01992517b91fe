"""`python -m bench.retention`: an SQLite store's size after days of event-shaped moderation
work, kept whole and pruned by the default retention, side by side.

Each day has `--events` events, two hours apart; each event's uploads (`--per-event`) arrive
over its first half hour. Every upload writes what the moderation pipeline writes: its item's
record, a validate, a scan and a derive task (each a successor of the one before, keyed as the
pipeline keys them), three changes of its record on the way, then a moderator's decision an
hour after the event's start (an audit row and an outbox notice, delivered at once; one in ten
rejected). The stages run at once: the store is the subject, not the media work. Time is a
manual clock moved minute by minute, so a day takes seconds of real time and the store's ages
are real ones. With retention, the pruner runs every `every` (5 minutes) of that clock, as the
workers of a deployment would; its batches are timed in real time (the write lock they hold).

Prints, at the end of each day, the file's size (after a checkpoint; SQLite does not give freed
pages back to the file system), the bytes its pages in use take, and the rows of each table;
saves the figures as JSON to `bench/results/retention.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from headrace.policy import ErrorClass, ManualClock
from headrace.policy.retention import DAY, Retention
from headrace.store.protocol.records import Audit, Notice
from headrace.store.protocol.types import AttemptError, Dead, Lease, NewTask, Settings, Succeeded
from headrace.store.sqlite import SQLiteStore

DEFAULT_OUT = Path(__file__).parent / "results" / "retention.json"
TABLES = ("tasks", "attempts", "task_deps", "records", "audit", "outbox", "group_rollup")
STAGES = ("validate", "scan", "derive")
MINUTE = 60.0
SLOTS = 64


@dataclass
class DayFigure:
    day: int
    file_bytes: int
    live_bytes: int
    rows: dict[str, int]


@dataclass
class PruneTimes:
    runs: int = 0
    batches: int = 0
    rows: int = 0
    seconds: float = 0.0
    longest_run_s: float = 0.0

    @property
    def ms_per_batch(self) -> float:
        return 1000 * self.seconds / self.batches if self.batches else 0.0


@dataclass
class Run:
    retention: str
    days: list[DayFigure] = field(default_factory=list)
    prune: PruneTimes = field(default_factory=PruneTimes)


class Day:
    """One store, a manual clock, and the uploads of the events in flight."""

    def __init__(self, store: SQLiteStore, clock: ManualClock, retention: Retention | None):
        self.store = store
        self.clock = clock
        self.retention = retention
        self.uploads = 0
        self.reviewable: dict[str, list[str]] = {}  # media ids by event, awaiting a decision
        self.prune = PruneTimes()
        self._pruned_at = clock.now()

    async def minute(self, arrivals: Sequence[tuple[str, str]]) -> None:
        """A minute of store time: the uploads (event, session) arriving, the stages run."""
        for event, session in arrivals:
            await self.upload(event, session)
        while leases := (await self.store.claim("bench", SLOTS, lease_for=300.0)).leases:
            outcomes = [(lease, await self.run(lease)) for lease in leases]
            await self.store.finish_many(outcomes)
        self.clock.advance(MINUTE)
        every = None if self.retention is None else self.retention.every
        if every is not None and self.clock.now() - self._pruned_at >= every:
            assert self.retention is not None
            await self.pruned(self.retention)
            self._pruned_at = self.clock.now()

    async def upload(self, event: str, session: str) -> None:
        self.uploads += 1
        media_id = f"{self.uploads:032x}"
        body = {
            "session": session,
            "digest": f"{self.uploads:064x}",
            "size": 2_400_000,
            "queued_as": "image",
            "weight": 1.0,
            "media_class": None,
            "format": None,
            "reason": None,
            "derived": None,
            "metadata": None,
            "caption": None,
            "memory": 58_000_000,
            "flags": [],
        }
        await self.store.records.put_record(
            "item", media_id, scope=event, state="accepted", body=body
        )
        await self.store.submit([stage_task("validate", media_id, event, session)])

    async def run(self, lease: Lease) -> Succeeded | Dead:
        """A stage's work as the pipeline records it, and its successor."""
        task = lease.task
        stage = task.kind.split(".")[1]
        if stage == "validate":
            await self.store.records.change_record("item", task.ref, state="validated", body=PROBED)
        elif stage == "scan":
            await self.store.records.change_record("item", task.ref, state="scanned")
        elif stage == "derive":
            derived = {"derived": f"derived/{task.ref}/derive.v1", "metadata": METADATA}
            await self.store.records.change_record(
                "item", task.ref, state="reviewable", body=derived
            )
            self.reviewable.setdefault(task.group or "", []).append(task.ref)
            return Succeeded()
        else:
            return Dead(AttemptError.of(ErrorClass.FATAL, "unknown"))
        following = STAGES[STAGES.index(stage) + 1]
        successor = stage_task(following, task.ref, task.group or "", task.flow)
        return Succeeded(successors=(successor,))

    async def review(self, event: str) -> None:
        """A moderator decides the event's reviewable items; the relay delivers the notices."""
        for n, media_id in enumerate(self.reviewable.pop(event, [])):
            decision = "rejected" if n % 10 == 9 else "approved"
            await self.store.records.change_record(
                "item",
                media_id,
                state=decision,
                when={"reviewable"},
                audit=Audit(f"review.{decision}", "mod-1"),
                notice=Notice(f"item.{decision}", {"media_id": media_id}),
            )
        pending = await self.store.records.outbox(limit=10_000)
        await self.store.records.mark_delivered([row.id for row in pending])

    async def pruned(self, retention: Retention) -> None:
        began = time.perf_counter()
        assert await self.store.take_pruner("bench", lease_for=600.0)
        result = await self.store.prune(retention)
        await self.store.release_pruner("bench", removed=result.total)
        spent = time.perf_counter() - began
        self.prune.runs += 1
        self.prune.batches += result.batches
        self.prune.rows += result.total
        self.prune.seconds += spent
        self.prune.longest_run_s = max(self.prune.longest_run_s, spent)


PROBED = {
    "media_class": "image",
    "format": "jpeg",
    "metadata": {"width": 1600, "height": 1200, "format": "jpeg", "size": 2_400_000},
    "memory": 58_000_000,
    "flags": [],
}
METADATA = {"width": 1600, "height": 1200, "preview": [1280, 960], "thumbnail": [320, 240]}


def stage_task(stage: str, media_id: str, event: str, session: str) -> NewTask:
    return NewTask(
        kind=f"moderation.{stage}.image",
        ref=media_id,
        flow=session,
        group=event,
        key=f"{stage}:{media_id}",
        max_attempts=3,
        memory=58_000_000,
    )


def arrivals(day: int, event: int, minute: int, per_event: int) -> list[tuple[str, str]]:
    """The uploads of an event in one of its first 30 minutes: sessions of four uploads."""
    first, last = per_event * minute // 30, per_event * (minute + 1) // 30
    name = f"d{day}e{event}"
    return [(name, f"s{n // 4}") for n in range(first, last)]


async def simulate(
    path: Path, retention: Retention | None, days: int, events: int, per_event: int
) -> Run:
    clock = ManualClock()
    store = SQLiteStore(path, clock=clock)
    await store.open(Settings())
    run = Run("off" if retention is None else "defaults")
    try:
        sim = Day(store, clock, retention)
        for day in range(days):
            for minute in range(24 * 60):
                event, into = divmod(minute, 120)
                coming = (
                    arrivals(day, event, into, per_event) if event < events and into < 30 else []
                )
                await sim.minute(coming)
                if event < events and into == 60:
                    await sim.review(f"d{day}e{event}")
            run.days.append(measure(path, day + 1))
        run.prune = sim.prune
    finally:
        await store.close()
    return run


def measure(path: Path, day: int) -> DayFigure:
    """The file after a checkpoint, its pages in use, and the rows of each table."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages, free, size = (
            conn.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("page_count", "freelist_count", "page_size")
        )
        rows = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    return DayFigure(day, path.stat().st_size, (pages - free) * size, rows)


def table(runs: Sequence[Run]) -> Table:
    figures = Table(title="An SQLite store after days of event-shaped work (manual clock)")
    for column in ("retention", "day", "file MiB", "in use MiB", *TABLES):
        figures.add_column(column, justify="left" if column == "retention" else "right")
    for run in runs:
        for day in run.days:
            figures.add_row(
                run.retention,
                str(day.day),
                f"{day.file_bytes / 2**20:.1f}",
                f"{day.live_bytes / 2**20:.1f}",
                *(f"{day.rows[t]:,}" for t in TABLES),
            )
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.retention", description=__doc__)
    parser.add_argument("--days", type=int, default=3, help="days of work (default 3)")
    parser.add_argument("--events", type=int, default=8, help="events a day (default 8)")
    parser.add_argument("--per-event", type=int, default=600, help="uploads an event (600)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to save the JSON")
    args = parser.parse_args(argv)
    console = Console(width=160)
    runs = []
    with tempfile.TemporaryDirectory(prefix="headrace-retention-") as scratch:
        for name, retention in (("off", None), ("defaults", Retention())):
            path = Path(scratch) / f"{name}.db"
            shape = (args.days, args.events, args.per_event)
            runs.append(asyncio.run(simulate(path, retention, *shape)))
    console.print(table(runs))
    for run in runs:
        last, first = run.days[-1], run.days[0]
        growth = (last.live_bytes - first.live_bytes) / max(1, len(run.days) - 1) / 2**20
        console.print(f"{run.retention}: pages in use grow {growth:.1f} MiB a day after day 1")
    kept = runs[1].prune
    console.print(
        f"pruner (defaults): {kept.runs} runs, {kept.batches} batches, {kept.rows:,} rows, "
        f"{kept.ms_per_batch:.1f} ms a batch, longest run {kept.longest_run_s * 1000:.0f} ms"
    )
    results = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "cores": os.cpu_count()},
        "sqlite": sqlite3.sqlite_version,
        "days": args.days,
        "events_per_day": args.events,
        "uploads_per_event": args.per_event,
        "retention": asdict(Retention()),
        "day_seconds": DAY,
        "runs": [
            {**asdict(run), "prune": {**asdict(run.prune), "ms_per_batch": run.prune.ms_per_batch}}
            for run in runs
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"saved {args.out}")


if __name__ == "__main__":
    main()
