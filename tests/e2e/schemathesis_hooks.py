"""Schemathesis hooks for the run against `headrace serve` (loaded by SCHEMATHESIS_HOOKS):
webhook deliveries are signed, so generated bodies reach the parser behind the signature, and
the shapes that once reached a 500 are sent among the explicit examples."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import schemathesis
from schemathesis import Case, HookContext

from headrace.service.api.webhooks import sign

WEBHOOKS = "/webhooks/{provider}"
SECRET = os.environ.get("HEADRACE_SCHEMA_WEBHOOK_SECRET", "")
PROVIDER = os.environ.get("HEADRACE_SCHEMA_WEBHOOK_PROVIDER", "vidgen")
DEEP = b"[" * 100_000 + b"]" * 100_000
# Bodies as raw JSON text: escapes a client library would not write (lone surrogates, NULs).
HOSTILE_DELIVERIES = (
    DEEP,
    b'{"id": "e1", "type": "x", "result": ' + DEEP + b"}",
    b'{"id": "evt\\ud800", "type": "job.done"}',
    b'{"id": "evt\\u0000", "type": "job.done"}',
    b'{"id": "e2", "type": "x", "remote_id": "j\\udfff", "status": "failed"}',
    b'{"id": "e3", "type": "x", "result": {"k\\u0000": "v\\ud800"}}',
    b'{"id": "e4", "type": "x", "result": NaN}',
    b'{"id": "e5", "type": "x", "result": 1e400}',
    b'{"id": "e6", "type": "x", "remote_id": "job-1", "status": "succeeded"}',
    b'{"id": "e6", "type": "x", "remote_id": "job-2", "status": "failed"}',  # the id again
)
NOT_A_PHOTO: Any = b"\xff\xd8\xff\xe0 not much of a photo"  # bytes, where the stubs say JSON
JSON_BODIES = (bytes, dict, list, str, int, float, bool, type(None))
HOSTILE_CAPTIONS = ("before\x00after", "\x00", "\u2028\x7f")


@schemathesis.hook
def before_add_examples(ctx: HookContext, examples: list[Case[Any]]) -> None:
    operation = ctx.operation
    if operation is None:
        return
    if operation.path == WEBHOOKS and operation.method.upper() == "POST":
        for raw in HOSTILE_DELIVERIES:
            examples.append(
                operation.Case(
                    path_parameters={"provider": PROVIDER},
                    body=raw,
                    media_type="application/json",
                )
            )
    if operation.path.endswith("/uploads") and operation.method.upper() == "POST":
        for caption in HOSTILE_CAPTIONS:
            examples.append(
                operation.Case(
                    path_parameters={"event": "gala"},
                    body={"file": NOT_A_PHOTO, "caption": caption},
                    media_type="multipart/form-data",
                )
            )


@schemathesis.hook
def before_call(ctx: HookContext, case: Case[Any], kwargs: dict[str, Any]) -> None:
    """Sign a delivery's body as the provider would, over the exact bytes sent."""
    if case.operation.path != WEBHOOKS or not SECRET or not isinstance(case.body, JSON_BODIES):
        return  # no body at all: sent unsigned, and refused as such
    raw = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
    case.body = raw
    case.media_type = "application/json"
    case.headers["Webhook-Signature"] = sign(SECRET, raw, int(time.time()))


@schemathesis.hook
def map_path_parameters(ctx: HookContext, path_parameters: dict[str, Any] | None) -> Any:
    """Deliveries go to the provider the server knows, so their bodies are read."""
    operation = ctx.operation
    if operation is not None and operation.path == WEBHOOKS and path_parameters is not None:
        return {**path_parameters, "provider": PROVIDER}
    return path_parameters


PROBLEM_MEMBERS = {"type": str, "title": str, "status": int, "detail": str, "code": str}


@schemathesis.check
def problem_details(ctx: Any, response: Any, case: Case[Any]) -> bool | None:
    """Every error answer is an RFC 9457 problem: its type, its members, its status."""
    if response.status_code < 400:
        return None
    kind = response.headers.get("content-type", [""])
    kind = kind[0] if isinstance(kind, list) else kind
    if kind != "application/problem+json":
        raise AssertionError(f"{response.status_code} answered as {kind!r}, not a problem")
    body = response.json()
    for name, member in PROBLEM_MEMBERS.items():
        if not isinstance(body.get(name), member):
            raise AssertionError(f"{response.status_code}: the problem's {name!r} is {body!r}")
    if body["status"] != response.status_code:
        raise AssertionError(f"{response.status_code}: the problem says {body['status']}")
    return True
