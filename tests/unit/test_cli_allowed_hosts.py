"""`headrace serve --allowed-host` and HEADRACE_ALLOWED_HOSTS: a value that is not a host name
stops the command in one line naming the option, before anything opens."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from headrace.service.cli import main


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--allowed-host", "bad_host"], {}, "'bad_host'"),
        (["--allowed-host", "media.example:8000"], {}, "'media.example:8000'"),
        (["--allowed-host", "ok.example", "--allowed-host", "https://x.example"], {}, "'https://"),
        ([], {"HEADRACE_ALLOWED_HOSTS": "ok.example  *.example"}, "'*.example'"),
    ],
)
def test_a_bad_allowed_host_is_one_line_naming_the_option(
    args: list[str], env: dict[str, str], named: str
) -> None:
    done = CliRunner().invoke(main, ["serve", *args], env=env)
    assert done.exit_code == 2
    [line] = done.output.strip().splitlines()
    assert line.startswith("Error: --allowed-host: ") and named in line


def test_serve_says_what_it_takes() -> None:
    done = CliRunner().invoke(main, ["serve", "--help"])
    assert "--allowed-host HOST" in done.output and "HEADRACE_ALLOWED_HOSTS" in done.output
