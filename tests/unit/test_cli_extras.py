"""A command that needs an extra which is not installed says which, in one line, exit status 2;
and what `service/extras.py` says each extra brings is what pyproject.toml's extras install.

Each command runs in a subprocess whose `sys.modules` blocks the extra's modules (a None entry:
Python's import system then refuses them), as if they were not installed."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

import pytest

from headrace.service import extras

ROOT = Path(__file__).resolve().parents[2]
WIDE = {"COLUMNS": "200"}  # help lines whole


def headrace_without(blocked: Sequence[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`headrace ARGS...` in a process where the `blocked` modules cannot be imported."""
    script = (
        "import sys\n"
        f"sys.modules.update(dict.fromkeys({list(blocked)!r}))\n"
        "from headrace.service.cli import main\n"
        f"main({list(args)!r}, prog_name='headrace')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}, **WIDE},
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.splitlines()
    return line


SERVE = "headrace serve needs headrace[service]"
MODERATION = "headrace demo moderation needs headrace[moderation]"


@pytest.mark.parametrize(
    ("blocked", "args", "said"),
    [
        (["fastapi"], ["serve"], SERVE),
        (["fastapi"], ["serve", "--db", "x.db", "--port", "0", "--no-such-option"], SERVE),
        (["av", "pyvips"], ["serve"], SERVE),  # serve runs the moderation pipeline too
        (["av"], ["demo", "moderation", "--crowd", "2"], MODERATION),
        (["matplotlib"], ["demo", "moderation"], MODERATION),
        # The whole group is the extra's.
        (["obstore"], ["event", "close", "--db", "x.db", "gala"], "headrace event needs "),
    ],
)
def test_a_command_without_its_extra_says_which_in_one_line(
    blocked: list[str], args: list[str], said: str
) -> None:
    line = one_line(headrace_without(blocked, *args))
    extra = "service" if args[0] == "serve" else "moderation"
    assert line.startswith(f"Error: {said}"), line
    assert f"needs headrace[{extra}]; install it with: pip install 'headrace[{extra}]'" in line
    assert all(name in line for name in blocked), line


def test_an_app_of_headraces_own_without_its_extra_says_which() -> None:
    app = "headrace.pipelines.moderation.deploy:make_app"
    for args in (["worker", app], ["prune", "--app", app, "--db", "x.db"]):
        line = one_line(headrace_without(["obstore"], *args))
        assert f"app {app!r} needs headrace[moderation]" in line, line
        assert "pip install 'headrace[moderation]'" in line and "obstore" in line, line


def test_the_help_lists_the_commands_of_a_missing_extra_with_what_they_need() -> None:
    done = headrace_without(["fastapi", "av"], "--help")
    assert done.returncode == 0, done.stderr
    assert re.search(r"  serve +Needs headrace\[service\]", done.stdout), done.stdout
    assert re.search(r"  event +Needs headrace\[moderation\]", done.stdout), done.stdout
    assert re.search(r"  demo +Run the studio pipeline", done.stdout), done.stdout
    shown = headrace_without(["fastapi"], "serve", "--help")
    assert shown.returncode == 0 and "pip install 'headrace[service]'" in shown.stdout


def test_the_core_commands_load_no_extra() -> None:
    """`headrace demo` and the store commands, looked up with every extra's module blocked."""
    script = (
        "import json, sys\n"
        f"sys.modules.update(dict.fromkeys({list(extras.MODULES['service'])!r}))\n"
        "from headrace.service.cli import main\n"
        "ctx = main.make_context('headrace', ['demo'])\n"
        "names = ('demo', 'provider-sim', 'prune', 'worker', 'status', 'token', 'dlq', 'db')\n"
        "found = {n: type(main.get_command(ctx, n)).__name__ for n in names}\n"
        "found['demo moderation'] = main.get_command(ctx, 'demo').get_command(ctx, 'moderation')"
        ".help\n"
        "print(json.dumps(found))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    found = json.loads(done.stdout)
    assert found.pop("demo moderation").startswith("Needs headrace[moderation]")
    assert found == {
        "demo": "LazyGroup",
        "provider-sim": "Command",
        "prune": "Command",
        "worker": "Command",
        "status": "Command",
        "token": "CommandGroup",
        "dlq": "Group",
        "db": "Group",
    }


def _normalized(name: str) -> str:
    """A distribution's name as package indexes compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(requirements: Sequence[str]) -> set[str]:
    return {_normalized(re.split(r"[\[<>=~! ;]", given, maxsplit=1)[0]) for given in requirements}


def _extra_distributions(extra: str, declared: dict[str, list[str]]) -> set[str]:
    """The distributions `extra` installs, following `headrace[other]` to the other extras."""
    names: set[str] = set()
    for requirement in declared[extra]:
        included = re.fullmatch(r"headrace\[(\w+)\]", requirement)
        names |= (
            _extra_distributions(included[1], declared)
            if included
            else _requirement_names([requirement])
        )
    return names


def test_each_extras_modules_come_with_that_extra_and_the_core_is_light() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["optional-dependencies"]
    core = _requirement_names(project["dependencies"])
    assert len(core) <= 6, core
    providers = importlib.metadata.packages_distributions()
    for extra, modules in extras.MODULES.items():
        brought = _extra_distributions(extra, declared)
        for module in modules:
            from_dists = {_normalized(name) for name in providers[module]}
            assert from_dists & brought, (extra, module, from_dists)
            assert not from_dists & core, (extra, module)  # the core does not bring it already


def test_a_module_names_the_narrowest_extra_that_brings_it() -> None:
    assert extras.extra_of("obstore.store") == "moderation"
    assert extras.extra_of("fastapi.responses") == "service"
    assert extras.extra_of("httpx") is None
