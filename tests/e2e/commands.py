"""Run the real `headrace` command in a subprocess, and read what it printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.e2e.cli_app:app"
# What the environment may say for a command line; a test sets it on purpose or not at all.
HEADRACE_VARIABLES = ("HEADRACE_URL", "HEADRACE_APP")


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in HEADRACE_VARIABLES}
    return {**env, "COLUMNS": "200", **(extra or {})}


def headrace(
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    cwd: Path = ROOT,
    prefix: Sequence[str] = (),
    **options: Any,
) -> subprocess.CompletedProcess[str]:
    """`headrace ARGS...` in `cwd`; `prefix` runs it through another command (e.g. one that
    changes user)."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "headrace", *args],
        cwd=cwd,
        env=environment(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **options,
    )


def failure_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line an expected failure prints: non-zero exit, no traceback, one stderr line."""
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def studio_report(done: subprocess.CompletedProcess[str], path: Path) -> dict[str, Any]:
    """`headrace demo --json path`'s report, once what every studio demo run promises holds:
    exit 0, the report printed on the embedded store, every task done within its quota."""
    assert done.returncode == 0, done.stderr
    assert "makespan / lower bound" in done.stdout
    assert "store: sqlite:///" in done.stdout
    report: dict[str, Any] = json.loads(path.read_text())
    assert report["all_succeeded"] is True
    assert report["rate_limited_responses"] == 0
    assert 1.0 <= report["ratio"] < 1.5
    assert all(g["succeeded"] == g["total"] for g in report["groups"])
    return report
