"""`POST /v1/events/{event}/uploads`: a contributor's upload, streamed to the media store.

The body is a multipart form: `file` (the media; its name and declared type are ignored) and
an optional `caption`. The file is spooled to a local file as it arrives, never held in memory,
then kept in the media store (linked into a directory, or uploaded in parts to a bucket); past the
largest size any class takes the answer is 413 at once, with nothing kept (a `Content-Length`
already too large is refused before a byte is read: the route's `BodyLimit`, edge.py). A body
that ends before its closing boundary is 400 `bad_form`, nothing kept. The answer is 202, with
the media id and state `queued`, only once the bytes, the item's record and its validate task
are committed.
When the event's or the session's admission bound is full: 429 with `Retry-After`, the item
kept as `declined` until it is sent again. An event that was closed takes no upload: 409
`event_closed`, before a byte of the body is read.

`Idempotency-Key`: the media id is derived from it (with the token and the event), so a retry
finds the first upload's record and task and gets the first answer; the same key with other
content or another caption is 422. The contributor's session (the fairness flow) is a random
id in a cookie scoped to the event's path: nothing about the device is read.

Bytes the same as an item's that is being refused at that moment are accepted all the same:
kept again from the spool file once the upload's record holds them (`Moderation.accept_blob`),
never a 500 and never "send it again". Were they gone with no spool file to keep them from
(`OriginalGone`: not on this route, which always has one), the answer would be `503
upload_lost` with `Retry-After`.

`GET /v1/events/{event}/uploads/{media_id}` (the 202's `Location`): what became of an upload,
for the contributor's session that sent it (its session cookie), as its state, its phase and,
when a stage turned it away, the safe reason; another session's upload, or one that does not
exist, is 404 alike. Moderators of the event read any of its uploads there.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Request, Response
from pydantic import BaseModel
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from headrace.pipelines.moderation.media import BlobWriter, TooLarge
from headrace.pipelines.moderation.pipeline import (
    ITEM,
    MAX_CAPTION,
    EventClosed,
    Item,
    ItemState,
    OriginalGone,
    UploadConflict,
)
from headrace.policy.errors import ConfigError, QueueFull
from headrace.policy.text import text_problem
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
from headrace.service.api.edge import BodyLimit, EdgeRoute

router = APIRouter(tags=["uploads"], route_class=EdgeRoute)

LABEL = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
SESSION_COOKIE = "headrace_session"
_SESSION = re.compile(r"s[0-9a-f]{24}")
_KEY = re.compile(r"[\x21-\x7e]{1,200}")
FORM_OVERHEAD = 64 * 1024  # bytes of a form around its file: boundaries, headers, a caption
MAX_PARTS = 4

Event = Annotated[str, Path(pattern=LABEL, description="the event's id")]
MediaId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="the upload's media id")]
# The states whose reason a contributor is shown: what a stage, not a moderator, decided.
TURNED_AWAY_BY_STAGES = (ItemState.REFUSED, ItemState.QUARANTINED)


class Accepted(BaseModel):
    media_id: str
    state: str
    event: str


class Upload(BaseModel):
    media_id: str
    event: str
    state: str  # the item's state: accepted, validated, scanned, reviewable, refused, ...
    phase: str  # queued (waits for a stage), processing (in one), done
    reason: str | None  # refused: a safe code (`media.unsupported`); quarantined: the finding


@dataclass
class Form:
    """What a multipart upload carried: its file written to `writer`, its caption."""

    writer: BlobWriter
    caption: bytearray | None = None
    has_file: bool = False
    parts: int = 0
    _name: str | None = None
    _headers: dict[str, bytes] = field(default_factory=dict)
    _field: bytearray = field(default_factory=bytearray)
    _value: bytearray = field(default_factory=bytearray)

    def begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise ApiError(400, "bad_form", "send one 'file' part and at most a 'caption'")
        self._headers, self._name = {}, None

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def header_end(self) -> None:
        self._headers[bytes(self._field).decode("latin-1").lower()] = bytes(self._value)
        self._field, self._value = bytearray(), bytearray()

    def headers_done(self) -> None:
        _, options = parse_options_header(self._headers.get("content-disposition", b""))
        name = options.get(b"name", b"").decode("latin-1")
        if name == "file":
            if self.has_file:
                raise ApiError(400, "bad_form", "send one 'file' part")
            self.has_file = True
        elif name == "caption":
            self.caption = bytearray()
        else:
            raise ApiError(400, "bad_form", "the form takes a 'file' and a 'caption', no more")
        self._name = name

    def data(self, data: bytes, start: int, end: int) -> None:
        if self._name == "file":
            self.writer.write(data[start:end])
        elif self.caption is not None:
            self.caption += data[start:end]
            if len(self.caption) > 4 * MAX_CAPTION:
                raise ApiError(422, "invalid", f"caption: at most {MAX_CAPTION} characters")

    def text_caption(self) -> str | None:
        if self.caption is None:
            return None
        try:
            text = self.caption.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(422, "invalid", "caption: expected UTF-8 text") from None
        if len(text) > MAX_CAPTION:
            raise ApiError(422, "invalid", f"caption: at most {MAX_CAPTION} characters")
        problem = text_problem(text)
        if problem is not None:
            raise ApiError(422, "invalid", f"caption: {problem}")
        return text


def boundary_of(request: Request) -> bytes:
    kind, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise ApiError(
            415, "unsupported_media_type", "send the upload as multipart/form-data (field 'file')"
        )
    return boundary


def body_limit(svc: Service) -> int:
    """The largest upload body: the largest file any class takes, and a form around it."""
    return svc.moderation.max_bytes + FORM_OVERHEAD


def too_large(limit: int) -> ApiError:
    return ApiError(413, "too_large", f"an upload may have at most {limit} bytes")


async def read_form(chunks: AsyncIterator[bytes], boundary: bytes, writer: BlobWriter) -> Form:
    """Parse a multipart body as it streams in, writing its file part to `writer`."""
    form = Form(writer)
    ended = False

    def end() -> None:
        nonlocal ended
        ended = True

    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": form.begin,
            "on_header_field": form.header_field,
            "on_header_value": form.header_value,
            "on_header_end": form.header_end,
            "on_headers_finished": form.headers_done,
            "on_part_data": form.data,
            "on_end": end,
        },
    )
    try:
        async for chunk in chunks:
            parser.write(chunk)
        parser.finalize()
    except MultipartParseError:
        raise ApiError(400, "bad_form", "the multipart body could not be read") from None
    if not ended:  # the parser takes a body cut short without a word
        raise ApiError(400, "bad_form", "the multipart body ends before its closing boundary")
    if not form.has_file:
        raise ApiError(400, "bad_form", "send the media as a form field named 'file'")
    if writer.size == 0:
        raise ApiError(400, "bad_form", "the file is empty")
    return form


def closed(event: str) -> ApiError:
    return ApiError(409, "event_closed", f"event {event} was closed: it takes no more uploads")


def media_id_for(token_id: str, event: str, key: str) -> str:
    """The media id an idempotency key stands for: the same key of the same token and event,
    the same id."""
    return hashlib.sha256(f"{token_id}\0{event}\0{key}".encode()).hexdigest()[:32]


def session_of(request: Request) -> tuple[str, bool]:
    """The contributor's session id from its cookie, or a new one (and True: set it)."""
    given = request.cookies.get(SESSION_COOKIE, "")
    if _SESSION.fullmatch(given):
        return given, False
    return "s" + secrets.token_hex(12), True


def session_cookie(svc: Service, event: str, session: str) -> dict[str, str]:
    """The Set-Cookie header that keeps a new session id (sent with a 429 too: a client told
    to come back stays in its session)."""
    made = Response()
    made.set_cookie(
        SESSION_COOKIE,
        session,
        max_age=86400,
        path=f"/v1/events/{event}",
        httponly=True,
        samesite="lax",
        secure=svc.settings.secure_cookies,
    )
    return {"set-cookie": made.headers["set-cookie"]}


@router.post(
    "/v1/events/{event}/uploads",
    status_code=202,
    response_model=Accepted,
    summary="Upload a photo, a video or a voice note to an event",
    responses={
        400: {"description": "the form is malformed"},
        401: {"description": "no valid bearer token"},
        403: {"description": "the token's role may not upload"},
        404: {"description": "no such event for this token"},
        409: {"description": "the event was closed: it takes no more uploads"},
        413: {"description": "larger than any class takes"},
        415: {"description": "not multipart/form-data"},
        422: {"description": "a bad field, or an idempotency key reused with other content"},
        429: {"description": "admission is full: retry after Retry-After seconds"},
    },
    dependencies=[Depends(BodyLimit(body_limit))],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["file"],
                        "properties": {
                            "file": {"type": "string", "format": "binary"},
                            "caption": {"type": "string", "maxLength": MAX_CAPTION},
                        },
                    }
                }
            },
        }
    },
)
async def upload(
    event: Event,
    request: Request,
    response: Response,
    svc: TheService,
    who: Caller,
    idempotency_key: Annotated[
        str | None,
        Header(description="the same key again returns the first answer", max_length=200),
    ] = None,
) -> Accepted:
    await require(svc, who, Role.CONTRIBUTOR, event=event, action="upload")
    media_id = None
    if idempotency_key is not None:
        if not _KEY.fullmatch(idempotency_key):
            raise ApiError(422, "invalid", "Idempotency-Key: 1 to 200 printable ASCII characters")
        media_id = media_id_for(who.token_id, event, idempotency_key)
    moderation = svc.moderation
    if await moderation.closed(event):
        raise closed(event)
    limit = moderation.max_bytes
    boundary = boundary_of(request)
    session, new_session = session_of(request)
    cookie = session_cookie(svc, event, session) if new_session else {}
    try:
        async with moderation.media.writer(limit=limit) as writer:
            form = await read_form(request.stream(), boundary, writer)
            caption = form.text_caption()
            blob = await writer.keep()
            item = await moderation.receive(
                blob,
                event=event,
                session=session,
                media_id=media_id,
                caption=caption,
                local=writer.path,
            )
    except TooLarge:
        raise too_large(limit) from None
    except EventClosed:  # closed while the body arrived
        raise closed(event) from None
    except OriginalGone:
        raise ApiError(
            503,
            "upload_lost",
            "the upload's bytes went with another item's as they were kept; send it again",
            {"Retry-After": "1", **cookie},
        ) from None
    except UploadConflict as conflict:
        raise ApiError(
            422,
            "idempotency_conflict",
            f"this Idempotency-Key was used for an upload whose {conflict.field} differs; "
            "use a new key for a new upload",
        ) from None
    except QueueFull as full:
        whose = "your session" if full.scope == "flow" else "this event"
        raise ApiError(
            429,
            "queue_full",
            f"{whose} has as many uploads waiting as admitted; send it again later",
            {"Retry-After": str(svc.settings.retry_after), **cookie},
        ) from None
    except ConfigError as error:
        raise ApiError(422, "invalid", str(error)) from None
    response.headers.update(cookie)
    response.headers["location"] = upload_path(event, item.media_id)
    return Accepted(media_id=item.media_id, state="queued", event=event)


def upload_path(event: str, media_id: str) -> str:
    return f"/v1/events/{event}/uploads/{media_id}"


@router.get(
    "/v1/events/{event}/uploads/{media_id}",
    response_model=Upload,
    summary="What became of an upload (its contributor's session, or a moderator)",
    responses={
        401: {"description": "no valid bearer token"},
        404: {"description": "no such upload for this token and session"},
    },
)
async def upload_state(
    event: Event, media_id: MediaId, request: Request, svc: TheService, who: Caller
) -> Upload:
    item = await uploaded(svc, who, event, media_id, request.cookies.get(SESSION_COOKIE, ""))
    return Upload(
        media_id=item.media_id,
        event=item.event,
        state=item.state.value,
        phase=(await svc.moderation.phase(item)).value,
        reason=item.reason if item.state in TURNED_AWAY_BY_STAGES else None,
    )


async def uploaded(svc: Service, who: Principal, event: str, media_id: str, session: str) -> Item:
    """The upload, if `who` moderates its event or, a contributor, sent it in `session`: else
    404 alike whether it exists or not (a denial of an existing one audited)."""
    action = "read"
    await require(svc, who, Role.CONTRIBUTOR, event=event, kind=ITEM, action=action)
    found = await svc.store.records.get_record(ITEM, media_id)
    if found is None or found.scope != event:
        raise not_found(ITEM)  # as a denial reads: existence is not said
    item = Item.of(found)
    if not who.role.holds(Role.MODERATOR) and item.session != session:
        raise await deny(svc, who, kind=ITEM, record_id=media_id, scope=event, action=action)
    return item
