"""The moderator page's forms, in process: each acts only on a form its own page sent (the form
token bound to a cookie: the sign-in's, or for signing in the sign-in form's; an Origin of this
service), and does nothing otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.pipeline import Staff
from headrace.pipelines.moderation.review import session_label
from headrace.service.api.auth import LOGIN, digest, form_token
from headrace.service.api.deps import LOGIN_COOKIE
from headrace.service.api.page import SIGN_IN_FORM_COOKIE

from .api import Harness, error_code, form_token_of, harness, reviewable, sign_in, sign_in_form

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
        and error_code(answer) == "forbidden"
        and "set-cookie" not in answer.headers
    )


async def login_state(h: Harness, cookie: str) -> str:
    found = await h.moderation.app.store.records.get_record(LOGIN, digest(cookie))
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
        assert answer.status_code == 403 and error_code(answer) == "forbidden"
        assert (await h.moderation.records.get(media_id)).state.value == "reviewable"


async def test_the_sign_in_page_sets_a_short_lived_form_cookie_for_its_form_alone(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path) as h:
        page = await h.client.get("/login")
        cookie = page.cookies[SIGN_IN_FORM_COOKIE]
        assert form_token_of(page) == form_token(cookie)
        set_cookie = page.headers["set-cookie"]
        for part in ("HttpOnly", "SameSite=strict", "Path=/login", "Max-Age=1800"):
            assert part in set_cookie
        token = form_token_of(page)
        signed = await h.client.post(
            "/login", data={"token": h.tokens["moderator"], "form_token": token}
        )
        assert signed.status_code == 303
        assert f'{SIGN_IN_FORM_COOKIE}="";' in signed.headers["set-cookie"]  # done with


async def sign_in_refused(h: Harness, form: dict[str, str]) -> None:
    """A sign-in with the moderator's token and `form`: refused with the form again, and a new
    form token that works."""
    answer = await h.client.post("/login", data={"token": h.tokens["moderator"], **form})
    assert answer.status_code == 403 and "text/html" in answer.headers["content-type"]
    assert "The sign-in form had expired" in answer.text
    assert LOGIN_COOKIE not in answer.cookies
    assert await h.moderation.app.store.records.list_records(LOGIN) == []
    again = {"token": h.tokens["moderator"], "form_token": form_token_of(answer)}
    assert (await h.client.post("/login", data=again)).status_code == 303


@pytest.mark.parametrize("wrong", WRONG_TOKENS)
async def test_a_sign_in_without_the_token_of_its_form_cookie_is_refused(
    tmp_path: Path, wrong: dict[str, str]
) -> None:
    async with harness(tmp_path) as h:
        await sign_in_form(h)
        await sign_in_refused(h, wrong)


@pytest.mark.parametrize("empty", [False, True])
async def test_a_sign_in_without_its_form_cookie_is_refused(tmp_path: Path, empty: bool) -> None:
    # What a page elsewhere that posts a sign-in form gets: a SameSite=Strict cookie stays out.
    # Neither the token of a form loaded before nor that of an empty cookie gets in.
    async with harness(tmp_path) as h:
        token = form_token("") if empty else await sign_in_form(h)
        h.client.cookies.clear()
        await sign_in_refused(h, {"form_token": token})


# A form's sender, as a browser names it: other sites', then this service's own.
FOREIGN = [
    {"Origin": "https://evil.example"},
    {"Origin": "null"},
    {"Origin": "http://test:8443"},  # this host on another port: another site's page
    {"Referer": "https://evil.example/page"},
]
SAME_SITE = [
    {},  # not a browser: the form token alone decides
    {"Origin": "http://test"},
    {"Origin": "https://test"},  # behind a TLS-terminating proxy
    {"Referer": "http://test/moderate/gala"},
    {"Origin": "https://media.example"},  # an allowed host
]
ALLOWED = ("test", "media.example")


@pytest.mark.parametrize("sender", FOREIGN)
async def test_a_sign_in_from_another_site_is_refused_with_the_form_again(
    tmp_path: Path, sender: dict[str, str]
) -> None:
    async with harness(tmp_path) as h:
        form = {"token": h.tokens["moderator"], "form_token": await sign_in_form(h)}
        answer = await h.client.post("/login", data=form, headers=sender)
        assert answer.status_code == 403 and "text/html" in answer.headers["content-type"]
        assert "The form was sent from another site" in answer.text
        assert 'name="token"' in answer.text
        assert LOGIN_COOKIE not in answer.cookies
        assert await h.moderation.app.store.records.list_records(LOGIN) == []


@pytest.mark.parametrize("sender", FOREIGN)
async def test_a_sign_out_from_another_site_is_refused(
    tmp_path: Path, sender: dict[str, str]
) -> None:
    async with harness(tmp_path) as h:
        cookie = await sign_in(h, "moderator")
        token = form_token_of(await h.client.get("/moderate/gala"))
        assert refused(await h.client.post("/logout", data={"form_token": token}, headers=sender))
        assert await login_state(h, cookie) == "active"


@pytest.mark.parametrize("sender", FOREIGN)
async def test_a_decision_from_another_site_is_refused(
    tmp_path: Path, sender: dict[str, str]
) -> None:
    async with harness(tmp_path) as h:
        media_id = await reviewable(h)
        await sign_in(h, "moderator")
        token = form_token_of(await h.client.get("/moderate/gala"))
        answer = await h.client.post(
            f"/moderate/gala/items/{media_id}",
            data={"decision": "approve", "form_token": token},
            headers=sender,
        )
        assert refused(answer)
        assert (await h.moderation.records.get(media_id)).state.value == "reviewable"


@pytest.mark.parametrize("sender", SAME_SITE)
async def test_forms_of_this_service_are_acted_on(tmp_path: Path, sender: dict[str, str]) -> None:
    async with harness(tmp_path, allowed_hosts=ALLOWED) as h:
        media_id = await reviewable(h)
        form = {"token": h.tokens["moderator"], "form_token": await sign_in_form(h)}
        signed = await h.client.post("/login", data=form, headers=sender)
        assert signed.status_code == 303
        token = form_token_of(await h.client.get("/moderate/gala"))
        decided = await h.client.post(
            f"/moderate/gala/items/{media_id}",
            data={"decision": "approve", "form_token": token},
            headers=sender,
        )
        assert decided.status_code == 303
        assert (await h.moderation.records.get(media_id)).state.value == "approved"
        out = await h.client.post("/logout", data={"form_token": token}, headers=sender)
        assert out.status_code == 303


# -- the page's calls (review by keyboard): JSON, checked as forms, the token in a header

CALLS = [
    ("claim/{id}", {}),
    ("decide/{id}", {"decision": "approve"}),
    ("release/{id}", {}),
    ("bulk", {"decision": "reject", "media_ids": ["{id}"], "reason": "off_topic"}),
]


def call_body(body: dict[str, Any], media_id: str) -> dict[str, Any]:
    return {k: [media_id] if k == "media_ids" else v for k, v in body.items()}


@pytest.mark.parametrize(("path", "body"), CALLS)
@pytest.mark.parametrize("token", ["", "0" * 64])
async def test_a_page_call_without_its_form_token_changes_nothing(
    tmp_path: Path, path: str, body: dict[str, Any], token: str
) -> None:
    async with harness(tmp_path) as h:
        media_id = await reviewable(h)
        await sign_in(h, "moderator")
        answer = await h.client.post(
            f"/moderate/gala/{path.format(id=media_id)}",
            json=call_body(body, media_id),
            headers={"X-Form-Token": token} if token else {},
        )
        assert refused(answer)
        assert (await h.moderation.records.get(media_id)).state.value == "reviewable"
        assert await h.moderation.reviews.claims("gala") == {}


@pytest.mark.parametrize("sender", FOREIGN)
async def test_a_page_call_from_another_site_is_refused(
    tmp_path: Path, sender: dict[str, str]
) -> None:
    async with harness(tmp_path) as h:
        media_id = await reviewable(h)
        await sign_in(h, "moderator")
        token = form_token_of(await h.client.get("/moderate/gala"))
        answer = await h.client.post(
            f"/moderate/gala/decide/{media_id}",
            json={"decision": "approve"},
            headers={"X-Form-Token": token, **sender},
        )
        assert refused(answer)
        assert (await h.moderation.records.get(media_id)).state.value == "reviewable"


async def test_the_page_calls_claim_decide_undo_and_decide_in_bulk(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        first, second = await reviewable(h), await reviewable(h)
        await sign_in(h, "moderator")
        page = await h.client.get("/moderate/gala")
        headers = {"X-Form-Token": form_token_of(page)}
        assert "data-holder" not in page.text and " pending</span>" in page.text

        async def call(path: str, body: dict[str, Any] | None = None) -> httpx.Response:
            return await h.client.post(f"/moderate/gala/{path}", json=body or {}, headers=headers)

        handed = await call("next", {"after": 0, "upto": 2**40})
        assert handed.json() == {"media_id": first, "taken": {}}
        await h.moderation.reviews.claim(second, "moderator-2")  # another moderator's
        taken = await call(f"claim/{second}")
        assert taken.status_code == 409 and taken.headers["x-holder"] == "moderator-2"
        again = await h.client.get("/moderate/gala")
        assert "moderator-2 is on it" in again.text
        polled = await h.client.get("/moderate/gala/new", params={"upto": 0, "since": 0})
        assert polled.json()["claims"] == {first: "moderator", second: "moderator-2"}

        bad = await call(f"decide/{first}", {"decision": "reject", "reason": "ugly"})
        assert bad.status_code == 422
        done = await call(f"decide/{first}", {"decision": "reject", "reason": "personal_data"})
        assert done.json()["state"] == "rejected" and done.json()["applied"] is True
        undone = await call(f"undo/{first}")
        assert undone.json() == {"media_id": first, "state": "reviewable"}
        again = await call(f"undo/{first}")  # a repeat: answered as the undo was
        assert again.json() == {"media_id": first, "state": "reviewable"}
        never = await call(f"undo/{second}")  # nothing of hers to undo
        assert never.status_code == 409 and never.headers["x-state"] == "reviewable"

        results = await call("bulk", {"decision": "approve", "media_ids": [first, second]})
        assert results.json() == [
            {
                "media_id": first,
                "applied": True,
                "state": "approved",
                "conflict": None,
                "holder": None,
            },
            {
                "media_id": second,
                "applied": False,
                "state": "reviewable",
                "conflict": "claimed",
                "holder": "moderator-2",
            },
        ]
        changed = await h.client.get("/moderate/gala/new", params={"upto": 0, "since": 0})
        assert {c["media_id"]: c["state"] for c in changed.json()["changed"]}[first] == "approved"
        topics = [
            n.topic for n in await h.moderation.app.store.records.outbox() if n.record_id == first
        ]
        assert topics == ["item.rejected", "item.reopened", "item.approved"]


async def test_each_item_shows_what_a_decision_needs(tmp_path: Path) -> None:
    """Its age, its session as a short label with how many of its items are pending, staff
    priority when it was given, the automatic flag's reason; a player for sound, and its length."""
    async with harness(tmp_path) as h:
        moderation = h.moderation
        staff = Staff(3.0, "organiser", "the keynote's photos")
        uploads = [
            (samples.jpeg(), "s-keynote", staff),
            (samples.voice_note(), "s-guest", None),
            (samples.jpeg(), "s-guest", None),
        ]
        for data, session, given in uploads:
            item = await moderation.accept_bytes(data, event="gala", session=session, staff=given)
            await moderation.submit(item)
        await h.drain()
        await sign_in(h, "moderator")
        page = (await h.client.get("/moderate/gala")).text
        assert page.count("staff priority ×3") == 1
        assert page.count(f">{session_label('s-guest')}</span>") == 2
        assert page.count("2 pending") == 2 and page.count("1 pending") == 1
        assert "s-guest" not in page and "s-keynote" not in page  # labels, never the ids
        assert page.count('class="age" data-uploaded="') == 3
        assert page.count("<audio controls") == 1 and 'alt="waveform of the recording"' in page
        assert page.count("length 0:02") == 1  # the recording's, before it is played
