"""`postgresql://…`: the store for many worker processes on many hosts (`store.py`), its
connections and driver (`connection.py`), its pool and transactions (`sessions.py`), its LISTEN
for work (`listen.py`) and its SQL (`sql/`)."""

from headrace.store.postgres.connection import MIGRATIONS, QUERIES, migrate, split_url
from headrace.store.postgres.store import PostgresStore

__all__ = ["MIGRATIONS", "QUERIES", "PostgresStore", "migrate", "split_url"]
