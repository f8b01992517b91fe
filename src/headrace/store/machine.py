"""The store's state machine, written once: every verb's transaction (submit, claim, the
outcomes, start stamps, renewals, cancel, redrive, reaping, the reads) as steps over named
statements. A backend is a `Driver`: it runs a named statement of its own dialect and hands back
its rows; the memory store is the model the conformance suite holds this to.

Writers lock rows in one order: tasks (by id), then gates (by name), then flows (by name), then
the store-wide counters, and the cost ledger (a row per group, kind and worker) last. An outcome
(or a batch of them) locks all it will touch before it writes anything. Where a claim discovers
a gate out of that order it takes the row only if it is free. On a database with row locks
(PostgreSQL) the `lock_*` statements take them; on one that serialises writers (SQLite) they
only read.

Time: with no clock given, every lease, run_at and gate time is the server's clock read in the
transaction (again after waiting for gate rows), so hosts with skewed clocks agree; with a
clock (a test's, or SQLite's) its value is used in the same statements.

Statements whose rows are not read are sent without waiting (`run`); a driver in pipeline mode
sends them with the next statement whose rows are read.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncGenerator, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from headrace.policy import fairness, ledger, poison
from headrace.policy import gate as gating
from headrace.policy.clock import Clock
from headrace.policy.errors import (
    ConfigError,
    ErrorClass,
    HeadraceError,
    LeaseLost,
    QueueFull,
    StoreError,
    UnknownGate,
    UnknownTask,
)
from headrace.policy.gate import GateConfig, GateState, GateStatistics
from headrace.policy.poison import Expiry
from headrace.policy.tiers import AGING_CEILING, Tier, aged_tier
from headrace.store import idempotency
from headrace.store.dispatch import GateBook, earliest, fits_claim, gate_key
from headrace.store.rows import (
    Candidate,
    Row,
    attempt_of,
    candidate_of,
    counts_by_state,
    gate_params,
    gate_state_of,
    holds,
    stage_of,
    task_of,
)
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

# Candidates read per statement while a claim walks the ready queue in (tier, tag, id) order.
CLAIM_BATCH = 256
# Widens the aging range past any float rounding of `now - step`; aged_tier decides.
AGING_SLACK = 1e-3
# Seconds of store time a store's claims go without reaping expired leases and aging low tasks
# after one that did: an expiry or an aging step is seen this much later at most, and a busy
# worker's claims skip two statements.
SWEEP_EVERY = 0.1


class Pending(Protocol):
    """A statement sent: its rows, read when wanted."""

    async def fetchall(self) -> list[Any]: ...

    async def fetchone(self) -> Any | None: ...


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
    by the store's clock."""

    at: float = -math.inf

    def due(self, now: float) -> bool:
        """Whether a claim at `now` sweeps first: SWEEP_EVERY has passed, or the clock went back."""
        return not self.at <= now < self.at + SWEEP_EVERY


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
            await self._tx.run("add_gates", names=missing)
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
            await self._tx.run("add_gates", names=missing)
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


@dataclass(frozen=True)
class Claimed:
    """A claim's outcome, its leases read once the transaction committed (`leased`: the rows
    `lease_tasks` returned, received with the commit)."""

    leased: Pending | None
    ids: list[int]
    until: float
    now: float
    wake_at: float | None

    async def result(self) -> ClaimResult:
        if self.leased is None:
            return ClaimResult((), self.now, self.wake_at)
        rows = await self.leased.fetchall()  # no round trip: the commit's sync brought them
        held = {record.id: record for record in map(task_of, rows)}
        leases = (Lease(held[i], held[i].lease_token, self.until) for i in self.ids)
        return ClaimResult(tuple(leases), self.now, self.wake_at)


@dataclass
class Planned:
    """A task of a submitted batch that will be created."""

    id: int
    task: NewTask
    unmet: list[int]
    failed: bool  # a dependency is already dead or cancelled
    payload_digest: str | None  # kept with a keyed task (store/idempotency.py)
    tag: float = 0.0


class Transaction:
    """One verb's transaction: the statements it runs and the state machine's steps, as in
    `MemoryStore` and `SQLiteStore` (the conformance suite holds the three to one semantics)."""

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
        self._clock = clock
        self.now = -math.inf
        self.gates = GateRows(self)
        self.wake = False  # notify listeners when this transaction commits
        self._virtual_time: float | None = None
        self._dispatches: int | None = None
        self._served: dict[str, int] = {}
        self._last_tags: dict[str, float] = {}  # the tag of each flow's last task dispatched now
        self._served_now: set[str] = set()
        self._tickets: dict[int, list[Row]] = {}  # ticket counts read, by task
        self._held: dict[int, TaskRecord] = {}  # tasks locked for outcomes, not yet written
        self._dependents = False  # `prepare` locked tasks waiting on those outcomes
        self._ledger: dict[tuple[str, str, str], float] = {}  # units, by (group, kind, worker)
        self._counters: Pending | None = None  # meta_values, sent early
        self._finishes: dict[str, float] = {}  # flows' finish tags after tagging new tasks
        self._gates_before_claim = 0  # gates held or met busy when the claim began (outcomes')

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

    async def run_many(self, query: str, rows: Iterable[Mapping[str, object]]) -> None:
        await self.driver.run_many(query, [{"now": self.now, **row} for row in rows])

    async def send_clock(self) -> Pending | None:
        """Ask the server for its time (None when a clock was given): sent after a lock, it
        answers once the lock is held."""
        return None if self._clock is not None else await self.send("server_now")

    async def read_clock(self, sent: Pending | None = None) -> None:
        """The store's time: the server's clock (the answer to `sent`, or asked now) unless a
        clock was given. It never goes back within a transaction."""
        if self._clock is not None:
            now = self._clock.now()
        else:
            found = await (sent or await self.send("server_now")).fetchone()
            now = float(found["now"]) if found is not None else -math.inf
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
        """Write what the transaction kept until its end: gate states, then the ledger."""
        await self.gates.flush()
        if self._ledger:  # last, in key order
            charged = sorted(self._ledger.items())
            params = [{"grp": g, "kind": k, "worker": w, "units": n} for (g, k, w), n in charged]
            await self.run_many("add_to_ledger", params)

    # -- submission

    async def submit(self, tasks: Sequence[NewTask], bounds: Mapping[str, int]) -> list[Submitted]:
        if not tasks or any(task.kind in bounds for task in tasks):
            await self.read_clock()
            states = await self.check_batch(tasks)
            planned = idempotency.plan(tasks, await self.known_keys(tasks))
            await self.check_bounds(tasks, planned, bounds)
            return await self.create(tasks, states, planned)
        return await self.submit_unbounded(tasks)

    async def submit_unbounded(self, tasks: Sequence[NewTask]) -> list[Submitted]:
        """A batch no bound counts, in one round trip before the insert: the tasks it depends on
        held (FOR SHARE), its keys looked up, then its flows made and locked, ids drawn (one per
        task, a few maybe unused), the virtual time read and the clock (once the flows are
        locked), in one statement.
        """
        named = self.named_dependencies(tasks)
        shared = await self.send("share_tasks", ids=sorted(set(named))) if named else None
        keys = sorted({task.key for task in tasks if task.key is not None})
        keyed = await self.send("task_ids_by_keys", keys=keys) if keys else None
        clock = None if self._clock is None else self._clock.now()
        flows = sorted({task.flow for task in tasks})
        start = await self.send("submit_start", flows=flows, n=len(tasks), clock=clock)
        rows = await shared.fetchall() if shared is not None else []
        states = {int(row["id"]): TaskState(row["state"]) for row in rows}
        for dep in named:
            if dep not in states:
                raise UnknownTask(dep)
        planned = idempotency.plan(
            tasks, _known(await keyed.fetchall() if keyed is not None else [])
        )
        found = await start.fetchone()
        if found is None:
            raise StoreError(f"{self.driver.name} store: submit_start returned no row")
        self.now = max(self.now, float(found["now"]))
        self._virtual_time = float(found["virtual_time"])
        finish = dict(zip(found["flows"], map(float, found["finish_tags"]), strict=True))
        ids = [int(drawn) for drawn in found["ids"]]
        return await self.create(tasks, states, planned, ids=ids, finish=finish)

    async def check_batch(self, tasks: Sequence[NewTask]) -> dict[int, TaskState]:
        """Refuse a batch naming an unknown gate or task; hold the tasks it depends on still
        (FOR SHARE) and return their states."""
        named = self.named_dependencies(tasks)
        states = await self.dependency_states(named)
        for dep in named:
            if dep not in states:
                raise UnknownTask(dep)
        return states

    def named_dependencies(self, tasks: Sequence[NewTask]) -> list[int]:
        """The task ids a batch depends on; an unknown gate or a later sibling is refused."""
        check_gates(tasks, self.configs)
        named: list[int] = []
        for index, task in enumerate(tasks):
            for dep in task.after:
                if not isinstance(dep, Sibling):
                    named.append(dep)
                elif not 0 <= dep.index < index:
                    raise ConfigError(f"task.after: sibling {dep.index} is not earlier")
        return named

    async def dependency_states(self, ids: Iterable[int]) -> dict[int, TaskState]:
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        found = await self.rows("share_tasks", ids=wanted)
        return {int(row["id"]): TaskState(row["state"]) for row in found}

    async def known_keys(self, tasks: Sequence[NewTask]) -> dict[str, idempotency.KnownKey]:
        """The tasks the batch's keys name already, with their payload digests."""
        keys = sorted({task.key for task in tasks if task.key is not None})
        if not keys:
            return {}
        return _known(await self.rows("task_ids_by_keys", keys=keys))

    async def check_bounds(
        self,
        tasks: Sequence[NewTask],
        planned: Sequence[idempotency.Planned],
        bounds: Mapping[str, int],
    ) -> None:
        for kind in sorted(bounds):
            new = idempotency.created_of_kind(tasks, planned, kind)
            if not new:
                continue
            # One submitter at a time counts a bounded kind, so two cannot both squeeze in.
            await self.run("advisory_lock", lock=f"headrace.bound:{kind}")
            queued = int((await self.one("count_queued", kind=kind))["n"])
            if queued + new > bounds[kind]:
                raise QueueFull(kind, bounds[kind])

    async def create(
        self,
        tasks: Sequence[NewTask],
        states: dict[int, TaskState],
        planned: Sequence[idempotency.Planned],
        *,
        ids: Sequence[int] | None = None,
        finish: dict[str, float] | None = None,
    ) -> list[Submitted]:
        """Create the batch's new tasks (`planned` None; the others name a task already) in one
        statement. `ids` drawn already (at least one per new task); `finish`: the flows locked
        already."""
        if not tasks:
            return []
        fresh = {index for index, step in enumerate(planned) if step is None}
        if ids is None:
            ids = [int(row["id"]) for row in await self.rows("next_task_ids", n=len(fresh))]
        fresh_ids = iter(ids)
        results: list[Submitted] = []
        for step in planned:
            if step is None:
                results.append(Submitted(next(fresh_ids), created=True))
            else:
                results.append(idempotency.reused(step, results))
        if fresh:
            await self.insert(tasks, results, states, fresh, finish)
        return results

    async def insert(
        self,
        tasks: Sequence[NewTask],
        results: Sequence[Submitted],
        states: dict[int, TaskState],
        fresh: Collection[int],
        finish: dict[str, float] | None = None,
    ) -> None:
        created = {results[index].id for index in fresh}
        afters = [_resolved(task, results) for task in tasks]
        others = {dep for after in afters for dep in after} - created - states.keys()
        states.update(await self.dependency_states(others))
        planned = [_plan(results[i].id, tasks[i], afters[i], states) for i in sorted(fresh)]
        await self.tag(planned, finish)
        # Not read before the commit: a key another writer took since `known_keys` fails the
        # transaction, and the next try finds that writer's task.
        await self.run(
            "insert_tasks",
            tasks=_insert_params(planned, self.now),
            flow_names=list(self._finishes),
            flow_finishes=list(self._finishes.values()),
        )
        deps = [(dep, p.id) for p in planned for dep in p.unmet]
        if deps:
            dep_ids, task_ids = zip(*deps, strict=True)
            await self.run("insert_dependencies", dep_ids=list(dep_ids), task_ids=list(task_ids))
        for failed in (p for p in planned if p.failed):
            await self.cancel_tree(failed.id, UPSTREAM_FAILED)
        self.wake = self.wake or any(not p.unmet for p in planned)

    async def tag(self, planned: Sequence[Planned], locked: dict[str, float] | None) -> None:
        """Start tags for new tasks, in batch order; their flows' rows are locked in name order
        (`locked`: already, with their finish tags)."""
        flows = sorted({p.task.flow for p in planned})
        if locked is None:
            await self.run("add_flows", flows=flows)
            found = await self.send("lock_flows", flows=flows)  # held already after `prepare`
            if self._virtual_time is None:
                self._counters = await self.send("meta_values")
            locked = {row["flow"]: float(row["finish_tag"]) for row in await found.fetchall()}
        finish = {flow: locked[flow] for flow in flows}
        virtual_time = await self.virtual_time()
        for p in planned:
            tagged = fairness.tag(virtual_time, finish[p.task.flow], p.task.weight)
            finish[p.task.flow] = tagged.flow_finish
            p.tag = tagged.start
        self._finishes = {flow: finish[flow] for flow in flows}  # written with the insert

    async def virtual_time(self) -> float:
        if self._virtual_time is None:
            await self.load_counters()
        return self._virtual_time or 0.0

    # -- claiming

    async def claim(
        self,
        worker: str,
        limit: int,
        lease_for: float,
        kinds: list[str] | None,
        *,
        alone: bool = True,
        durable: bool = True,
    ) -> Claimed:
        """The claim's time, counters and next run_at (`claim_start`) come back with the first
        batch's gates, in one round trip. Each batch's gates are locked before its tasks, so a
        task is only ever held by a claim that holds its gates: two claims never hand a gate's
        tickets out of (tier, tag) order. Not `durable`: the commit does not wait for the WAL
        flush."""
        clock = None if self._clock is None else self._clock.now()
        commit = "on" if durable else "off"
        self._gates_before_claim = len(self.gates.states) + len(self.gates.busy)
        start: Pending | None = await self.send("claim_start", clock=clock, commit=commit)
        next_at: float | None = None
        chosen: list[Candidate] = []
        excluded: set[str] = set()
        book: GateBook | None = None
        async with contextlib.aclosing(self.rounds(kinds, excluded, limit)) as rounds:
            async for candidates in rounds:
                if start is not None:
                    next_at, start = await self.read_claim_start(start), None
                book = book or GateBook(self.configs, self.gates.get, self.now)
                if self.admit(book, candidates, chosen, excluded, limit, alone):
                    break
        if start is not None:  # no candidate at all
            next_at = await self.read_claim_start(start)
        book = book or GateBook(self.configs, self.gates.get, self.now)
        for name in book.changed:
            self.gates.put(name, book.states[name])
        wake_at = earliest(book.wake_at(), next_at)
        return await self.lease(chosen, worker, lease_for, wake_at)

    async def sweep(self) -> float:
        """Reap expired leases and age low tasks; return the store time it ran at."""
        await self.read_clock()
        aging = await self.send_aging()
        if await self.reap():
            aging = await self.send_aging()  # tasks made ready again may age as well
        await self.age(aging)
        return self.now

    async def read_claim_start(self, sent: Pending) -> float | None:
        """The time `claim_start` fixed for the claim's statements and the counters it read;
        return the earliest future run_at of a ready task (reaping and leasing cannot change
        it)."""
        found = await sent.fetchone()
        if found is None:
            raise StoreError(f"{self.driver.name} store: claim_start returned no row")
        self.now = max(self.now, float(found["now"]))
        self._dispatches = int(found["dispatches"])
        self._virtual_time = float(found["virtual_time"])
        return None if found["next_at"] is None else float(found["next_at"])

    async def rounds(
        self, kinds: list[str] | None, excluded: set[str], limit: int
    ) -> AsyncGenerator[list[Candidate], None]:
        """Ready tasks due now in (tier, tag, id) order, a batch at a time (the first just big
        enough for `limit`, then growing): in one statement, each batch's gates are locked
        first, then its tasks whose gates this claim holds. Handed out whole rounds at a time:
        a run of equal (tier, tag) is never split, so `take_turns` sees each round entire. Gate
        keys in `excluded` (refused so far) are left out of later batches."""
        after: tuple[int, float, int] = (-1, 0.0, 0)
        size = min(CLAIM_BATCH, 2 * limit + 8)
        held: list[Candidate] = []
        while True:
            batch = {"tier": after[0], "tag": after[1], "id": after[2], "kinds": kinds}
            peeked, last, tasks = await self.claim_batch(batch, sorted(excluded), size)
            if peeked < size:
                if held or tasks:
                    yield held + tasks
                return
            assert last is not None
            after = last
            size = min(CLAIM_BATCH, size * 4)
            if not (held or tasks):  # every task of the batch held by others, or refused
                continue
            whole, held = _split_last_round([*held, *tasks])
            if whole:
                yield whole

    async def claim_batch(
        self, batch: Mapping[str, object], refused: list[str], size: int
    ) -> tuple[int, tuple[int, float, int] | None, list[Candidate]]:
        """The next batch of up to `size` candidates: its gates locked (the first time, the
        clock read once they are held), then those of its tasks whose gates are all held.
        Returns how many tasks the batch had, the last one's (tier, tag, id) and the tasks
        taken. A gate used for the first time has no row to lock yet: it is made, and the
        batch read again."""
        for _ in range(2):
            # Until the claim holds (or met busy) a gate of its own, the clock is read again
            # once the batch's gates are held: it may have waited for them. Gates that outcomes
            # in the same transaction hold do not count.
            first = len(self.gates.states) + len(self.gates.busy) == self._gates_before_claim
            sent = await self.send(
                "claim_batch",
                **batch,
                refused=refused,
                batch=size,
                held=sorted(self.gates.states),
                top=max(self.gates.states, default=""),
            )
            time = await self.send_clock() if first else None
            rows = await sent.fetchall()
            if first:
                await self.read_clock(time)
            edge = rows[0]
            self.gates.take(edge["gate_rows"])
            others = [name for name in edge["wanted"] if name not in self.gates.states]
            if not others or not await self.gates.make(others):
                self.gates.busy.update(others)  # another claim holds them: its tasks are its
                break
        for row in rows:  # when each flow was last served, read with the candidates
            if row["id"] is not None:
                self._served.setdefault(row["flow"], int(row["flow_served"]))
        tasks = [candidate_of(row) for row in rows if row["id"] is not None]
        if edge["last_id"] is None:
            return 0, None, tasks
        last = (int(edge["last_tier"]), float(edge["last_tag"]), int(edge["last_id"]))
        return int(edge["peeked"]), last, tasks

    def admit(
        self,
        book: GateBook,
        candidates: Sequence[Candidate],
        chosen: list[Candidate],
        excluded: set[str],
        limit: int,
        alone: bool,
    ) -> bool:
        """Choose among `candidates` in turn; True once the claim is complete."""
        ordered = fairness.take_turns(
            candidates,
            rank=lambda task: (task.tier, task.tag),
            flow=lambda task: task.flow,
            last_served=self.last_served,
        )
        for task in ordered:
            if len(chosen) >= limit:
                break
            key = gate_key(task.gates)
            if key in excluded or key in book.refused_keys:
                continue
            if not fits_claim(task, len(chosen), alone):
                continue
            if self.gates.busy.intersection(task.gates):
                excluded.add(key)  # another claim holds one of its gates: next claim
            elif book.admit(task.gates):
                chosen.append(task)
                self.dispatched(task)
                if task.solo:
                    return True
        excluded.update(book.refused_keys)
        return len(chosen) >= limit

    async def load_counters(self) -> None:
        if self._dispatches is None:
            sent = self._counters or await self.send("meta_values")
            found = {row["name"]: row["value"] for row in await sent.fetchall()}
            self._dispatches = int(found["dispatches"])
            self._virtual_time = float(found["virtual_time"])

    def last_served(self, flow: str) -> int:
        return self._served.get(flow, 0)

    def dispatched(self, task: Candidate) -> None:
        self._virtual_time = fairness.advance(self._virtual_time or 0.0, task.tag)
        self._dispatches = (self._dispatches or 0) + 1
        self._served[task.flow] = self._dispatches
        self._served_now.add(task.flow)
        self._last_tags[task.flow] = max(self._last_tags.get(task.flow, task.tag), task.tag)

    async def lease(
        self, chosen: Sequence[Candidate], worker: str, lease_for: float, wake_at: float | None
    ) -> Claimed:
        """Lease `chosen`; the leased rows are read once the transaction has committed (they
        come back with the commit: one round trip for both)."""
        until = self.now + lease_for
        if not chosen:
            return Claimed(None, [], until, self.now, wake_at)
        ids = [task.id for task in chosen]
        flows = sorted(self._served_now)
        await self.run("lock_flows", flows=flows)  # before the counters
        rated = sorted({name for task in chosen for name in task.gates if self.rated(name)})
        leased = await self.send(
            "lease_tasks",
            ids=ids,
            rated=rated,
            worker=worker,
            until=until,
            virtual_time=self._virtual_time or 0.0,
            # turns numbered up to this claim's count (`base`), renumbered once it is counted
            base=self._dispatches or 0,
            flows=flows,
            served=[self._served[flow] for flow in flows],
            tags=[self._last_tags[flow] for flow in flows],
        )
        return Claimed(leased, ids, until, self.now, wake_at)

    async def send_aging(self) -> Pending | None:
        """Ready tasks below the aging ceiling that may have waited an aging step."""
        step = self.settings.aging_step
        if step <= 0:
            return None
        cutoff = self.now - step + AGING_SLACK
        return await self.send("aging_candidates", ceiling=int(AGING_CEILING), cutoff=cutoff)

    async def age(self, candidates: Pending | None) -> None:
        if candidates is None:
            return
        promoted: dict[int, int] = {}
        for found in await candidates.fetchall():
            tier = Tier(found["tier"])
            aged = aged_tier(tier, self.now - found["ready_since"], self.settings.aging_step)
            if aged != tier:
                promoted[int(found["id"])] = int(aged)
        if promoted:
            await self.run("promote", ids=list(promoted), tiers=list(promoted.values()))

    async def claim_polls(
        self, worker: str, limit: int, lease_for: float, kinds: list[str] | None
    ) -> ClaimResult:
        due = [
            int(row["id"]) for row in await self.rows("due_polls", kinds=kinds, limit=max(0, limit))
        ]
        leases: list[Lease] = []
        if due:
            until = self.now + lease_for
            found = await self.rows("lease_polls", ids=due, worker=worker, until=until)
            leased = {record.id: record for record in map(task_of, found)}
            leases = [Lease(leased[i], leased[i].lease_token, until) for i in due]
        later = (await self.one("next_poll_at"))["at"]
        return ClaimResult(tuple(leases), self.now, later)

    # -- gates

    async def ticket_counts(self, task_id: int) -> list[Row]:
        if task_id not in self._tickets:
            self._tickets[task_id] = await self.rows("ticket_counts", task_id=task_id)
        return self._tickets[task_id]

    async def release(self, task_id: int, *, delete: bool = True) -> None:
        """Return a task's tickets to their gates (`delete=False`: the caller deletes the rows);
        a start never stamped is stamped now, at the outcome."""
        held = await self.ticket_counts(task_id)
        self._tickets[task_id] = []
        if not held:
            return
        await self.gates.lock(found["gate"] for found in held)
        for found in held:
            name = found["gate"]
            state = self.stamped(name, int(found["unstarted"]))
            self.gates.put(name, gating.release(state, int(found["n"])))
        if delete:
            await self.run("delete_tickets", task_id=task_id)
        self.wake = True

    def rated(self, name: str) -> bool:
        return gating.resolve(name, self.configs).rate is not None

    def stamped(self, name: str, count: int) -> GateState:
        """The state of gate `name` (locked) after `count` of its reserved starts are stamped."""
        state, config = self.gates.get(name), gating.find(name, self.configs)
        for _ in range(count):
            state = gating.start(config, state, self.now)
        return state

    async def start(self, lease: Lease, gates: Collection[str] | None) -> None:
        """Stamp the reserved starts of the task `lease` holds (on `gates`, or every one)."""
        found = await self.row("lock_task", id=lease.task_id)
        task = None if found is None else task_of(found)
        await self.read_clock()
        if task is None or not holds(task, lease.token, self.now):
            raise LeaseLost(lease.task_id)
        await self.stamp_starts(task.id, gates)

    async def stamp_starts(self, task_id: int, gates: Collection[str] | None = None) -> None:
        """Stamp a held task's reserved starts now; its tickets stay held."""
        held = await self.ticket_counts(task_id)
        chosen = [
            found
            for found in held
            if found["unstarted"] and (gates is None or found["gate"] in gates)
        ]
        if not chosen:
            return
        names = [found["gate"] for found in chosen]
        await self.gates.lock(names, clock=True)
        for found in chosen:
            self.gates.put(found["gate"], self.stamped(found["gate"], int(found["unstarted"])))
        await self.run("mark_started", task_id=task_id, gates=names)
        self._tickets.pop(task_id, None)  # read again if needed: the rows changed

    async def penalize(self, names: Sequence[str]) -> None:
        configs = {name: gating.resolve(name, self.configs) for name in names}
        await self.gates.lock(names)
        for name, config in configs.items():
            self.gates.put(name, gating.penalize(config, self.gates.get(name), self.now))

    # -- lease holders

    async def renew(self, leases: Sequence[Lease], lease_for: float) -> list[Lease | None]:
        if not leases:
            return []
        until = self.now + lease_for
        ids = [lease.task_id for lease in leases]
        tokens = [lease.token for lease in leases]
        found = await self.rows("renew_leases", ids=ids, tokens=tokens, until=until)
        renewed = {record.id: record for record in map(task_of, found)}
        return [
            Lease(renewed[lease.task_id], lease.token, until)
            if lease.task_id in renewed and renewed[lease.task_id].lease_token == lease.token
            else None
            for lease in leases
        ]

    async def prepare(self, outcomes: Sequence[tuple[Lease, Outcome]]) -> None:
        """Lock, before any is written and in the order every writer follows, what the outcomes
        will touch: their tasks and the tasks waiting on those that succeed or die, the tasks
        their successors wait on, the gates, the successors' flows. Then no outcome of a batch
        waits for a lock while holding one a later outcome's order puts first."""
        ids = sorted({lease.task_id for lease, _ in outcomes})
        dead = [lease.task_id for lease, outcome in outcomes if isinstance(outcome, Dead)]
        done = [lease.task_id for lease, outcome in outcomes if isinstance(outcome, Succeeded)]
        locked = await self.send("lock_for_outcomes", ids=ids, dead=dead, succeeded=done)
        time = await self.send_clock()  # answered after the row locks: a wait must not stretch
        tickets = await self.send("ticket_counts_many", task_ids=ids)  # a lease
        held = {int(row["id"]): task_of(row) for row in await locked.fetchall()}
        self._held = {task_id: held[task_id] for task_id in ids if task_id in held}
        self._dependents = len(held) > len(self._held)  # some outcome's dependents, locked
        await self.read_clock(time)
        self._tickets.update({task_id: [] for task_id in ids})
        for found in await tickets.fetchall():
            self._tickets[int(found["task_id"])].append(found)
        successors = [t for _, o in outcomes if isinstance(o, Succeeded) for t in o.successors]
        await self.dependency_states(d for t in successors for d in t.after if isinstance(d, int))
        gates = [row["gate"] for rows in self._tickets.values() for row in rows]
        await self.gates.lock([*gates, *_declared(outcomes, self.configs)], clock=True)
        await self.lock_flows(sorted({task.flow for task in successors}))

    async def lock_flows(self, flows: list[str]) -> None:
        if flows:
            await self.run("add_flows", flows=flows)
            await self.run("lock_flows", flows=flows)

    async def held(self, lease: Lease) -> TaskRecord:
        """The task `lease` still holds (locked by `prepare`), checked against the clock read
        once every lock was held."""
        task = self._held.pop(lease.task_id, None)
        if task is None:  # an earlier outcome of the batch was for this task too: read it again
            found = await self.row("lock_task", id=lease.task_id)
            task = None if found is None else task_of(found)
        if task is None or not holds(task, lease.token, self.now):
            raise LeaseLost(lease.task_id)
        return task

    async def finish(self, lease: Lease, outcome: Outcome) -> None:
        await self.prepare([(lease, outcome)])
        await self.apply(lease, outcome)

    async def apply(self, lease: Lease, outcome: Outcome) -> None:
        task = await self.held(lease)
        if isinstance(outcome, PollAgain):
            await self.poll_again(task, outcome)
        elif isinstance(outcome, Succeeded):
            await self.succeed(task, outcome)
        elif isinstance(outcome, Retry):
            await self.retry(task, outcome)
        elif isinstance(outcome, Dead):
            await self.die(task, outcome)
        else:
            await self.await_remote(task, outcome)

    async def finish_many(
        self, outcomes: Sequence[tuple[Lease, Outcome]]
    ) -> list[HeadraceError | None]:
        """Each outcome inside its own savepoint: one refused outcome leaves no trace and does
        not undo the others."""
        await self.prepare(outcomes)
        results: list[HeadraceError | None] = []
        plain: list[TaskRecord] = []  # plain successes not written yet, in batch order
        for lease, outcome in outcomes:
            if _plain_success(outcome) and lease.task_id in self._held:
                task = self._held.pop(lease.task_id)
                if holds(task, lease.token, self.now):
                    await self.succeed_plain(task, outcome)
                    plain.append(task)
                    results.append(None)
                else:
                    results.append(LeaseLost(lease.task_id))
                continue
            await self.write_successes(plain)  # before this outcome, as in batch order
            before, charged = self.gates.snapshot(), dict(self._ledger)
            try:
                async with self.driver.savepoint():
                    await self.apply(lease, outcome)
            except HeadraceError as error:
                self.gates.restore(before)
                self._ledger = charged
                self._tickets.clear()  # read again: the rollback may have restored some
                results.append(error)
            else:
                results.append(None)
        await self.write_successes(plain)
        return results

    async def succeed_plain(self, task: TaskRecord, outcome: Outcome) -> None:
        """A success without successors, held and checked: nothing in it can be refused, so it
        needs no savepoint; its rows are written with its neighbours' by `write_successes`."""
        assert isinstance(outcome, Succeeded)
        await self.lock_gates_for(task, ())
        await self.release(task.id, delete=False)
        self.charge(task, outcome)
        # Listeners hear of it if tickets came back (`release`) or dependents may be ready.
        self.wake = self.wake or self._dependents

    def charge(self, task: TaskRecord, outcome: Succeeded) -> None:
        """Add a success's units to its group's ledger, written at the end of the transaction
        into the shard of the worker that ran it (no other writer waits on that row)."""
        entry = (task.group or "", task.kind, task.worker or "")
        units = ledger.units_spent(task.cost, outcome.cost)
        self._ledger[entry] = self._ledger.get(entry, 0.0) + units

    async def write_successes(self, tasks: list[TaskRecord]) -> None:
        """The rows of a run of plain successes, in one statement (as `succeed_task` each)."""
        if tasks:
            ids = [task.id for task in tasks]
            numbers = [task.attempt for task in tasks]
            await self.run("succeed_tasks", ids=ids, numbers=numbers)
            tasks.clear()

    async def lock_gates_for(self, task: TaskRecord, penalized: Sequence[str]) -> None:
        """Lock the gates an outcome touches (the task's tickets and those it penalises) in
        name order, then read the clock again: gate times follow the order of the locks."""
        for name in penalized:
            gating.resolve(name, self.configs)
        held = await self.ticket_counts(task.id)
        await self.gates.lock([*(found["gate"] for found in held), *penalized], clock=True)

    async def poll_again(self, task: TaskRecord, outcome: PollAgain) -> None:
        if task.state is not TaskState.WAITING:
            raise ConfigError("PollAgain: only a waiting task can be polled again")
        run_at = self.now + outcome.delay
        await self.run("poll_again", id=task.id, run_at=run_at, code=outcome.code)

    async def succeed(self, task: TaskRecord, outcome: Succeeded) -> None:
        # Successors are checked like a submitted batch: a bad one fails the whole completion.
        states = await self.check_batch(outcome.successors)
        planned = idempotency.plan(outcome.successors, await self.known_keys(outcome.successors))
        await self.lock_gates_for(task, ())
        await self.release(task.id, delete=False)
        await self.run("succeed_task", id=task.id, number=task.attempt)
        self.charge(task, outcome)
        states[task.id] = TaskState.SUCCEEDED  # successors that wait on it have nothing to wait for
        await self.create(outcome.successors, states, planned)
        self.wake = True

    async def retry(self, task: TaskRecord, outcome: Retry) -> None:
        await self.lock_gates_for(task, outcome.penalize)
        await self.penalize(outcome.penalize)
        await self.endattempt_of(task, AttemptOutcome.RETRY, outcome.error)
        await self.release(task.id)
        run_at = self.now + outcome.delay
        await self.run("mark_retry", id=task.id, run_at=run_at, code=outcome.error.code)

    async def die(self, task: TaskRecord, outcome: Dead) -> None:
        await self.lock_gates_for(task, outcome.penalize)
        await self.penalize(outcome.penalize)
        await self.endattempt_of(task, AttemptOutcome.DEAD, outcome.error)
        await self.bury(task.id, outcome.error.code)

    async def await_remote(self, task: TaskRecord, outcome: AwaitRemote) -> None:
        if task.state is TaskState.WAITING:
            raise ConfigError("AwaitRemote: the task is already waiting on a remote job")
        await self.endattempt_of(task, AttemptOutcome.WAITING, None)
        await self.stamp_starts(task.id)  # the job was submitted: counted from now at latest
        deadline = self.now + outcome.timeout if outcome.timeout is not None else None
        await self.run(
            "mark_waiting",
            id=task.id,
            remote_id=outcome.remote_id,
            poll_every=outcome.poll_every,
            deadline=deadline,
            run_at=self.now + outcome.poll_every,
        )

    async def endattempt_of(
        self, task: TaskRecord, outcome: AttemptOutcome, error: AttemptError | None
    ) -> None:
        await self.run(
            "end_attempt",
            task_id=task.id,
            number=task.attempt,
            outcome=outcome.value,
            error_class=error.error_class.value if error else None,
            code=error.code if error else None,
            message=error.message if error else None,
        )

    async def bury(self, task_id: int, code: str) -> None:
        await self.end_task(task_id, TaskState.DEAD, code)
        for dependent in await self.dependents(task_id):
            await self.cancel_tree(dependent, UPSTREAM_FAILED)

    async def end_task(self, task_id: int, state: TaskState, code: str) -> None:
        await self.release(task_id)
        await self.run("mark_ended", id=task_id, state=state.value, code=code)

    async def dependents(self, task_id: int) -> list[int]:
        return [int(found["task_id"]) for found in await self.rows("dependents", dep_id=task_id)]

    async def lock_tree(self, roots: Sequence[int]) -> list[int]:
        """Lock tasks and everything waiting on them, in id order (before any gate)."""
        found = await self.rows("lock_for_outcomes", ids=[], dead=list(roots), succeeded=[])
        return [int(row["id"]) for row in found]

    # -- dead letters

    async def redrive(
        self, ids: list[int] | None, group: str | None, kind: str | None
    ) -> list[int]:
        redriven: list[int] = []
        for found in await self.rows("dead_letters", ids=ids, grp=group, kind=kind):
            if await self.row("redrive_task", id=found["id"]) is not None:
                redriven.append(int(found["id"]))
                await self.restore_dependents(int(found["id"]))
        self.wake = self.wake or bool(redriven)
        return redriven

    async def restore_dependents(self, task_id: int) -> None:
        for dependent in await self.dependents(task_id):
            if (await self.one("failed_deps", id=dependent))["n"]:
                continue
            if await self.row("restore_dependent", id=dependent) is not None:
                await self.restore_dependents(dependent)

    # -- cancellation and reaping

    async def cancel(self, task_id: int) -> bool:
        await self.lock_tree([task_id])  # first: an outcome cannot land between look and act
        if (await self.task(task_id)).state.terminal:
            return False
        await self.cancel_tree(task_id, "cancelled")
        return True

    async def cancel_tree(self, root: int, code: str) -> None:
        tree = await self.lock_tree([root])
        held = await self.rows("ticket_gates", task_ids=tree)
        await self.gates.lock(found["gate"] for found in held)
        pending = [(root, code)]
        while pending:
            task_id, reason = pending.pop()
            task = await self.task(task_id)
            if task.state.terminal:
                continue
            if task.state in (TaskState.RUNNING, TaskState.WAITING):
                await self.endattempt_of(task, AttemptOutcome.CANCELLED, None)
            await self.end_task(task_id, TaskState.CANCELLED, reason)
            dependents = reversed(await self.dependents(task_id))
            pending.extend((dependent, UPSTREAM_FAILED) for dependent in dependents)

    async def reap(self) -> int:
        expired = [task_of(found) for found in await self.rows("expired_leases")]
        if not expired:
            return 0
        ids = [task.id for task in expired]
        await self.lock_tree(ids)
        held = await self.rows("ticket_gates", task_ids=ids)
        await self.gates.lock((found["gate"] for found in held), clock=True)
        for task in expired:
            await self.expire(task)
        self.wake = True
        return len(expired)

    async def expire(self, task: TaskRecord) -> None:
        error = AttemptError.of(ErrorClass.TRANSIENT, LEASE_EXPIRED, "worker lost its lease")
        await self.endattempt_of(task, AttemptOutcome.LEASE_EXPIRED, error)
        beside = await self.one(
            "crash_companions", worker=task.worker or "", task_id=task.id, number=task.attempt
        )
        found = poison.verdict(
            alone=not beside["n"],
            expiries=task.expiries + 1,
            poison_expiries=self.settings.poison_expiries,
            attempts_used=task.attempts_used,
            max_attempts=task.max_attempts,
        )
        if found in (Expiry.POISON, Expiry.SPENT):
            await self.run("count_expiry", id=task.id)
            await self.bury(task.id, POISON if found is Expiry.POISON else LEASE_EXPIRED)
            return
        await self.release(task.id)
        solo = found is Expiry.SOLO
        await self.run("requeue_expired", id=task.id, code=LEASE_EXPIRED, solo=solo)

    # -- reading

    async def task(self, task_id: int) -> TaskRecord:
        found = await self.row("task_by_id", id=task_id)
        if found is None:
            raise UnknownTask(task_id)
        return task_of(found)

    async def find(self, key: str) -> TaskRecord | None:
        found = await self.rows("task_ids_by_keys", keys=[key])
        return await self.task(int(found[0]["id"])) if found else None

    async def tasks(
        self, group: str | None, state: TaskState | None, kind: str | None, limit: int
    ) -> list[TaskRecord]:
        value = state.value if state is not None else None
        found = await self.rows("list_tasks", grp=group, state=value, kind=kind, limit=limit)
        return [task_of(row) for row in found]

    async def attempts(self, task_id: int) -> list[Attempt]:
        await self.task(task_id)
        return [attempt_of(found) for found in await self.rows("task_attempts", task_id=task_id)]

    async def counts(self, kinds: list[str] | None) -> dict[TaskState, int]:
        return counts_by_state(await self.rows("count_by_state", kinds=kinds))

    async def stages(self, kinds: list[str] | None) -> list[StageStats]:
        found = await self.rows("stage_stats", kinds=kinds)
        return [stage_of(row, self.now) for row in found]

    async def groups(self) -> list[str]:
        return sorted(str(found["grp"]) for found in await self.rows("group_names"))

    async def group_report(self, group: str) -> GroupReport:
        by_state = counts_by_state(await self.rows("group_counts", grp=group))
        spent = await self.rows("group_ledger", grp=group)
        cost = dict(sorted((str(r["kind"]), float(r["units"])) for r in spent))
        failures = tuple(
            Failure(r["id"], r["kind"], r["ref"], r["error_code"], r["attempt"])
            for r in await self.rows("group_failures", grp=group)
        )
        total = sum(by_state.values())
        return GroupReport(group, total, by_state, cost, failures)

    async def gate_statistics(self) -> list[GateStatistics]:
        stats: list[GateStatistics] = []
        for found in await self.rows("all_gates"):
            try:
                config = gating.resolve(found["name"], self.configs)
            except UnknownGate:
                continue  # declared by another process sharing the store, not by this one
            stats.append(gating.statistics(config, gate_state_of(found), self.now))
        return sorted(stats, key=lambda s: s.name)


def _declared(
    outcomes: Iterable[tuple[Lease, Outcome]], configs: Mapping[str, GateConfig]
) -> list[str]:
    """The gates the outcomes penalise that a spec declares (the others fail their outcome)."""
    names = {n for _, o in outcomes if isinstance(o, Retry | Dead) for n in o.penalize}
    declared = []
    for name in sorted(names):
        with contextlib.suppress(UnknownGate):
            gating.resolve(name, configs)
            declared.append(name)
    return declared


def _plain_success(outcome: Outcome) -> bool:
    return isinstance(outcome, Succeeded) and not outcome.successors


def _split_last_round(
    candidates: list[Candidate],
) -> tuple[list[Candidate], list[Candidate]]:
    """`candidates` cut before the run of equal (tier, tag) that ends it (which may go on in
    the next batch)."""
    last = (candidates[-1].tier, candidates[-1].tag)
    cut = len(candidates)
    while cut and (candidates[cut - 1].tier, candidates[cut - 1].tag) == last:
        cut -= 1
    return candidates[:cut], candidates[cut:]


def _resolved(task: NewTask, results: Sequence[Submitted]) -> list[int]:
    return [results[d.index].id if isinstance(d, Sibling) else d for d in task.after]


def _plan(
    task_id: int, task: NewTask, after: Sequence[int], states: Mapping[int, TaskState]
) -> Planned:
    unmet = sorted({dep for dep in after if states.get(dep) is not TaskState.SUCCEEDED})
    failed = any(states.get(dep) in (TaskState.DEAD, TaskState.CANCELLED) for dep in unmet)
    return Planned(task_id, task, unmet, failed, idempotency.stored_digest(task, after))


def _known(rows: Iterable[Row]) -> dict[str, idempotency.KnownKey]:
    """`task_ids_by_keys` rows by key."""
    return {row["key"]: idempotency.KnownKey(int(row["id"]), row["payload_digest"]) for row in rows}


def check_gates(tasks: Iterable[NewTask], configs: Mapping[str, GateConfig]) -> None:
    """Refuse a task naming an unknown gate."""
    for task in tasks:
        for name in task.gates:
            gating.resolve(name, configs)


def task_row(task: NewTask) -> dict[str, Any]:
    """A new task's own columns, as `submit_plain` and `insert_tasks` read them."""
    return {
        "kind": task.kind,
        "ref": task.ref,
        "gates": list(task.gates),
        "gate_key": gate_key(task.gates),
        "flow": task.flow,
        "grp": task.group,
        "tier": int(task.tier),
        "cost": float(task.cost),
        "max_attempts": task.max_attempts,
    }


def _insert_params(planned: Sequence[Planned], now: float) -> Json:
    """The rows `insert_tasks` creates, as one JSON array (one parameter to send, whatever the
    batch's size)."""
    return Json(
        [
            {
                **task_row(p.task),
                "id": p.id,
                "key": p.task.key,
                "payload_digest": p.payload_digest,
                "state": (TaskState.PENDING if p.unmet else TaskState.READY).value,
                "tag": p.tag,
                "run_at": now + p.task.delay,
                "ready_since": None if p.unmet else now,
                "unmet": len(p.unmet),
            }
            for p in planned
        ]
    )
