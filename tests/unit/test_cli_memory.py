"""`--memory` as `worker`, `serve` and `demo moderation` read it."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from headrace.runtime.memory import DEFAULT_MEMORY, GIB, MIB
from headrace.service.cli import main, memory_option


@memory_option
@click.command()
def show(memory: int | None) -> None:
    click.echo(repr(memory))


@pytest.mark.parametrize(
    ("given", "budget"),
    [
        ("1GiB", GIB),
        ("512MiB", 512 * MIB),
        ("800M", 800_000_000),
        ("1073741824", GIB),
        ("off", None),
    ],
)
def test_sizes_are_read_in_their_units(given: str, budget: int | None) -> None:
    done = CliRunner().invoke(show, ["--memory", given])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == repr(budget)


def test_the_default_fits_a_one_gib_worker() -> None:
    done = CliRunner().invoke(show, [])
    assert done.output.strip() == repr(DEFAULT_MEMORY) == repr(768 * MIB)


@pytest.mark.parametrize("command", [["worker"], ["serve"], ["demo", "moderation"]])
def test_each_worker_command_takes_it(command: list[str]) -> None:
    done = CliRunner().invoke(main, [*command, "--help"])
    assert "--memory SIZE" in done.output and "768MiB" in done.output
