"""Keep secrets out of error records, logs and metric labels."""

from __future__ import annotations

import re

_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    # Signed URLs carry their credential in the query string: keep scheme, host and path only.
    (re.compile(r"(\bhttps?://[^\s?#\"']+)\?[^\s\"']*", re.IGNORECASE), r"\1?[redacted]"),
    (re.compile(r"\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+", re.IGNORECASE), r"\1 [redacted]"),
    # `key=value`, `key: value`, and JSON or Python dicts (`"key": "value"`)
    (
        re.compile(
            r"\b(api[_-]?key|token|secret|password|signature|sig|x-amz-[a-z-]+|authorization)"
            r"([\"']?\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&]+)",
            re.IGNORECASE,
        ),
        r"\1\2[redacted]",
    ),
    (re.compile(r"\b(sk|pk|key)-[A-Za-z0-9_-]{8,}\b"), "[redacted-key]"),
)
MAX_MESSAGE = 500


def redact(text: str, *, limit: int | None = MAX_MESSAGE) -> str:
    """`text` with credentials, signed-URL queries and tokens removed, cut to `limit`
    characters (None: keep the length, e.g. for a traceback in a log)."""
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text
