"""`headrace dlq list|show|retry` against a real SQLite file, in subprocesses."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import headrace as hr
from headrace.store.protocol.types import TaskState

from .commands import ROOT, environment


def headrace(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "headrace", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(),
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def make_dead_letters(db: Path) -> list[int]:
    async def run() -> list[int]:
        app = hr.App(f"sqlite:///{db}")

        @app.task(max_attempts=1)
        async def render(ctx: hr.Context, ref: str) -> None:
            raise hr.Fatal("insufficient balance", code="minimax_1008")

        @app.task(max_attempts=1)
        async def caption(ctx: hr.Context, ref: str) -> None:
            raise hr.Fatal("flagged", code="minimax_1026")

        async with app:
            ids = [await render.submit(f"ep1/s{n}", group="ep1") for n in range(3)]
            ids.append(await caption.submit("ep2/c1", group="ep2"))
            await hr.Worker(app).drain()
        return ids

    return asyncio.run(run())


def test_list_show_and_a_raced_retry_redrive_each_letter_once(tmp_path: Path) -> None:
    db = tmp_path / "dlq.db"
    ids = make_dead_letters(db)
    code, out, err = finish(headrace("dlq", "list", "--db", str(db), "--kind", "render"))
    assert code == 0, err
    assert "Dead letters (3)" in out
    assert "minimax_1008" in out
    assert "caption" not in out
    code, out, err = finish(headrace("dlq", "show", "--db", str(db), str(ids[0])))
    assert code == 0, err
    assert "insufficient balance" in out
    assert "minimax_1008" in out
    racers = [headrace("dlq", "retry", "--db", str(db), "--group", "ep1") for _ in range(2)]
    results = [finish(racer) for racer in racers]
    assert [code for code, _, _ in results] == [0, 0]
    counts = [int(re.findall(r"re-enqueued (\d+)", out)[0]) for _, out, _ in results]
    assert sorted(counts) in ([0, 3], [1, 2])  # each letter once, whoever won it
    assert sum(counts) == 3

    async def states() -> list[TaskState]:
        store = hr.App(f"sqlite:///{db}")
        async with store:
            return [(await store.store.get(i)).state for i in ids]

    assert asyncio.run(states()) == [TaskState.READY] * 3 + [TaskState.DEAD]


def test_show_names_an_unknown_task_and_the_store_is_required(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    make_dead_letters(db)
    code, _, err = finish(headrace("dlq", "show", "--db", str(db), "999"))
    assert code == 2
    assert "999" in err
    code, _, err = finish(headrace("dlq", "list"))
    assert code == 2
    assert "--db" in err
    missing = tmp_path / "missing.db"
    code, _, err = finish(headrace("dlq", "list", "--db", str(missing)))
    assert code == 2
    assert "no store at" in err
    assert not missing.exists()


def make_markup_letters(db: Path) -> list[int]:
    async def run() -> list[int]:
        app = hr.App(f"sqlite:///{db}")

        @app.task(max_attempts=1)
        async def render(ctx: hr.Context, ref: str) -> None:
            raise hr.Fatal(f"cannot read {ref} [/] [red]", code="bad_[input]")

        async with app:
            ids = [
                await render.submit("[bold]x[/bold]", group="[i]ep[/i]"),
                await render.submit("shot[/]", group="ep2"),
            ]
            await hr.Worker(app).drain()
        return ids

    return asyncio.run(run())


def test_list_and_show_print_refs_and_messages_verbatim(tmp_path: Path) -> None:
    db = tmp_path / "markup.db"
    ids = make_markup_letters(db)
    code, out, err = finish(headrace("dlq", "list", "--db", str(db)))
    assert code == 0, err
    for text in ("[bold]x[/bold]", "shot[/]", "[i]ep[/i]", "bad_[input]"):
        assert text in out
    code, out, err = finish(headrace("dlq", "show", "--db", str(db), str(ids[1])))
    assert code == 0, err
    for text in ("shot[/]", "cannot read shot[/] [/] [red]", "bad_[input]"):
        assert text in out
