"""The HTTP service: `create_api(moderation, settings)` makes the ASGI app `headrace serve` runs.

Routes: uploads (`uploads.py`), items and decisions (`items.py`), progress and operations
(`status.py`), webhooks (`webhooks.py`), the moderator page (`page.py`), `/metrics`
(`metrics.py`, admin) and `/healthz`. The OpenAPI document is at `/openapi.json`, browsable at
`/docs` (Swagger UI, its files served from here: it needs no network; its "Authorize" takes a
bearer token, the document's `bearer` security scheme).

Every route checks its credential and caps its body before reading it (`edge.py`). Every error,
whatever raised it (a route, validation, the router's 404 and 405, static files, a body too
large), is an RFC 9457 problem (`deps.ApiError`): `type`, `title`, `status`, `detail` saying what
to do and repeating nothing the client sent, and `code`; a body that is not JSON is 400
`bad_request`, a field out of its range 422 `invalid` with `errors` naming each field. A failure
nobody expected is a 500 with code `internal`, logged by its type only. The access log
(`headrace.http`) has the method, the route's template (never the raw path or query string: a
signed URL's secret stays out), the status and the time taken. Every answer carries the headers
`websafety.py` names, takes HEAD where it takes GET, and is compressed as `delivery.py` says.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from swagger_ui_bundle import swagger_ui_path

from headrace.pipelines.moderation.media import MediaUnavailable
from headrace.pipelines.moderation.pipeline import Moderation
from headrace.policy.errors import ConfigError, StoreUnavailable
from headrace.runtime.worker import Worker
from headrace.service.api import (
    delivery,
    events,
    items,
    metrics,
    page,
    status,
    uploads,
    webhooks,
    websafety,
)
from headrace.service.api.auth import Role
from headrace.service.api.deps import (
    ApiError,
    ApiSettings,
    Caller,
    Refused,
    Service,
    TheService,
    error_response,
    require,
)
from headrace.service.api.edge import EdgeRoute
from headrace.service.api.openapi import Api
from headrace.service.notify import OutboxRelay

log = logging.getLogger("headrace.http")


def create_api(
    moderation: Moderation,
    settings: ApiSettings | None = None,
    *,
    workers: Sequence[Worker] = (),
    relay: OutboxRelay | None = None,
) -> FastAPI:
    """The service over `moderation` (its app is opened with the service and closed after).
    `workers`: run in this process for the service's life, stopped gracefully (their running
    handlers finish) before the store closes. `relay`: sends the outbox's notifications."""
    service = Service(moderation, settings or ApiSettings())

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        async with moderation.app:
            if service.settings.media_delivery == "redirect":
                service.media_origin = await moderation.media.signing_origin()
            running = [asyncio.create_task(worker.run()) for worker in workers]
            relaying = (
                None if relay is None else asyncio.create_task(relay.run(moderation.app.store))
            )
            try:
                yield
            finally:
                if relaying is not None:
                    relaying.cancel()
                for worker in workers:
                    worker.stop()
                await asyncio.gather(
                    *running, *([relaying] if relaying else []), return_exceptions=True
                )

    api = Api(
        title="headrace",
        summary="Uploads, moderation, progress and operations of a headrace deployment",
        version="1",
        lifespan=lifespan,
        redirect_slashes=False,  # Starlette's redirect names the client's Host: without_slash
        docs_url=None,  # FastAPI's /docs and /redoc load their scripts from a CDN: _add_docs
        redoc_url=None,
    )
    api.state.service = service
    api.router.route_class = EdgeRoute  # the routes below, as every router's
    routers = (uploads.router, items.router, events.router, status.router, webhooks.router)
    for router in (*routers, page.router, page.sign_in_forms, page.forms):
        api.include_router(router)
    static = str(resources.files("headrace.service.api").joinpath("static"))
    files = delivery.CachedFiles(directory=static, cache_control=delivery.PAGE_FILES)
    api.mount("/static", files, name="static")
    _add_operations(api)
    _add_docs(api)
    _add_error_handlers(api)
    # Each added outside the one before: a HEAD's GET is compressed as the GET is, the access
    # log sees a Host refused and a HEAD as a HEAD, and the headers go on every answer, the
    # access log's 500 too.
    api.add_middleware(delivery.Compression)
    if service.settings.allowed_hosts:
        api.add_middleware(websafety.AllowedHosts, hosts=service.settings.allowed_hosts)
    api.add_middleware(delivery.HeadAsGet)
    api.middleware("http")(access_log)
    api.add_middleware(websafety.SecurityHeaders)
    return api


def _add_operations(api: FastAPI) -> None:
    @api.get("/healthz", tags=["operations"], summary="The service answers and its store too")
    async def healthz(svc: TheService) -> dict[str, str]:
        await svc.store.now()
        return {"status": "ok"}

    @api.get("/livez", tags=["operations"], summary="The process answers (for a liveness probe)")
    async def livez() -> dict[str, str]:
        return {"status": "ok"}

    @api.get(
        "/readyz",
        tags=["operations"],
        summary="Whether to send this process requests (for a readiness probe)",
        responses={503: {"description": "draining, or its store or media cannot be reached"}},
    )
    async def readyz(svc: TheService) -> JSONResponse:
        failing = await unready(svc)
        if failing:
            reasons = ", ".join(failing)
            return error_response(
                ApiError(
                    503,
                    "unready",
                    f"send this process no requests for now: {reasons}",
                    {"Retry-After": "2"},
                    {"failing": failing},
                )
            )
        return JSONResponse({"status": "ok"})

    @api.get(
        "/metrics",
        tags=["operations"],
        summary="Prometheus metrics (admin)",
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {}}}},
    )
    async def prometheus(svc: TheService, who: Caller) -> Response:
        await require(svc, who, Role.ADMIN, action="metrics.read")
        lease = svc.settings.metrics_lease
        found = await metrics.scrape(svc.moderation.app, svc.name, lease_for=lease)
        # Read anew at every scrape (its process figures change by the second): never cached.
        return Response(
            found, media_type=metrics.CONTENT_TYPE, headers={"Cache-Control": "no-store"}
        )


async def unready(svc: Service) -> list[str]:
    """What keeps this process from taking requests: `draining` (it was told to stop),
    `store`, `media` (they cannot be reached)."""
    failing = ["draining"] if svc.draining else []
    try:
        await svc.store.now()
    except StoreUnavailable:
        failing.append("store")
    try:
        await svc.moderation.media.answers()
    except MediaUnavailable:
        failing.append("media")
    return failing


DOCS_ASSETS = "/docs/assets"


def _add_docs(api: FastAPI) -> None:
    """/docs: Swagger UI over /openapi.json, its script and style served from the files the
    swagger-ui-bundle-v2 package ships, so it works with no network."""
    assets = delivery.CachedFiles(directory=str(swagger_ui_path), cache_control=delivery.DOCS_FILES)
    api.mount(DOCS_ASSETS, assets, name="docs-assets")

    @api.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=api.openapi_url or "/openapi.json",
            title=f"{api.title} - Swagger UI",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
            swagger_ui_parameters={"validatorUrl": None},  # the document is sent to no one
        )


def _add_error_handlers(api: FastAPI) -> None:
    @api.exception_handler(ApiError)
    async def on_api_error(request: Request, error: ApiError) -> Response:
        return error_response(error)

    _add_page_error_handlers(api)

    @api.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, error: RequestValidationError) -> Response:
        return error_response(invalid(error.errors()))

    @api.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, error: StarletteHTTPException) -> Response:
        if isinstance(error, Refused):
            return error_response(error.error)
        if error.status_code == 404 and (path := websafety.without_slash(request)) is not None:
            return RedirectResponse(path, status_code=307)
        return error_response(http_problem(error))

    @api.exception_handler(ConfigError)
    async def on_config(request: Request, error: ConfigError) -> Response:
        return error_response(ApiError(422, "invalid", "a value is not acceptable"))

    @api.exception_handler(StoreUnavailable)
    async def on_store(request: Request, error: StoreUnavailable) -> Response:
        busy = ApiError(503, "unavailable", "the store cannot be reached: retry shortly")
        busy.headers["Retry-After"] = "2"
        return error_response(busy)

    @api.exception_handler(MediaUnavailable)
    async def on_media(request: Request, error: MediaUnavailable) -> Response:
        log.warning("media store: %s failed: %s", error.operation, error.reason)
        busy = ApiError(503, "unavailable", "the media store cannot be reached: retry shortly")
        busy.headers["Retry-After"] = "2"
        return error_response(busy)


# What the router, static files and Starlette answer on their own, as problems.
HTTP_PROBLEMS = {
    400: ("bad_request", "the request could not be read"),
    404: ("not_found", "nothing is at this path"),
    405: ("method_not_allowed", "not allowed here: Allow names the methods that are"),
    413: ("too_large", "the request's body is too large"),
}


def http_problem(error: StarletteHTTPException) -> ApiError:
    code, message = HTTP_PROBLEMS.get(error.status_code, ("http_error", "the request failed"))
    headers = dict(error.headers or {})
    allowed = [method.strip() for method in headers.get("Allow", "").split(",")]
    if "GET" in allowed and "HEAD" not in allowed:  # HEAD goes wherever GET does (delivery.py)
        headers["Allow"] = ", ".join([*allowed, "HEAD"])
    return ApiError(error.status_code, code, message, headers)


def _add_page_error_handlers(api: FastAPI) -> None:
    """A browser's answers: a redirect to sign in, the sign-in form again."""

    @api.exception_handler(page.SignInNeeded)
    async def on_sign_in(request: Request, error: page.SignInNeeded) -> Response:
        if request.method == "GET" and "/new" not in request.url.path:
            return RedirectResponse("/login", status_code=303)
        return error_response(ApiError(401, "unauthenticated", "sign in again at /login"))

    @api.exception_handler(page.FormRefused)
    async def on_form_refused(request: Request, refusal: page.FormRefused) -> Response:
        if request.url.path == page.SIGN_IN:  # someone signing in reads a page, not JSON
            return page.sign_in_refused(request, refusal)
        return error_response(refusal)


def invalid(errors: Any) -> ApiError:
    """400 `bad_request` for a body that is not JSON; else 422 `invalid`, naming each field
    (`body.decision`, `query.limit`) and what is wrong with it, never the value given."""
    if any(error.get("type") == "json_invalid" for error in errors):
        return ApiError(400, "bad_request", "the body is not valid JSON")
    fields = [
        {"field": ".".join(str(step) for step in error.get("loc", ())), "detail": error["msg"]}
        for error in errors[:10]
    ]
    detail = "; ".join(f"{found['field']}: {found['detail']}" for found in fields)
    return ApiError(
        422, "invalid", detail or "the request is not valid", members={"errors": fields}
    )


def route_of(request: Request) -> str:
    """The template of the route a request matched (`/v1/items/{media_id}`), or `-`."""
    route = request.scope.get("route")
    return str(getattr(route, "path", "-"))


async def access_log(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    started = time.perf_counter()
    try:
        answer = await call_next(request)
    except Exception as error:  # by its type only: its message may hold what a client sent
        log.error("%s %s failed: %s", request.method, route_of(request), type(error).__name__)
        answer = error_response(ApiError(500, "internal", "the service failed; try again later"))
    elapsed = (time.perf_counter() - started) * 1000
    log.info("%s %s %d %.1fms", request.method, route_of(request), answer.status_code, elapsed)
    return answer
