"""`POST /webhooks/{provider}`: deliveries from a provider, checked, kept once, acknowledged.

A delivery is signed with the provider's secret (`ApiSettings.webhook_secrets`): the header
`Webhook-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">` (several `v1=`
values may be sent while a secret is rotated). The timestamp must be within the window
(`webhook_window`, 300 s by default) of the store's clock, so a captured delivery cannot be
replayed later. The body is a JSON object with an `id` (the provider's event id), a `type`,
and for a remote job's completion its `remote_id`, `status` (`succeeded` or `failed`) and an
optional `result`.

A delivery is acknowledged (200) only once it is a record in the store (kind `delivery`,
keyed by provider and event id): a provider that retries a delivery it saw no answer to gets
200 again, `"duplicate": true`, and the delivery is kept and acted on once. A remote job's
completion is kept as the job's outcome (`remote.deliver`) and the tasks waiting on it are
checked at once: their poller reads it instead of asking the provider, and a stage without a
poller is resolved by it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request
from pydantic import BaseModel

from headrace.policy.errors import ConfigError
from headrace.policy.text import MAX_DEPTH, check_document
from headrace.runtime import remote
from headrace.service.api.deps import ApiError, TheService
from headrace.service.api.edge import BodyLimit, EdgeRoute
from headrace.store.protocol.records import Audit

router = APIRouter(tags=["webhooks"], route_class=EdgeRoute)

DELIVERY = "delivery"  # the record kind of a webhook delivery
MAX_BODY = 256 * 1024
STATUSES = ("succeeded", "failed")

Provider = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]


class Acknowledged(BaseModel):
    id: str
    duplicate: bool


def signature_ok(secret: str, header: str, body: bytes) -> tuple[bool, float | None]:
    """Whether `header` signs `body` with `secret`, and the timestamp it signed."""
    timestamp, signatures = None, []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit() and len(value) <= 12:
            timestamp = value
        elif name == "v1" and len(value) == 64:
            signatures.append(value)
    if timestamp is None or not signatures:
        return False, None
    signed = timestamp.encode() + b"." + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    good = any(hmac.compare_digest(expected, given) for given in signatures)
    return good, float(timestamp)


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The `Webhook-Signature` header a provider sends (for tests and the provider simulator)."""
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def parse(body: bytes) -> dict[str, Any]:
    """The delivery's JSON object, its fields checked: every string one that every store keeps
    alike, `result` at most `MAX_DEPTH` levels deep (4xx naming the field, never a 500)."""
    try:
        found = json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ApiError(400, "bad_request", f"the body is nested deeper than {MAX_DEPTH}") from None
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "bad_request", "the body must be a JSON object") from None
    if not isinstance(found, dict):
        raise ApiError(400, "bad_request", "the body must be a JSON object")
    event_id, kind = found.get("id"), found.get("type")
    if not isinstance(event_id, str) or not 0 < len(event_id) <= 200:
        raise ApiError(422, "invalid", "id: the provider's event id, 1 to 200 characters")
    if not isinstance(kind, str) or not 0 < len(kind) <= 100:
        raise ApiError(422, "invalid", "type: 1 to 100 characters")
    remote_id, status = found.get("remote_id"), found.get("status")
    if remote_id is not None and (not isinstance(remote_id, str) or len(remote_id) > 200):
        raise ApiError(422, "invalid", "remote_id: at most 200 characters")
    if remote_id is not None and status not in STATUSES:
        raise ApiError(422, "invalid", "status: 'succeeded' or 'failed' with a remote_id")
    try:
        for name in ("id", "type", "remote_id", "result"):
            check_document(found.get(name), name, depth=MAX_DEPTH)
    except ConfigError as error:
        raise ApiError(422, "invalid", str(error)) from None
    return found


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number too large for a float")
    return value


def kept_as(found: dict[str, Any]) -> dict[str, Any]:
    """The body a delivery is kept with: what a duplicate of it must carry again."""
    return {
        "event_id": found["id"],
        "type": found["type"],
        "remote_id": found.get("remote_id"),
        "status": found.get("status"),
        "result": found.get("result"),
    }


@router.post(
    "/webhooks/{provider}",
    response_model=Acknowledged,
    summary="Receive a provider's signed delivery",
    responses={
        400: {"description": "not a JSON object"},
        401: {"description": "missing or wrong signature, or a timestamp out of the window"},
        404: {"description": "no such provider"},
        413: {"description": "larger than 256 KiB"},
        422: {"description": "a field is missing or malformed"},
    },
    dependencies=[Depends(BodyLimit(MAX_BODY))],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["id", "type"],
                        "properties": {
                            "id": {"type": "string"},
                            "type": {"type": "string"},
                            "remote_id": {"type": "string"},
                            "status": {"type": "string", "enum": list(STATUSES)},
                            "result": {},
                        },
                    }
                }
            },
        }
    },
)
async def receive(
    provider: Provider,
    request: Request,
    svc: TheService,
    webhook_signature: Annotated[str | None, Header(max_length=1000)] = None,
) -> Acknowledged:
    secret = svc.settings.webhook_secrets.get(provider)
    if secret is None:
        raise ApiError(404, "not_found", "no such provider")
    body = await request.body()  # at most MAX_BODY: the route's BodyLimit
    good, timestamp = signature_ok(secret, webhook_signature or "", body)
    if not good or timestamp is None:
        raise ApiError(401, "bad_signature", "the Webhook-Signature does not sign this body")
    now = await svc.store.now()
    if abs(now - timestamp) > svc.settings.webhook_window:
        raise ApiError(401, "stale", "the signed timestamp is outside the accepted window")
    found = parse(body)
    key = hashlib.sha256(f"{provider}\0{found['id']}".encode()).hexdigest()
    body_kept = kept_as(found)
    kept = await svc.store.records.put_record(
        DELIVERY,
        key,
        scope=provider,
        state="received",
        body=body_kept,
        audit=Audit("webhook.received", provider),
    )
    first = dict(kept.record.body)
    if not kept.applied and first != body_kept:
        raise ApiError(
            409,
            "conflict",
            "id: this delivery id was received before with another body; the first one stands",
        )
    if first["remote_id"] is not None:  # again for a duplicate: a crash may have come in between
        succeeded = first["status"] == "succeeded"
        await remote.deliver(
            svc.store, provider, first["remote_id"], succeeded=succeeded, result=first["result"]
        )
    return Acknowledged(id=found["id"], duplicate=not kept.applied)
