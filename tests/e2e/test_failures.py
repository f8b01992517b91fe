"""Expected failures print one line that names the path, URL or address: the real command."""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from .commands import APP, ROOT, failure_line, headrace

# Every command that takes a store, with what it needs besides the store.
STORE_COMMANDS = {
    "worker": ["worker", APP],
    "submit": ["submit", "--app", APP, "render", "shot-1"],
    "cancel": ["cancel", "1"],
    "status": ["status"],
    "dlq list": ["dlq", "list"],
    "dlq show": ["dlq", "show", "1"],
    "dlq retry": ["dlq", "retry"],
    "db upgrade": ["db", "upgrade"],
}
READING = ("cancel", "status", "dlq list", "dlq show", "dlq retry")
PASSWORD = "hunter2"
POSTGRES_DSN = os.environ.get("HEADRACE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def store_command(name: str, db: str) -> list[str]:
    return [*STORE_COMMANDS[name], "--db", db]


@pytest.mark.parametrize("command", STORE_COMMANDS)
def test_a_missing_directory_is_named(command: str, tmp_path: Path) -> None:
    path = tmp_path / "no-such-dir" / "studio.db"
    line = failure_line(headrace(*store_command(command, str(path))))
    assert str(path) in line
    expected = "no store at" if command in READING else "directory"
    assert expected in line
    assert not path.parent.exists()


@pytest.mark.parametrize("command", READING)
def test_a_store_file_that_does_not_exist_is_not_created(command: str, tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    line = failure_line(headrace(*store_command(command, f"sqlite:///{path}")))
    assert f"no store at {path}" in line
    assert not path.exists()


@pytest.mark.parametrize("command", STORE_COMMANDS)
def test_a_file_that_is_not_a_database_is_named(command: str, tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are not the tables you are looking for\n" * 100)
    line = failure_line(headrace(*store_command(command, str(path))))
    assert str(path) in line
    assert "not an SQLite database" in line


@pytest.mark.parametrize("command", ["worker", "status", "db upgrade"])
def test_a_store_from_a_newer_headrace_is_refused(command: str, tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA user_version = 99")
    connection.close()
    line = failure_line(headrace(*store_command(command, str(path))))
    assert str(path) in line
    assert "schema version 99" in line
    assert "newer" not in line or "headrace" in line


@pytest.mark.parametrize("command", STORE_COMMANDS)
def test_an_unreachable_server_is_named_without_the_password(command: str) -> None:
    url = f"postgresql://headrace:{PASSWORD}@127.0.0.1:1/media"
    done = headrace(*store_command(command, url))
    line = failure_line(done)
    assert "postgresql://headrace:***@127.0.0.1:1/media" in line
    assert "cannot reach" in line
    assert PASSWORD not in done.stderr + done.stdout


@pytest.mark.parametrize("command", ["worker", "status"])
def test_a_database_that_does_not_exist_is_named(command: str) -> None:
    try:
        psycopg.connect(POSTGRES_DSN, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_DSN}: {exc}")
    parts = urlsplit(POSTGRES_DSN)
    url = urlunsplit(parts._replace(path="/headrace_no_such_database"))
    line = failure_line(headrace(*store_command(command, url)))
    assert url in line
    assert 'database "headrace_no_such_database" does not exist' in line


# Run under `without_dac_override`: exits 0 when the checkout imports and the read-only file
# given refuses to open for writing.
PROBE = (
    "import sys, headrace\n"
    "try:\n"
    "    open(sys.argv[1], 'a').close()\n"
    "except PermissionError:\n"
    "    sys.exit(0)\n"
    "sys.exit('a read-only file opened for writing')\n"
)


@pytest.fixture
def without_dac_override(tmp_path: Path) -> list[str]:
    """A prefix under which a file's mode binds the command's writes. Root writes any file
    whatever its mode by CAP_DAC_OVERRIDE: as root, the command runs without that capability,
    still as uid 0 and with CAP_DAC_READ_SEARCH, so it reads the checkout whatever the
    checkout's mode (another user cannot enter a clone inside `mktemp -d`, mode 0700)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root, and no setpriv to drop CAP_DAC_OVERRIDE")
    prefix = [setpriv, "--bounding-set=-dac_override", "--inh-caps=-dac_override"]
    read_only = tmp_path / "probe"
    read_only.touch(mode=0o444)
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", PROBE, str(read_only)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    read_only.unlink()
    if probe.returncode != 0:
        said = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        pytest.skip(f"running as root, and file modes do not bind without CAP_DAC_OVERRIDE: {said}")
    return prefix


@pytest.mark.parametrize("command", ["submit", "cancel"])
def test_a_read_only_store_is_named(
    command: str, tmp_path: Path, without_dac_override: list[str]
) -> None:
    path = tmp_path / "studio.db"
    made = headrace("submit", "--app", APP, "--db", str(path), "render", "shot-0")
    assert made.returncode == 0, made.stderr
    path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    line = failure_line(headrace(*store_command(command, str(path)), prefix=without_dac_override))
    assert str(path) in line
    assert "read-only" in line


def test_a_port_in_use_is_named() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = failure_line(headrace("provider-sim", "--port", str(port)))
    assert f"127.0.0.1:{port}" in line
    assert "in use" in line


@pytest.mark.parametrize(
    ("target", "named"),
    [
        ("no_such_module:app", "cannot import 'no_such_module'"),
        ("json:nothing", "has no attribute 'nothing'"),
        ("json:dumps", "not a headrace App"),
    ],
)
@pytest.mark.parametrize(
    "how",
    [
        ["worker", "{target}"],
        ["worker", "--app", "{target}"],
        ["submit", "--app", "{target}", "render", "x"],
        ["status", "--app", "{target}"],
        ["dlq", "list", "--app", "{target}"],
    ],
)
def test_a_bad_app_is_named(how: list[str], target: str, named: str, tmp_path: Path) -> None:
    args = [part.format(target=target) for part in how]
    line = failure_line(headrace(*args, "--db", str(tmp_path / "s.db")))
    assert target in line
    assert named in line


def test_a_bad_app_from_the_environment_is_named() -> None:
    line = failure_line(headrace("worker", env={"HEADRACE_APP": "json:nothing"}))
    assert "json:nothing" in line


@pytest.mark.parametrize("given", ["video", "video=0", "video=two", "=2"])
def test_a_bad_cost_class_option_is_named(given: str, tmp_path: Path) -> None:
    line = failure_line(headrace("worker", APP, "--db", str(tmp_path / "s.db"), "--class", given))
    assert "--class" in line and repr(given) in line


MEMORY_COMMANDS = {
    "worker": ["worker", APP],
    "serve": ["serve"],
    "demo moderation": ["demo", "moderation"],
}


@pytest.mark.parametrize("command", MEMORY_COMMANDS)
@pytest.mark.parametrize("given", ["lots", "0", "1.5XB", "-1GiB"])
def test_a_bad_memory_budget_is_named(command: str, given: str, tmp_path: Path) -> None:
    args = [*MEMORY_COMMANDS[command], "--memory", given]
    line = failure_line(headrace(*args, cwd=tmp_path, env={"PYTHONPATH": str(ROOT)}))
    assert line.startswith("Error: --memory: ") and repr(given) in line
    assert not list(tmp_path.iterdir())  # refused before anything was opened or made


def test_a_worker_without_slots_for_a_stage_class_is_named(tmp_path: Path) -> None:
    app = tmp_path / "classed_app.py"
    app.write_text(
        "import headrace as hr\n"
        "app = hr.App('memory://')\n"
        "@app.task(cost_class='video')\n"
        "async def render(ctx, ref):\n"
        "    return None\n"
    )
    line = failure_line(
        headrace(
            "worker",
            "classed_app:app",
            "--class",
            "image=2",
            env={"PYTHONPATH": str(tmp_path)},
        )
    )
    assert "task render: cost class 'video' has no slots" in line


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--claim-ttl", "0s", "--claim-ttl: expected 1 to 86400 seconds"),
        ("--undo-window", "2d", "--undo-window: expected 0 to 86400 seconds"),
        ("--undo-window", "soon", "--undo-window: cannot read 'soon' as a duration"),
    ],
)
def test_a_bad_review_rule_is_named_by_its_option(
    option: str, value: str, said: str, tmp_path: Path
) -> None:
    db, media = tmp_path / "serve.db", tmp_path / "media"
    done = headrace("serve", "--db", str(db), "--media", str(media), option, value)
    assert said in failure_line(done) and done.returncode == 2
