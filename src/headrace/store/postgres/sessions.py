"""A PostgreSQL store's sessions: its pool of connections, how each is set up (its schema, the
limits on a quiet session, keepalives), and one transaction on one of them, framed in pipeline
mode and run again when it met a conflict, or lost its connection before the commit."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from psycopg import sql as pgsql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from headrace.policy.errors import StoreError
from headrace.store.postgres.connection import (
    GONE_AFTER,
    PROBE_IDLE,
    PROBE_INTERVAL,
    PROBES,
    SESSION_LOST,
    Again,
    Connection,
    Dropped,
    PipelineDriver,
    Queries,
    check_connection,
    client_side,
    named,
    translated,
)

T = TypeVar("T")

# Seconds a verb waits for a pooled connection before the store counts as unavailable, and
# seconds the pool retries a failed connection (backing off) before it gives up on it. Equal, so
# a verb retried after an outage starts a fresh connection at once rather than waiting behind
# a long back-off: the server is used again within about a second of coming back.
POOL_TIMEOUT = 5.0
RECONNECT_TIMEOUT = POOL_TIMEOUT
# Seconds a pooled session may sit inside a transaction before the server ends it (its locks
# with it): a host whose link is cut mid-transaction holds up others for this long, not until
# TCP gives up on it (hours). The store's own transactions wait on the client for microseconds.
IDLE_IN_TRANSACTION = 10.0
# TCP keepalive probes the server sends on a pooled session (as the client does on its side,
# connection.py): the first after PROBE_IDLE quiet seconds, then every PROBE_INTERVAL; PROBES
# unanswered end the session, as does data left unacknowledged for as long. A host gone
# (power, link) is found in about 25 s in any state, mid-statement included, where the limit
# above does not apply.
# A pooled connection prepares a statement the first time it runs it (psycopg's default, the
# fifth, parses and plans it in full at each of the four before: 1.4 to 2.5 ms for a claim's
# batch), and keeps every one it has prepared: the store runs its named statements only, again
# and again. An idle worker's pool holds two to four connections, each preparing its own.
PREPARE_THRESHOLD = 0
PREPARED_MAX = 256  # more than the store has named statements (test_postgres_prepared.py)
# Tries of one verb that met a deadlock, a serialization failure or a racing idempotency key.
CONFLICT_TRIES = 5

BEGIN = "BEGIN"
COMMIT = "COMMIT"


class Sessions:
    """The connections of one store (one schema); `transact` runs a step in one transaction."""

    def __init__(
        self,
        dsn: str,
        queries: Queries,
        *,
        schema: str,
        pool_min: int,
        pool_max: int,
        idle_in_transaction: float,
    ) -> None:
        self.dsn = dsn
        self.queries = queries
        self.schema = schema
        self.channel = schema  # one schema, one store: its wake-ups are its own
        self.pool_min = pool_min
        self.pool_max = pool_max
        self.idle_in_transaction = idle_in_transaction
        self._pool: AsyncConnectionPool[Connection] | None = None

    @property
    def opened(self) -> bool:
        return self._pool is not None

    async def open(self) -> None:
        pool = self._new_pool()
        try:
            await translated(pool.open(wait=True, timeout=POOL_TIMEOUT))
        except BaseException:
            await pool.close()
            raise
        self._pool = pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def pool(self) -> AsyncConnectionPool[Connection]:
        if self._pool is None:
            raise StoreError(
                f"the store in schema {self.schema!r} is not open: await store.open(settings) first"
            )
        return self._pool

    async def transact(self, step: Callable[[PipelineDriver], Awaitable[T]]) -> T:
        """Run `step` in one transaction, again when it met a conflict; driver errors come out
        as StoreError (StoreUnavailable for a lost or unreachable server)."""
        return await self.retried(lambda: self._once(step))

    async def retried(self, once: Callable[[], Awaitable[T]]) -> T:
        """`once()`, again when it met a conflict (it then wrote nothing)."""
        tries = 0
        while True:
            tries += 1
            try:
                return await translated(once())
            except Again as again:
                if tries >= CONFLICT_TRIES:
                    raise again.give_up(tries) from again.__cause__

    async def _once(self, step: Callable[[PipelineDriver], Awaitable[T]]) -> T:
        async with self.pool().connection() as conn:
            committing = False
            try:
                # Pipeline mode: statements whose results are not read go with the next read.
                # The transaction is framed here rather than by `conn.transaction()`, which in
                # a pipeline waits for its BEGIN and syncs twice around its COMMIT: BEGIN goes
                # with the first statement, COMMIT with the pipeline's last Sync. A verb that
                # fails or is cancelled leaves it open: the pool's connection context rolls it
                # back as it takes the connection back.
                async with conn.pipeline() as pipeline:
                    await conn.execute(BEGIN)
                    result = await step(PipelineDriver(conn, self.queries, pipeline))
                    committing = True
                    await conn.execute(COMMIT)
            except SESSION_LOST as exc:
                if conn.broken and not committing:  # lost before the commit: nothing written
                    raise Dropped from exc
                raise
        return result

    def conninfo(self, application: str) -> str:
        """What a connection of this store is opened with: the URL's, with the client's
        timeouts and keepalives (`client_side`) and a name in pg_stat_activity."""
        return named(client_side(self.dsn), f"{application}/{self.schema}")

    def compose(self, query: str) -> pgsql.Composed:
        """A statement that names the schema or channel, which parameters cannot."""
        template = pgsql.SQL(self.queries[query].text)
        return template.format(
            schema=pgsql.Identifier(self.schema), channel=pgsql.Identifier(self.channel)
        )

    def _new_pool(self) -> AsyncConnectionPool[Connection]:
        return AsyncConnectionPool(
            self.conninfo("headrace"),
            connection_class=Connection,
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                "prepare_threshold": PREPARE_THRESHOLD,
            },
            min_size=self.pool_min,
            max_size=self.pool_max,
            open=False,
            configure=self._configure,
            check=check_connection,
            timeout=POOL_TIMEOUT,
            reconnect_timeout=RECONNECT_TIMEOUT,
            name=f"headrace-{self.schema}",
        )

    async def _configure(self, conn: Connection) -> None:
        conn.prepared_max = PREPARED_MAX
        await conn.execute(self.queries["set_search_path"].text, {"schema": self.schema})
        milliseconds = round(self.idle_in_transaction * 1000)
        if self.idle_in_transaction > 0:
            milliseconds = max(1, milliseconds)
        limits = {
            "milliseconds": str(milliseconds),
            "probe_idle": str(PROBE_IDLE),
            "probe_interval": str(PROBE_INTERVAL),
            "probes": str(PROBES),
            "unacked_ms": str(GONE_AFTER * 1000),
        }
        await conn.execute(self.queries["bound_quiet_sessions"].text, limits)
