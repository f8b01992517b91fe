"""The docs' programs run: the README's taste exits 0, and every complete program of the how-to
guide (a python block that begins with its imports) prints exactly the output block that
follows it. Each runs as a script in a directory of its own."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.postgres import fresh_schema

from .commands import ROOT, environment, headrace

README = ROOT / "README.md"
HOW_TO = ROOT / "docs" / "how-to.md"
PROGRAM_TIMEOUT = 60.0  # seconds: the how-to's programs run on the virtual clock, in well under 1
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>\S*)\s*$")
HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*$")
IMPORT = re.compile(r"^(import|from)\s")


@dataclass(frozen=True)
class Block:
    """A fenced block: the heading it sits under, its info string (`python`, or empty for
    output) and its text; `adjacent` when only blank lines separate it from the block before."""

    heading: str
    info: str
    text: str
    adjacent: bool


@dataclass(frozen=True)
class Program:
    heading: str
    source: str
    expected: str | None  # what it prints, when an output block follows it directly


def blocks(markdown: str) -> list[Block]:
    found: list[Block] = []
    heading = ""
    lines = iter(markdown.splitlines())
    since_block: list[str] | None = None  # lines since the last block closed
    for line in lines:
        fence = FENCE.match(line)
        if fence is None:
            title = HEADING.match(line)
            if title is not None:
                heading = title["title"]
            if since_block is not None:
                since_block.append(line)
            continue
        indent = len(fence["indent"])
        body: list[str] = []
        for inner in lines:
            if inner.strip() == "```":
                break
            body.append(inner[indent:])
        adjacent = since_block is not None and not any(s.strip() for s in since_block)
        text = "".join(f"{row}\n" for row in body)
        found.append(Block(heading, fence["info"], text, adjacent))
        since_block = []
    return found


def programs(markdown: str) -> list[Program]:
    """The complete programs of a page, each with the output block right after it, if any."""
    found = blocks(markdown)
    complete: list[Program] = []
    for index, block in enumerate(found):
        if block.info != "python" or not IMPORT.match(block.text):
            continue
        after = found[index + 1] if index + 1 < len(found) else None
        shown = after.text if after is not None and after.adjacent and after.info == "" else None
        complete.append(Program(block.heading, block.text, shown))
    return complete


def slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def cases(path: Path) -> list[pytest.ParameterSet]:
    """One case per program, named by its heading (and its place under it, after the first)."""
    params: list[pytest.ParameterSet] = []
    seen: dict[str, int] = {}
    for program in programs(path.read_text()):
        name = slug(program.heading)
        seen[name] = seen.get(name, 0) + 1
        suffix = f"-{seen[name]}" if seen[name] > 1 else ""
        params.append(pytest.param(program, id=f"{name}{suffix}"))
    return params


def run_python(
    args: list[str], cwd: Path, timeout: float = PROGRAM_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_program(source: str, cwd: Path, name: str = "program.py") -> str:
    """Run `source` as a script in `cwd`; return what it printed, failing on a non-zero exit."""
    (cwd / name).write_text(source)
    done = run_python([name], cwd)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def section(markdown: str, heading: str) -> list[Block]:
    return [block for block in blocks(markdown) if block.heading == heading]


@pytest.mark.realtime
def test_the_readme_taste_runs(tmp_path: Path) -> None:
    taste = [b for b in section(README.read_text(), "A taste") if b.info == "python"]
    assert taste, "README.md: no python block under '## A taste'"
    run_program(taste[0].text, tmp_path, name="taste.py")


@pytest.mark.parametrize("program", cases(HOW_TO))
def test_a_how_to_program_prints_what_the_page_shows(program: Program, tmp_path: Path) -> None:
    printed = run_program(program.source, tmp_path)
    if program.expected is not None:
        assert printed == program.expected


def test_the_how_to_test_on_the_virtual_clock_passes(tmp_path: Path) -> None:
    """The conftest and the test module the how-to shows, run by pytest as a user would."""
    shown = section(HOW_TO.read_text(), "Test on the virtual clock")
    [conftest] = [b.text for b in shown if "def anyio_backend" in b.text]
    [module] = [b.text for b in shown if re.search(r"^async def test_", b.text, re.M)]
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_example.py").write_text(module)
    done = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_the_how_to_programs_are_found() -> None:
    """An empty parameter list would skip, not fail: make sure the parser sees the programs and
    the outputs under them."""
    found = programs(HOW_TO.read_text())
    assert len(found) >= 10
    assert sum(program.expected is not None for program in found) >= 8


# What the PostgreSQL guides say `headrace db upgrade` prints: the command they show, run on a
# schema of its own, prints the same versions.
UPGRADE_PAGES = [ROOT / "docs" / name for name in ("deploy-postgres.md", "service.md", "how-to.md")]
VERSIONS = re.compile(r"(?:schema version |`)(\d+) -> (\d+)")


def upgrade_figures(page: Path) -> list[tuple[int, int]]:
    """Every `schema version A -> B` (or `` `A -> B` ``) a page gives, as (A, B)."""
    return [(int(a), int(b)) for a, b in VERSIONS.findall(page.read_text())]


def test_the_schema_versions_the_docs_give_are_what_db_upgrade_prints() -> None:
    with fresh_schema("docs_upgrade") as url:
        printed = [headrace("db", "upgrade", "--db", url).stdout.strip() for _ in range(2)]
    first, again = (VERSIONS.search(line) for line in printed)
    assert first is not None and again is not None, printed
    latest = int(first[2])
    assert (int(first[1]), latest) == (0, latest) and printed[
        1
    ] == f"schema version {latest} -> {latest}"
    for page in UPGRADE_PAGES:
        figures = upgrade_figures(page)
        assert figures, f"{page.name}: no `schema version A -> B` found"
        assert (0, latest) in figures, (page.name, figures)  # the first run, as the page says
        assert {after for _, after in figures} == {latest}, (page.name, figures)
