"""What keeps other sites out: headers on every answer, and whether a form came from a page of
this service.

Every answer, whatever made it (a route, an error, static files, a redirect), says that its
type is not to be sniffed, that no frame of another site may hold it, and that the URLs of this
service go to no other site in a Referer (`SecurityHeaders`). Every redirect names a path, never
a URL built from the `Host` a client sent (`without_slash` replaces Starlette's own redirect of
a trailing slash, which did). Told its names (`ApiSettings.allowed_hosts`), the service answers
a request for any other host 400 `bad_host` (`AllowedHosts`).

A browser says where a request comes from: `Origin` on every POST, and `Referer` unless a
policy drops it. A page form (sign-in, sign-out, a decision) is acted on only when that is this
service: the host the request was sent to (its `Host`, the scheme ignored, so a TLS-terminating
proxy in front changes nothing) or one of the configured allowed hosts.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from urllib.parse import quote, urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from headrace.service.api.deps import ApiError, error_response

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",  # an upload's preview is never run as a script
    "X-Frame-Options": "DENY",  # no page is framed: its buttons cannot be clicked blind
    "Referrer-Policy": "same-origin",  # event names and item ids in our URLs stay with us
}


class SecurityHeaders:
    """Middleware: `SECURITY_HEADERS` on every HTTP answer of the app it wraps."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


class AllowedHosts:
    """Middleware: a request whose `Host` names none of `hosts` (on any port) is answered 400
    `bad_host`, on every route. /healthz too: a probe sends one of the names, or its address is
    one of them."""

    def __init__(self, app: ASGIApp, hosts: Collection[str]) -> None:
        self.app = app
        self.hosts = frozenset(hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.named(scope):  # the lifespan has no Host
            await self.app(scope, receive, send)
            return
        refused = ApiError(400, "bad_host", "this service does not answer for that host name")
        await error_response(refused)(scope, receive, send)

    def named(self, scope: Scope) -> bool:
        return host_name(Headers(scope=scope).get("host", "")) in self.hosts


def host_name(authority: str) -> str:
    """The host of a `host[:port]` (an IPv6 address without its brackets), lowercased."""
    authority = authority.lower()
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.partition(":")[0]


def same_origin(headers: Mapping[str, str], allowed_hosts: Collection[str]) -> bool:
    """Whether a request comes from a page of this service: its `Origin`, else its `Referer`,
    names the `Host` it was sent to (host and port alike) or an allowed host (any port).
    `Origin: null` (a sandboxed frame, a redirect from elsewhere) does not."""
    sender = headers.get("origin") or headers.get("referer")
    if not sender:
        # Neither header: not a browser's form (browsers send Origin with every POST), but a
        # script or a test. Let it by: the form token, bound to a cookie, still has to match.
        return True
    authority = urlsplit(sender).netloc.rpartition("@")[2].lower()
    if not authority:
        return False
    return authority == headers.get("host", "").lower() or host_name(authority) in allowed_hosts


def without_slash(request: Request) -> str | None:
    """Where to send a request whose path no route takes but would without its trailing slash
    (`/moderate/` to `/moderate`, the query string kept): a path, never an absolute URL. None
    when there is no such route."""
    path: str = request.scope["path"]
    if "route" in request.scope or path == "/" or not path.endswith("/"):
        return None
    bare = {**request.scope, "path": path.rstrip("/")}
    if all(route.matches(bare)[0] is Match.NONE for route in request.app.router.routes):
        return None
    raw = request.scope.get("raw_path")
    target = raw.decode("latin-1").rstrip("/") if raw else quote(path.rstrip("/"))
    if target.startswith(("//", "/\\")) or not target.startswith("/"):
        return None  # a browser reads these as another host: no route is named so anyway
    query = request.scope.get("query_string", b"").decode("latin-1")
    return f"{target}?{query}" if query else target
