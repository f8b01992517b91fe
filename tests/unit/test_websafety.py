"""Whether a request comes from a page of this service (`websafety.same_origin`), that every
page form asks it, which host names the service can be told to answer for (`host_names`), and
that its middleware leave the lifespan alone."""

from __future__ import annotations

import pytest
from fastapi.routing import APIRoute
from starlette.types import Message, Receive, Scope, Send

from headrace.policy.errors import ConfigError
from headrace.service.api import page
from headrace.service.api.deps import ApiSettings, host_names
from headrace.service.api.websafety import (
    AllowedHosts,
    SecurityHeaders,
    host_name,
    same_origin,
)

ALLOWED = ("media.example", "::1")


@pytest.mark.parametrize(
    ("headers", "same"),
    [
        ({"host": "svc.example", "origin": "https://svc.example"}, True),
        ({"host": "svc.example", "origin": "http://svc.example"}, True),  # scheme ignored
        ({"host": "svc.example:8000", "origin": "http://SVC.example:8000"}, True),
        ({"host": "svc.example", "origin": "https://media.example:8443"}, True),  # allowed
        ({"host": "svc.example", "origin": "http://[::1]:8000"}, True),  # allowed, IPv6
        ({"host": "svc.example", "referer": "https://svc.example/moderate/gala?upto=3"}, True),
        ({"host": "svc.example"}, True),  # neither header: not a browser's form
        ({"host": "svc.example", "origin": "", "referer": ""}, True),
        ({"host": "svc.example", "origin": "https://evil.example"}, False),
        ({"host": "svc.example", "origin": "null"}, False),
        ({"host": "svc.example", "origin": "https://svc.example.evil.example"}, False),
        ({"host": "svc.example:8000", "origin": "http://svc.example:9000"}, False),
        ({"host": "svc.example", "origin": "https://svc.example@evil.example"}, False),
        ({"host": "svc.example", "referer": "https://evil.example/svc.example"}, False),
        (
            {
                "host": "svc.example",
                "origin": "https://evil.example",
                "referer": "https://svc.example/",
            },
            False,
        ),
        ({"host": "svc.example", "origin": "not a url"}, False),
        ({"origin": "https://svc.example"}, False),  # no Host to be the same as
    ],
)
def test_a_sender_is_this_service_only_by_host_or_an_allowed_host(
    headers: dict[str, str], same: bool
) -> None:
    assert same_origin(headers, ALLOWED) is same


@pytest.mark.parametrize(
    ("authority", "host"),
    [("svc.example", "svc.example"), ("SVC.example:80", "svc.example"), ("[::1]:8000", "::1")],
)
def test_the_host_of_an_authority(authority: str, host: str) -> None:
    assert host_name(authority) == host


def test_allowed_hosts_are_kept_lowercase_and_unbracketed() -> None:
    given = ("Media.Example", "localhost", "10.0.0.7", "[::1]", "media.example")
    assert ApiSettings(allowed_hosts=given).allowed_hosts == (
        "media.example",
        "localhost",
        "10.0.0.7",
        "::1",
    )


@pytest.mark.parametrize(
    "wrong", ["", "media.example:8000", "https://media.example", "*.example", "a b", "bad_host"]
)
def test_anything_but_a_host_name_is_refused_naming_the_field(wrong: str) -> None:
    with pytest.raises(ConfigError, match=r"^allowed_hosts: .* is not a host name"):
        ApiSettings(allowed_hosts=(wrong,))
    with pytest.raises(ConfigError, match=r"^--allowed-host: "):
        host_names([wrong], "--allowed-host")


def test_every_form_of_the_page_checks_its_sender_first() -> None:
    assert [route for route in page.router.routes if "POST" in getattr(route, "methods", ())] == []
    for route in page.forms.routes:
        assert isinstance(route, APIRoute)
        assert [d.dependency for d in route.dependencies] == [page.same_site], route.path


async def nothing() -> Message:
    raise AssertionError("nothing is read")


async def nowhere(message: Message) -> None:
    raise AssertionError("nothing is sent")


@pytest.mark.anyio
@pytest.mark.parametrize("allowed_hosts", [(), ("media.example",)])
async def test_the_middleware_pass_the_lifespan_through(allowed_hosts: tuple[str, ...]) -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    wrapped = SecurityHeaders(AllowedHosts(app, hosts=allowed_hosts))
    await wrapped({"type": "lifespan"}, nothing, nowhere)
    assert seen == ["lifespan"]
