"""Following the service guide's first steps in a checkout leaves nothing git would show: what
the commands make there (the SQLite store and the files SQLite and headrace keep beside it, the
media directory) is ignored by the checkout's .gitignore."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .commands import ROOT, environment, headrace

SERVING = re.compile(r"serving (http://\S+):")


def ignored(name: str) -> bool:
    """Whether the checkout's .gitignore ignores `name` at its top."""
    done = subprocess.run(["git", "check-ignore", "--no-index", "-q", name], cwd=ROOT, check=False)
    return done.returncode == 0


def serve_a_moment(cwd: Path) -> None:
    """`headrace serve --db headrace.db --media ./media`, as the guide starts it, until it
    answers; then Ctrl-C."""
    command = [sys.executable, "-m", "headrace", "serve", "--db", "headrace.db"]
    command += ["--media", "./media", "--port", "0"]
    with subprocess.Popen(
        command, cwd=cwd, env=environment(), stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stderr is not None
        address = next(
            found[1] for line in process.stderr if (found := SERVING.search(line)) is not None
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{address}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    assert process.returncode == 0


@pytest.mark.realtime
def test_what_the_service_guide_makes_in_a_checkout_is_ignored(tmp_path: Path) -> None:
    made = headrace(
        "token",
        "create",
        "--db",
        "headrace.db",
        "ops",
        "--role",
        "admin",
        "--event",
        "*",
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    serve_a_moment(tmp_path)
    left = sorted(path.name + ("/" if path.is_dir() else "") for path in tmp_path.iterdir())
    assert {"headrace.db", "headrace.db-turn", "media/"} <= set(left), left
    assert [name for name in left if not ignored(name)] == []
