"""Open a store from a URL: `memory://`, `sqlite:///relative.db`, `sqlite:////absolute.db`,
`postgresql://user@host:port/db` (or `postgres://`)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from headrace.policy.clock import Clock
from headrace.policy.errors import ConfigError
from headrace.store.protocol.tasks import Store
from headrace.store.schemes import MEMORY_SCHEME, POSTGRES_SCHEMES, SQLITE_SCHEME
from headrace.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from headrace.store.postgres import PostgresStore

__all__ = ["MEMORY_SCHEME", "POSTGRES_SCHEMES", "SQLITE_SCHEME", "open_store", "upgrade_schema"]


def open_store(url: str, *, clock: Clock | None = None) -> Store:
    """A store for `url`; the store is opened later with `Store.open(settings)`."""
    scheme = urlsplit(url).scheme
    if scheme == MEMORY_SCHEME:
        return SQLiteStore.in_memory(clock=clock)
    if scheme == SQLITE_SCHEME:
        return SQLiteStore.from_url(url, clock=clock)
    if scheme in POSTGRES_SCHEMES:
        return _postgres().from_url(url, clock=clock)
    raise _unknown(url)


async def upgrade_schema(url: str) -> tuple[int, int]:
    """Apply the migrations the store at `url` lacks; return its schema version before and after
    (what `headrace db upgrade` prints)."""
    scheme = urlsplit(url).scheme
    if scheme in POSTGRES_SCHEMES:
        return await _postgres().from_url(url).upgrade()
    if scheme == SQLITE_SCHEME:
        return await SQLiteStore.from_url(url).upgrade()
    if scheme == MEMORY_SCHEME:
        raise ConfigError("store url: memory:// keeps no schema to upgrade")
    raise _unknown(url)


def _postgres() -> type[PostgresStore]:
    """The PostgreSQL store, imported when a URL names it: psycopg and its compiled driver
    (about 10 MiB) stay out of processes that run on SQLite."""
    from headrace.store.postgres import PostgresStore

    return PostgresStore


def _unknown(url: str) -> ConfigError:
    return ConfigError(
        f"store url: unknown scheme {urlsplit(url).scheme!r} in {url!r}; "
        "use memory://, sqlite:///file.db or postgresql://user@host/db"
    )
