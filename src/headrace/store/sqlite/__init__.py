"""`sqlite:///path`: the embedded default store (store.py), its file and connections
(connection.py), the wake-ups between its processes on one host (wake.py), and its SQL (sql/)."""

from headrace.store.sqlite.connection import path_from_url
from headrace.store.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore", "path_from_url"]
