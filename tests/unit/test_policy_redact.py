"""Redaction: no signed URL query, bearer token, api key, `sk-` key or URL password survives, in
plain or percent-encoded form; refs that carry one are named without their secret."""

from __future__ import annotations

import string
from urllib.parse import quote

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from headrace.policy.redact import MAX_MESSAGE, credential_in, redact

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


# -- percent-encoded forms, and refs that carry credentials

CREDENTIAL_PARAMETERS = [
    "X-Amz-Signature",
    "X-Amz-Credential",
    "X-Amz-Security-Token",
    "X-Goog-Signature",
    "X-Goog-Credential",
    "Signature",
    "signature",
    "sig",
    "token",
    "access_token",
    "api_key",
    "apiKey",
    "client_secret",
]
# How `=` and `&` look after encoding once, twice or three times, in either case of hex.
EQUALS = ["=", "%3D", "%3d", "%253D", "%253d", "%25253D"]
AMPERSANDS = ["&", "%26", "%2526", "%252526", "?", "%3F", "%253F", ""]


@st.composite
def mixed_case(draw: st.DrawFn, name: str) -> str:
    upper = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.upper() if up else c.lower() for c, up in zip(name, upper, strict=True))


@st.composite
def encoded_credentials(draw: st.DrawFn, secret: str) -> str:
    """`secret` as a credential parameter's value, in some encoded shape."""
    name = draw(st.sampled_from(CREDENTIAL_PARAMETERS).flatmap(mixed_case))
    before = draw(st.sampled_from(AMPERSANDS))
    pair = f"{before}{name}{draw(st.sampled_from(EQUALS))}{secret}"
    shape = draw(st.sampled_from(["pair", "query", "url in a url", "quoted", "quoted twice"]))
    if shape == "query":
        return f"Expires%3D1700000000{pair}%26Key-Pair-Id%3DK2JCJMDEHXQW5F"
    if shape == "url in a url":
        inner = quote(f"https://bucket.example.com/ev42/clip.mp4?{name}={secret}", safe="")
        return f"https://proxy.example.com/fetch?u={inner}"
    if shape == "quoted":
        return quote(f"x=1&{name}={secret}", safe="")
    if shape == "quoted twice":
        return quote(quote(f"{name}={secret}", safe=""), safe="")
    return pair


@given(secrets, surroundings, st.data())
@settings(max_examples=600, deadline=None)
def test_an_encoded_credential_never_survives(
    secret: str, around: tuple[str, str], data: st.DataObject
) -> None:
    text = data.draw(encoded_credentials(secret), label="encoded")
    before, after = around
    assert_gone(secret, before + text + after)
    assert credential_in(text) is not None, text


@given(secrets, st.sampled_from(["Bearer", "bearer", "Basic"]), st.sampled_from(["%20", "+"]))
@settings(max_examples=100, deadline=None)
def test_an_encoded_bearer_token_never_survives(secret: str, scheme: str, space: str) -> None:
    for text in (f"Authorization%3A{space}{scheme}{space}{secret}", quote(f"{scheme} {secret}")):
        assert_gone(secret, text)
        assert credential_in(text) == f"a {scheme} token"


@given(secrets, st.sampled_from(["https", "postgresql", "ftp"]), st.booleans())
@settings(max_examples=100, deadline=None)
def test_a_url_with_a_user_or_password_never_survives(
    secret: str, scheme: str, encoded: bool
) -> None:
    url = f"{scheme}://uploader:{secret}@db.example.com:5432/media"
    text = quote(url, safe="") if encoded else url
    assert_gone(secret, f"cannot connect to {text}: refused")
    assert credential_in(text) == "a URL with a user name or password"


@pytest.mark.parametrize(
    ("ref", "found"),
    [
        (
            "https://b.s3.amazonaws.com/a.mp4?X-Amz-Signature=S3CR3T",
            "the 'X-Amz-Signature' parameter",
        ),
        (
            "https://storage.googleapis.com/b/a.mp4?X-Goog-Signature=S3CR3T",
            "the 'X-Goog-Signature'",
        ),
        ("https://cdn.example.com/a.mp4?Expires=1&Signature=S3CR3T&Key-Pair-Id=K", "'Signature'"),
        ("https://acct.blob.core.windows.net/c/a.mp4?sv=2022&sig=S3CR3T", "the 'sig' parameter"),
        ("clip.mp4?access_token=S3CR3T", "the 'access_token' parameter"),
        ("clip.mp4?api_key=S3CR3T", "the 'api_key' parameter"),
        ("clip.mp4%3Ftoken%3Dabc", "the 'token' parameter"),
        ("clip.mp4%253Fsignature%253Dabc", "the 'signature' parameter"),
        ("Bearer S3CR3T.eyJzdWIi", "a Bearer token"),
        ("https://user:S3CR3T@cdn.example.com/a.mp4", "a URL with a user name or password"),
        ("s3://S3CR3T@bucket/a.mp4", "a URL with a user name or password"),
    ],
)
def test_a_credential_in_a_ref_is_named_without_its_value(ref: str, found: str) -> None:
    named = credential_in(ref)
    assert named is not None and found in named
    assert "S3CR3T" not in named


@pytest.mark.parametrize(
    "ref",
    [
        "ep6-s01",
        "uploads/ev42/8f14e45f.mp4",
        "gala-2024:contributor-17:upload-8f14e45f",
        "https://cdn.example.com/v/ep6-s01.mp4?v=2",
        "s3://bucket/ev42/clip.mp4",
        "max_tokens=4096",
        "key-art-ep6-0001",
        "50%-preview",
    ],
)
def test_a_record_id_carries_no_credential(ref: str) -> None:
    assert credential_in(ref) is None


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None)
def test_redacting_twice_changes_nothing(text: str) -> None:
    once = redact(text, limit=None)
    assert redact(once, limit=None) == once


# Text where every rule may find something: the characters the rules look for, their words,
# and unicode whitespace (which `\s` matches too).
rule_text = st.lists(
    st.sampled_from(
        [
            *"ab=:?@-/ \t\u00a0\u2003%'\"",
            "https://",
            "ftp://",
            "token",
            "X-Amz-",
            "api_key",
            "bearer",
            "Basic",
            "sk-",
            "abcdefghij",
            "%3D",
        ]
    ),
    min_size=1,
    max_size=30,
).map("".join)


@settings(max_examples=400)
@given(rule_text)
@example("bearer\tabcdefghij")
@example("Basic\u00a0abcdefghij")
@example("token : abc")
@example("ftp://a:b@host")
def test_a_rule_skipped_for_want_of_what_it_needs_would_have_found_nothing(text: str) -> None:
    """`Rule.needs` only saves time: every rule applied to every text gives the same text, and
    names the same credential."""
    from headrace.policy import redact as module

    applied = text
    for rule in module.RULES:
        applied = rule.pattern.sub(rule.replacement, applied)
        assert rule.may_match(text) or rule.pattern.search(text) is None
    assert module._apply(text) == applied
