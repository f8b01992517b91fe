"""The moderator page's forms, in process: each acts only on a form its own page sent (the form
token bound to a cookie, a same-site Origin), and does nothing otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from headrace.service.api.auth import LOGIN, digest
from headrace.service.api.deps import LOGIN_COOKIE

from .api import Harness, form_token_of, harness, reviewable, sign_in

pytestmark = pytest.mark.anyio

# A form token that is not the page's: missing, another one, text a form should never send.
WRONG_TOKENS = [{}, {"form_token": "0" * 64}, {"form_token": "é" * 64}]


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real time: the SQLite store's thread


def refused(answer: httpx.Response) -> bool:
    """A 403 in the API's error shape that sets no cookie."""
    return (
        answer.status_code == 403
        and answer.json()["error"]["code"] == "forbidden"
        and "set-cookie" not in answer.headers
    )


async def login_state(h: Harness, cookie: str) -> str:
    found = await h.moderation.app.store.get_record(LOGIN, digest(cookie))
    assert found is not None
    return found.state


@pytest.mark.parametrize("wrong", WRONG_TOKENS)
async def test_sign_out_without_its_form_token_changes_nothing(
    tmp_path: Path, wrong: dict[str, str]
) -> None:
    async with harness(tmp_path) as h:
        cookie = await sign_in(h, "moderator")
        assert refused(await h.client.post("/logout", data=wrong))
        assert await login_state(h, cookie) == "active"
        assert (await h.client.get("/moderate/gala")).status_code == 200


async def test_sign_out_with_its_form_token_ends_the_sign_in_on_the_server(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path) as h:
        cookie = await sign_in(h, "moderator")
        page = await h.client.get("/moderate/gala")
        out = await h.client.post("/logout", data={"form_token": form_token_of(page)})
        assert out.status_code == 303 and out.headers["location"] == "/login"
        assert out.headers["set-cookie"].startswith(f'{LOGIN_COOKIE}="";')  # deleted
        assert await login_state(h, cookie) == "revoked"
        h.client.cookies.set(LOGIN_COOKIE, cookie)  # a copy of the cookie is dead too
        assert (await h.client.get("/moderate/gala")).headers["location"] == "/login"


@pytest.mark.parametrize("wrong", WRONG_TOKENS)
async def test_a_decision_without_its_form_token_changes_nothing(
    tmp_path: Path, wrong: dict[str, str]
) -> None:
    async with harness(tmp_path) as h:
        media_id = await reviewable(h)
        await sign_in(h, "moderator")
        answer = await h.client.post(
            f"/moderate/gala/items/{media_id}", data={"decision": "approve", **wrong}
        )
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"
        assert (await h.moderation.records.get(media_id)).state.value == "reviewable"
