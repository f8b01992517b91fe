"""The real `headrace` command in subprocesses."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import pytest

from .commands import headrace, studio_report


@pytest.mark.realtime
@pytest.mark.timeout(240)
def test_demo_runs_the_studio_under_quota_on_the_embedded_store(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    done = headrace("demo", "--no-progress", "--json", str(report_path), cwd=tmp_path, timeout=200)
    report = studio_report(done, report_path)
    assert report["first_jammed"] == "provider:image"
    assert report["aging_promotions"] == 8
    assert report["promoted_to_rush"] == 0
    assert report["rush_jumps"] > 0
    assert [g["group"] for g in report["groups"]] == [
        "ep1",
        "ep2",
        "ep3",
        "ep4",
        "ep5",
        "ep6",
        "posters",
    ]
    assert all(g["dead"] == 0 and g["cancelled"] == 0 for g in report["groups"])
    for stats in report["referee"].values():
        assert stats["rejected"] == 0
        assert stats["max_in_window"] <= stats["quota"]["rpm"]
        assert stats["max_concurrent"] <= stats["quota"]["concurrency"]


def test_bad_options_are_named() -> None:
    done = headrace("demo", "--inject", "meteor")
    assert done.returncode == 2
    assert "--inject" in done.stderr
    assert "meteor" in done.stderr
    done = headrace("demo", "--window", "soon")
    assert done.returncode == 2
    assert "--window" in done.stderr


def test_worker_names_an_app_it_cannot_load() -> None:
    done = headrace("worker", "no_such_module:app")
    assert done.returncode == 2
    assert "no_such_module" in done.stderr
    done = headrace("worker", "json:dumps")
    assert done.returncode == 2
    assert "not a headrace App" in done.stderr


def test_version_is_the_package_version() -> None:
    done = headrace("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"headrace, version {importlib.metadata.version('headrace')}"


@pytest.mark.realtime
def test_a_second_demo_on_the_same_store_is_refused_in_one_line(tmp_path: Path) -> None:
    small = ("--no-progress", "--episodes", "1", "--shots", "1", "--low-batch", "0")
    first = headrace("demo", *small, "--window", "1s", "--db", "same.db", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert re.search(r"makespan\s+│\s+\d+\.\d+s", first.stdout), first.stdout
    again = headrace("demo", *small, "--window", "1s", "--db", "same.db", cwd=tmp_path)
    assert again.returncode != 0
    assert "Traceback" not in again.stderr
    [line] = again.stderr.splitlines()
    assert f"sqlite:///{tmp_path / 'same.db'}" in line
    assert "already holds 5 tasks" in line
    assert "makespan" not in again.stdout


@pytest.mark.realtime
def test_the_demo_in_80_columns_shows_every_gate_name_whole(tmp_path: Path) -> None:
    small = ("--no-progress", "--episodes", "1", "--shots", "1", "--low-batch", "0")
    done = headrace("demo", *small, "--window", "1s", cwd=tmp_path, env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in done.stdout  # nothing ellipsized
    gates = "\n".join(lines[next(n for n, line in enumerate(lines) if line.startswith("Gates")) :])
    for name in ("local:assembly", "provider:image", "provider:speech", "provider:video"):
        assert re.search(rf"│ {re.escape(name)} +│", gates), done.stdout


def test_worker_takes_the_app_once() -> None:
    done = headrace("worker", "tests.e2e.cli_app:app", "--app", "tests.e2e.cli_app:make_app")
    assert done.returncode == 2
    assert "two apps given" in done.stderr
    done = headrace("worker")
    assert done.returncode == 2
    assert "MODULE:ATTR" in done.stderr


def test_the_store_option_overrides_the_app_and_the_environment_gives_both(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    app = "tests.e2e.cli_app:app"  # its own store is memory://: nothing would outlive a command
    submitted = headrace("submit", "--app", app, "--db", str(db), "render", "a")
    assert submitted.returncode == 0, submitted.stderr
    environment = {"HEADRACE_URL": f"sqlite:///{db}", "HEADRACE_APP": app}
    shown = headrace("status", env=environment)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"│ render\s+│\s+0 │\s+1 │", shown.stdout), shown.stdout


def test_demo_moderation_runs_a_burst_of_real_media_beside_fifo(tmp_path: Path) -> None:
    report_path, chart = tmp_path / "report.json", tmp_path / "depths.png"
    small = ["--crowd", "3", "--photos", "2", "--heavy", "6", "--latecomers", "1"]
    small += ["--videos", "1", "--voice", "1"]
    done = headrace(
        "demo", "moderation", *small, "--no-progress", "--json", str(report_path),
        "--chart", str(chart), cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "the burst, measured" in done.stdout
    report = json.loads(report_path.read_text())
    assert set(report) == {"fair", "fair without heavy", "fifo", "heavy_delay_s"}
    uploads = 3 * 2 + 6 + 1 + 1 + 1
    assert report["fair"]["states"] == {"reviewable": uploads}
    assert report["fair"]["duplicate_derivatives"] == 0
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_moderation_names_a_clamd_that_does_not_answer(tmp_path: Path) -> None:
    done = headrace("demo", "moderation", "--clamd", str(tmp_path / "no.sock"), cwd=tmp_path)
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and "no clamd answers there" in done.stderr
    assert "Traceback" not in done.stderr
