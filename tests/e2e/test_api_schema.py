"""Schemathesis against the served OpenAPI document: whatever it sends, no answer is a 5xx,
every error is an RFC 9457 problem (`problem_details`, schemathesis_hooks.py), and every status
and content type is one the document declares.

The `schemathesis run` command generates requests for every operation from the document
(valid ones and not, coverage, fuzzing and stateful phases) and sends them to a real
`headrace serve` on SQLite and on PostgreSQL, once with an admin's token and once with a
moderator's of another event. Its hooks (`schemathesis_hooks.py`) sign webhook deliveries, so
generated bodies get past the signature, and add the hostile shapes that once reached a 500
(deep nesting, lone surrogates, NULs, numbers JSON cannot say, an id sent again with another
body, NULs in captions) to the explicit examples.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.store.protocol.types import Settings
from headrace.store.urls import open_store
from tests.integration.postgres import fresh_schema, reachable

from .commands import ROOT, environment
from .server import WEBHOOK_SECRET, Server, serving

pytestmark = pytest.mark.realtime

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    scratch = tmp_path_factory.mktemp("schema")
    if request.param == "sqlite":
        with serving(scratch) as running:
            yield running
        return
    reachable()
    with fresh_schema("schema") as url, serving(scratch, store=url) as running:
        yield running


@pytest.mark.parametrize("who", ["admin", "other-moderator"])
def test_no_request_gets_a_server_error(server: Server, who: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            str(SCHEMATHESIS),
            "run",
            f"{server.url}/openapi.json",
            "--checks",
            "not_a_server_error,problem_details,status_code_conformance,content_type_conformance",
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
        env=environment(
            {
                "SCHEMATHESIS_HOOKS": "tests.e2e.schemathesis_hooks",
                "PYTHONPATH": str(ROOT),
                "HEADRACE_SCHEMA_WEBHOOK_SECRET": WEBHOOK_SECRET,
            }
        ),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    totals = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
    assert totals is not None and totals[1] == totals[2] and int(totals[1]) > 100, done.stdout
    if who == "admin":  # signed deliveries were read and kept: the hooks did their part
        assert asyncio.run(deliveries(server.store)) > 0, done.stdout


async def deliveries(url: str) -> int:
    store = open_store(url)
    await store.open(Settings())
    try:
        return len(await store.records.list_records("delivery"))
    finally:
        await store.close()
