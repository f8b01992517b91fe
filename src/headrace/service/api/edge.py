"""What a request must pass before a byte of its body is read: its credential and its size.

FastAPI reads a route's body before it resolves the route's dependencies, so a token checked
by a dependency is checked after the body, however large, is in memory. Every route of the
service is an `EdgeRoute`, which before the body is read:

- checks the credential the route declares: a bearer token when the route depends on
  `deps.principal` (its `Caller` parameter), a moderator's sign-in when it is a
  `SignedInRoute` (the page's forms and calls). Without a valid one: 401, the body unread.
- caps the body at `DEFAULT_BODY_LIMIT` (64 KiB), or at what the route declares among its
  dependencies with `BodyLimit` (an upload: the service's upload limit). A `Content-Length`
  past it is 413 `too_large` at once; a body sent without one (chunked) is 413 as soon as the
  bytes received pass it, and the rest is never read.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.types import Message, Receive

from headrace.service.api import auth
from headrace.service.api.auth import Role
from headrace.service.api.deps import (
    LOGIN_COOKIE,
    ApiError,
    Refused,
    Service,
    identify,
    principal,
    service,
)

DEFAULT_BODY_LIMIT = 64 * 1024  # bytes: every JSON body and form of the service fits


@dataclass(frozen=True)
class BodyLimit:
    """A route's largest body, declared among its dependencies:
    `dependencies=[Depends(BodyLimit(256 * 1024))]`, or a function of the service for a limit
    the deployment sets. Read by `EdgeRoute` when the route is made; a no-op when resolved."""

    size: int | Callable[[Service], int]

    def bytes_for(self, svc: Service) -> int:
        return self.size if isinstance(self.size, int) else self.size(svc)

    async def __call__(self) -> None:
        return None


class EdgeRoute(APIRoute):
    """An APIRoute whose credential is checked and whose body is capped before it is read."""

    signed_in = False  # the page's sign-in, not a bearer token (`SignedInRoute`)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        calls = list(dependency_calls(self.dependant))
        bearer = principal in calls
        limit = next((call for call in calls if isinstance(call, BodyLimit)), None)
        signed_in = self.signed_in

        async def guarded(request: Request) -> Response:
            svc = service(request)
            if bearer:
                request.state.principal = await identify(request)
            elif signed_in:
                await check_sign_in(request, svc)
            cap = DEFAULT_BODY_LIMIT if limit is None else limit.bytes_for(svc)
            check_length(request, cap)
            return await handle(Request(request.scope, capped(request.receive, cap)))

        return guarded


class SignedInRoute(EdgeRoute):
    """A form or call of the moderator page: it needs a moderator's sign-in (its cookie)."""

    signed_in = True


def dependency_calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    """Every dependency a route resolves, its parameters' and its decorator's, depth first."""
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from dependency_calls(sub)


async def check_sign_in(request: Request, svc: Service) -> None:
    """Go on only with a live sign-in of a moderator: else 401, as the page's calls say."""
    who = await auth.signed_in(svc.store, request.cookies.get(LOGIN_COOKIE, ""))
    if who is None or not who.role.holds(Role.MODERATOR):
        raise ApiError(401, "unauthenticated", "sign in again at /login")


def too_large(limit: int) -> ApiError:
    return ApiError(413, "too_large", f"this request's body may have at most {limit} bytes")


def check_length(request: Request, limit: int) -> None:
    """413 when `Content-Length` says more than `limit`; 400 when it is not a number."""
    declared = request.headers.get("content-length")
    if declared is None:
        return
    if not declared.isdigit():
        raise ApiError(400, "bad_request", "Content-Length: expected a number of bytes")
    if int(declared) > limit:
        raise too_large(limit)


def capped(receive: Receive, limit: int) -> Receive:
    """`receive`, refusing (413) the message that takes the body past `limit` bytes."""
    received = 0

    async def receive_capped() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise Refused(too_large(limit))  # passes FastAPI's body reading as it is
        return message

    return receive_capped
