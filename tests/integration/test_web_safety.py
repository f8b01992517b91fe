"""What every answer of the service carries, in process: the security headers on each kind of
answer (JSON, errors, pages, static files, previews, redirects, metrics, the API docs), and
redirects that name a path, never the Host a client sent; the host names it answers for; API
docs that load nothing from another server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from headrace.service.api.websafety import SECURITY_HEADERS

from .api import error_code, form_token_of, harness, reviewable, sign_in, sign_in_form

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real time: the SQLite store's thread


def has_security_headers(answer: httpx.Response) -> bool:
    return all(answer.headers.get(name) == value for name, value in SECURITY_HEADERS.items())


# (method, path, who: a bearer token's holder or "page" for a sign-in, status expected)
ANSWERS = [
    ("GET", "/healthz", None, 200),
    ("GET", "/openapi.json", None, 200),
    ("GET", "/docs", None, 200),
    ("GET", "/static/page.css", None, 200),
    ("GET", "/static/nothing.css", None, 404),
    ("GET", "/login", None, 200),
    ("GET", "/moderate", None, 303),
    ("GET", "/moderate/gala", "page", 200),
    ("GET", "/moderate/gala/new", "page", 200),
    ("POST", "/logout", "page", 403),
    ("GET", "/v1/stages", "moderator", 200),
    ("GET", "/v1/stages", None, 401),
    ("GET", "/v1/gates", "moderator", 403),
    ("GET", "/v1/nowhere", None, 404),
    ("DELETE", "/healthz", None, 405),
    ("GET", "/v1/events/gala/items?limit=0", "moderator", 422),
    ("GET", "/metrics", "admin", 200),
    ("POST", "/webhooks/vidgen", None, 401),
]


@pytest.mark.parametrize(("method", "path", "who", "status"), ANSWERS)
async def test_every_kind_of_answer_carries_the_security_headers(
    tmp_path: Path, method: str, path: str, who: str | None, status: int
) -> None:
    async with harness(tmp_path) as h:
        headers = {}
        if who == "page":
            await sign_in(h, "moderator")
        elif who is not None:
            headers = h.auth(who)
        answer = await h.client.request(method, path, headers=headers)
        assert answer.status_code == status, answer.text
        assert has_security_headers(answer), answer.headers


async def test_previews_and_an_unexpected_failure_carry_them_too(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        media_id = await reviewable(h)
        preview = await h.client.get(f"/v1/items/{media_id}/preview", headers=h.auth("admin"))
        assert preview.headers["content-type"] == "image/webp"
        await sign_in(h, "moderator")
        thumbnail = await h.client.get(f"/moderate/media/{media_id}")
        assert thumbnail.headers["content-type"] == "image/webp"
        h.api.add_api_route("/boom", fail)
        failed = await h.client.get("/boom")
        assert failed.status_code == 500 and error_code(failed) == "internal"
        assert all(map(has_security_headers, (preview, thumbnail, failed)))


async def fail() -> None:
    raise RuntimeError("a bug")


@pytest.mark.parametrize(
    ("path", "location"),
    [
        ("/moderate/", "/moderate"),
        ("/v1/stages/", "/v1/stages"),
        ("/login/", "/login"),
        ("/moderate/gala//", "/moderate/gala"),
        (
            "/v1/events/gala/items/?limit=5&state=reviewable",
            "/v1/events/gala/items?limit=5&state=reviewable",
        ),
        ("/v1/items/caf%C3%A9/", "/v1/items/caf%C3%A9"),
    ],
)
async def test_a_trailing_slash_redirects_to_the_path_without_it_whatever_the_host(
    tmp_path: Path, path: str, location: str
) -> None:
    async with harness(tmp_path) as h:
        answer = await h.client.get(path, headers={"Host": "evil.example"})
        assert (answer.status_code, answer.headers["location"]) == (307, location)
        assert has_security_headers(answer)


@pytest.mark.parametrize(
    "path", ["/nowhere/", "/v1/nowhere/", "//evil.example/", "/\\evil.example/"]
)
async def test_a_trailing_slash_no_route_would_take_is_not_found(tmp_path: Path, path: str) -> None:
    async with harness(tmp_path) as h:
        # A whole URL, so that httpx sends `//evil.example/` as a path, not as another host.
        answer = await h.client.get(f"http://test{path}", headers={"Host": "evil.example"})
        assert answer.status_code == 404 and error_code(answer) == "not_found"


async def test_every_redirect_of_the_page_names_a_path(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        media_id = await reviewable(h)
        h.client.headers["Host"] = "evil.example"
        redirects = [await h.client.get("/moderate/gala")]  # not signed in: to /login
        form = {"token": h.tokens["moderator"], "form_token": await sign_in_form(h)}
        redirects.append(await h.client.post("/login", data=form))
        redirects.append(await h.client.get("/moderate"))  # its one event
        token = form_token_of(await h.client.get("/moderate/gala"))
        decision = {"decision": "approve", "form_token": token}
        redirects.append(await h.client.post(f"/moderate/gala/items/{media_id}", data=decision))
        redirects.append(await h.client.post("/logout", data={"form_token": token}))
        locations = [answer.headers["location"] for answer in redirects]
        assert [answer.status_code for answer in redirects] == [303] * 5
        assert locations[:3] == ["/login", "/moderate", "/moderate/gala"]
        assert all(where.startswith("/") and not where.startswith("//") for where in locations)


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("media.example", 200),
        ("MEDIA.example:8443", 200),
        ("10.0.0.7:8000", 200),
        ("test", 400),
        ("evil.example", 400),
        ("media.example.evil.example", 400),
    ],
)
async def test_told_its_names_the_service_answers_no_other_host(
    tmp_path: Path, host: str, status: int
) -> None:
    async with harness(tmp_path, allowed_hosts=("media.example", "10.0.0.7")) as h:
        for path in ("/healthz", "/moderate/", "/v1/nowhere"):
            answer = await h.client.get(path, headers={"Host": host})
            assert has_security_headers(answer)
            if status == 400:
                assert answer.status_code == 400
                assert error_code(answer) == "bad_host"
            else:
                assert answer.status_code == {"/healthz": 200, "/moderate/": 307}.get(path, 404)


async def test_the_api_docs_load_nothing_from_another_server(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        docs = await h.client.get("/docs")
        assert docs.status_code == 200 and "SwaggerUIBundle" in docs.text
        assert re.findall(r"(?i)https?:|//[a-z]", docs.text) == []  # no URL names a host
        assert "url: '/openapi.json'" in docs.text
        assets = re.findall(r'(?:src|href)="([^"]+)"', docs.text)
        assert sorted(Path(url).suffix for url in assets) == [".css", ".js", ".png"]
        for url in assets:
            asset = await h.client.get(url)
            assert asset.status_code == 200
            assert DOCS_ASSET_TYPES[Path(url).suffix] in asset.headers["content-type"]
        assert (await h.client.get("/redoc")).status_code == 404


DOCS_ASSET_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png"}
