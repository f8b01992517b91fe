"""The `headrace` command's lazily loaded commands: listed and run like the others, and a worker
process that starts without them does not load the web and media stacks."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from headrace.service.cli import main

LAZY = ("demo", "event", "provider-sim", "prune", "serve")


def test_every_command_is_listed_and_has_its_help() -> None:
    listed = CliRunner().invoke(main, ["--help"])
    assert listed.exit_code == 0, listed.output
    for name in (*LAZY, "worker", "submit", "status", "dlq", "db", "token"):
        assert f"  {name} " in listed.output, name
        shown = CliRunner().invoke(main, [name, "--help"])
        assert shown.exit_code == 0 and "Usage: " in shown.output, (name, shown.output)


def test_an_unknown_command_is_a_usage_error() -> None:
    done = CliRunner().invoke(main, ["serv"])
    assert done.exit_code == 2 and "No such command 'serv'" in done.output


def test_the_worker_command_loads_no_web_or_media_stack() -> None:
    """What `headrace worker` imports before it runs: the command module, and nothing of the
    commands that serve or make media (each a second or so of start-up and 60 MB, per process)."""
    heavy = ("fastapi", "uvicorn", "starlette", "av", "PIL", "pyvips", "httpx")
    script = (
        "import json, sys\n"
        "import headrace.service.cli as cli\n"
        "cli.main.get_command(None, 'worker')\n"
        f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(found.stdout) == []
