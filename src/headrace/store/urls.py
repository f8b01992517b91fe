"""Open a store from a URL: `memory://`, `sqlite:///relative.db`, `sqlite:////absolute.db`,
`postgresql://user@host:port/db` (or `postgres://`)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from headrace.policy.clock import Clock
from headrace.policy.errors import ConfigError
from headrace.store.base import Store

MEMORY_SCHEME = "memory"
SQLITE_SCHEME = "sqlite"
POSTGRES_SCHEMES = ("postgresql", "postgres")
# A URL's password, wherever it appears in a text: `scheme://user:password@` or `?password=`.
_URL_PASSWORD = re.compile(r"\b([a-z][a-z0-9+.-]*://[^\s/@:]*):[^\s/]*@", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&\s]*", re.IGNORECASE)


def open_store(url: str, *, clock: Clock | None = None) -> Store:
    """A store for `url`; the store is opened later with `Store.open(settings)`."""
    scheme = urlsplit(url).scheme
    if scheme == MEMORY_SCHEME:
        from headrace.store.sqlite import SQLiteStore

        return SQLiteStore.in_memory(clock=clock)
    if scheme == SQLITE_SCHEME:
        from headrace.store.sqlite import SQLiteStore

        return SQLiteStore.from_url(url, clock=clock)
    if scheme in POSTGRES_SCHEMES:
        from headrace.store.postgres import PostgresStore

        return PostgresStore.from_url(url, clock=clock)
    raise _unknown(url)


async def upgrade_schema(url: str) -> tuple[int, int]:
    """Apply the migrations the store at `url` lacks; return its schema version before and after
    (what `headrace db upgrade` prints)."""
    scheme = urlsplit(url).scheme
    if scheme in POSTGRES_SCHEMES:
        from headrace.store.postgres import PostgresStore

        return await PostgresStore.from_url(url).upgrade()
    if scheme == SQLITE_SCHEME:
        from headrace.store.sqlite import SQLiteStore

        return await SQLiteStore.from_url(url).upgrade()
    if scheme == MEMORY_SCHEME:
        raise ConfigError("store url: memory:// keeps no schema to upgrade")
    raise _unknown(url)


def hide_passwords(text: str) -> str:
    """`text` (a store URL, or a message that quotes one) with every URL's password shown as
    `***`: what a log line or an error message may print."""
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1:***@", text))


def _unknown(url: str) -> ConfigError:
    return ConfigError(
        f"store url: unknown scheme {urlsplit(url).scheme!r} in {url!r}; "
        "use memory://, sqlite:///file.db or postgresql://user@host/db"
    )
