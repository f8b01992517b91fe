"""Redaction: no signed URL query, bearer token, api key or `sk-` key survives."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.policy.redact import MAX_MESSAGE, redact

# Secrets are long runs of letters and digits, so one cannot hide inside the redacted text.
secrets = st.text(string.ascii_letters + string.digits, min_size=16, max_size=48)
surroundings = st.sampled_from(
    [
        ("", ""),
        ("upload failed: ", ""),
        ("provider said: ", " (retrying)"),
        ("(", ")"),
        ("a, ", "; b"),
        ("\n", "\n"),
    ]
)


def assert_gone(secret: str, text: str) -> None:
    cleaned = redact(text)
    assert secret not in cleaned, cleaned


@given(secrets, surroundings, st.sampled_from(["http", "https", "HTTPS"]))
@settings(max_examples=200, deadline=None)
def test_signed_url_query_is_stripped(secret: str, around: tuple[str, str], scheme: str) -> None:
    url = (
        f"{scheme}://media.example-bucket.s3.amazonaws.com/uploads/ev42/clip.mp4"
        f"?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={secret}%2F20240101"
        f"&X-Amz-Signature={secret[::-1]}&X-Amz-Expires=900"
    )
    before, after = around
    cleaned = redact(before + url + after)
    assert secret not in cleaned
    assert secret[::-1] not in cleaned
    assert f"{scheme}://media.example-bucket.s3.amazonaws.com/uploads/ev42/clip.mp4" in cleaned
    assert "X-Amz" not in cleaned


def test_a_signed_url_keeps_scheme_host_and_path() -> None:
    text = "GET https://cdn.example.com/v/ep6-s01.mp4?sig=abc123&exp=99 failed"
    assert redact(text) == "GET https://cdn.example.com/v/ep6-s01.mp4?[redacted] failed"


@given(secrets, surroundings, st.sampled_from(["Bearer", "bearer", "BEARER", "Basic"]))
@settings(max_examples=200, deadline=None)
def test_bearer_and_basic_credentials_are_removed(
    secret: str, around: tuple[str, str], scheme: str
) -> None:
    before, after = around
    for token in (secret, f"{secret[:8]}.{secret[8:]}.sig-_~+/=", f"{secret}=="):
        assert_gone(secret[8:], before + f"Authorization: {scheme} {token}" + after)
        assert_gone(secret[8:], before + f"{scheme} {token}" + after)


@given(
    secrets,
    surroundings,
    st.sampled_from(
        ["api_key", "api-key", "apikey", "API_KEY", "x-api-key", "token", "secret", "password"]
    ),
    st.sampled_from(["=", ": ", " = ", ":"]),
    st.sampled_from(["", '"', "'"]),
)
@settings(max_examples=300, deadline=None)
def test_key_value_credentials_are_removed(
    secret: str, around: tuple[str, str], key: str, sep: str, quote: str
) -> None:
    before, after = around
    assert_gone(secret, f"{before}{key}{sep}{quote}{secret}{quote}{after}")
    assert_gone(secret, f"{before}?user=7&{key}{sep}{secret}&page=2{after}")


@given(secrets, st.sampled_from(["api_key", "token", "password", "apiKey"]))
@settings(max_examples=100, deadline=None)
def test_json_credentials_are_removed(secret: str, key: str) -> None:
    assert_gone(secret, f'{{"{key}": "{secret}", "model": "video-01"}}')
    assert_gone(secret, f"{{'{key}': '{secret}'}}")


@given(secrets, surroundings, st.sampled_from(["sk", "pk", "key"]), st.sampled_from(["", "proj-"]))
@settings(max_examples=200, deadline=None)
def test_sk_style_keys_are_removed(
    secret: str, around: tuple[str, str], prefix: str, project: str
) -> None:
    before, after = around
    assert_gone(secret, f"{before}{prefix}-{project}{secret}{after}")
    assert "[redacted-key]" in redact(f"{prefix}-{project}{secret}")


def test_examples() -> None:
    assert redact("auth failed with sk-abcdefgh12345678") == "auth failed with [redacted-key]"
    assert redact("Authorization: Bearer eyJhbGciOi.eyJzdWIi.sIgNaTuRe") == (
        "Authorization: [redacted] [redacted]"
    )
    assert (
        redact("retry with api_key=abc123; region=eu") == "retry with api_key=[redacted]; region=eu"
    )


ORDINARY = [
    "",
    "render failed for shot ep6-s01 after 3 attempts (HTTP 503)",
    "status_code=1002 rate limited (requests)",
    "insufficient balance",
    "upload 8f14e45f accepted for event gala-2024, 3 of 40 derived",
    "the key frame at 00:01:02 was black",
    "timeout after 30s waiting for the video job",
    "See https://status.example.com/incidents for details.",
    "moderation: output flagged by moderation",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_unchanged(text: str) -> None:
    assert redact(text) == text


# "basic" or "bearer" followed by any word is redacted even in prose (over-eager, never leaky),
# so plain text here leaves those two words out.
plain = st.text(string.ascii_letters + string.digits + " .,!?()'\n", max_size=MAX_MESSAGE).filter(
    lambda text: not any(word in text.lower() for word in ("bearer", "basic"))
)


@given(plain)
@settings(max_examples=300, deadline=None)
def test_text_without_credential_shapes_is_unchanged(text: str) -> None:
    assert redact(text) == text


@given(st.text(max_size=2 * MAX_MESSAGE))
@settings(max_examples=200, deadline=None)
def test_redacted_text_is_bounded(text: str) -> None:
    cleaned = redact(text)
    assert len(cleaned) <= MAX_MESSAGE
    if len(text) <= MAX_MESSAGE and cleaned == text:
        return
    assert len(cleaned) < MAX_MESSAGE or cleaned.endswith("…")


def test_a_long_message_is_cut_after_redacting() -> None:
    secret = "Z" * 40
    text = "x" * (MAX_MESSAGE - 20) + f" token={secret} " + "y" * 40
    cleaned = redact(text)
    assert len(cleaned) == MAX_MESSAGE
    assert cleaned.endswith("…")
    assert "ZZZZ" not in cleaned
