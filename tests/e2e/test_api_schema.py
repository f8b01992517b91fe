"""Schemathesis against the served OpenAPI document: whatever it sends, no answer is a 5xx.

The `schemathesis run` command generates requests for every operation from the document
(valid ones and not, coverage, fuzzing and stateful phases) and sends them to a real
`headrace serve`, once with an admin's token and once with a moderator's of another event.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .server import Server, serving

pytestmark = pytest.mark.realtime

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("schema")) as running:
        yield running


@pytest.mark.parametrize("who", ["admin", "other-moderator"])
def test_no_request_gets_a_server_error(server: Server, who: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            str(SCHEMATHESIS),
            "run",
            f"{server.url}/openapi.json",
            "--checks",
            "not_a_server_error",
            "--header",
            f"Authorization: Bearer {server.tokens[who]}",
            "--max-examples",
            "25",
            "--seed",
            "1",
            "--report-dir",
            str(tmp_path),
            "--no-color",
        ],
        cwd=tmp_path,  # its cache directory goes there, not into the checkout
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    totals = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
    assert totals is not None and totals[1] == totals[2] and int(totals[1]) > 100, done.stdout
