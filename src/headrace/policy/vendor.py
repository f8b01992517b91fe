"""Vendor responses mapped to error classes: the MiniMax `base_resp.status_code` table and HTTP.

The table is data, so a new vendor is a new table. 0 is success; rate-limit codes retry and
penalise the gate; auth, balance, parameter and moderation codes never retry; anything unknown
is treated as transient.
"""

from __future__ import annotations

import datetime
import email.utils
from collections.abc import Mapping
from dataclasses import dataclass

from headrace.policy.errors import ErrorClass, Fatal, RateLimited, TaskFailure, Transient


@dataclass(frozen=True)
class VendorCode:
    error_class: ErrorClass
    meaning: str


MINIMAX_CODES: Mapping[int, VendorCode] = {
    1002: VendorCode(ErrorClass.RATE_LIMITED, "rate limited (requests)"),
    1039: VendorCode(ErrorClass.RATE_LIMITED, "rate limited (tokens per minute)"),
    1004: VendorCode(ErrorClass.FATAL, "authentication failed"),
    1008: VendorCode(ErrorClass.FATAL, "insufficient balance"),
    2013: VendorCode(ErrorClass.FATAL, "invalid parameters"),
    1026: VendorCode(ErrorClass.FATAL, "input flagged by moderation"),
    1027: VendorCode(ErrorClass.FATAL, "output flagged by moderation"),
}
MINIMAX_OK = 0

_FAILURES: Mapping[ErrorClass, type[TaskFailure]] = {
    ErrorClass.RATE_LIMITED: RateLimited,
    ErrorClass.TRANSIENT: Transient,
    ErrorClass.FATAL: Fatal,
}


def minimax_failure(
    status_code: int, table: Mapping[int, VendorCode] = MINIMAX_CODES
) -> TaskFailure | None:
    """The failure for a MiniMax status code, or None for success. Unknown codes are transient."""
    if status_code == MINIMAX_OK:
        return None
    known = table.get(status_code)
    code = f"minimax_{status_code}"
    if known is None:
        return Transient(f"unknown vendor status {status_code}", code=code)
    return _FAILURES[known.error_class](known.meaning, code=code)


_FATAL_HTTP = frozenset({400, 401, 402, 403, 404, 405, 410, 413, 415, 422})


def http_failure(
    status: int, retry_after: str | None = None, now: float = 0.0
) -> TaskFailure | None:
    """The failure for an HTTP status: 429 rate limited (honouring Retry-After), 5xx transient,
    a client error that a retry cannot fix fatal, anything else in 4xx transient."""
    if status < 400:
        return None
    code = f"http_{status}"
    if status == 429:
        return RateLimited("HTTP 429", code=code, retry_after=parse_retry_after(retry_after, now))
    if status in _FATAL_HTTP:
        return Fatal(f"HTTP {status}", code=code)
    return Transient(f"HTTP {status}", code=code)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds, or an HTTP date (`now` epoch)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        # HTTP dates are GMT; the asctime form and a "-0000" zone parse without a zone
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - now)
