"""The machine's ground: the `Driver` a backend provides, the statements a transaction runs
through it, its clock, and the gate rows it holds (`GateRows`)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from headrace.policy import gate as gating
from headrace.policy.clock import Clock
from headrace.policy.errors import (
    StoreError,
    UnknownTask,
)
from headrace.policy.gate import GateConfig, GateState
from headrace.store.machine import bounds as stage_bounds
from headrace.store.machine.rows import (
    Row,
    gate_params,
    gate_state_of,
    task_of,
)
from headrace.store.protocol.records import Record
from headrace.store.protocol.types import (
    Settings,
    TaskRecord,
)

# Candidates read per statement while a claim walks the ready queue in (tier, tag, id) order.
CLAIM_BATCH = 256
# Widens the aging range past any float rounding of `now - step`; aged_tier decides.
AGING_SLACK = 1e-3
# Seconds of store time a store's claims go without reaping expired leases and aging low tasks
# after one that did: an expiry or an aging step is seen this much later at most, and a busy
# worker's claims skip two statements.
SWEEP_EVERY = 0.1
# Seconds of store time between a store's folds of the tallies (`fold_tallies`, with a sweep):
# on PostgreSQL the changes its triggers appended move into the tallies, so a read sums at most
# what changed in about that time; on SQLite the tallies that count nothing go.
FOLD_EVERY = 10.0
# Held from numbering a transaction's records to its commit, so that seqs commit in the order
# they are taken: a reader that sees a record's seq has seen every smaller one that will ever be
# (a list past a cursor never gains an item before it). Taken as the transaction's last step
# (`number_records`), after every other lock, so a writer holds it for its commit alone, never
# while it waits on its client (a cut link, a stalled process would hold up every writer of
# records). SQLite's single writer gives the order without a lock.
SEQ_LOCK = "headrace.records.seq"


class Pending(Protocol):
    """A statement sent: its rows, read when wanted."""

    async def fetchall(self) -> list[Any]: ...

    async def fetchone(self) -> Any | None: ...

    async def table(self) -> tuple[Sequence[str], Sequence[Sequence[Any]]]:
        """Its column names and its rows as tuples, for reading by position (`rows.tasks_of`,
        `rows.candidates_of`): no dict made for each row."""
        ...


class Driver(Protocol):
    """A database connection inside one transaction, speaking its dialect's named statements.
    Lists are passed as the database keeps them (an array, or a JSON array); a `Json` value as
    a JSON document."""

    name: str

    async def send(self, query: str, params: Mapping[str, object]) -> Pending: ...

    async def run_many(self, query: str, params: Sequence[Mapping[str, object]]) -> None: ...

    def savepoint(self) -> AbstractAsyncContextManager[object]:
        """A nested transaction: left by an exception, it undoes its writes."""
        ...


@dataclass
class Sweeps:
    """When a store's claims last reaped expired leases and aged low tasks (`Transaction.sweep`),
    and last folded the tallies, by the store's clock."""

    at: float = -math.inf
    folded: float = -math.inf

    def due(self, now: float) -> bool:
        """Whether a claim at `now` sweeps first: SWEEP_EVERY has passed, or the clock went back."""
        return not self.at <= now < self.at + SWEEP_EVERY

    def fold_due(self, now: float) -> bool:
        """Whether a sweep at `now` folds the tallies too: FOLD_EVERY has passed, or the clock
        went back."""
        return not self.folded <= now < self.folded + FOLD_EVERY

    def swept(self, at: float, *, folded: bool) -> None:
        self.at = at
        if folded:
            self.folded = at


@dataclass(frozen=True)
class Json:
    """A parameter sent as one JSON document (a batch's rows: one parameter whatever its size)."""

    value: object


@dataclass(frozen=True)
class GateSnapshot:
    states: dict[str, GateState]
    changed: set[str]
    busy: set[str]


class GateRows:
    """The gate rows one transaction holds, with their states. Rows are locked in name order,
    waiting for other writers; a claim that finds a gate out of that order takes it only if it
    is free (`busy` names the others), so two claims never wait on each other."""

    def __init__(self, tx: Transaction) -> None:
        self._tx = tx
        self.states: dict[str, GateState] = {}
        self.changed: set[str] = set()
        self.busy: set[str] = set()

    async def lock(
        self, names: Iterable[str], *, or_skip: bool = False, clock: bool = False
    ) -> None:
        """Lock and load the gates among `names` not held yet. With `clock`, read the clock
        again once the locks that may have waited are held (in the same round trip)."""
        wanted = sorted(set(names) - self.states.keys() - self.busy)
        top = max(self.states, default="")
        waiting = [name for name in wanted if not or_skip or name > top]
        if waiting:
            await self._take("lock_gates", waiting, clock=clock)
        free_only = [name for name in wanted if name not in self.states]
        if free_only:
            await self._take("try_lock_gates", free_only, clock=False)
            self.busy.update(name for name in free_only if name not in self.states)

    async def _take(self, query: str, names: Sequence[str], *, clock: bool) -> None:
        await self._load(query, names, clock=clock)
        missing = [name for name in names if name not in self.states]
        if missing:  # first use: create the rows, then lock them
            await self._tx.add_gates(missing)
            await self._load(query, missing, clock=clock)

    async def _load(self, query: str, names: Sequence[str], *, clock: bool) -> None:
        locked = await self._tx.send(query, names=list(names))
        time = await self._tx.send_clock() if clock else None
        for found in await locked.fetchall():
            self.states[found["name"]] = gate_state_of(found)
        if clock:
            await self._tx.read_clock(time)

    def take(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Gate rows this transaction has just locked."""
        for found in rows:
            self.states[found["name"]] = gate_state_of(found)

    async def make(self, names: Sequence[str]) -> bool:
        """Rows for gates used for the first time (another writer may be making them too);
        whether any was missing."""
        found = await self._tx.rows("missing_gates", names=list(names))
        missing = [row["name"] for row in found]
        if missing:
            await self._tx.add_gates(missing)
        return bool(missing)

    def get(self, name: str) -> GateState:
        return self.states[name]

    def put(self, name: str, state: GateState) -> None:
        self.states[name] = state
        self.changed.add(name)

    def snapshot(self) -> GateSnapshot:
        return GateSnapshot(dict(self.states), set(self.changed), set(self.busy))

    def restore(self, snapshot: GateSnapshot) -> None:
        """Back to `snapshot`, after a savepoint rollback (which also released newer locks)."""
        self.states = dict(snapshot.states)
        self.changed = set(snapshot.changed)
        self.busy = set(snapshot.busy)

    async def flush(self) -> None:
        if self.changed:
            params = [gate_params(name, self.states[name]) for name in sorted(self.changed)]
            await self._tx.run_many("save_gate", params)
            self.changed.clear()


class Transaction:
    """One verb's transaction: its driver, its clock and what it holds until it ends, handed to
    the steps of each family of verbs (tickets.py, submit.py, outcomes.py, claim.py, records.py,
    pruning.py, reads.py)."""

    def __init__(
        self,
        driver: Driver,
        configs: Mapping[str, GateConfig],
        settings: Settings,
        clock: Clock | None,
    ) -> None:
        self.driver = driver
        self.configs = configs
        self.settings = settings
        self.limits = stage_bounds.by_kind(settings.stages)  # the stages' limits, by name
        self.clock = clock
        self.now = -math.inf
        self.gates = GateRows(self)
        self.wake = False  # notify listeners when this transaction commits
        # What several steps of one transaction share (a verb's own working state stays in
        # its module: a claim's `Taking`, a batch of outcomes' `Held`). The store-wide
        # counters, read once (`load_counters`) by submissions and claims, and sent early:
        self.counters: Pending | None = None
        self.virtual_time: float | None = None
        self.dispatches: int | None = None
        self.finishes: dict[str, float] = {}  # flows' finish tags after tagging new tasks
        self.tickets: dict[int, list[Row]] = {}  # ticket counts read, by task
        # Written at the end (`conclude`): the ledger's units, by (group, kind, worker), and
        # the records made or moved, by key, to be numbered again.
        self.ledger: dict[tuple[str, str, str], float] = {}
        self.numbered: dict[tuple[str, str], list[Record]] = {}

    # -- statements

    # Each runs the named query; `query` is positional-only so a parameter may be called `name`.

    async def send(self, query: str, /, **params: object) -> Pending:
        """Send a statement and read its rows later: statements sent before a read share its
        round trip (pipeline mode)."""
        return await self.driver.send(query, {"now": self.now, **params})

    async def rows(self, query: str, /, **params: object) -> list[Row]:
        return await (await self.send(query, **params)).fetchall()

    async def row(self, query: str, /, **params: object) -> Row | None:
        found = await self.rows(query, **params)
        return found[0] if found else None

    async def one(self, query: str, /, **params: object) -> Row:
        found = await self.row(query, **params)
        if found is None:
            raise StoreError(f"{self.driver.name} store: {query} found no row")
        return found

    async def run(self, query: str, /, **params: object) -> None:
        await self.send(query, **params)

    async def add_gates(self, names: list[str]) -> None:
        """Rows for gates used for the first time, each with the declaration it comes from (so
        a process that does not declare it reports it under that name)."""
        specs = [gating.declared_as(name, self.configs) for name in names]
        await self.run("add_gates", names=names, specs=specs)

    async def run_many(self, query: str, rows: Iterable[Mapping[str, object]]) -> None:
        await self.driver.run_many(query, [{"now": self.now, **row} for row in rows])

    async def send_clock(self) -> Pending | None:
        """Ask the server for its time (None when a clock was given): sent after a lock, it
        answers once the lock is held."""
        return None if self.clock is not None else await self.send("server_now")

    async def read_clock(self, sent: Pending | None = None) -> None:
        """The store's time: the server's clock (the answer to `sent`, or asked now) unless a
        clock was given. It never goes back within a transaction."""
        found = None
        if self.clock is None:
            found = await (sent or await self.send("server_now")).fetchone()
        self.clock_read(None if found is None else found["now"])

    def clock_read(self, server: float | None) -> None:
        """The store's time, given the server's clock as a statement read it (`server`, None
        when it did not): the clock given, if any. It never goes back within a transaction."""
        if self.clock is not None:
            now = self.clock.now()
        else:
            now = -math.inf if server is None else float(server)
        self.now = max(self.now, now)

    async def current_time(self) -> float:
        return self.now

    async def clock_sample(self) -> tuple[float, float]:
        """The server's time and this host's monotonic time at the middle of the round trip
        that asked for it."""
        sent = time.monotonic()
        await self.read_clock()
        return self.now, (sent + time.monotonic()) / 2

    async def conclude(self) -> None:
        """Write what the transaction kept until its end: gate states, the ledger, then the
        seqs of the records it made or moved."""
        await self.gates.flush()
        if self.ledger:  # last, in key order
            charged = sorted(self.ledger.items())
            params = [{"grp": g, "kind": k, "worker": w, "units": n} for (g, k, w), n in charged]
            await self.run_many("add_to_ledger", params)
        await self.number_records()

    async def number_records(self) -> None:
        """Give the records made or moved their seqs under SEQ_LOCK, as the transaction ends
        (the seqs they were written with hold their place until then), and set them on the
        records this transaction returns."""
        if not self.numbered:
            return
        await self.run("advisory_lock", lock=SEQ_LOCK)
        keys = sorted(self.numbered)
        found = await self.rows(
            "number_records", kinds=[kind for kind, _ in keys], ids=[i for _, i in keys]
        )
        for row in found:
            for record in self.numbered[(row["kind"], row["id"])]:
                object.__setattr__(record, "seq", int(row["seq"]))  # not yet handed out

    # -- what every verb may read

    async def task(self, task_id: int) -> TaskRecord:
        found = await self.row("task_by_id", id=task_id)
        if found is None:
            raise UnknownTask(task_id)
        return task_of(found)

    async def load_counters(self) -> None:
        if self.dispatches is None:
            sent = self.counters or await self.send("meta_values")
            found = {row["name"]: row["value"] for row in await sent.fetchall()}
            self.dispatches = int(found["dispatches"])
            self.virtual_time = float(found["virtual_time"])
