"""Keep secrets out of error records, logs and metric labels, and credentials out of refs.

One set of rules serves both ends. `redact` rewrites what every rule matches; `credential_in`
names the first credential rule a piece of input matches, so a store can refuse a task whose
`ref` carries a signed URL or a token. Some rules only redact: any URL's query is cut from a
message (a signature may hide under any parameter name), but a ref with a plain query is fine.

Text is also read percent-decoded, once and again (up to `MAX_DECODINGS` times): a word that
holds an escape (`token%3D…`, `%26sig%3D…`, `X-Amz-Signature%253D…`, a signed URL encoded into
another URL's query) is decoded until the rules find nothing more, and shown decoded and
redacted at the deepest level where they found something.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote_plus

MAX_MESSAGE = 500
MAX_DECODINGS = 4


@dataclass(frozen=True)
class Rule:
    """`what` names what the rule finds (a `{name}` in it is the matched `name` group: the
    parameter or scheme, never the secret). `credential`: a ref that matches is refused."""

    what: str
    pattern: re.Pattern[str]
    replacement: str
    credential: bool
    # What every match of `pattern` holds (a character it cannot do without): a text without
    # it is not searched, so a plain ref costs a scan for a few characters, not the rules.
    needs: re.Pattern[str] | None = None

    def may_match(self, text: str) -> bool:
        return self.needs is None or self.needs.search(text) is not None

    def describe(self, match: re.Match[str]) -> str:
        name = match.groupdict().get("name")
        return self.what.format(name=name) if name else self.what


# Parameter names that carry a credential: `token`, `access_token`, `api_key`, `x-api-key`,
# `client_secret`, `sig`, `signature`, `X-Goog-Signature`, `X-Amz-Credential`, every `X-Amz-*`.
# A name is tried once per run of word characters and hyphens, from its start: linear time.
_CREDENTIAL_NAME = (
    r"(?<![\w-])(?P<name>x-(?:amz|goog)-[\w-]*"
    r"|[\w-]*?(?:(?:api|access|secret|private|client)[_-]?key"
    r"|token|secret|password|passwd|credential|signature|sig|authorization))"
)

RULES: tuple[Rule, ...] = (
    Rule(
        "a URL with a user name or password",
        re.compile(r"\b([a-z][a-z0-9+.-]{0,30}://)[^\s/@?#\"']+@", re.IGNORECASE),
        r"\1[redacted]@",
        credential=True,
        needs=re.compile("@"),
    ),
    # Signed URLs carry their credential in the query string: keep scheme, host and path only.
    Rule(
        "a URL query",
        re.compile(r"(\bhttps?://[^\s?#\"']+)\?[^\s\"']*", re.IGNORECASE),
        r"\1?[redacted]",
        credential=False,
        needs=re.compile(r"\?"),
    ),
    Rule(
        "a {name} token",
        re.compile(r"\b(?P<name>bearer|basic)\s+[A-Za-z0-9._~+/=-]+", re.IGNORECASE),
        r"\g<name> [redacted]",
        credential=True,
        needs=re.compile(r"\s"),
    ),
    # `name=value`, `name: value`, and JSON or Python dicts (`"name": "value"`)
    Rule(
        "the {name!r} parameter",
        re.compile(
            rf"{_CREDENTIAL_NAME}([\"']?\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&]+)",
            re.IGNORECASE,
        ),
        r"\g<name>\2[redacted]",
        credential=True,
        needs=re.compile("[=:]"),
    ),
    Rule(
        "an API key",
        re.compile(r"\b(sk|pk|key)-[A-Za-z0-9_-]{8,}\b"),
        "[redacted-key]",
        credential=False,
        needs=re.compile("-"),
    ),
)
_WORD = re.compile(r"\S+")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


def redact(text: str, *, limit: int | None = MAX_MESSAGE) -> str:
    """`text` with credentials, signed-URL queries and tokens removed, in plain or
    percent-encoded form, cut to `limit` characters (None: keep the length, e.g. for a
    traceback in a log)."""
    text = _apply(text)
    if "%" in text:  # only a percent escape can hide more (`_redact_escaped`)
        text = _WORD.sub(_redact_escaped, text)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def credential_in(text: str) -> str | None:
    """What credential `text` carries (e.g. "the 'X-Amz-Signature' parameter"), in plain or
    percent-encoded form; None when it carries none. The description never holds the secret."""
    for form in (text, *_decodings(text)):
        for rule in RULES:
            match = rule.pattern.search(form) if rule.credential and rule.may_match(form) else None
            if match is not None:
                return rule.describe(match)
    return None


def _apply(text: str) -> str:
    for rule in RULES:
        if rule.may_match(text):
            text = rule.pattern.sub(rule.replacement, text)
    return text


def _redact_escaped(match: re.Match[str]) -> str:
    """A word with percent escapes, redacted at every depth of decoding; shown decoded as deep
    as the rules found something there (the redacted text itself decodes to no secret)."""
    word = match[0]
    if _ESCAPE.search(word) is None:
        return word
    shown = current = word
    for _ in range(MAX_DECODINGS):
        decoded = unquote_plus(current)
        if decoded == current:
            break
        current = _apply(decoded)
        if current != decoded:
            shown = current
    return shown


def _decodings(text: str) -> list[str]:
    forms: list[str] = []
    current = text
    for _ in range(MAX_DECODINGS):
        decoded = unquote_plus(current)
        if decoded == current:
            break
        forms.append(decoded)
        current = decoded
    return forms


# A URL's password, wherever it appears in a text: `scheme://user:password@` or `?password=`.
_URL_PASSWORD = re.compile(r"\b([a-z][a-z0-9+.-]*://[^\s/@:]*):[^\s/]*@", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&\s]*", re.IGNORECASE)


def hide_passwords(text: str) -> str:
    """`text` (a store URL, or a message that quotes one) with every URL's password shown as
    `***`: what a log line or an error message may print."""
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1:***@", text))
