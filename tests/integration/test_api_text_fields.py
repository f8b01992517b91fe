"""A property over every free-text field the API takes (an upload's caption, a webhook's id,
type, remote id and result, a group's name, the dead letters' filters): whatever text is sent,
lone surrogates and NULs included, the answer is never a 5xx, and SQLite and PostgreSQL give the
same status."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.pipeline import Admission

from .api import Harness, harness
from .postgres import fresh_schema, reachable

pytestmark = pytest.mark.anyio

# Any code point, surrogates too (Python's JSON decoder makes them from escapes), NUL and the
# other controls weighted in, since they are what a store may refuse.
TEXT = st.text(
    st.one_of(
        st.characters(exclude_categories=()),
        st.sampled_from("\x00\ud800\udfff\x7f\n\u2028"),
    ),
    max_size=40,
)
SMALL_JPEG = samples.jpeg(32, 24)
EXAMPLES = itertools.count()


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": False})  # debug off: hundreds of requests in one test


@pytest.fixture
async def services(tmp_path: Path) -> AsyncIterator[dict[str, Harness]]:
    """The service over an SQLite store and over a PostgreSQL schema, open together."""
    roomy = Admission(per_event=10_000, per_session=10_000)
    reachable()
    for name in ("s", "p"):
        (tmp_path / name).mkdir()
    async with contextlib.AsyncExitStack() as stack:
        url = stack.enter_context(fresh_schema("text"))
        sqlite = await stack.enter_async_context(harness(tmp_path / "s", admission=roomy))
        postgres = await stack.enter_async_context(
            harness(tmp_path / "p", admission=roomy, url=url)
        )
        yield {"sqlite": sqlite, "postgres": postgres}


async def answers(h: Harness, text: str, n: int) -> list[int]:
    """The statuses of every request that carries `text` in a free-text field."""
    raw = text.encode("utf-8", "surrogatepass")
    path = quote(raw, safe="")
    admin = h.auth("admin")
    webhooks = [
        {"id": text or "x", "type": "job.done"},
        {"id": f"t{n}", "type": text or "x"},
        {"id": f"r{n}", "type": "job.done", "remote_id": text, "status": "succeeded"},
        {"id": f"s{n}", "type": "job.done", "result": {text: [text]}},
    ]
    sent = [await h.deliver(json.dumps(body).encode()) for body in webhooks]
    files = {"file": ("a.jpg", SMALL_JPEG), "caption": (None, raw)}
    sent.append(
        await h.client.post("/v1/events/gala/uploads", headers=h.auth("uploader"), files=files)
    )
    sent.append(await h.client.get(f"/v1/groups/{path or 'x'}", headers=admin))
    sent.append(await h.client.get(f"/v1/dead-letters?group={path}&kind={path}", headers=admin))
    return [answer.status_code for answer in sent]


@pytest.mark.realtime
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],  # one service for all
)
@given(text=TEXT)
async def test_any_text_in_any_field_is_never_a_5xx_and_the_same_on_both_stores(
    services: dict[str, Harness], text: str
) -> None:
    n = next(EXAMPLES)
    found = {name: await answers(h, text, n) for name, h in services.items()}
    assert found["sqlite"] == found["postgres"], (text, found)
    assert all(status < 500 for status in found["sqlite"]), (text, found)
