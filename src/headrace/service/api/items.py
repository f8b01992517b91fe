"""Items for moderators: an event's items in a stable order, one item, its preview, its audit
trail, and the decision (`approve`, `reject`: idempotent; the first decision stands).

A preview kept in a directory is a file the service sends. One kept in a bucket reaches the
browser as `--media-delivery` says: `redirect` (307 to a URL signed for that request, valid a
few minutes, never stored or logged; the redirect itself `Cache-Control: private, no-store`),
or `stream` (through the service, as it arrives from the bucket)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from fastapi.responses import FileResponse, RedirectResponse, StreamingResponse
from pydantic import BaseModel

from headrace.pipelines.moderation.derive import POSTER, PREVIEW, THUMBNAIL, WAVEFORM
from headrace.pipelines.moderation.media import LocalFile, Served, SignedUrl
from headrace.pipelines.moderation.pipeline import ITEM, Item, ItemState
from headrace.pipelines.moderation.review import ClaimedByOther
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
from headrace.service.api.uploads import Event

router = APIRouter(tags=["items"])

MediaId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="the item's media id")]
PREVIEWS = {  # what the page shows of each class, and the smaller one for lists
    "image": (PREVIEW, THUMBNAIL),
    "video": (POSTER, POSTER),
    "audio": (WAVEFORM, WAVEFORM),
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
    preview = thumbnail = None
    if item.derived is not None and item.media_class in PREVIEWS:
        base = f"/v1/items/{item.media_id}/preview"
        preview, thumbnail = base, f"{base}?size=small"
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
    )


async def visible_item(svc: Service, who: Principal, media_id: str, action: str) -> Item:
    """The item, if `who` moderates its event: else 404 (audited when it exists)."""
    await require(svc, who, Role.MODERATOR, kind=ITEM, record_id=media_id, action=action)
    found = await svc.store.get_record(ITEM, media_id)
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
    found = await svc.store.list_records(ITEM, scope=event, state=wanted, after=after, limit=limit)
    items = [view(Item.of(record)) for record in found]
    last = found[-1].seq if found else after
    newer = await svc.store.count_records(ITEM, scope=event, state=wanted, after=last)
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


def preview_response(served: Served | None) -> Response:
    if served is None:
        raise not_found("preview")
    if isinstance(served, LocalFile):
        return FileResponse(served.path, media_type="image/webp", headers=PRIVATE)
    if isinstance(served, SignedUrl):
        # A signed URL is a credential for its minutes: no cache keeps the redirect.
        return RedirectResponse(served.url, 307, headers={"Cache-Control": "private, no-store"})
    headers = {**PRIVATE, "Content-Length": str(served.size)}
    return StreamingResponse(served.chunks, media_type="image/webp", headers=headers)


PRIVATE = {"Cache-Control": "private"}


@router.get(
    "/v1/items/{media_id}/audit", response_model=list[AuditView], summary="An item's audit trail"
)
async def item_audit(media_id: MediaId, svc: TheService, who: Caller) -> list[AuditView]:
    await visible_item(svc, who, media_id, "read")
    rows = await svc.store.audit_log(kind=ITEM, record_id=media_id)
    return [
        AuditView(at=r.at, action=r.action, actor=r.actor, outcome=r.outcome, detail=dict(r.detail))
        for r in rows
    ]


async def decide(svc: Service, who: Principal, media_id: str, *, approve: bool) -> Decision:
    action = "review.approved" if approve else "review.rejected"
    await visible_item(svc, who, media_id, action)
    try:
        reviewed = await svc.moderation.review(media_id, approve=approve, by=who.name)
    except ClaimedByOther as taken:
        raise claimed(taken) from None
    except ConfigError:
        state = (await svc.moderation.records.get(media_id)).state.value
        raise ApiError(
            409, "conflict", f"the item is {state}: only a reviewable item can be decided"
        ) from None
    return Decision(item=view(reviewed.item), applied=reviewed.applied)


def claimed(taken: ClaimedByOther) -> ApiError:
    """409 `claimed`: another moderator holds the item (their claim, until it lapses)."""
    claim = taken.claim
    return ApiError(
        409,
        "claimed",
        f"{claim.holder} is reviewing this item; take another, or wait until {claim.until:.0f}",
    )


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
    summary="Reject a reviewable item",
    responses=DECISION_ANSWERS,
)
async def reject(media_id: MediaId, svc: TheService, who: Caller) -> Decision:
    return await decide(svc, who, media_id, approve=False)
