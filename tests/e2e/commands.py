"""Run the real `headrace` command in a subprocess, and read what it printed."""

from __future__ import annotations

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
