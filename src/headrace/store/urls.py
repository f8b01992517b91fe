"""Open a store from a URL: `memory://`, `sqlite:///relative.db`, `sqlite:////absolute.db`."""

from __future__ import annotations

from urllib.parse import urlsplit

from headrace.policy.clock import Clock
from headrace.policy.errors import ConfigError
from headrace.store.base import Store


def open_store(url: str, *, clock: Clock | None = None) -> Store:
    """A store for `url`; the store is opened later with `Store.open(settings)`."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        from headrace.store.memory import MemoryStore

        return MemoryStore(clock)
    if scheme == "sqlite":
        from headrace.store.sqlite import SQLiteStore

        return SQLiteStore.from_url(url, clock=clock)
    raise ConfigError(
        f"store url: unknown scheme {scheme!r} in {url!r}; use memory:// or sqlite:///file.db"
    )
