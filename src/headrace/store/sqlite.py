"""`sqlite:///path`: the embedded default store, shared by the processes of one host.

One file holds everything dispatch decides with: tasks, gate states and tickets, leases, fair
queueing tags. Every verb is one transaction, and every writing verb takes the file's write lock
first (`BEGIN IMMEDIATE`), so claims from several processes are serialised and a gate's cap and
rate hold across all of them. The store's clock defaults to the wall clock (epoch seconds), which
every process on the host shares.

The connection lives on one worker thread and each verb runs there whole, so the event loop never
waits on the database. The statements are named in `store/sql/sqlite_queries.sql`; the schema is
the versioned migrations in `store/sql/migrations/`, applied by `open()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sqlite3
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote, urlsplit

from headrace.policy import fairness, poison
from headrace.policy import gate as gating
from headrace.policy.clock import Clock, WallClock
from headrace.policy.errors import (
    ConfigError,
    ErrorClass,
    HeadraceError,
    LeaseLost,
    QueueFull,
    SchemaTooNew,
    StoreError,
    UnknownGate,
    UnknownTask,
)
from headrace.policy.gate import GateConfig, GateState, GateStatistics
from headrace.policy.poison import Expiry
from headrace.policy.tiers import AGING_CEILING, Tier, aged_tier
from headrace.store import idempotency, sql
from headrace.store.dispatch import GateBook, earliest, fits_claim, gate_key
from headrace.store.types import (
    LEASE_EXPIRED,
    POISON,
    UPSTREAM_FAILED,
    Attempt,
    AttemptError,
    AttemptOutcome,
    AwaitRemote,
    ClaimResult,
    Dead,
    Failure,
    GroupReport,
    Lease,
    NewTask,
    Outcome,
    PollAgain,
    Retry,
    Settings,
    Sibling,
    StageStats,
    Submitted,
    Succeeded,
    TaskRecord,
    TaskState,
)
from headrace.store.wake import WakeChannel

T = TypeVar("T")

SCHEME = "sqlite"
QUERIES = "sqlite_queries.sql"
# RETURNING (3.35) and json_each; every supported Python ships a newer SQLite.
MIN_SQLITE_VERSION = (3, 35, 0)
# Candidates read per statement while a claim walks the ready queue in (tier, tag, id) order.
CLAIM_BATCH = 256
# Seconds between looks for other processes' commits: the fallback when no wake-up comes.
DATA_VERSION_POLL = 0.02
# Widens the aging index range past any float rounding of `now - step`; aged_tier decides.
AGING_SLACK = 1e-3

Queries = Mapping[str, sql.Query]
_LOCKED = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)  # primary result codes


class SQLiteStore:
    """The embedded store: one SQLite file, shared by the processes of one host."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Clock | None = None,
        busy_timeout: float = 10.0,
        data_version_poll: float = DATA_VERSION_POLL,
    ) -> None:
        if not busy_timeout >= 0:
            raise ConfigError(f"sqlite busy_timeout: expected seconds >= 0, got {busy_timeout!r}")
        if not data_version_poll > 0:
            raise ConfigError(
                f"sqlite data_version_poll: expected seconds > 0, got {data_version_poll!r}"
            )
        self.path = Path(path)
        self.clock: Clock = clock or WallClock()
        self.busy_timeout = busy_timeout
        self.data_version_poll = data_version_poll
        self.settings = Settings()
        self._configs: dict[str, GateConfig] = {}
        self._queries: Queries = sql.load_queries(QUERIES)
        self._executor: ThreadPoolExecutor | None = None
        self._connection: sqlite3.Connection | None = None
        self._data_version = 0
        self._woke = False  # set on the store's thread by a write that may free work
        self._woken = asyncio.Event()  # ... and passed on to waiters by the event loop
        self._channel = WakeChannel(self.path, self._woken.set)  # ... to and from other processes

    @classmethod
    def from_url(
        cls, url: str, *, clock: Clock | None = None, busy_timeout: float = 10.0
    ) -> SQLiteStore:
        """A store for `sqlite:///relative/path.db` or `sqlite:////absolute/path.db`."""
        return cls(path_from_url(url), clock=clock, busy_timeout=busy_timeout)

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    # -- lifecycle

    async def open(self, settings: Settings) -> None:
        self.settings = settings
        self._configs = {config.name: config for config in settings.gates}
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="headrace-sqlite")
        try:
            await self._in_thread(self._connect)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        self._channel.close()
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._disconnect)
        finally:
            executor.shutdown(wait=True)

    async def now(self) -> float:
        return self.clock.now()

    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109
        """Return once a write of this store made work claimable since the last claim, or one
        of another process did (its wake-up comes through store/wake.py), or another connection
        committed (the file's data version, looked at every `data_version_poll` seconds: the
        fallback for a lost wake-up), or after `timeout`."""
        self._channel.listen()  # before the data version is read: no commit slips between
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (left := deadline - loop.time()) > 0:
            if self._woken.is_set():
                self._woken.clear()  # seen: the next wait waits for something newer
                return
            if await self._in_thread(self._changed_elsewhere):
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), min(self.data_version_poll, left))

    # -- submission

    async def submit(
        self, tasks: Sequence[NewTask], *, bounds: Mapping[str, int] | None = None
    ) -> list[Submitted]:
        batch, limits = tuple(tasks), dict(bounds or {})
        return await self._write(lambda tx: tx.submit(batch, limits))

    # -- claiming

    async def claim(
        self,
        worker: str,
        limit: int,
        *,
        lease_for: float,
        kinds: Collection[str] | None = None,
        alone: bool = True,
    ) -> ClaimResult:
        wanted = _kinds_json(kinds)
        self._woken.clear()  # this claim sees everything written before it
        return await self._write(lambda tx: tx.claim(worker, limit, lease_for, wanted, alone))

    async def claim_polls(
        self, worker: str, limit: int, *, lease_for: float, kinds: Collection[str] | None = None
    ) -> ClaimResult:
        wanted = _kinds_json(kinds)
        return await self._write(lambda tx: tx.claim_polls(worker, limit, lease_for, wanted))

    # -- lease holders

    async def renew(self, leases: Sequence[Lease], *, lease_for: float) -> list[Lease | None]:
        held = tuple(leases)
        return await self._write(lambda tx: tx.renew(held, lease_for))

    async def start(self, lease: Lease, gates: Collection[str] | None = None) -> None:
        chosen = None if gates is None else frozenset(gates)
        await self._write(lambda tx: tx.start(lease, chosen))

    async def finish(self, lease: Lease, outcome: Outcome) -> None:
        await self._write(lambda tx: tx.finish(lease, outcome))

    async def finish_many(
        self, outcomes: Sequence[tuple[Lease, Outcome]]
    ) -> list[HeadraceError | None]:
        return await self._write(lambda tx: tx.finish_many(outcomes))

    # -- cancellation and reaping

    async def cancel(self, task_id: int) -> bool:
        return await self._write(lambda tx: tx.cancel(task_id))

    async def redrive(
        self,
        *,
        task_ids: Collection[int] | None = None,
        group: str | None = None,
        kind: str | None = None,
    ) -> list[int]:
        ids = None if task_ids is None else json.dumps(sorted(task_ids))
        return await self._write(lambda tx: tx.redrive(ids, group, kind))

    async def reap(self) -> int:
        return await self._write(lambda tx: tx.reap())

    # -- reading

    async def get(self, task_id: int) -> TaskRecord:
        return await self._read(lambda tx: tx.task(task_id))

    async def find(self, key: str) -> TaskRecord | None:
        return await self._read(lambda tx: tx.find(key))

    async def tasks(
        self,
        *,
        group: str | None = None,
        state: TaskState | None = None,
        kind: str | None = None,
        limit: int = 1000,
    ) -> list[TaskRecord]:
        return await self._read(lambda tx: tx.tasks(group, state, kind, limit))

    async def attempts(self, task_id: int) -> list[Attempt]:
        return await self._read(lambda tx: tx.attempts(task_id))

    async def counts(self, *, kinds: Collection[str] | None = None) -> dict[TaskState, int]:
        chosen = None if kinds is None else json.dumps(sorted(kinds))
        return await self._read(lambda tx: tx.counts(chosen))

    async def stages(self, *, kinds: Collection[str] | None = None) -> list[StageStats]:
        chosen = _kinds_json(kinds)
        return await self._read(lambda tx: tx.stages(chosen))

    async def groups(self) -> list[str]:
        return await self._read(lambda tx: tx.groups())

    async def group_report(self, group: str) -> GroupReport:
        return await self._read(lambda tx: tx.group_report(group))

    async def gate_statistics(self) -> list[GateStatistics]:
        return await self._read(lambda tx: tx.gate_statistics())

    # -- the worker thread

    async def _write(self, verb: Callable[[_Transaction], T]) -> T:
        result = await self._in_thread(lambda: self._transact("begin_write", verb))
        if self._woke:  # committed: idle workers may claim, in this process and others
            self._woke = False
            self._woken.set()
            self._channel.notify()
        return result

    async def _read(self, verb: Callable[[_Transaction], T]) -> T:
        return await self._in_thread(lambda: self._transact("begin_read", verb))

    def _read_data_version(self, conn: sqlite3.Connection) -> int:
        return int(conn.execute(self._queries["data_version"].text).fetchone()[0])

    def _changed_elsewhere(self) -> bool:
        """Whether another connection committed since this one last looked (store thread)."""
        if self._connection is None:
            return False
        version = self._read_data_version(self._connection)
        changed = version != self._data_version
        self._data_version = version
        return changed

    async def _in_thread(self, work: Callable[[], T]) -> T:
        if self._executor is None:
            raise StoreError(f"{self!r} is not open: await store.open(settings) first")
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def _transact(self, begin: str, verb: Callable[[_Transaction], T]) -> T:
        connection = self._connection
        if connection is None:
            raise StoreError(f"{self!r} is not open: await store.open(settings) first")

        def work(conn: sqlite3.Connection) -> T:
            # The clock is read once the lock is held, so times follow the commit order.
            now = self.clock.now()
            tx = _Transaction(conn, self._queries, self._configs, self.settings, now)
            result = verb(tx)
            self._data_version = self._read_data_version(conn)
            self._woke = self._woke or tx.wake
            return result

        return in_transaction(connection, self._queries, begin, work)

    def _connect(self) -> None:
        if self._connection is not None:
            return
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            raise StoreError(f"the sqlite store needs SQLite >= 3.35, not {sqlite3.sqlite_version}")
        connection = _translated(lambda: connect(self.path, self.busy_timeout, self._queries))
        try:
            migrate(connection, self._queries)
        except BaseException:
            connection.close()
            raise
        self._connection = connection

    def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


def path_from_url(url: str) -> Path:
    """The file a `sqlite:///relative/path.db` or `sqlite:////absolute/path.db` URL names."""
    parts = urlsplit(url)
    path = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    if parts.scheme != SCHEME or parts.netloc or parts.query or parts.fragment or not path:
        raise ConfigError(
            "store url: expected sqlite:///relative/path.db or sqlite:////absolute/path.db, "
            f"got {url!r}"
        )
    return Path(path)


def connect(path: Path, busy_timeout: float, queries: Queries) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, foreign keys on."""
    connection = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    try:
        connection.row_factory = sqlite3.Row
        for name in ("journal_wal", "synchronous_normal", "foreign_keys_on"):
            connection.execute(queries[name].text).fetchall()
    except BaseException:
        connection.close()
        raise
    return connection


def migrate(connection: sqlite3.Connection, queries: Queries) -> int:
    """Apply the migrations the file lacks, all in one transaction; return the schema version."""

    def apply(conn: sqlite3.Connection) -> int:
        current = int(conn.execute(queries["user_version"].text).fetchone()[0])
        migrations = sql.load_migrations()
        latest = migrations[-1].version
        if current > latest:
            raise SchemaTooNew("the database", current, latest)
        for migration in migrations[current:]:
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute(queries["set_user_version"].text.format(version=migration.version))
        return latest

    return in_transaction(connection, queries, "begin_write", apply)


def in_transaction(
    connection: sqlite3.Connection,
    queries: Queries,
    begin: str,
    work: Callable[[sqlite3.Connection], T],
) -> T:
    """Run `work` in one transaction: commit, or roll back and re-raise. SQLite errors come out
    as StoreError."""

    def attempt() -> T:
        connection.execute(queries[begin].text)
        try:
            result = work(connection)
            connection.execute(queries["commit"].text)
        except BaseException:
            if connection.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute(queries["rollback"].text)
            raise
        return result

    return _translated(attempt)


def _translated(work: Callable[[], T]) -> T:
    try:
        return work()
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _LOCKED:
            raise StoreError("sqlite store: the database stayed locked past busy_timeout") from exc
        raise StoreError(f"sqlite store: {exc}") from exc


class _Transaction:
    """One verb's transaction: the statements it runs and the state machine's steps, as in
    `MemoryStore` (the conformance suite holds the two to the same semantics)."""

    def __init__(
        self,
        connection: sqlite3.Connection,
        queries: Queries,
        configs: Mapping[str, GateConfig],
        settings: Settings,
        now: float,
    ) -> None:
        self._connection = connection
        self._queries = queries
        self.configs = configs
        self.settings = settings
        self.now = now
        self.wake = False  # this transaction may have made work claimable
        self._virtual_time: float | None = None
        self._dispatches: int | None = None
        self._served: dict[str, int] = {}

    # -- statements

    # Each runs the named query; `query` is positional-only so a parameter may be called `name`.

    def _execute(self, query: str, params: Mapping[str, object]) -> sqlite3.Cursor:
        return self._connection.execute(self._queries[query].text, {"now": self.now, **params})

    def rows(self, query: str, /, **params: object) -> list[sqlite3.Row]:
        return self._execute(query, params).fetchall()

    def row(self, query: str, /, **params: object) -> sqlite3.Row | None:
        found = self.rows(query, **params)
        return found[0] if found else None

    def one(self, query: str, /, **params: object) -> sqlite3.Row:
        found = self.row(query, **params)
        if found is None:
            raise StoreError(f"sqlite store: {query} found no row")
        return found

    def run(self, query: str, /, **params: object) -> None:
        self._execute(query, params)

    def run_many(self, query: str, rows: Iterable[Mapping[str, object]]) -> None:
        params = ({"now": self.now, **row} for row in rows)
        self._connection.executemany(self._queries[query].text, params)

    # -- submission

    def submit(self, tasks: Sequence[NewTask], bounds: Mapping[str, int]) -> list[Submitted]:
        self.check_batch(tasks)
        planned = self.plan(tasks)
        self.check_bounds(tasks, planned, bounds)
        return self.create(tasks, planned)

    def check_batch(self, tasks: Sequence[NewTask]) -> None:
        for index, task in enumerate(tasks):
            for name in task.gates:
                gating.resolve(name, self.configs)
            for dep in task.after:
                if isinstance(dep, Sibling):
                    if not 0 <= dep.index < index:
                        raise ConfigError(f"task.after: sibling {dep.index} is not earlier")
                elif self.row("task_by_id", id=dep) is None:
                    raise UnknownTask(dep)

    def check_bounds(
        self,
        tasks: Sequence[NewTask],
        planned: Sequence[idempotency.Planned],
        bounds: Mapping[str, int],
    ) -> None:
        for kind, bound in bounds.items():
            new = idempotency.created_of_kind(tasks, planned, kind)
            if not new:
                continue
            queued = int(self.one("count_queued", kind=kind)["n"])
            if queued + new > bound:
                raise QueueFull(kind, bound)

    def plan(self, tasks: Sequence[NewTask]) -> list[idempotency.Planned]:
        """What the batch's keys name already; KeyConflict for a key with another payload."""
        known = {}
        for key in sorted({task.key for task in tasks if task.key is not None}):
            found = self.known_key(key)
            if found is not None:
                known[key] = found
        return idempotency.plan(tasks, known)

    def create(
        self, tasks: Sequence[NewTask], planned: Sequence[idempotency.Planned]
    ) -> list[Submitted]:
        results: list[Submitted] = []
        for task, step in zip(tasks, planned, strict=True):
            if step is not None:
                results.append(idempotency.reused(step, results))
                continue
            after = [results[d.index].id if isinstance(d, Sibling) else d for d in task.after]
            results.append(self.insert(task, after))
        return results

    def known_key(self, key: str) -> idempotency.KnownKey | None:
        found = self.row("task_id_by_key", key=key)
        if found is None:
            return None
        return idempotency.KnownKey(int(found["id"]), found["payload_digest"])

    def insert(self, task: NewTask, after: Sequence[int]) -> Submitted:
        states = {dep: self.task(dep).state for dep in after}
        unmet = sorted(dep for dep, state in states.items() if state is not TaskState.SUCCEEDED)
        tagged = fairness.tag(self.virtual_time(), self.flow_finish(task.flow), task.weight)
        digest = idempotency.stored_digest(task, after)
        params = _task_params(task, tagged.start, unmet, self.now)
        inserted = self.row("insert_task", **params, payload_digest=digest)
        if inserted is None:
            return self.key_taken(task, digest)
        task_id = int(inserted["id"])
        self.wake = self.wake or not unmet
        self.run("save_flow_finish", flow=task.flow, finish=tagged.flow_finish)
        self.run_many("insert_dependency", ({"dep_id": d, "task_id": task_id} for d in unmet))
        if any(states[dep] in (TaskState.DEAD, TaskState.CANCELLED) for dep in unmet):
            self.cancel_tree(task_id, UPSTREAM_FAILED)
        return Submitted(task_id, created=True)

    def key_taken(self, task: NewTask, digest: str | None) -> Submitted:
        """Another writer created a task with this key first: the key names that task, if it
        was submitted with the same payload."""
        found = self.known_key(task.key or "")
        if found is None or digest is None:
            raise StoreError(f"sqlite store: key {task.key!r} conflicted but names no task")
        idempotency.check(task.key or "", found.digest, digest, found.task_id)
        return Submitted(found.task_id, created=False)

    def virtual_time(self) -> float:
        if self._virtual_time is None:
            found = self.row("virtual_time")
            self._virtual_time = 0.0 if found is None else float(found["value"])
        return self._virtual_time

    def advance_virtual_time(self, tag: float) -> None:
        current = self.virtual_time()
        advanced = fairness.advance(current, tag)
        if advanced != current:
            self._virtual_time = advanced
            self.run("save_virtual_time", value=advanced)

    def flow_finish(self, flow: str) -> float:
        found = self.row("flow_finish", flow=flow)
        return 0.0 if found is None else float(found["finish_tag"])

    # -- claiming

    def claim(
        self, worker: str, limit: int, lease_for: float, kinds: str | None, alone: bool
    ) -> ClaimResult:
        self.reap()
        self.age()
        book = GateBook(self.configs, self.gate_state, self.now)
        candidates = fairness.take_turns(
            self.candidates(kinds, book.refused_keys, limit),
            rank=lambda task: (task.tier, task.tag),
            flow=lambda task: task.flow,
            last_served=self.last_served,
        )
        leases: list[Lease] = []
        while len(leases) < limit and (task := next(candidates, None)) is not None:
            if not fits_claim(task, len(leases), alone):
                continue
            if gate_key(task.gates) in book.refused_keys or not book.admit(task.gates):
                continue
            leases.append(self.lease(task, worker, lease_for))
            if task.solo:
                break
        for name in sorted(book.changed):
            self.save_gate(name, book.states[name])
        later = self.one("next_ready_run_at")["at"]
        return ClaimResult(tuple(leases), self.now, earliest(book.wake_at(), later))

    def candidates(
        self, kinds: str | None, refused: Collection[str], limit: int
    ) -> Iterator[TaskRecord]:
        """Ready tasks due now in (tier, tag, id) order, read a batch at a time (the first just
        big enough for `limit`, then growing); keys refused so far are left out of later
        batches."""
        after: tuple[int, float, int] = (-1, 0.0, 0)
        size = min(CLAIM_BATCH, 2 * limit + 8)
        while True:
            batch = self.rows(
                "ready_candidates",
                tier=after[0],
                tag=after[1],
                id=after[2],
                kinds=kinds,
                refused=json.dumps(sorted(refused)),
                batch=size,
            )
            yield from (_record(row) for row in batch)
            if len(batch) < size:
                return
            size = min(CLAIM_BATCH, size * 4)
            last = batch[-1]
            after = (last["tier"], last["tag"], last["id"])

    def last_served(self, flow: str) -> int:
        if flow not in self._served:
            found = self.row("flow_served", flow=flow)
            self._served[flow] = 0 if found is None else int(found["served"])
        return self._served[flow]

    def mark_served(self, flow: str) -> None:
        if self._dispatches is None:
            found = self.row("dispatches")
            self._dispatches = 0 if found is None else int(found["value"])
        self._dispatches += 1
        self._served[flow] = self._dispatches
        self.run("save_flow_served", flow=flow, served=self._dispatches)
        self.run("save_dispatches", value=self._dispatches)

    def lease(self, task: TaskRecord, worker: str, lease_for: float) -> Lease:
        self.advance_virtual_time(task.tag)
        self.mark_served(task.flow)
        self.run_many(
            "insert_ticket",
            ({"task_id": task.id, "gate": g, "started": not self.rated(g)} for g in task.gates),
        )
        until = self.now + lease_for
        record = _record(self.one("lease_task", id=task.id, worker=worker, until=until))
        self.run("insert_attempt", task_id=task.id, number=record.attempt, worker=worker)
        return Lease(record, record.lease_token, until)

    def age(self) -> None:
        step = self.settings.aging_step
        if step <= 0:
            return
        cutoff = self.now - step + AGING_SLACK
        for tier in (t for t in Tier if t > AGING_CEILING):
            for found in self.rows("aging_candidates", tier=int(tier), cutoff=cutoff):
                aged = aged_tier(tier, self.now - found["ready_since"], step)
                if aged != tier:
                    self.run("promote", id=found["id"], tier=int(aged))

    def claim_polls(
        self, worker: str, limit: int, lease_for: float, kinds: str | None
    ) -> ClaimResult:
        until = self.now + lease_for
        leases: list[Lease] = []
        for due in self.rows("due_polls", kinds=kinds, limit=max(0, limit)):
            record = _record(self.one("lease_poll", id=due["id"], worker=worker, until=until))
            leases.append(Lease(record, record.lease_token, until))
        return ClaimResult(tuple(leases), self.now, self.one("next_poll_at")["at"])

    # -- gates

    def gate_state(self, name: str) -> GateState:
        found = self.row("gate_state", name=name)
        return GateState() if found is None else _gate_state(found)

    def save_gate(self, name: str, state: GateState) -> None:
        self.run("save_gate", **_gate_params(name, state))

    def rated(self, gate: str) -> bool:
        return gating.resolve(gate, self.configs).rate is not None

    def start(self, lease: Lease, gates: Collection[str] | None) -> None:
        """Stamp the task's reserved starts (on `gates`, or every one) at the store's now."""
        self.held(lease)
        self.stamp_starts(lease.task_id, gates)

    def stamp_starts(self, task_id: int, gates: Collection[str] | None = None) -> None:
        for found in self.rows("unstarted_tickets", task_id=task_id):
            name = found["gate"]
            if gates is not None and name not in gates:
                continue
            config = gating.find(name, self.configs)
            self.save_gate(name, gating.start(config, self.gate_state(name), self.now))
            self.run("mark_started", task_id=task_id, gate=name)

    def release(self, task_id: int) -> None:
        self.stamp_starts(task_id)  # a start never stamped counts from the outcome
        for held in self.rows("ticket_counts", task_id=task_id):
            name = held["gate"]
            self.save_gate(name, gating.release(self.gate_state(name), held["n"]))
            self.wake = True  # a ticket back: a task its gate refused may go now
        self.run("delete_tickets", task_id=task_id)

    def penalize(self, names: Sequence[str]) -> None:
        for name in names:
            config = gating.resolve(name, self.configs)
            self.save_gate(name, gating.penalize(config, self.gate_state(name), self.now))

    # -- lease holders

    def renew(self, leases: Sequence[Lease], lease_for: float) -> list[Lease | None]:
        until = self.now + lease_for
        renewed: list[Lease | None] = []
        for lease in leases:
            found = self.row("renew_lease", id=lease.task_id, token=lease.token, until=until)
            renewed.append(None if found is None else Lease(_record(found), lease.token, until))
        return renewed

    def held(self, lease: Lease) -> TaskRecord:
        """The task `lease` still holds, checked in the transaction that writes its outcome."""
        found = self.row("task_by_id", id=lease.task_id)
        task = None if found is None else _record(found)
        if task is None or not _holds(task, lease.token, self.now):
            raise LeaseLost(lease.task_id)
        return task

    def finish(self, lease: Lease, outcome: Outcome) -> None:
        task = self.held(lease)
        if isinstance(outcome, PollAgain):
            self.poll_again(task, outcome)
        elif isinstance(outcome, Succeeded):
            self.succeed(task, outcome)
        elif isinstance(outcome, Retry):
            self.retry(task, outcome)
        elif isinstance(outcome, Dead):
            self.die(task, outcome)
        else:
            self.await_remote(task, outcome)

    def finish_many(self, outcomes: Sequence[tuple[Lease, Outcome]]) -> list[HeadraceError | None]:
        """Each outcome inside its own savepoint: one refused outcome leaves no trace and does
        not undo the others."""
        results: list[HeadraceError | None] = []
        for lease, outcome in outcomes:
            self.run("savepoint")
            try:
                self.finish(lease, outcome)
            except HeadraceError as error:
                self.run("rollback_to_savepoint")
                results.append(error)
            else:
                results.append(None)
            self.run("release_savepoint")
        return results

    def poll_again(self, task: TaskRecord, outcome: PollAgain) -> None:
        if task.state is not TaskState.WAITING:
            raise ConfigError("PollAgain: only a waiting task can be polled again")
        self.run("poll_again", id=task.id, run_at=self.now + outcome.delay, code=outcome.code)

    def succeed(self, task: TaskRecord, outcome: Succeeded) -> None:
        # Successors are checked like a submitted batch: a bad one fails the whole completion.
        self.check_batch(outcome.successors)
        planned = self.plan(outcome.successors)
        self.end_attempt(task, AttemptOutcome.SUCCEEDED, None)
        self.release(task.id)
        self.run("mark_succeeded", id=task.id)
        units = outcome.cost if outcome.cost is not None else task.cost
        self.run("add_to_ledger", grp=task.group or "", kind=task.kind, units=units)
        self.create(outcome.successors, planned)
        unblocked = self._execute("unblock_dependents", {"dep_id": task.id}).rowcount
        self.wake = self.wake or unblocked > 0

    def retry(self, task: TaskRecord, outcome: Retry) -> None:
        self.penalize(outcome.penalize)
        self.end_attempt(task, AttemptOutcome.RETRY, outcome.error)
        self.release(task.id)
        run_at = self.now + outcome.delay
        self.run("mark_retry", id=task.id, run_at=run_at, code=outcome.error.code)
        self.wake = True

    def die(self, task: TaskRecord, outcome: Dead) -> None:
        self.penalize(outcome.penalize)
        self.end_attempt(task, AttemptOutcome.DEAD, outcome.error)
        self.bury(task.id, outcome.error.code)

    def await_remote(self, task: TaskRecord, outcome: AwaitRemote) -> None:
        if task.state is TaskState.WAITING:
            raise ConfigError("AwaitRemote: the task is already waiting on a remote job")
        self.end_attempt(task, AttemptOutcome.WAITING, None)
        self.stamp_starts(task.id)  # the job was submitted: its start counts from now at latest
        deadline = self.now + outcome.timeout if outcome.timeout is not None else None
        self.run(
            "mark_waiting",
            id=task.id,
            remote_id=outcome.remote_id,
            poll_every=outcome.poll_every,
            deadline=deadline,
            run_at=self.now + outcome.poll_every,
        )

    def end_attempt(
        self, task: TaskRecord, outcome: AttemptOutcome, error: AttemptError | None
    ) -> None:
        self.run(
            "end_attempt",
            task_id=task.id,
            number=task.attempt,
            outcome=outcome.value,
            error_class=error.error_class.value if error else None,
            code=error.code if error else None,
            message=error.message if error else None,
        )

    def bury(self, task_id: int, code: str) -> None:
        self.end_task(task_id, TaskState.DEAD, code)
        for dependent in self.dependents(task_id):
            self.cancel_tree(dependent, UPSTREAM_FAILED)

    def end_task(self, task_id: int, state: TaskState, code: str) -> None:
        self.release(task_id)
        self.run("mark_ended", id=task_id, state=state.value, code=code)

    def dependents(self, task_id: int) -> list[int]:
        return [int(found["task_id"]) for found in self.rows("dependents", dep_id=task_id)]

    # -- dead letters

    def redrive(self, ids: str | None, group: str | None, kind: str | None) -> list[int]:
        redriven = []
        for found in self.rows("dead_letters", ids=ids, grp=group, kind=kind):
            if self.row("redrive_task", id=found["id"]) is not None:
                self.wake = True
                redriven.append(int(found["id"]))
                self.restore_dependents(int(found["id"]))
        return redriven

    def restore_dependents(self, task_id: int) -> None:
        for dependent in self.dependents(task_id):
            if self.one("failed_deps", id=dependent)["n"]:
                continue
            if self.row("restore_dependent", id=dependent) is not None:
                self.restore_dependents(dependent)

    # -- cancellation and reaping

    def cancel(self, task_id: int) -> bool:
        if self.task(task_id).state.terminal:
            return False
        self.cancel_tree(task_id, "cancelled")
        return True

    def cancel_tree(self, root: int, code: str) -> None:
        pending = [(root, code)]
        while pending:
            task_id, reason = pending.pop()
            task = self.task(task_id)
            if task.state.terminal:
                continue
            if task.state in (TaskState.RUNNING, TaskState.WAITING):
                self.end_attempt(task, AttemptOutcome.CANCELLED, None)
            self.end_task(task_id, TaskState.CANCELLED, reason)
            dependents = reversed(self.dependents(task_id))
            pending.extend((dependent, UPSTREAM_FAILED) for dependent in dependents)

    def reap(self) -> int:
        expired = sorted((_record(r) for r in self.rows("expired_leases")), key=lambda t: t.id)
        for task in expired:
            self.expire(task)
        return len(expired)

    def expire(self, task: TaskRecord) -> None:
        error = AttemptError.of(ErrorClass.TRANSIENT, LEASE_EXPIRED, "worker lost its lease")
        self.end_attempt(task, AttemptOutcome.LEASE_EXPIRED, error)
        beside = self.one(
            "crash_companions", worker=task.worker or "", task_id=task.id, number=task.attempt
        )["n"]
        found = poison.verdict(
            alone=not beside,
            expiries=task.expiries + 1,
            poison_expiries=self.settings.poison_expiries,
            attempts_used=task.attempts_used,
            max_attempts=task.max_attempts,
        )
        if found in (Expiry.POISON, Expiry.SPENT):
            self.run("count_expiry", id=task.id)
            self.bury(task.id, POISON if found is Expiry.POISON else LEASE_EXPIRED)
            return
        self.release(task.id)
        self.run("requeue_expired", id=task.id, code=LEASE_EXPIRED, solo=found is Expiry.SOLO)
        self.wake = True

    # -- reading

    def task(self, task_id: int) -> TaskRecord:
        found = self.row("task_by_id", id=task_id)
        if found is None:
            raise UnknownTask(task_id)
        return _record(found)

    def find(self, key: str) -> TaskRecord | None:
        found = self.known_key(key)
        return None if found is None else self.task(found.task_id)

    def tasks(
        self, group: str | None, state: TaskState | None, kind: str | None, limit: int
    ) -> list[TaskRecord]:
        value = state.value if state is not None else None
        found = self.rows("list_tasks", grp=group, state=value, kind=kind, limit=limit)
        return [_record(row) for row in found]

    def attempts(self, task_id: int) -> list[Attempt]:
        self.task(task_id)
        return [_attempt(found) for found in self.rows("task_attempts", task_id=task_id)]

    def counts(self, kinds: str | None) -> dict[TaskState, int]:
        return _by_state(self.rows("count_by_state", kinds=kinds))

    def stages(self, kinds: str | None) -> list[StageStats]:
        return [_stage(found, self.now) for found in self.rows("stage_stats", kinds=kinds)]

    def groups(self) -> list[str]:
        return sorted(str(found["grp"]) for found in self.rows("group_names"))

    def group_report(self, group: str) -> GroupReport:
        by_state = _by_state(self.rows("group_counts", grp=group))
        cost = {str(r["kind"]): float(r["units"]) for r in self.rows("group_ledger", grp=group)}
        failures = tuple(
            Failure(r["id"], r["kind"], r["ref"], r["error_code"], r["attempt"])
            for r in self.rows("group_failures", grp=group)
        )
        total = sum(by_state.values())
        return GroupReport(group, total, by_state, dict(sorted(cost.items())), failures)

    def gate_statistics(self) -> list[GateStatistics]:
        stats: list[GateStatistics] = []
        for found in self.rows("all_gates"):
            try:
                config = gating.resolve(found["name"], self.configs)
            except UnknownGate:
                continue  # declared by another process sharing the file, not by this one
            stats.append(gating.statistics(config, _gate_state(found), self.now))
        return sorted(stats, key=lambda s: s.name)


def _holds(task: TaskRecord, token: int, now: float) -> bool:
    return (
        task.state in (TaskState.RUNNING, TaskState.WAITING)
        and task.lease_token == token
        and task.lease_until is not None
        and task.lease_until > now
    )


def _kinds_json(kinds: Collection[str] | None) -> str | None:
    return None if kinds is None else json.dumps(sorted(kinds))


def _by_state(rows: Iterable[sqlite3.Row]) -> dict[TaskState, int]:
    counts = dict.fromkeys(TaskState, 0)
    for found in rows:
        counts[TaskState(found["state"])] = int(found["n"])
    return counts


def _task_params(task: NewTask, tag: float, unmet: Sequence[int], now: float) -> dict[str, object]:
    return {
        "kind": task.kind,
        "ref": task.ref,
        "gates": " ".join(task.gates),
        "gate_key": gate_key(task.gates),
        "flow": task.flow,
        "grp": task.group,
        "tier": int(task.tier),
        "cost": task.cost,
        "key": task.key,
        "state": (TaskState.PENDING if unmet else TaskState.READY).value,
        "max_attempts": task.max_attempts,
        "tag": tag,
        "run_at": now + task.delay,
        "ready_since": None if unmet else now,
        "unmet": len(unmet),
    }


def _stage(row: sqlite3.Row, now: float) -> StageStats:
    oldest = row["oldest_ready"]
    return StageStats(
        row["kind"],
        pending=row["pending"],
        ready=row["ready"],
        running=row["running"],
        waiting=row["waiting"],
        oldest_ready_age=None if oldest is None else now - oldest,
    )


def _record(row: sqlite3.Row) -> TaskRecord:
    return TaskRecord(
        id=row["id"],
        kind=row["kind"],
        ref=row["ref"],
        gates=tuple(row["gates"].split()),
        flow=row["flow"],
        group=row["grp"],
        tier=Tier(row["tier"]),
        submitted_tier=Tier(row["submitted_tier"]),
        cost=row["cost"],
        key=row["key"],
        state=TaskState(row["state"]),
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        tag=row["tag"],
        created_at=row["created_at"],
        run_at=row["run_at"],
        ready_since=row["ready_since"],
        promoted_at=row["promoted_at"],
        finished_at=row["finished_at"],
        worker=row["worker"],
        lease_until=row["lease_until"],
        lease_token=row["lease_token"],
        remote_id=row["remote_id"],
        poll_every=row["poll_every"],
        remote_deadline=row["remote_deadline"],
        error_code=row["error_code"],
        expiries=row["expiries"],
        attempt_base=row["attempt_base"],
        solo=bool(row["solo"]),
        remote_jobs=row["remote_jobs"],
    )


def _attempt(row: sqlite3.Row) -> Attempt:
    error_class = row["error_class"]
    return Attempt(
        task_id=row["task_id"],
        number=row["number"],
        worker=row["worker"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        outcome=AttemptOutcome(row["outcome"]),
        error_class=ErrorClass(error_class) if error_class is not None else None,
        code=row["code"],
        message=row["message"],
    )


def _gate_state(row: sqlite3.Row) -> GateState:
    penalized_until = row["penalized_until"]
    return GateState(
        in_flight=row["in_flight"],
        starts=tuple(float(start) for start in json.loads(row["starts"])),
        penalized_until=-math.inf if penalized_until is None else penalized_until,
        granted=row["granted"],
        blocked_by_token=row["blocked_by_token"],
        blocked_by_concurrency=row["blocked_by_concurrency"],
        rate_limited=row["rate_limited"],
        peak_in_flight=row["peak_in_flight"],
        first_blocked_at=row["first_blocked_at"],
        unstarted=row["unstarted"],
    )


def _gate_params(name: str, state: GateState) -> dict[str, object]:
    penalized = state.penalized_until
    return {
        "name": name,
        "in_flight": state.in_flight,
        "starts": json.dumps(list(state.starts)),
        "penalized_until": None if penalized == -math.inf else penalized,
        "granted": state.granted,
        "blocked_by_token": state.blocked_by_token,
        "blocked_by_concurrency": state.blocked_by_concurrency,
        "rate_limited": state.rate_limited,
        "peak_in_flight": state.peak_in_flight,
        "first_blocked_at": state.first_blocked_at,
        "unstarted": state.unstarted,
    }


__all__ = ["SQLiteStore", "connect", "migrate", "path_from_url"]
