"""The OpenAPI document says what the service answers: a route's own answers, and for every
error, whatever its status, an RFC 9457 problem (`application/problem+json`, deps.ApiError),
never FastAPI's own validation-error body. Its security scheme, `bearer`, comes from the
`Caller` dependency (deps.BEARER)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from headrace.service.api.deps import PROBLEM

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An RFC 9457 problem: `code` names it, `detail` says what to do.",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string", "format": "uri-reference"},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "errors": {
            "type": "array",
            "description": "a validation error's fields",
            "items": {
                "type": "object",
                "properties": {"field": {"type": "string"}, "detail": {"type": "string"}},
            },
        },
        "failing": {"type": "array", "items": {"type": "string"}},
    },
    "additionalProperties": True,
}
PROBLEM_CONTENT = {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}
ANY_ERROR = {
    "description": "an error: a problem whose `code` says which (docs/api.md)",
    "content": PROBLEM_CONTENT,
}
# FastAPI's description of its own 422 body, which this service never sends.
FASTAPI_ERRORS = ("HTTPValidationError", "ValidationError")


class Api(FastAPI):
    """FastAPI, whose OpenAPI document describes every error as a problem."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            self.openapi_schema = with_problems(super().openapi())
        return self.openapi_schema


def with_problems(document: dict[str, Any]) -> dict[str, Any]:
    """`document` with each operation's error answers, and any other (`default`), problems."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            answers = operation.setdefault("responses", {})
            for status, answer in answers.items():
                if status[:1] in ("4", "5"):
                    answer["content"] = PROBLEM_CONTENT
            answers["default"] = ANY_ERROR
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in FASTAPI_ERRORS:
        schemas.pop(name, None)
    schemas["Problem"] = PROBLEM_SCHEMA
    return document
