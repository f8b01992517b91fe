"""The moderator page: server-rendered, one small script.

A moderator signs in once with a token; the page then lists an event's reviewable items in the
order they became reviewable, up to the boundary the page was loaded with (`upto`, a record
seq). Items that become reviewable later never enter the list under the moderator's cursor:
a line above it counts them ("Show 3 new items", refreshed by the script), and the moderator
chooses when to cross it. Approve and reject are forms (a form token bound to the sign-in; a
rejection's reason chosen from a list that starts with none chosen); after a decision the page
comes back with the same boundary, so the rest stays where it was.

The page's script (static/page.js, docs/service.md "Moderating") does the same by keyboard and
mouse alike, around one current item: whatever makes an item current (a click on it, j and k,
Tab, scrolling it into view, a decision moving on) claims it for the moderator (renewed while it
stays current, given back when another becomes current undecided); a approves, r rejects with a
reason picked by click or number, u undoes the last decision within its window, s selects the
pending items of the current item's session and x one item, for a bulk decision; Enter opens a
photo large (`/moderate/media/{id}?size=large`); ? lists the keys. These are JSON calls of the
page (`/moderate/{event}/...`), each checked like a form. The page polls `/moderate/{event}/new`
every two seconds: the count of new items above the list (and their ids: an item undone since
is on the page already), who holds which item, and which items were decided meanwhile, marked
where they are: the list never reorders and nothing is inserted above the cursor.

Signing out ends the sign-in on the server and gives back every claim the moderator holds, so
the items they had in focus are free for others at once.

Every form that changes something (sign-in, sign-out, a decision, a claim) is a route of
`forms`, which refuses one sent from another site before anything else (`same_site`): 403
`forbidden`, nothing done (the sign-in form again, for a sign-in). Each needs a form token too:
sign-out and the page's actions the one bound to the sign-in's cookie (a form field, or the
`X-Form-Token` header of the page's calls), a sign-in the one bound to the cookie the sign-in
form came with. A decision or call of the page without a live sign-in is 401 before its body is
read (`edge.SignedInRoute`; signing in and out are `sign_in_forms`, which need none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Form, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import BaseModel, Field

from headrace.pipelines.moderation.derive import PLAYBACK_SECONDS
from headrace.pipelines.moderation.pipeline import ITEM, Item, ItemState
from headrace.pipelines.moderation.review import (
    MAX_BULK,
    REJECT_REASONS,
    ClaimedByOther,
)
from headrace.policy.errors import ConfigError
from headrace.service.api import auth, websafety
from headrace.service.api.auth import Principal, Role
from headrace.service.api.deps import (
    LOGIN_COOKIE,
    ApiError,
    Service,
    TheService,
    deny,
    service,
)
from headrace.service.api.edge import EdgeRoute, SignedInRoute
from headrace.service.api.items import (
    PLAYABLE,
    Bulk,
    ItemView,
    bulk_decide,
    bulk_view,
    check_reason_field,
    claim_view,
    playback_answer,
    preview_answer,
    release_claims_of,
    review_conflict,
    view,
)
from headrace.service.api.uploads import Event

router = APIRouter(include_in_schema=False, route_class=EdgeRoute)  # what the page shows

PAGE_SIZE = 100
REVIEWABLE = ItemState.REVIEWABLE.value
# Items the pipeline held back on its own, shown apart with why: never derived, never decided.
FLAGGED = (ItemState.QUARANTINED.value, ItemState.REFUSED.value)
_TEMPLATES = str(resources.files("headrace.service.api").joinpath("templates"))
templates = Jinja2Templates(
    env=Environment(loader=FileSystemLoader(_TEMPLATES), autoescape=select_autoescape(default=True))
)


class SignInNeeded(Exception):
    """The page needs a sign-in: answered with a redirect to /login."""


class FormRefused(ApiError):
    """A page form not to act on: 403, and nothing done."""

    def __init__(self, message: str) -> None:
        super().__init__(403, "forbidden", message)


async def same_site(request: Request, svc: TheService) -> None:
    """Go on only with a form a page of this service sent (websafety.same_origin): a page of
    another site could make the browser send one, with its cookies."""
    if not websafety.same_origin(request.headers, svc.settings.allowed_hosts):
        raise FormRefused("the form was sent from another site: use this service's own page")


# What the page does: every state-changing form, each checked by `same_site` first. Its
# decisions and calls need a sign-in, checked before their body is read (edge.SignedInRoute);
# signing in and out do not.
forms = APIRouter(
    include_in_schema=False, dependencies=[Depends(same_site)], route_class=SignedInRoute
)
sign_in_forms = APIRouter(
    include_in_schema=False, dependencies=[Depends(same_site)], route_class=EdgeRoute
)


def check_form_token(cookie: str, given: str) -> None:
    """Go on only with the form token of this sign-in's cookie: a page of another site can make
    the browser send the cookie, but cannot read the token."""
    if not auth.form_token_ok(cookie, given):
        raise FormRefused("the form is stale: load the page again")


async def page_principal(request: Request, svc: Service) -> tuple[Principal, str]:
    """The signed-in moderator and the sign-in's cookie; SignInNeeded without one."""
    cookie = request.cookies.get(LOGIN_COOKIE, "")
    who = await auth.signed_in(svc.store, cookie)
    if who is None or not who.role.holds(Role.MODERATOR):
        raise SignInNeeded
    return who, cookie


def render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    csp = content_policy(service(request).media_origin)
    headers = {"Cache-Control": "no-store", "Content-Security-Policy": csp}
    return templates.TemplateResponse(
        request, name, {"who": None, **context}, status_code=status, headers=headers
    )


def content_policy(media_origin: str | None) -> str:
    """The page's Content-Security-Policy: everything from this service, and images, sound and
    video from `media_origin` too (where previews are redirected to, when they are)."""
    origin = "" if media_origin is None else f" {media_origin}"
    return "; ".join(
        (
            "default-src 'self'",
            f"img-src 'self'{origin}",
            f"media-src 'self'{origin}",
            "script-src 'self'",
            "style-src 'self'",
            "frame-ancestors 'none'",
        )
    )


SIGN_IN = "/login"
SIGN_IN_FORM_COOKIE = "headrace_login_form"


@router.get(SIGN_IN, response_class=HTMLResponse)
async def login_form(request: Request) -> HTMLResponse:
    return sign_in_page(request)


def sign_in_page(request: Request, status: int = 200, error: str | None = None) -> HTMLResponse:
    """The sign-in form, with what went wrong the last time: a new form cookie each time, sent
    back only to /login, and the form token bound to it in the form."""
    cookie, token = auth.sign_in_form()
    answer = render(request, "login.html", status, error=error, form_token=token)
    answer.set_cookie(
        SIGN_IN_FORM_COOKIE,
        cookie,
        max_age=auth.SIGN_IN_FORM_TTL,
        path=SIGN_IN,
        httponly=True,
        samesite="strict",
        secure=service(request).settings.secure_cookies,
    )
    return answer


def sign_in_refused(request: Request, refusal: FormRefused) -> HTMLResponse:
    """The answer to a refused sign-in form (its moderator token never looked at): the form
    again, saying why."""
    why = refusal.message
    return sign_in_page(request, refusal.status, f"{why[:1].upper()}{why[1:]}.")


@sign_in_forms.post(SIGN_IN)
async def login(
    request: Request,
    svc: TheService,
    token: Annotated[str, Form(max_length=300)] = "",
    form_token: Annotated[str, Form(max_length=100)] = "",
) -> Response:
    if not auth.form_token_ok(request.cookies.get(SIGN_IN_FORM_COOKIE, ""), form_token):
        raise FormRefused("the sign-in form had expired or was not this service's: sign in again")
    who = await auth.principal_of(svc.store, token.strip())
    if who is None or not who.role.holds(Role.MODERATOR):
        return sign_in_page(request, 401, "That token does not sign a moderator in.")
    cookie, _ = await auth.sign_in(svc.store, who)
    answer = RedirectResponse("/moderate", status_code=303)
    answer.set_cookie(
        LOGIN_COOKIE,
        cookie,
        max_age=int(auth.LOGIN_TTL),
        httponly=True,
        samesite="strict",
        secure=svc.settings.secure_cookies,
    )
    answer.delete_cookie(SIGN_IN_FORM_COOKIE, path=SIGN_IN)
    return answer


@sign_in_forms.post("/logout")
async def logout(
    request: Request, svc: TheService, form_token: Annotated[str, Form(max_length=100)] = ""
) -> Response:
    cookie = request.cookies.get(LOGIN_COOKIE, "")
    check_form_token(cookie, form_token)
    who = await auth.signed_in(svc.store, cookie)
    await auth.sign_out(svc.store, cookie)
    if who is not None:  # their claims go with them: others take those items at once
        await release_claims_of(svc, who)
    answer = RedirectResponse("/login", status_code=303)
    answer.delete_cookie(LOGIN_COOKIE)
    return answer


@router.get("/", response_class=HTMLResponse)
@router.get("/moderate", response_class=HTMLResponse)
async def events(request: Request, svc: TheService) -> Response:
    who, cookie = await page_principal(request, svc)
    known = sorted(set(await svc.store.groups()) | {e for e in who.events if e != auth.EVERY_EVENT})
    mine = auth.events_of(who, known)
    if len(mine) == 1:
        return RedirectResponse(f"/moderate/{mine[0]}", status_code=303)
    return render(request, "events.html", who=who, form_token=auth.form_token(cookie), events=mine)


async def boundary(svc: Service, event: str, upto: int) -> tuple[int, int]:
    """How many items became reviewable past `upto`, and the seq of the last of them."""
    newer, latest, _ = await newer_items(svc, event, upto)
    return newer, latest


async def newer_items(svc: Service, event: str, upto: int) -> tuple[int, int, list[str]]:
    """`boundary`, and the media ids of those items (at most a page of them)."""
    newer = await svc.store.records.count_records(ITEM, scope=event, state=REVIEWABLE, after=upto)
    if not newer:
        return 0, upto, []
    found = await svc.store.records.list_records(
        ITEM, scope=event, state=REVIEWABLE, after=upto, limit=PAGE_SIZE
    )
    return len(found), found[-1].seq, [record.id for record in found]


@router.get("/moderate/{event}", response_class=HTMLResponse)
async def queue(
    request: Request,
    event: Event,
    svc: TheService,
    upto: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    message: Annotated[str | None, Query(max_length=100)] = None,
) -> Response:
    who, cookie = await page_principal(request, svc)
    if not who.sees(event):
        raise await deny(svc, who, kind="event", record_id=event, scope=event, action="page.read")
    found = await svc.store.records.list_records(
        ITEM, scope=event, state=REVIEWABLE, limit=PAGE_SIZE
    )
    # The boundary: what is reviewable now, and never past the last item a full page lists (what
    # the page does not show is counted as new, and `next` hands out nothing it does not show).
    last = found[-1].seq if found else 0
    if upto is None:
        upto = last
    elif len(found) == PAGE_SIZE:
        upto = min(upto, last)
    listed = [Item.of(record) for record in found if record.seq <= upto]
    newer, latest = await boundary(svc, event, upto)
    flagged: list[ItemView] = []
    for state in FLAGGED:
        held = await svc.store.records.list_records(ITEM, scope=event, state=state, limit=PAGE_SIZE)
        flagged.extend(view(Item.of(record)) for record in held)
    reviews = svc.moderation.reviews
    pending = await reviews.pending_by_session(event)
    claims = await reviews.claims(event)
    now = await svc.store.now()
    items = [
        ItemContext.of(
            item,
            pending=pending.get(item.session, 0),
            holder=claims[item.media_id].holder if item.media_id in claims else None,
        )
        for item in listed
    ]
    return render(
        request,
        "queue.html",
        who=who,
        admin=who.role.holds(Role.ADMIN),
        form_token=auth.form_token(cookie),
        event=event,
        items=items,
        upto=upto,
        cursor=max((item.seq for item in listed), default=upto),
        newer=newer,
        latest=latest,
        flagged=sorted(flagged, key=lambda item: item.seq),
        message=MESSAGES.get(message or ""),
        now=now,
        reasons=REJECT_REASONS,
        rules=reviews.rules,
    )


@dataclass(frozen=True)
class ItemContext:
    """An item as the page shows it: with how many of its session's items are pending, who
    else holds it now, and for sound and video its length (from probing: a player shows 0:00
    until it has loaded) and, when its playable copy is shorter, how much of it plays."""

    item: ItemView
    pending: int
    holder: str | None
    length: str | None = None
    plays: str | None = None

    @classmethod
    def of(cls, item: Item, *, pending: int, holder: str | None) -> ItemContext:
        seconds = _seconds(item)
        if seconds is None:
            return cls(view(item), pending, holder)
        cut = clock(PLAYBACK_SECONDS) if seconds > PLAYBACK_SECONDS else None
        return cls(view(item), pending, holder, length=clock(seconds), plays=cut)


def _seconds(item: Item) -> float | None:
    """How long a recording or video is, as probing found it (None: an image, or not known)."""
    if item.media_class not in PLAYABLE or item.metadata is None:
        return None
    seconds = item.metadata.get("seconds")
    return float(seconds) if isinstance(seconds, int | float) and seconds > 0 else None


def clock(seconds: float) -> str:
    """`seconds` as a player shows a length: 0:07, 4:05, 1:02:03 (rounded up to the second, so
    a recording of 0.4 s is not 0:00)."""
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


MESSAGES = {
    "approved": "Approved.",
    "rejected": "Rejected.",
    "decided": "Someone decided that item already.",
    "claimed": "Another moderator is reviewing that item.",
}


@router.get("/moderate/{event}/new")
async def new_items(
    request: Request,
    event: Event,
    svc: TheService,
    upto: Annotated[int, Query(ge=0, le=2**62)] = 0,
    since: Annotated[int | None, Query(ge=0, le=2**62)] = None,
) -> Response:
    """What changed since the page was loaded: how many items became reviewable past `upto`
    (and the seq of the last), who holds which item now, and the items that changed state past
    `since` (decided, reopened), with the cursor to ask from next time."""
    who, _ = await page_principal(request, svc)
    if not who.sees(event):
        raise await deny(svc, who, kind="event", record_id=event, scope=event, action="page.read")
    newer, latest, fresh = await newer_items(svc, event, upto)
    # Their ids too: an item undone since (its seq moved past `upto`) is on the page already,
    # and the page counts only what it does not show.
    answer: dict[str, Any] = {"newer": newer, "latest": latest, "newer_ids": fresh}
    if since is not None:
        claims = await svc.moderation.reviews.claims(event)
        answer["claims"] = {media_id: claim.holder for media_id, claim in claims.items()}
        changed = await svc.store.records.list_records(
            ITEM, scope=event, after=since, limit=PAGE_SIZE
        )
        answer["changed"] = [
            {"media_id": r.id, "state": r.state, "decided_by": r.body.get("decided_by")}
            for r in changed
        ]
        answer["since"] = changed[-1].seq if changed else since
    return JSONResponse(answer, headers={"Cache-Control": "no-store"})


@forms.post("/moderate/{event}/items/{media_id}")
async def decide(
    request: Request,
    event: Event,
    media_id: Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")],
    svc: TheService,
    decision: Annotated[str, Form(pattern="^(approve|reject)$")],
    form_token: Annotated[str, Form(max_length=100)] = "",
    upto: Annotated[int, Form(ge=0, le=2**62)] = 0,
    reason: Annotated[str | None, Form(max_length=40)] = None,
) -> Response:
    who, cookie = await page_principal(request, svc)
    check_form_token(cookie, form_token)
    record = await svc.store.records.get_record(ITEM, media_id)
    if record is None or record.scope != event or not who.sees(event):
        action = f"review.{decision}"
        raise await deny(svc, who, kind=ITEM, record_id=media_id, scope=event, action=action)
    approve = decision == "approve"
    try:
        reviewed = await svc.moderation.review(
            media_id, approve=approve, by=who.name, reason=None if approve else reason or None
        )
        own = reviewed.applied or reviewed.item.decided_by == who.name  # or its repeat
        message = reviewed.item.state.value if own else "decided"
    except ClaimedByOther:
        message = "claimed"
    except ConfigError:
        message = "decided"
    return RedirectResponse(f"/moderate/{event}?upto={upto}&message={message}", status_code=303)


@router.get("/moderate/media/{media_id}")
async def media(
    request: Request,
    media_id: Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")],
    svc: TheService,
    size: Annotated[str, Query(pattern="^(large|small)$")] = "small",
) -> Response:
    """An item's preview: the list's (`small`), or the large one a photo opens to."""
    who, _ = await page_principal(request, svc)
    record = await svc.store.records.get_record(ITEM, media_id)
    if record is None or not who.sees(record.scope):
        raise ApiError(404, "not_found", "no such item")
    return await preview_answer(svc, Item.of(record), small=size == "small")


@router.get("/moderate/media/{media_id}/play")
async def play(
    request: Request,
    media_id: Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")],
    svc: TheService,
) -> Response:
    who, _ = await page_principal(request, svc)
    record = await svc.store.records.get_record(ITEM, media_id)
    if record is None or not who.sees(record.scope):
        raise ApiError(404, "not_found", "no such item")
    return await playback_answer(svc, Item.of(record))


# -- the page's calls: JSON, checked as forms (`same_site`, and the form token in a header)

MediaIdPath = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]


async def page_actor(request: Request, svc: Service, event: str, media_ids: list[str]) -> Principal:
    """The signed-in moderator of `event` sending one of the page's calls, with the form token
    of the sign-in in `X-Form-Token`; the items named must be the event's (else 404, audited)."""
    try:
        who, cookie = await page_principal(request, svc)
    except SignInNeeded:
        raise ApiError(401, "unauthenticated", "sign in again: /login") from None
    check_form_token(cookie, request.headers.get("x-form-token", ""))
    if not who.sees(event):
        raise await deny(svc, who, kind="event", record_id=event, scope=event, action="page.act")
    for media_id in media_ids:
        record = await svc.store.records.get_record(ITEM, media_id)
        if record is None or record.scope != event:
            raise await deny(
                svc, who, kind=ITEM, record_id=media_id, scope=event, action="page.act"
            )
    return who


@forms.post("/moderate/{event}/claim/{media_id}")
async def page_claim(
    request: Request, event: Event, media_id: MediaIdPath, svc: TheService
) -> Response:
    """Claim (or renew) the item in focus."""
    who = await page_actor(request, svc, event, [media_id])
    try:
        claim = await svc.moderation.reviews.claim(media_id, who.name)
    except ConfigError as error:
        raise review_conflict(error) from None
    return JSONResponse(claim_view(claim).model_dump())


class PageRelease(BaseModel):
    reason: str | None = Field(default=None, max_length=200)


@forms.post("/moderate/{event}/release/{media_id}")
async def page_release(
    request: Request,
    event: Event,
    media_id: MediaIdPath,
    svc: TheService,
    asked: PageRelease | None = None,
) -> Response:
    """Give the item's claim back (focus left it); an admin, anyone's with a reason."""
    who = await page_actor(request, svc, event, [media_id])
    reason = None if asked is None else asked.reason
    admin = reason is not None and who.role.holds(Role.ADMIN)
    try:
        released = await svc.moderation.reviews.release(
            media_id, who.name, admin=admin, reason=reason
        )
    except ConfigError as error:
        raise ApiError(422, "invalid", str(error)) from None
    return JSONResponse({"released": released})


class PageNext(BaseModel):
    after: int = Field(default=0, ge=0, le=2**62)  # the seq of the item in focus
    upto: int = Field(ge=0, le=2**62)  # the page's boundary


@forms.post("/moderate/{event}/next")
async def page_next(request: Request, event: Event, asked: PageNext, svc: TheService) -> Response:
    """Claim the next item past `after` (up to the boundary) that nobody else holds."""
    who = await page_actor(request, svc, event, [])
    item, others = await svc.moderation.reviews.next_item(
        event, who.name, after=asked.after, upto=asked.upto
    )
    return JSONResponse(
        {
            "media_id": None if item is None else item.media_id,
            "taken": {claim.media_id: claim.holder for claim in others},
        }
    )


class PageDecision(BaseModel):
    decision: Literal["approve", "reject"]
    reason: str | None = Field(default=None, max_length=40)


@forms.post("/moderate/{event}/decide/{media_id}")
async def page_decide(
    request: Request, event: Event, media_id: MediaIdPath, asked: PageDecision, svc: TheService
) -> Response:
    who = await page_actor(request, svc, event, [media_id])
    check_reason_field(asked.reason, asked.decision == "approve")
    try:
        reviewed = await svc.moderation.review(
            media_id, approve=asked.decision == "approve", by=who.name, reason=asked.reason
        )
    except ConfigError as error:
        raise review_conflict(error) from None
    window = svc.moderation.reviews.rules.undo_window
    return JSONResponse(
        {
            "media_id": media_id,
            "state": reviewed.item.state.value,
            "applied": reviewed.applied,
            "undo_until": await svc.store.now() + window if reviewed.applied else None,
        }
    )


@forms.post("/moderate/{event}/undo/{media_id}")
async def page_undo(
    request: Request, event: Event, media_id: MediaIdPath, svc: TheService
) -> Response:
    who = await page_actor(request, svc, event, [media_id])
    try:
        item = await svc.moderation.reviews.undo(media_id, who.name)
    except ConfigError as error:
        raise review_conflict(error) from None
    return JSONResponse({"media_id": media_id, "state": item.state.value})


class PageBulk(BaseModel):
    decision: Literal["approve", "reject"]
    media_ids: list[Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]] = Field(
        min_length=1, max_length=MAX_BULK
    )
    reason: str | None = Field(default=None, max_length=40)


@forms.post("/moderate/{event}/bulk")
async def page_bulk(request: Request, event: Event, asked: PageBulk, svc: TheService) -> Response:
    who = await page_actor(request, svc, event, [])
    bulk = Bulk(decision=asked.decision, media_ids=asked.media_ids, reason=asked.reason)
    check_reason_field(asked.reason, asked.decision == "approve")
    results = await bulk_decide(svc, who, event, bulk)
    return JSONResponse([bulk_view(result).model_dump() for result in results])
