"""Vendor responses to error classes: the MiniMax status-code table, HTTP statuses, Retry-After."""

from __future__ import annotations

import calendar
import email.utils
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.policy.errors import ErrorClass, Fatal, RateLimited, TaskFailure, Transient
from headrace.policy.vendor import (
    MINIMAX_CODES,
    MINIMAX_OK,
    http_failure,
    minimax_failure,
    parse_retry_after,
)

RATE_LIMITED_CODES = [1002, 1039]
FATAL_CODES = [1004, 1008, 2013, 1026, 1027]
# 1994-11-06 08:48:37 GMT: one minute before the dates in the headers below
NOW = float(calendar.timegm((1994, 11, 6, 8, 48, 37)))


def test_zero_is_success() -> None:
    assert MINIMAX_OK == 0
    assert minimax_failure(0) is None


@pytest.mark.parametrize("status", RATE_LIMITED_CODES)
def test_rate_limit_codes_retry_and_penalise(status: int) -> None:
    failure = minimax_failure(status)
    assert isinstance(failure, RateLimited)
    assert failure.error_class is ErrorClass.RATE_LIMITED
    assert failure.code == f"minimax_{status}"
    assert failure.retry_after is None


@pytest.mark.parametrize("status", FATAL_CODES)
def test_auth_balance_parameter_and_moderation_codes_never_retry(status: int) -> None:
    failure = minimax_failure(status)
    assert isinstance(failure, Fatal)
    assert failure.error_class is ErrorClass.FATAL
    assert failure.code == f"minimax_{status}"
    assert failure.message == MINIMAX_CODES[status].meaning


def test_the_table_holds_exactly_the_known_codes() -> None:
    assert sorted(MINIMAX_CODES) == sorted(RATE_LIMITED_CODES + FATAL_CODES)


@given(st.integers(-(2**31), 2**31).filter(lambda c: c != MINIMAX_OK and c not in MINIMAX_CODES))
@settings(max_examples=200, deadline=None)
def test_unknown_codes_are_transient(status: int) -> None:
    failure = minimax_failure(status)
    assert isinstance(failure, Transient)
    assert failure.error_class is ErrorClass.TRANSIENT
    assert failure.code == f"minimax_{status}"


def test_another_table_can_be_passed() -> None:
    assert isinstance(minimax_failure(1002, table={}), Transient)


@given(st.integers(100, 399))
@settings(max_examples=50, deadline=None)
def test_http_below_400_is_success(status: int) -> None:
    assert http_failure(status) is None


def test_http_429_with_retry_after_seconds() -> None:
    failure = http_failure(429, "120")
    assert isinstance(failure, RateLimited)
    assert failure.retry_after == 120.0
    assert failure.code == "http_429"


def test_http_429_without_retry_after() -> None:
    failure = http_failure(429)
    assert isinstance(failure, RateLimited)
    assert failure.retry_after is None


@pytest.mark.parametrize(
    "header",
    [
        "Sun, 06 Nov 1994 08:49:37 GMT",  # IMF-fixdate, the preferred form
        "Sunday, 06-Nov-94 08:49:37 GMT",  # obsolete RFC 850 form
        "Sun Nov  6 08:49:37 1994",  # obsolete asctime form: no zone, and it means GMT
    ],
)
def test_http_429_with_retry_after_date(header: str) -> None:
    failure = http_failure(429, header, now=NOW)
    assert isinstance(failure, RateLimited)
    assert failure.retry_after == 60.0


@pytest.fixture
def far_from_utc() -> Iterator[None]:
    """The host's local time zone five hours west of UTC, restored afterwards."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TZ", "XYZ+05")
    time.tzset()
    try:
        yield
    finally:
        mp.undo()
        time.tzset()


@pytest.mark.usefixtures("far_from_utc")
@pytest.mark.parametrize(
    "header",
    [
        "Sun Nov  6 08:49:37 1994",
        "Sun, 06 Nov 1994 08:49:37 -0000",
        "Sun, 06 Nov 1994 08:49:37 GMT",
    ],
)
def test_an_http_date_does_not_depend_on_the_host_time_zone(header: str) -> None:
    assert time.timezone == 5 * 3600
    assert parse_retry_after(header, NOW) == 60.0


@given(st.integers(0, 10**6), st.integers(-(10**6), 10**6))
@settings(max_examples=200, deadline=None)
def test_retry_after_date_is_relative_to_now(ahead: int, base: int) -> None:
    now = NOW + base
    header = email.utils.formatdate(now + ahead, usegmt=True)
    assert parse_retry_after(header, now) == float(ahead)


def test_a_date_in_the_past_means_now() -> None:
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", NOW + 3600) == 0.0


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("0", 0.0), ("30", 30.0), (" 30 ", 30.0), ("", None), ("  ", None), (None, None)],
)
def test_retry_after_seconds(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header, NOW) == seconds


@pytest.mark.parametrize("header", ["soon", "-5", "1.5", "1e3", "²", "٣", "Sun, 31 Feb 1994"])
def test_unreadable_retry_after_is_ignored(header: str) -> None:
    assert parse_retry_after(header, NOW) is None


@given(st.text(max_size=40))
@settings(max_examples=300, deadline=None)
def test_any_retry_after_header_is_read_or_ignored(header: str) -> None:
    """A vendor's header never raises: it is a non-negative delay, or nothing."""
    delay = parse_retry_after(header, NOW)
    assert delay is None or delay >= 0.0


@given(st.integers(500, 599))
@settings(max_examples=50, deadline=None)
def test_http_5xx_is_transient(status: int) -> None:
    failure = http_failure(status, "30")
    assert isinstance(failure, Transient)
    assert failure.code == f"http_{status}"


@pytest.mark.parametrize("status", [400, 401, 402, 403, 404, 405, 410, 413, 415, 422])
def test_client_errors_a_retry_cannot_fix_are_fatal(status: int) -> None:
    failure = http_failure(status)
    assert isinstance(failure, Fatal)
    assert failure.error_class is ErrorClass.FATAL


def test_401_is_fatal() -> None:
    failure = http_failure(401)
    assert isinstance(failure, Fatal)
    assert failure.code == "http_401"


@pytest.mark.parametrize("status", [408, 409, 425, 499])
def test_other_client_errors_are_transient(status: int) -> None:
    assert isinstance(http_failure(status), Transient)


@given(st.integers(400, 599))
@settings(max_examples=100, deadline=None)
def test_every_error_status_maps_to_one_class(status: int) -> None:
    failure = http_failure(status)
    assert isinstance(failure, TaskFailure)
    expected = (
        ErrorClass.RATE_LIMITED
        if status == 429
        else ErrorClass.TRANSIENT
        if status >= 500
        else failure.error_class
    )
    assert failure.error_class is expected
