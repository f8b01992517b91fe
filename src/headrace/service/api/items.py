"""Items for moderators: an event's items in a stable order, one item, its preview and its
playable copy, its audit trail; claims, decisions (`approve`, `reject`: idempotent, the first
stands; a decision needs the item's claim, taken on the way when it is free), bulk decisions,
undo within the window, and an admin's change of a decision (pipelines/moderation/review.py).

A preview kept in a directory is a file the service sends. One kept in a bucket reaches the
browser as `--media-delivery` says: `redirect` (307 to a URL signed for that request, valid a
few minutes, never stored or logged; the redirect itself `Cache-Control: private, no-store`),
or `stream` (through the service, as it arrives from the bucket)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Response
from fastapi.responses import RedirectResponse
from pydantic import BaseModel, Field

from headrace.pipelines.moderation.derive import (
    AUDIO_PLAYBACK,
    POSTER,
    PREVIEW,
    THUMBNAIL,
    VIDEO_PREVIEW,
    WAVEFORM,
)
from headrace.pipelines.moderation.media import LocalFile, Served, SignedUrl
from headrace.pipelines.moderation.pipeline import ITEM, Item, ItemState
from headrace.pipelines.moderation.review import (
    CLAIM,
    MAX_BULK,
    REASON_CODES,
    BulkResult,
    Claim,
    ClaimedByOther,
    NotReviewable,
    session_label,
)
from headrace.policy.errors import ConfigError
from headrace.service.api.auth import Principal, Role
from headrace.service.api.deps import (
    ApiError,
    Caller,
    Service,
    TheService,
    deny,
    not_found,
    require,
)
from headrace.service.api.edge import EdgeRoute
from headrace.service.api.sending import MediaFile, MediaStream
from headrace.service.api.uploads import Event

router = APIRouter(tags=["items"], route_class=EdgeRoute)

MediaId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="the item's media id")]
PREVIEWS = {  # what the page shows of each class, and the smaller one for lists
    "image": (PREVIEW, THUMBNAIL),
    "video": (POSTER, POSTER),
    "audio": (WAVEFORM, WAVEFORM),
}
PLAYABLE = {  # a class's playable copy, and its media type
    "video": (VIDEO_PREVIEW, "video/mp4"),
    "audio": (AUDIO_PLAYBACK, "audio/mp4"),
}


class ItemView(BaseModel):
    media_id: str
    event: str
    state: str
    media_type: str | None
    format: str | None
    reason: str | None  # why it was flagged or refused: a safe code, or what the scan found
    flags: list[str]  # safe codes to look at beside a reviewable item (`media.trailing_data`)
    caption: str | None
    size: int
    seq: int
    preview: str | None  # the preview's URL, once derived
    thumbnail: str | None
    playback: str | None  # audio and video: the playable copy's URL, once derived
    uploaded_at: float  # by the store's clock
    session: str  # the contributor's event-local session, as a short label
    priority: float  # staff priority: its share of its session's turns (1: none set)
    decided_by: str | None
    decision_reason: str | None


class ItemPage(BaseModel):
    items: list[ItemView]
    next: int  # pass as `after` for the items past these
    newer: int  # items past `next` not in this page


class Decision(BaseModel):
    item: ItemView
    applied: bool  # False: the same decision was made before


class AuditView(BaseModel):
    at: float
    action: str
    actor: str
    outcome: str
    detail: dict[str, Any]


def view(item: Item) -> ItemView:
    preview = thumbnail = playback = None
    if item.derived is not None and item.media_class in PREVIEWS:
        base = f"/v1/items/{item.media_id}/preview"
        preview, thumbnail = base, f"{base}?size=small"
    if item.derived is not None and item.media_class in PLAYABLE:
        playback = f"/v1/items/{item.media_id}/playback"
    return ItemView(
        media_id=item.media_id,
        event=item.event,
        state=item.state.value,
        media_type=item.media_class or item.queued_as,
        format=item.format,
        reason=item.reason,
        flags=list(item.flags),
        caption=item.caption,
        size=item.size,
        seq=item.seq,
        preview=preview,
        thumbnail=thumbnail,
        playback=playback,
        uploaded_at=item.uploaded_at,
        session=session_label(item.session),
        priority=item.weight,
        decided_by=item.decided_by,
        decision_reason=item.decision_reason,
    )


async def visible_item(svc: Service, who: Principal, media_id: str, action: str) -> Item:
    """The item, if `who` moderates its event: else 404 (audited when it exists)."""
    await require(svc, who, Role.MODERATOR, kind=ITEM, record_id=media_id, action=action)
    found = await svc.store.records.get_record(ITEM, media_id)
    if found is None:
        raise not_found("item")
    if not who.sees(found.scope):
        raise await deny(svc, who, kind=ITEM, record_id=media_id, scope=found.scope, action=action)
    return Item.of(found)


@router.get("/v1/events/{event}/items", response_model=ItemPage, summary="An event's items")
async def list_items(
    event: Event,
    svc: TheService,
    who: Caller,
    state: Annotated[ItemState | None, Query(description="only items in this state")] = None,
    after: Annotated[int, Query(ge=0, le=2**62, description="the `next` of a page")] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> ItemPage:
    """Items in the order of their last change of state: an item that changes later comes
    later, so a page never reorders and the items past it are only ever new."""
    await require(svc, who, Role.MODERATOR, event=event)
    wanted = None if state is None else state.value
    found = await svc.store.records.list_records(
        ITEM, scope=event, state=wanted, after=after, limit=limit
    )
    items = [view(Item.of(record)) for record in found]
    last = found[-1].seq if found else after
    newer = await svc.store.records.count_records(ITEM, scope=event, state=wanted, after=last)
    return ItemPage(items=items, next=last, newer=newer)


@router.get("/v1/items/{media_id}", response_model=ItemView, summary="One item")
async def get_item(media_id: MediaId, svc: TheService, who: Caller) -> ItemView:
    return view(await visible_item(svc, who, media_id, "read"))


@router.get(
    "/v1/items/{media_id}/preview",
    response_class=Response,
    summary="An item's preview (WebP)",
    responses={
        200: {"content": {"image/webp": {}}},
        307: {"description": "fetch it from the media store, by a URL valid a few minutes"},
        404: {"description": "none yet"},
    },
)
async def preview(
    media_id: MediaId,
    svc: TheService,
    who: Caller,
    size: Annotated[str, Query(pattern="^(large|small)$")] = "large",
) -> Response:
    item = await visible_item(svc, who, media_id, "read")
    return await preview_answer(svc, item, small=size == "small")


async def preview_answer(svc: Service, item: Item, *, small: bool) -> Response:
    """An item's preview (`small`: the one lists show) as `--media-delivery` says."""
    names = PREVIEWS.get(item.media_class or "")
    if item.derived is None or names is None:
        raise not_found("preview")
    served = await svc.moderation.media.preview(
        item.derived, names[small], signed=svc.settings.media_delivery == "redirect"
    )
    return preview_response(served)


def preview_response(served: Served | None, media_type: str = "image/webp") -> Response:
    """A derivative as `--media-delivery` says, answering conditional requests; a local file
    answers Range requests too (a player seeks with them): sending.py."""
    if served is None:
        raise not_found("preview")
    if isinstance(served, LocalFile):
        return MediaFile(served.path, media_type, PRIVATE)
    if isinstance(served, SignedUrl):
        # A signed URL is a credential for its minutes: no cache keeps the redirect.
        return RedirectResponse(served.url, 307, headers={"Cache-Control": "private, no-store"})
    return MediaStream(served, media_type, PRIVATE)


async def playback_answer(svc: Service, item: Item) -> Response:
    """An item's playable copy (audio or video) as `--media-delivery` says."""
    found = PLAYABLE.get(item.media_class or "")
    if item.derived is None or found is None:
        raise not_found("playable copy")
    name, media_type = found
    served = await svc.moderation.media.preview(
        item.derived, name, signed=svc.settings.media_delivery == "redirect"
    )
    return preview_response(served, media_type)


@router.get(
    "/v1/items/{media_id}/playback",
    response_class=Response,
    summary="An item's playable copy (audio: AAC in MP4; video: H.264 and AAC in MP4)",
    responses={
        200: {"content": {"audio/mp4": {}, "video/mp4": {}}},
        206: {"description": "the range asked for"},
        307: {"description": "fetch it from the media store, by a URL valid a few minutes"},
        404: {"description": "none: not audio or video, or not derived yet"},
    },
)
async def playback(media_id: MediaId, svc: TheService, who: Caller) -> Response:
    return await playback_answer(svc, await visible_item(svc, who, media_id, "read"))


# Only the moderator's browser keeps a copy, for a few minutes; then it asks again (304).
PRIVATE = {"Cache-Control": "private, max-age=300"}


@router.get(
    "/v1/items/{media_id}/audit", response_model=list[AuditView], summary="An item's audit trail"
)
async def item_audit(media_id: MediaId, svc: TheService, who: Caller) -> list[AuditView]:
    await visible_item(svc, who, media_id, "read")
    rows = await svc.store.records.audit_log(kind=ITEM, record_id=media_id)
    return [
        AuditView(at=r.at, action=r.action, actor=r.actor, outcome=r.outcome, detail=dict(r.detail))
        for r in rows
    ]


class DecisionAsked(BaseModel):
    reason: str | None = None  # a rejection's reason: a code of `review.REJECT_REASONS`


async def decide(
    svc: Service, who: Principal, media_id: str, *, approve: bool, reason: str | None = None
) -> Decision:
    action = "review.approved" if approve else "review.rejected"
    await visible_item(svc, who, media_id, action)
    check_reason_field(reason, approve)
    try:
        reviewed = await svc.moderation.review(
            media_id, approve=approve, by=who.name, reason=reason
        )
    except (ClaimedByOther, NotReviewable) as refused:
        raise review_conflict(refused) from None
    return Decision(item=view(reviewed.item), applied=reviewed.applied)


def check_reason_field(reason: str | None, approve: bool) -> None:
    if reason is None:
        return
    if approve:
        raise ApiError(422, "invalid", "reason: only a rejection takes one")
    if reason not in REASON_CODES:
        known = ", ".join(sorted(REASON_CODES))
        raise ApiError(422, "invalid", f"reason: expected one of {known}")


def review_conflict(error: ConfigError) -> ApiError:
    """409 for a review action that cannot apply: `claimed` while another moderator holds the
    item (who, in `X-Holder`), else `conflict` saying why (the item's state, when that is why,
    in `X-State`). The page's script reads the headers."""
    if isinstance(error, ClaimedByOther):
        holder = error.claim.holder or ""
        message = f"{holder} is reviewing this item; take another, or wait until its claim lapses"
        return ApiError(409, "claimed", message, headers={"X-Holder": holder})
    headers = {"X-State": error.item.state.value} if isinstance(error, NotReviewable) else {}
    return ApiError(409, "conflict", str(error).split(": ", 1)[-1], headers=headers)


DECISION_ANSWERS: dict[int | str, dict[str, Any]] = {
    401: {"description": "no valid bearer token"},
    403: {"description": "not a moderator"},
    404: {"description": "no such item for this token"},
    409: {
        "description": "the item was decided otherwise, is not reviewable yet, or another "
        "moderator holds it (`claimed`)"
    },
}


@router.post(
    "/v1/items/{media_id}/approve",
    response_model=Decision,
    summary="Approve a reviewable item",
    responses=DECISION_ANSWERS,
)
async def approve(media_id: MediaId, svc: TheService, who: Caller) -> Decision:
    return await decide(svc, who, media_id, approve=True)


@router.post(
    "/v1/items/{media_id}/reject",
    response_model=Decision,
    summary="Reject a reviewable item (with a reason, optionally)",
    responses=DECISION_ANSWERS,
)
async def reject(
    media_id: MediaId, svc: TheService, who: Caller, asked: DecisionAsked | None = None
) -> Decision:
    reason = None if asked is None else asked.reason
    return await decide(svc, who, media_id, approve=False, reason=reason)


# -- claims


class ClaimView(BaseModel):
    media_id: str
    holder: str | None  # None: free
    since: float
    until: float  # when it lapses unless renewed (by the store's clock)


def claim_view(claim: Claim) -> ClaimView:
    return ClaimView(
        media_id=claim.media_id, holder=claim.holder, since=claim.since, until=claim.until
    )


@router.post(
    "/v1/items/{media_id}/claim",
    response_model=ClaimView,
    summary="Claim an item for review (or renew one's claim)",
    responses={409: {"description": "another moderator holds it (`claimed`), or it is decided"}},
)
async def take_claim(media_id: MediaId, svc: TheService, who: Caller) -> ClaimView:
    await visible_item(svc, who, media_id, "claim.taken")
    try:
        return claim_view(await svc.moderation.reviews.claim(media_id, who.name))
    except (ClaimedByOther, NotReviewable) as refused:
        raise review_conflict(refused) from None


class Release(BaseModel):
    reason: str | None = None  # an admin releasing another's claim says why


@router.post(
    "/v1/items/{media_id}/claim/release",
    summary="Give a claim back (an admin: anyone's, with a reason)",
    responses={200: {"description": "`released`: whether a claim was held and is now free"}},
)
async def release_claim(
    media_id: MediaId, svc: TheService, who: Caller, asked: Release | None = None
) -> dict[str, bool]:
    await visible_item(svc, who, media_id, "claim.released")
    admin = who.role.holds(Role.ADMIN) and asked is not None and asked.reason is not None
    reason = None if asked is None else asked.reason
    try:
        released = await svc.moderation.reviews.release(
            media_id, who.name, admin=admin, reason=reason
        )
    except ConfigError as error:
        raise ApiError(422, "invalid", str(error)) from None
    return {"released": released}


@router.post(
    "/v1/claims/release",
    summary="Give back every claim the caller holds (a client signing its moderator out)",
    responses={200: {"description": "`released`: how many claims were held and are now free"}},
)
async def release_mine(svc: TheService, who: Caller) -> dict[str, int]:
    await require(svc, who, Role.MODERATOR, kind=CLAIM, action="claim.released")
    return {"released": await release_claims_of(svc, who)}


async def release_claims_of(svc: Service, who: Principal) -> int:
    """Every claim `who` holds given back: they are done reviewing (signed out)."""
    return await svc.moderation.reviews.release_all(who.name, reason="signed out")


# -- undo, an admin's change, bulk


@router.post(
    "/v1/items/{media_id}/undo",
    response_model=ItemView,
    summary="Undo one's own decision within the undo window",
    responses={409: {"description": "not decided, decided by another, or past the window"}},
)
async def undo(media_id: MediaId, svc: TheService, who: Caller) -> ItemView:
    await visible_item(svc, who, media_id, "review.undone")
    try:
        return view(await svc.moderation.reviews.undo(media_id, who.name))
    except ConfigError as error:
        raise review_conflict(error) from None


class Change(BaseModel):
    decision: Literal["approve", "reject"]
    reason: str


@router.post(
    "/v1/items/{media_id}/change",
    response_model=ItemView,
    summary="An admin's change of a decision, with a reason",
    responses={409: {"description": "the item is not decided the other way"}},
)
async def change(media_id: MediaId, asked: Change, svc: TheService, who: Caller) -> ItemView:
    await require(svc, who, Role.ADMIN, kind=ITEM, record_id=media_id, action="review.changed")
    await visible_item(svc, who, media_id, "review.changed")
    try:
        changed = await svc.moderation.reviews.change(
            media_id, approve=asked.decision == "approve", by=who.name, reason=asked.reason
        )
    except NotReviewable as moved:
        raise review_conflict(moved) from None
    except ConfigError as error:
        raise ApiError(422, "invalid", str(error)) from None
    return view(changed)


class Bulk(BaseModel):
    decision: Literal["approve", "reject"]
    media_ids: list[Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]] = Field(
        min_length=1, max_length=MAX_BULK
    )
    reason: str | None = None


class BulkItem(BaseModel):
    media_id: str
    applied: bool
    state: str | None
    conflict: str | None  # `decided`, `claimed` (by `holder`) or `missing`
    holder: str | None


def bulk_view(result: BulkResult) -> BulkItem:
    return BulkItem(
        media_id=result.media_id,
        applied=result.applied,
        state=result.state,
        conflict=result.conflict,
        holder=result.holder,
    )


@router.post(
    "/v1/events/{event}/decisions",
    response_model=list[BulkItem],
    summary="Approve or reject many items at once, each with its own audit row and notice",
)
async def bulk(event: Event, asked: Bulk, svc: TheService, who: Caller) -> list[BulkItem]:
    await require(svc, who, Role.MODERATOR, event=event)
    check_reason_field(asked.reason, asked.decision == "approve")
    results = await bulk_decide(svc, who, event, asked)
    return [bulk_view(result) for result in results]


async def bulk_decide(svc: Service, who: Principal, event: str, asked: Bulk) -> list[BulkResult]:
    """The bulk decision on the items of `event` among those asked (others are `missing`)."""
    return await svc.moderation.reviews.decide_many(
        asked.media_ids,
        approve=asked.decision == "approve",
        by=who.name,
        reason=asked.reason,
        event=event,
    )
