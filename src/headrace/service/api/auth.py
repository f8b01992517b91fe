"""Who a request is: bearer tokens, kept hashed, with a role scoped to events.

A token is shown once, when it is made (`headrace token create`), and kept only as the SHA-256
of its text: a record of kind `token` whose id is that digest, whose body names the holder, the
role and the events. Roles, each holding the ones below it: `admin` (every event, dead letters,
gates, metrics), `moderator` (the items and progress of its events), `contributor` (uploads to
its events). A principal asking for something of an event it has no part in gets the answer a
missing thing gets (404), so event names do not leak; that denial is written to the audit log.

The moderator page signs in with the same token, once: the sign-in becomes a record of kind
`login` (kept as the SHA-256 of a random cookie), so the token never travels again.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from headrace.policy.errors import ConfigError
from headrace.store.protocol.records import Audit, check_name
from headrace.store.protocol.tasks import Store

TOKEN = "token"  # the record kind of a bearer token
LOGIN = "login"  # the record kind of a page sign-in
TOKEN_PREFIX = "hr_"
ACTIVE = "active"
REVOKED = "revoked"
EVERY_EVENT = "*"
LOGIN_TTL = 12 * 3600.0
SIGN_IN_FORM_TTL = 1800  # seconds a loaded sign-in form stays usable (its cookie's max-age)


class Role(enum.Enum):
    CONTRIBUTOR = "contributor"
    MODERATOR = "moderator"
    ADMIN = "admin"

    def holds(self, needed: Role) -> bool:
        return _RANK[self] >= _RANK[needed]


_RANK = {Role.CONTRIBUTOR: 0, Role.MODERATOR: 1, Role.ADMIN: 2}


@dataclass(frozen=True)
class Principal:
    """Who a request is: `name` (a label, what the audit log says), a role and its events."""

    name: str
    role: Role
    events: frozenset[str]
    token_id: str  # the token's digest: what idempotency keys are scoped to

    def sees(self, event: str) -> bool:
        return EVERY_EVENT in self.events or event in self.events

    def may(self, role: Role, event: str | None = None) -> bool:
        return self.role.holds(role) and (event is None or self.sees(event))


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


async def create_token(
    store: Store, *, name: str, role: Role, events: Collection[str], by: str = "cli"
) -> str:
    """Make a token and keep its digest; the text returned is shown once and kept nowhere."""
    check_name(name, "token.name")
    scope = sorted(set(events))
    if not scope:
        raise ConfigError("token.events: name at least one event, or '*' for every event")
    for event in scope:
        if event != EVERY_EVENT:
            check_name(event, "token.events")
    if EVERY_EVENT in scope and role is not Role.ADMIN:
        raise ConfigError("token.events: only an admin token covers every event ('*')")
    token = new_token()
    body = {"name": name, "role": role.value, "events": scope}
    await store.records.put_record(
        TOKEN,
        digest(token),
        scope=name,
        state=ACTIVE,
        body=body,
        audit=Audit("token.created", by, {"role": role.value, "events": scope}),
    )
    return token


async def revoke_token(store: Store, name: str, *, by: str = "cli") -> int:
    """Revoke every active token of a holder; return how many."""
    revoked = 0
    for record in await store.records.list_records(TOKEN, scope=check_name(name, "token.name")):
        changed = await store.records.change_record(
            TOKEN, record.id, state=REVOKED, when={ACTIVE}, audit=Audit("token.revoked", by)
        )
        revoked += changed.applied
    return revoked


async def principal_of(store: Store, token: str) -> Principal | None:
    """The principal an active token names, or None."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    found = await store.records.get_record(TOKEN, digest(token))
    if found is None or found.state != ACTIVE:
        return None
    body = found.body
    return Principal(body["name"], Role(body["role"]), frozenset(body["events"]), found.id)


async def sign_in(store: Store, principal: Principal) -> tuple[str, str]:
    """A page sign-in for `principal`: the cookie's value and the form token that proves a
    form came from a page of that sign-in."""
    cookie = secrets.token_urlsafe(32)
    now = await store.now()
    await store.records.put_record(
        LOGIN,
        digest(cookie),
        scope=principal.name,
        state=ACTIVE,
        body={"token": principal.token_id, "until": now + LOGIN_TTL},
        audit=Audit("login", principal.name),
    )
    return cookie, form_token(cookie)


def sign_in_form() -> tuple[str, str]:
    """A sign-in form's cookie (random, kept nowhere) and the form token bound to it. Another
    site's page can neither read the token nor make the browser send a SameSite=Strict cookie,
    so it cannot sign the browser in, as its own moderator, without the moderator knowing."""
    cookie = secrets.token_urlsafe(32)
    return cookie, form_token(cookie)


async def signed_in(store: Store, cookie: str) -> Principal | None:
    """The principal of a live sign-in cookie (its token still active), or None."""
    if not cookie or len(cookie) > 100:
        return None
    found = await store.records.get_record(LOGIN, digest(cookie))
    if found is None or found.state != ACTIVE or found.body["until"] < await store.now():
        return None
    token = await store.records.get_record(TOKEN, found.body["token"])
    if token is None or token.state != ACTIVE:
        return None
    body = token.body
    return Principal(body["name"], Role(body["role"]), frozenset(body["events"]), token.id)


async def sign_out(store: Store, cookie: str) -> None:
    """End the sign-in of `cookie` on the server: a copy of the cookie kept anywhere is dead."""
    if cookie and len(cookie) <= 100:
        key = digest(cookie)
        if await store.records.get_record(LOGIN, key) is not None:
            await store.records.change_record(LOGIN, key, state=REVOKED, when={ACTIVE})


def form_token(cookie: str) -> str:
    """What a page's forms carry: bound to the sign-in, useless without its cookie."""
    return hmac.new(cookie.encode(), b"headrace form", hashlib.sha256).hexdigest()


def form_token_ok(cookie: str, given: str) -> bool:
    """Whether `given` is the form token of `cookie`. Never without a cookie: the token of an
    empty one is no secret. Compared as bytes, so any text a form sends is just wrong."""
    return bool(cookie) and hmac.compare_digest(form_token(cookie).encode(), given.encode())


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header."""
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def events_of(principal: Principal, known: Sequence[str]) -> list[str]:
    """The events among `known` a principal sees."""
    return [event for event in known if principal.sees(event)]
