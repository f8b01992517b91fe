"""`headrace submit`, `cancel`, `status` and `worker` together on one SQLite file, the store and
the app given by options or by the environment, as a user would."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .commands import APP, ROOT, environment, failure_line, headrace


def submitted_id(done: subprocess.CompletedProcess[str]) -> int:
    assert done.returncode == 0, done.stderr
    match = re.match(r"submitted task (\d+): ", done.stdout)
    assert match is not None, done.stdout
    return int(match[1])


def test_submit_prints_the_new_id_and_a_known_key_says_so(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    first = submitted_id(headrace("submit", "--app", APP, "--db", db, "render", "ep1/s1"))
    keyed = headrace(
        *("submit", "--app", APP, "--db", db, "render", "ep1/s2", "--key", "ep1/s2:v1"),
        *("--group", "ep1", "--flow", "ep1", "--tier", "rush", "--delay", "30s"),
    )
    second = submitted_id(keyed)
    assert second == first + 1
    again = headrace(*keyed.args[3:])  # the same submission: the same task
    assert again.returncode == 0, again.stderr
    assert f"task {second} already has the key 'ep1/s2:v1'" in again.stdout
    assert "nothing new submitted" in again.stdout
    other = failure_line(
        headrace("submit", "--app", APP, "--db", db, "render", "other", "--key", "ep1/s2:v1")
    )
    assert f"already names task {second}, whose ref differs" in other
    show = headrace("dlq", "show", "--db", db, str(second))
    assert show.returncode == 0, show.stderr
    for field in ("ep1 / ep1", "rush (submitted rush)", "provider:image", "ep1/s2:v1"):
        assert field in show.stdout


def test_submit_after_waits_and_names_what_it_does_not_know(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    first = submitted_id(headrace("submit", "--app", APP, "--db", db, "render", "a"))
    done = headrace("submit", "--app", APP, "--db", db, "publish", "a", "--after", str(first))
    assert ", pending" in done.stdout
    line = failure_line(headrace("submit", "--app", APP, "--db", db, "transcode", "a"))
    assert "no task named 'transcode'" in line and "publish, render" in line
    line = failure_line(
        headrace("submit", "--app", APP, "--db", db, "render", "b", "--after", "99")
    )
    assert "task 99" in line
    line = failure_line(headrace("submit", "--db", db, "render", "b"))
    assert "--app" in line


def test_cancel_cancels_a_task_and_its_dependents_and_says_so(tmp_path: Path) -> None:
    env = {"HEADRACE_URL": str(tmp_path / "s.db"), "HEADRACE_APP": APP}
    first = submitted_id(headrace("submit", "render", "a", env=env))
    second = submitted_id(headrace("submit", "publish", "a", "--after", str(first), env=env))
    done = headrace("cancel", str(first), env=env)
    assert done.returncode == 0, done.stderr
    assert f"cancelled task {first} (render a, was ready) and the tasks that wait on it" in (
        done.stdout
    )
    done = headrace("cancel", str(second), env=env)
    assert done.returncode == 0, done.stderr
    assert f"task {second} (publish a) is already cancelled: nothing to cancel" in done.stdout
    line = failure_line(headrace("cancel", "99", env=env))
    assert "task 99: no such task" in line


def test_status_shows_groups_stages_and_gates(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    for ref in ("a", "b", "c"):
        submitted_id(headrace("submit", "--app", APP, "--db", db, "render", ref, "--group", "ep1"))
    doomed = submitted_id(
        headrace("submit", "--app", APP, "--db", db, "render", "d", "--group", "ep1")
    )
    assert headrace("cancel", "--db", db, str(doomed)).returncode == 0
    done = headrace("status", "--app", APP, "--db", db)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"│ ep1\s+│\s+4 │\s+0 │\s+0 │\s+1 │\s+0% │", out), out
    assert re.search(r"│ render\s+│\s+0 │\s+3 │\s+0 │\s+0 │\s+\d+s │", out), out
    assert re.search(r"│ publish\s+│\s+0 │\s+0 │\s+0 │\s+0 │\s+- │", out), out  # idle, declared
    assert re.search(r"│ provider:image\s+│\s+2 │\s+10/6s │\s+0 │\s+0 │", out), out
    assert re.search(r"│ local:publish\s+│\s+1 │\s+- │\s+0 │\s+0 │", out), out  # not used yet
    bare = headrace("status", env={"HEADRACE_URL": db})
    assert bare.returncode == 0, bare.stderr
    assert "give --app to see them" in bare.stdout
    assert "publish" not in bare.stdout  # without the app, only stages with work


def test_status_watch_redraws_until_ctrl_c_and_exits_cleanly(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    submitted_id(headrace("submit", "--app", APP, "--db", db, "render", "a", "--group", "ep1"))
    watching = subprocess.Popen(
        [sys.executable, "-m", "headrace", "status", "--watch", "--every", "0.2s", "--db", db],
        cwd=ROOT,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert watching.stdout is not None
    assert "Ctrl-C to stop" in watching.stdout.readline()
    time.sleep(0.6)
    watching.send_signal(signal.SIGINT)
    out, err = watching.communicate(timeout=30)
    assert watching.returncode == 0, err
    assert "Traceback" not in err
    assert "Stages" in out


@pytest.mark.realtime
def test_a_worker_from_the_environment_runs_what_submit_enqueues(tmp_path: Path) -> None:
    env = {"HEADRACE_URL": str(tmp_path / "s.db"), "HEADRACE_APP": APP}
    worker = subprocess.Popen(
        [sys.executable, "-m", "headrace", "--log-format", "json", "worker", "--name", "w1"],
        cwd=ROOT,
        env=environment(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stderr is not None
        banner = json.loads(worker.stderr.readline())
        first = submitted_id(headrace("submit", "render", "a", "--group", "ep1", env=env))
        deadline = time.monotonic() + 30
        while "100%" not in (shown := headrace("status", env=env).stdout):
            assert time.monotonic() < deadline, shown
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert (banner["level"], banner["logger"]) == ("INFO", "headrace.worker")
    message = banner["message"]
    assert message.startswith("worker w1 started: store sqlite:///")
    for part in (f"app {APP}", "4 slots", "lease 30s", "provider:image (cap 2, 10/6s)"):
        assert part in message
    assert "local:publish (cap 1)" in message
    assert "succeeded" in headrace("dlq", "show", str(first), env=env).stdout
