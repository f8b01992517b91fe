"""What every endpoint stands on: the `Service` (the pipeline, its store, the settings), who is
asking (`Principal`, from a bearer token or a page sign-in), and the errors an endpoint answers
with.

Every error is an RFC 9457 problem (`application/problem+json`):

    {"type": "about:blank", "title": "Too Many Requests", "status": 429,
     "detail": "this event has as many uploads waiting as admitted; send it again later",
     "code": "queue_full"}

`title` is the status's name; `detail` says what to do and echoes nothing the client sent;
`code`, an extension member, is the stable name of the problem a client acts on (the `type`
stays `about:blank`: the code and the status say it all). A few problems carry more members
(`errors`: the fields a request got wrong; `failing`: what keeps a process unready)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Annotated, Any, Literal, get_args

from fastapi import Depends, Request, Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator
from starlette.exceptions import HTTPException

from headrace.pipelines.moderation.pipeline import Moderation
from headrace.policy.errors import ConfigError
from headrace.policy.text import text_problem
from headrace.service.api import auth, metrics
from headrace.service.api.auth import Principal, Role
from headrace.store.protocol.records import Audit
from headrace.store.protocol.tasks import Store

LOGIN_COOKIE = "headrace_login"
Delivery = Literal["redirect", "stream"]


@dataclass(frozen=True)
class ApiSettings:
    """`webhook_secrets`: per provider, the key its deliveries are signed with; a provider not
    named here is refused. `webhook_window`: seconds a signed timestamp stays acceptable.
    `retry_after`: seconds a client told 429 waits. `secure_cookies`: cookies only over HTTPS
    (on behind a TLS proxy; off for plain http on localhost). `allowed_hosts`: the names the
    service answers for, on any port (`host_names`); empty, any. `media_delivery`: how a
    preview kept in a bucket reaches the browser, by a redirect to a URL signed for that
    request or streamed through the service (a directory's previews are files it sends).
    `metrics_lease`: seconds a scrape holds the lease of the process that exports the
    store-wide series (api/metrics.py): more than the scrape interval."""

    webhook_secrets: Mapping[str, str] = field(default_factory=dict)
    webhook_window: float = 300.0
    retry_after: int = 2
    secure_cookies: bool = False
    allowed_hosts: tuple[str, ...] = ()
    media_delivery: Delivery = "redirect"
    metrics_lease: float = metrics.LEASE

    def __post_init__(self) -> None:
        # Kept in the form requests are compared in: lowercase, an IPv6 address unbracketed.
        object.__setattr__(self, "allowed_hosts", host_names(self.allowed_hosts, "allowed_hosts"))
        if not 0 < self.webhook_window <= 3600:
            raise ConfigError("webhook_window: expected 0 < seconds <= 3600")
        if not 0 < self.retry_after <= 3600:
            raise ConfigError("retry_after: expected 1 to 3600 seconds")
        if self.media_delivery not in get_args(Delivery):
            raise ConfigError("media_delivery: expected 'redirect' or 'stream'")
        if not 1 <= self.metrics_lease <= 3600:
            raise ConfigError("metrics_lease: expected 1 to 3600 seconds")
        for provider, secret in self.webhook_secrets.items():
            if len(secret) < 16:
                raise ConfigError(f"webhook secret of {provider!r}: expected 16 characters or more")


_HOST_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def host_names(given: Iterable[str], what: str) -> tuple[str, ...]:
    """Host names (`media.example`, `localhost`) and IP addresses (`10.0.0.7`, `::1` or
    `[::1]`), lowercased, IPv6 unbracketed; no port, no scheme, no wildcard. ConfigError
    naming `what` and the value otherwise."""
    names = []
    for name in given:
        host = name.strip().lower()
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not _is_host(host):
            raise ConfigError(
                f"{what}: {name!r} is not a host name or IP address (no port, scheme or '*')"
            )
        names.append(host)
    return tuple(dict.fromkeys(names))


def _is_host(host: str) -> bool:
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return False
        return True
    labels = host.split(".")
    return len(host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


@dataclass
class Service:
    moderation: Moderation
    settings: ApiSettings
    # Where previews are redirected to (a page must allow its images from there), read from
    # the media store as the service starts; None: previews come from the service itself.
    media_origin: str | None = None
    # Set when the server was told to stop (SIGTERM): requests in flight finish, and /readyz
    # says to send no more.
    draining: bool = False
    # This process among those sharing the store, as it holds the exporter's lease of /metrics.
    name: str = field(default_factory=metrics.process_name)

    @property
    def store(self) -> Store:
        return self.moderation.app.store


PROBLEM = "application/problem+json"
# RFC 9110's names where Python's are older ones.
TITLES = {413: "Content Too Large", 416: "Range Not Satisfiable", 422: "Unprocessable Content"}


class ApiError(Exception):
    """An answer other than success: `status`, a stable `code` and a message saying what to do
    (never the client's input, never a secret); `members`: more members of its problem body."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: Mapping[str, str] | None = None,
        members: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.members = dict(members or {})

    def body(self) -> dict[str, Any]:
        """The RFC 9457 problem."""
        return {
            "type": "about:blank",
            "title": TITLES.get(self.status) or HTTPStatus(self.status).phrase,
            "status": self.status,
            "detail": self.message,
            "code": self.code,
            **self.members,
        }


class Refused(HTTPException):
    """An ApiError raised where only an HTTPException passes (while FastAPI reads a body)."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.status, error.message, error.headers)
        self.error = error


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(
        error.body(), status_code=error.status, headers=error.headers, media_type=PROBLEM
    )


def not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", f"no such {what}")


def service(request: Request) -> Service:
    found: Service = request.app.state.service
    return found


# What the OpenAPI document declares (so /docs offers "Authorize"); the token is checked by
# `identify`, before the body is read (edge.py).
BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="A token made by `headrace token create`: `Authorization: Bearer hr_...`",
)


async def identify(request: Request) -> Principal:
    """The bearer token's principal; 401 without a valid one."""
    token = auth.bearer(request.headers.get("authorization"))
    if token is None:
        raise ApiError(
            401,
            "unauthenticated",
            "send 'Authorization: Bearer <token>'",
            {"WWW-Authenticate": "Bearer"},
        )
    found = await auth.principal_of(service(request).store, token)
    if found is None:
        raise ApiError(
            401,
            "unauthenticated",
            "the token is unknown or revoked",
            {"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    return found


async def principal(
    request: Request,
    _: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None,
) -> Principal:
    """Who sent the bearer token: found by the route before it read the body (edge.py), or
    here for a route that is not an EdgeRoute."""
    known = getattr(request.state, "principal", None)
    if isinstance(known, Principal):
        return known
    return await identify(request)


Caller = Annotated[Principal, Depends(principal)]
TheService = Annotated[Service, Depends(service)]


async def deny(
    svc: Service, who: Principal, *, kind: str, record_id: str, scope: str, action: str
) -> ApiError:
    """A denial written to the audit log; answered 404 (the thing's existence is not said)."""
    await svc.store.records.write_audit(
        kind,
        record_id,
        scope=scope,
        audit=Audit(action, who.name, {"role": who.role.value}),
        outcome="denied",
    )
    return not_found(kind)


async def require(
    svc: Service,
    who: Principal,
    role: Role,
    *,
    event: str | None = None,
    kind: str = "event",
    record_id: str | None = None,
    action: str = "read",
) -> None:
    """Go on only if `who` holds `role` (for `event`, when given): a principal of too low a
    role gets 403, one outside the event 404; both are audited."""
    if not who.role.holds(role):
        await svc.store.records.write_audit(
            kind,
            record_id or event or "all",
            scope=event or "all",
            audit=Audit(action, who.name, {"role": who.role.value, "needed": role.value}),
            outcome="denied",
        )
        raise ApiError(403, "forbidden", f"this needs the {role.value} role")
    if event is not None and not who.sees(event):
        raise await deny(
            svc, who, kind=kind, record_id=record_id or event, scope=event, action=action
        )


def _storable(value: str | None) -> str | None:
    problem = None if value is None else text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# Free text from a path or query that reaches the store: refused alike on every store (422
# naming the parameter) when not every store can keep it (a NUL, a lone surrogate).
StoredText = AfterValidator(_storable)
