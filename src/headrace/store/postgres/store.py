"""`postgresql://…`: the store for many worker processes on many hosts, on PostgreSQL.

Every verb is one transaction on a connection from an async pool (psycopg 3). Dispatch state
lives in tables, so a gate's cap and rate, fair tags and leases hold across every process:

- A claim reaps expired leases and ages low tasks (a store's claims do so once per
  SWEEP_EVERY of store time, not each one), then reads ready candidates in `(tier, tag, id)`
  order a batch at a time with `FOR UPDATE SKIP LOCKED` (claims never wait on each other's
  tasks), locks the rows of the gates those candidates need in name order, and feeds
  `GateBook` through `take_turns`, as the other stores do. It then writes the gate states,
  tickets, leases, attempt rows, dispatch count and virtual time before it commits.
- Writers lock rows in one order: tasks (by id), then gates (by name), then flows (by name),
  then the store-wide counters, and the cost ledger last, at the commit. An outcome (or a batch
  of them) locks all it will touch before it writes anything. Where a claim discovers a gate
  out of that order it takes the row only if it is free; a transaction that still meets a
  deadlock or serialization failure runs again.
- Time: with no clock given, every lease, run_at and gate time is the server's
  `clock_timestamp()` read in the transaction (again after waiting for gate rows), so hosts with
  skewed clocks agree. A test passes a clock and its value is used instead, in the same SQL.
  `now()` asks the server at most once per CLOCK_REUSE and moves that answer on by the host's
  monotonic clock in between (a worker asks for every task it starts).
- Outcomes: a batch's plain successes (no successors) are written by one set-based statement;
  any other outcome runs in a savepoint of its own.
- Every write by a lease holder checks its token and `lease_until > now` on the locked task row;
  a stale holder gets `LeaseLost`.
- `submit`, and outcomes that make tasks ready or return tickets, `NOTIFY` the store's channel
  (its schema's name) when they commit; `wait_for_work` listens on a connection of its own.

A connection lost before the commit runs the verb again on another connection; a server that
cannot be reached, or a loss during the commit, comes out as `StoreUnavailable`; other driver
errors as `StoreError`. The statements are named in `store/postgres/sql/queries.sql`; the schema
is the versioned migrations in `store/postgres/sql/migrations/`, applied by `open()` (or
`headrace db upgrade`) under an advisory lock, in the store's own PostgreSQL schema.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

import psycopg
from psycopg import errors as pgerrors
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from headrace.policy import fairness
from headrace.policy.clock import Clock
from headrace.policy.errors import ConfigError, HeadraceError, StoreError
from headrace.policy.gate import GateConfig
from headrace.store.machine import (
    Claimed,
    SweepDue,
    Sweeps,
    Transaction,
    check_gates,
    sql,
    task_row,
)
from headrace.store.machine import claim as claim_steps
from headrace.store.machine import outcomes as outcome_steps
from headrace.store.machine import submit as submit_steps
from headrace.store.machine.record_verbs import RecordVerbs
from headrace.store.machine.verbs import TaskVerbs, kinds_list
from headrace.store.postgres.connection import (
    QUERIES,
    Dropped,
    PipelineDriver,
    Queries,
    bool_option,
    check_pool_sizes,
    int_option,
    migrate,
    retrieve,
    seconds_option,
    split_url,
    translated,
    without_password,
)
from headrace.store.postgres.listen import Listener
from headrace.store.postgres.sessions import IDLE_IN_TRANSACTION, Sessions
from headrace.store.protocol.types import (
    ClaimResult,
    KindLimit,
    Lease,
    MemoryRoom,
    NewTask,
    Outcome,
    Settings,
    Submitted,
    Succeeded,
)

T = TypeVar("T")

DEFAULT_SCHEMA = "headrace"
# Seconds `now()` reuses the server's last answer, moved on by the host's monotonic clock.
CLOCK_REUSE = 1.0


class PostgresStore(TaskVerbs):
    """The store many processes on many hosts share: one PostgreSQL schema."""

    def __init__(
        self,
        dsn: str,
        *,
        clock: Clock | None = None,
        pool_min: int = 1,
        pool_max: int = 10,
        schema: str = DEFAULT_SCHEMA,
        durable_claims: bool = False,
        idle_in_transaction: float = IDLE_IN_TRANSACTION,
    ) -> None:
        """`durable_claims`: a claim's commit waits for the WAL flush, as every other write's
        does. Off, a claim commits without waiting (`synchronous_commit = off` for it alone):
        the task starts sooner, and a server crash in the flush's few hundred milliseconds
        forgets the claim as if its worker had died (the task runs again, the holder's writes
        are refused); its gate tickets and tokens are forgotten with it.

        `idle_in_transaction`: seconds the server lets one of the pool's sessions wait on its
        client inside a transaction before it ends the session and releases its locks (0: no
        limit). A host cut off mid-transaction then holds the others up for that long."""
        check_pool_sizes(pool_min, pool_max)
        if not (0 <= idle_in_transaction < math.inf):
            raise ConfigError(
                f"postgres idle_in_transaction: expected seconds >= 0, got {idle_in_transaction!r}"
            )
        if not schema or len(schema) > 63:
            raise ConfigError(f"postgres schema: expected 1 to 63 characters, got {schema!r}")
        self.dsn = dsn
        self.clock = clock
        self.schema = schema
        self.durable_claims = durable_claims
        self.settings = Settings()
        self._configs: dict[str, GateConfig] = {}
        self._limited: frozenset[str] = frozenset()  # stages with limits on waiting tasks
        self._queries: Queries = sql.load_queries(QUERIES)
        self.sessions = Sessions(
            dsn,
            self._queries,
            schema=schema,
            pool_min=pool_min,
            pool_max=pool_max,
            idle_in_transaction=idle_in_transaction,
        )
        self.channel = self.sessions.channel
        self._server_clock: tuple[float, float] | None = None  # (server time, monotonic then)
        self._last_now = -math.inf
        self._clock_question: asyncio.Task[tuple[float, float]] | None = None
        self._sweeps = Sweeps()
        self._listener = Listener(
            self.sessions.conninfo("headrace-listen"), self.sessions.compose("listen")
        )
        self.records = RecordVerbs(self)  # same database, same transactions

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> PostgresStore:
        """A store for `postgresql://user@host:port/db` (or `postgres://`). The query may add
        `schema`, `pool_min`, `pool_max`, `durable_claims` (true or false) and
        `idle_in_transaction` (seconds); the rest of the URL goes to libpq as it is."""
        dsn, options = split_url(url)
        return cls(
            dsn,
            clock=clock,
            schema=options.get("schema", DEFAULT_SCHEMA),
            pool_min=int_option(options, "pool_min", 1),
            pool_max=int_option(options, "pool_max", 10),
            durable_claims=bool_option(options, "durable_claims", False),
            idle_in_transaction=seconds_option(options, "idle_in_transaction", IDLE_IN_TRANSACTION),
        )

    def __repr__(self) -> str:
        return f"PostgresStore({without_password(self.dsn)!r}, schema={self.schema!r})"

    # -- lifecycle

    async def open(self, settings: Settings) -> None:
        self.settings = settings
        self._configs = {config.name: config for config in settings.gates}
        self._limited = frozenset(stage.kind for stage in settings.stages if stage.limited)
        if self.sessions.opened:
            return
        await self.upgrade()  # on a connection of its own: an unreachable server fails fast
        await self.sessions.open()

    async def close(self) -> None:
        await self._listener.close()
        await self.sessions.close()

    async def upgrade(self) -> tuple[int, int]:
        """Apply the migrations the schema lacks, on a connection of its own; return the schema
        version before and after."""
        connect = psycopg.AsyncConnection.connect(
            self.sessions.conninfo("headrace"), autocommit=True, row_factory=dict_row
        )
        conn = await translated(connect)
        async with conn:
            return await translated(migrate(conn, self._queries, self.schema))

    async def now(self) -> float:
        """The server's clock, asked at most every CLOCK_REUSE seconds: in between, the last
        answer moved on by this host's monotonic clock (off by at most half that round trip
        plus the drift of two clocks over a second; never going back)."""
        if self.clock is not None:
            return await self._read(Transaction.current_time)
        local = time.monotonic()
        if self._server_clock is None or local - self._server_clock[1] >= CLOCK_REUSE:
            self._server_clock = await self._sample_clock()
            local = time.monotonic()
        server, at = self._server_clock
        self._last_now = max(self._last_now, server + (local - at))
        return self._last_now

    async def _sample_clock(self) -> tuple[float, float]:
        """One question to the server at a time: callers meanwhile share its answer."""
        question = self._clock_question
        if question is None or question.done():
            question = asyncio.create_task(self._read(Transaction.clock_sample))
            question.add_done_callback(retrieve)  # even when every caller was cancelled
            self._clock_question = question
        return await asyncio.shield(question)

    @property
    def wakes(self) -> int:
        return self._listener.wakes

    @property
    def sees_every_write(self) -> bool:
        return False  # a notice may be lost while the listener connects again

    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109
        self.sessions.pool()  # open, or say so
        await self._listener.wait(timeout)

    # -- submission

    async def submit(
        self, tasks: Sequence[NewTask], *, bounds: Mapping[str, int] | None = None
    ) -> list[Submitted]:
        batch, limits = tuple(tasks), dict(bounds or {})
        if _plain(batch, limits.keys() | self._limited):
            submitted = await self._submit_plain(batch)
            if submitted is not None:
                return submitted
        return await self._write(
            lambda tx: submit_steps.submit(tx, batch, limits), clock_first=False
        )

    async def _submit_plain(self, batch: Sequence[NewTask]) -> list[Submitted] | None:
        """A plain batch (`_plain`) in one statement, committed on its own: no round trip to
        begin or to commit. None when one of its flows is new (nothing was written): the
        general path makes the flow."""
        check_gates(batch, self._configs)
        params = {
            "tasks": _plain_rows(batch),
            "clock": None if self.clock is None else self.clock.now(),
            "channel": self.channel,
        }

        async def once() -> DictRow | None:
            async with self.sessions.pool().connection() as conn:
                try:
                    cursor = await conn.execute(self._queries["submit_plain"].text, params)
                    return await cursor.fetchone()
                except pgerrors.AdminShutdown as exc:
                    # The server ended the session (a restart, pg_terminate_backend) before
                    # the statement's commit: it wrote nothing, and runs again on another
                    # connection. Any other lost connection leaves it unknown: unavailable.
                    raise Dropped from exc

        found = await self.sessions.retried(once)
        if found is None:
            raise StoreError("postgres store: submit_plain returned no row")
        if not found["complete"]:
            return None
        return [Submitted(int(drawn), created=True) for drawn in found["ids"]]

    # -- claiming

    async def claim(
        self,
        worker: str,
        limit: int,
        *,
        lease_for: float,
        kinds: Collection[str] | None = None,
        alone: bool = True,
        finished: Sequence[tuple[Lease, Outcome]] = (),
        within: Sequence[KindLimit] = (),
        memory: MemoryRoom | None = None,
        ahead: int = 0,
    ) -> ClaimResult:
        wanted, groups = kinds_list(kinds), tuple(within)
        # Outcomes with successors lock the successors' flows, and a claim locks gates after
        # its outcomes; every writer locks gates before flows, so those outcomes are written
        # first, in a transaction of their own (a claim holding a flow while it waits for a
        # gate another claim holds, which waits for that flow, would be a deadlock).
        spawning = [n for n, (_, outcome) in enumerate(finished) if _spawns(outcome)]
        early = await self.finish_many([finished[n] for n in spawning]) if spawning else []
        carried = [n for n in range(len(finished)) if n not in set(spawning)]
        batch = tuple(finished[n] for n in carried)
        # A claim that records outcomes commits durably, as `finish_many` does.
        durable = self.durable_claims or bool(batch)

        # Reap expired leases and age low tasks once SWEEP_EVERY of store time has passed (or
        # the clock went back), judged by the clock as this store last saw it. The sweep is a
        # transaction of its own, before the claim: the tasks it makes ready or promotes are
        # then not held by a claim that has yet to lock their gates (another claim would skip
        # them, out of order). Unless the tallies are due to be folded too, the claim first
        # looks whether the sweep would find anything (SweepDue): mostly it would not, and the
        # sweep's transaction is saved (traced on an idle worker, one claim in six had it in
        # front).
        seen = self.clock.now() if self.clock is not None else await self.now()
        sweep = self._sweeps.due(seen)
        if sweep and self._sweeps.fold_due(seen):
            self._sweeps.swept(
                await self._write(lambda tx: claim_steps.sweep(tx, fold=True)), folded=True
            )
            sweep = False

        def verb(check: bool) -> Callable[[Transaction], Awaitable[ClaimAnswer]]:
            async def claim(tx: Transaction) -> ClaimAnswer:
                # The outcomes first: they lock their tasks, then gates, as every writer does;
                # the claim then holds those gates already and waits only above them.
                results = await outcome_steps.finish_many(tx, batch) if batch else []
                claimed = await claim_steps.claim(
                    tx,
                    worker,
                    limit,
                    lease_for,
                    wanted,
                    alone=alone,
                    durable=durable,
                    within=groups,
                    memory=memory,
                    ahead=ahead,
                    sweep_check=check,
                )
                return results, claimed

            return claim

        try:
            results, claimed = await self._write(verb(sweep), clock_first=False)
        except SweepDue:  # rolled back: nothing of it was written
            self._sweeps.swept(await self._write(lambda tx: claim_steps.sweep(tx)), folded=False)
            results, claimed = await self._write(verb(False), clock_first=False)
        else:
            if sweep:  # looked, and there was nothing to sweep
                self._sweeps.swept(claimed.now, folded=False)
        merged: list[HeadraceError | None] = [None] * len(finished)
        for n, result in [*zip(spawning, early, strict=True), *zip(carried, results, strict=True)]:
            merged[n] = result
        return replace(claimed.result(await claimed.rows()), finished=tuple(merged))

    # -- transactions

    async def _write(
        self, verb: Callable[[Transaction], Awaitable[T]], *, clock_first: bool = True
    ) -> T:
        """`clock_first=False`: the verb reads the clock itself, once it holds its rows."""
        return await self._transact(verb, read=False, clock_first=clock_first)

    async def _read(self, verb: Callable[[Transaction], Awaitable[T]]) -> T:
        return await self._transact(verb, read=True, clock_first=True)

    async def _transact(
        self, verb: Callable[[Transaction], Awaitable[T]], *, read: bool, clock_first: bool
    ) -> T:
        """Run `verb` in one transaction, again when it met a conflict."""

        async def step(driver: PipelineDriver) -> T:
            tx = Transaction(driver, self._configs, self.settings, self.clock)
            if read:
                await tx.run("read_snapshot")
            if clock_first:
                await tx.read_clock()
            result = await verb(tx)
            await tx.conclude()
            if tx.wake:  # heard by listeners once the transaction commits
                await tx.run("notify", channel=self.channel)
            return result

        return await self.sessions.transact(step)


ClaimAnswer = tuple[list[HeadraceError | None], Claimed]  # the carried outcomes' results; the claim


def _spawns(outcome: Outcome) -> bool:
    return isinstance(outcome, Succeeded) and bool(outcome.successors)


def _plain(batch: Sequence[NewTask], bounded: Collection[str]) -> bool:
    """A batch `submit_plain` can take: no keys, no dependencies, no kind whose stage has
    limits (`bounded`), no task that continues another's place in line, one task per flow (each
    task's tag is then its flow's first)."""
    flows = {task.flow for task in batch}
    return (
        bool(batch)
        and len(flows) == len(batch)
        and not any(
            task.key is not None or task.after or task.kind in bounded or task.continues is not None
            for task in batch
        )
    )


def _plain_rows(batch: Sequence[NewTask]) -> Jsonb:
    return Jsonb(
        [
            {
                **task_row(task),
                "i": number,
                "delay": float(task.delay),
                "service": fairness.service(task.weight),
            }
            for number, task in enumerate(batch, start=1)
        ]
    )
