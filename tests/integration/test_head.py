"""HEAD wherever GET works (RFC 9110 section 9.3.2): every GET route of the app, found from its
router so a route added later is walked too, and every file of its static mounts, answer HEAD
with GET's status and headers and no body."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

import headrace as hr
from headrace.pipelines.moderation import samples
from headrace.store.protocol.types import TaskState

from .api import Harness, harness, reviewable, sign_in

pytestmark = pytest.mark.anyio

# Headers whose value is new on every answer: a sign-in form's cookie.
FRESH = {"set-cookie"}


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real time: the SQLite store's thread


def get_paths(h: Harness) -> list[str]:
    """The path template of every route that answers GET."""
    paths = []
    for context in iter_route_contexts(h.api.router.routes):
        if context.methods is not None and "GET" in context.methods:
            paths.append(str(context.path))
    return paths


def static_files(h: Harness) -> list[str]:
    """Every file of every static mount, as a path."""
    paths = []
    for route in h.api.router.routes:
        if isinstance(route, Mount) and isinstance(route.app, StaticFiles):
            assert route.app.directory is not None
            for file in sorted(Path(route.app.directory).iterdir()):
                if file.is_file():
                    paths.append(f"{route.path}/{file.name}")
    return paths


def fails(app: hr.App) -> None:
    """A stage whose one attempt dies: a dead letter to show."""

    @app.task(name="fails")
    async def broken(ctx: hr.Context, ref: str) -> None:
        raise hr.Fatal("broken", code="test.broken")


async def values(h: Harness, media_id: str) -> dict[str, str]:
    """A value for each path parameter, naming something that is there: a dead task's id
    (a task's page shows it too)."""
    await h.moderation.app.definition("fails").submit("x", group="gala")
    await h.drain()
    [dead] = await h.moderation.app.store.tasks(state=TaskState.DEAD, limit=1)
    return {"event": "gala", "media_id": media_id, "task_id": str(dead.id), "group": "gala"}


def filled(template: str, known: dict[str, str]) -> str:
    names = re.findall(r"{(\w+)}", template)
    assert set(names) <= set(known), f"{template}: give its parameters a value here"
    return re.sub(r"{(\w+)}", lambda found: known[found[1]], template)


def same_head(get: httpx.Response, head: httpx.Response, fresh: set[str] = FRESH) -> list[str]:
    """How HEAD's answer differs from GET's: nothing, when it is right. `fresh`: headers whose
    value may change from one answer to the next (only their presence is compared)."""
    differences = []
    if head.status_code != get.status_code:
        differences.append(f"status {head.status_code} != {get.status_code}")
    if head.content:
        differences.append(f"a body of {len(head.content)} bytes")
    for name in set(get.headers) | set(head.headers):
        if name not in fresh and get.headers.get(name) != head.headers.get(name):
            differences.append(f"{name}: {head.headers.get(name)!r} != {get.headers.get(name)!r}")
        elif (name in get.headers) != (name in head.headers):
            differences.append(f"{name} missing")
    return differences


async def test_every_get_route_and_static_file_answers_head_as_get(tmp_path: Path) -> None:
    async with harness(tmp_path, declare=fails) as h:
        clip = await reviewable(h, data=samples.mp4(1.0, 160, 120))  # a preview and a playback
        await sign_in(h, "admin")  # the page's routes, and a bearer token for the API's
        h.client.headers.update(h.auth("admin"))
        known = await values(h, clip)
        paths = [filled(path, known) for path in get_paths(h)] + static_files(h)
        assert {"/metrics", "/docs", "/openapi.json", "/static/page.js"} <= set(paths)
        assert f"/v1/items/{clip}/playback" in paths
        assert "/docs/assets/swagger-ui-bundle.js" in paths
        found: dict[str, list[str]] = {}
        statuses = {}
        for path in paths:
            get = await h.client.get(path)
            head = await h.client.head(path)
            statuses[path] = get.status_code
            # A page made anew for each request (no-store) says the time, to the millisecond:
            # its length may change from one answer to the next, so only its presence counts.
            made_anew = get.headers.get("cache-control") == "no-store"
            varies = FRESH | ({"content-length"} if made_anew else set())
            if differences := same_head(get, head, varies):
                found[path] = differences
        assert found == {}
        # Each route was reached, not refused: 2xx, or a redirect of the page.
        assert {path for path, status in statuses.items() if status >= 400} == set()


async def test_a_range_and_a_condition_on_head_answer_as_on_get(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        note = await reviewable(h, data=samples.voice_note(1.0))
        path, auth = f"/v1/items/{note}/playback", h.auth("moderator")
        whole = await h.client.get(path, headers=auth)
        for asked in (
            {"Range": "bytes=0-99"},
            {"Range": f"bytes={10**9}-"},
            {"If-None-Match": whole.headers["etag"]},
        ):
            get = await h.client.get(path, headers={**auth, **asked})
            head = await h.client.head(path, headers={**auth, **asked})
            assert same_head(get, head) == [], asked
            assert get.status_code in (206, 304, 416)


async def test_a_method_a_get_route_does_not_take_names_head_among_those_it_does(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path) as h:
        answer = await h.client.delete("/healthz")
        assert answer.status_code == 405 and answer.headers["allow"] == "GET, HEAD"
        posted = await h.client.head("/v1/events/gala/decisions")  # a POST route's GET is 405
        assert posted.status_code == 405 and posted.headers["allow"] == "POST"
