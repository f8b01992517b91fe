"""The URL schemes of the stores, named once for `urls` and the backends without importing any
backend (the PostgreSQL one brings psycopg into the process)."""

MEMORY_SCHEME = "memory"
SQLITE_SCHEME = "sqlite"
POSTGRES_SCHEMES = ("postgresql", "postgres")
