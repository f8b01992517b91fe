"""Claims: ready tasks read in (tier, tag, id) order a batch at a time, their gates locked
first, chosen in turn through `GateBook`, and leased; remote polls leased."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from headrace.policy import fairness
from headrace.policy.errors import (
    StoreError,
)
from headrace.policy.tiers import AGING_CEILING, Tier, aged_tier
from headrace.store.machine import bounds as stage_bounds
from headrace.store.machine import outcomes, tickets
from headrace.store.machine.core import (
    AGING_SLACK,
    CLAIM_BATCH,
    SWEEP_EVERY,
    Pending,
    Transaction,
)
from headrace.store.machine.dispatch import (
    GateBook,
    KindBudget,
    MemoryBudget,
    earliest,
    fits_claim,
    gate_key,
    takes,
    waits_for_alone,
)
from headrace.store.machine.rows import (
    Candidate,
    candidates_of,
    positions,
    task_of,
    tasks_of,
)
from headrace.store.protocol.types import (
    ClaimResult,
    KindLimit,
    Lease,
    MemoryRoom,
)


class SweepDue(Exception):
    """A claim asked to look for a sweep's work (`claim(sweep_check=True)`) found some: a lease
    run out or a task old enough to age. Its transaction is to be rolled back, the sweep run,
    and the claim made again, so that it sees what the sweep released."""


# Candidates a claim's first batch reads past its limit and an eighth more (`first_batch`).
FIRST_BATCH_MARGIN = 8

# An id past every task's: a batch that starts after (tier, tag, PAST_ROUND) starts after the
# whole round of that (tier, tag).
PAST_ROUND = 2**63 - 1

# `lease_tasks`' rows as read: column names, then each row's values by position.
LeasedRows = tuple[Sequence[str], Sequence[Sequence[Any]]]


@dataclass(frozen=True)
class Claimed:
    """A claim's outcome, its leases not read yet (`leased`: the rows `lease_tasks` returns;
    on PostgreSQL they come back with the commit)."""

    leased: Pending | None
    ids: list[int]
    until: float
    now: float
    wake_at: float | None
    solo_waiting: bool = False

    async def rows(self) -> LeasedRows | None:
        """The leased rows as they came (no round trip on PostgreSQL: the commit's sync
        brought them). SQLite reads them before its commit and makes them records (`result`)
        after it, out of the write lock every process queues for."""
        return None if self.leased is None else await self.leased.table()

    def result(self, rows: LeasedRows | None) -> ClaimResult:
        """The claim's leases, from its `rows`."""
        if rows is None:
            return ClaimResult((), self.now, self.wake_at, solo_waiting=self.solo_waiting)
        held = {record.id: record for record in tasks_of(*rows)}
        leases = (Lease(held[i], held[i].lease_token, self.until) for i in self.ids)
        return ClaimResult(tuple(leases), self.now, self.wake_at, solo_waiting=self.solo_waiting)


@dataclass
class Taking:
    """What one claim has taken so far and may still take, and the lanes it served."""

    budget: KindBudget  # what it may still take of each group of kinds
    memory: MemoryBudget  # what it may still charge of the worker's memory
    gates_before: int  # gates held or met busy when it began (its transaction's outcomes')
    held_back: frozenset[str]  # full stages that hold their feeders back
    solo_waiting: bool = False  # it passed over a task that must run alone
    served: dict[str, int] = field(default_factory=dict)  # each lane's last dispatch count
    last_tags: dict[str, float] = field(default_factory=dict)  # each lane's last tag now
    served_now: set[str] = field(default_factory=set)  # the lanes it served

    def last_served(self, name: str) -> int:
        """When a flow or a lane was last served: the dispatch count then, 0 if never."""
        return self.served.get(name, 0)


async def claim(
    tx: Transaction,
    worker: str,
    limit: int,
    lease_for: float,
    kinds: list[str] | None,
    *,
    alone: bool = True,
    durable: bool = True,
    within: Sequence[KindLimit] = (),
    memory: MemoryRoom | None = None,
    ahead: int = 0,
    sweep_check: bool = False,
) -> Claimed:
    """The claim's time, counters and next run_at (`claim_start`) come back with the first
    batch's gates, in one round trip. Each batch's gates are locked before its tasks, so a
    task is only ever held by a claim that holds its gates: two claims never hand a gate's
    tickets out of (tier, tag) order. Not `durable`: the commit does not wait for the WAL
    flush. `within`: at most so many tasks of each group of kinds (a worker's cost
    classes); a full group's kinds are left out of later batches. `memory`: what the tasks
    taken may charge of the worker's memory (`MemoryBudget`); later batches leave out tasks
    larger than what is left. `ahead`: up to so many more tasks past `limit` that may wait
    in the worker for a slot (`dispatch.may_wait`). `sweep_check`: PostgreSQL's
    `claim_start` also looks whether a sweep would find anything (two index probes), and
    SweepDue is raised if it would: a store whose sweeps are transactions of their own runs
    one only then (SQLite's sweep in the claim's transaction and never ask)."""
    limits = await backpressure(tx)
    run = Taking(
        KindBudget([*within, *limits.values()]),
        MemoryBudget(memory),
        gates_before=len(tx.gates.states) + len(tx.gates.busy),
        held_back=stage_bounds.holding_back(limits),
    )
    clock = None if tx.clock is None else tx.clock.now()
    commit = "on" if durable else "off"
    step = tx.settings.aging_step
    start: Pending | None = await tx.send(
        "claim_start",
        clock=clock,
        commit=commit,
        sweep_check=sweep_check,
        ceiling=int(AGING_CEILING),
        aging_step=step if step > 0 else None,
        slack=AGING_SLACK,
    )
    next_at: float | None = None
    chosen: list[Candidate] = []
    excluded: set[str] = set()
    book: GateBook | None = None
    async with contextlib.aclosing(
        rounds(tx, run, kinds, excluded, (limit, ahead), chosen)
    ) as batches:
        async for candidates in batches:
            if start is not None:
                next_at, start = await read_claim_start(tx, start), None
            book = book or GateBook(tx.configs, tx.gates.get, tx.now)
            if admit(tx, run, book, candidates, chosen, excluded, (limit, ahead), alone):
                break
    if start is not None:  # no candidate at all
        next_at = await read_claim_start(tx, start)
    book = book or GateBook(tx.configs, tx.gates.get, tx.now)
    for name in book.changed:
        tx.gates.put(name, book.states[name])
    wake_at = earliest(book.wake_at(), next_at)
    return await lease(tx, run, chosen, worker, lease_for, wake_at)


async def backpressure(tx: Transaction) -> dict[str, KindLimit]:
    """How many tasks the stages feeding a bounded stage may start in this claim: its room
    now, less what their running tasks may still add (store/machine/bounds.py). Read before the
    claim's batches, with no lock: two claims that read the same room may together start
    more than it, and the successors that then do not fit defer their task (`defer`)."""
    counted = list(stage_bounds.counted_kinds(tx.settings.stages))
    if not counted:
        return {}
    queued: dict[str, int] = {}
    active: dict[str, int] = {}
    for found in await tx.rows("stage_counts", kinds=counted):
        queued[found["kind"]] = int(found["queued"])
        active[found["kind"]] = int(found["active"])
    return stage_bounds.backpressure(tx.settings.stages, queued, active)


async def sweep(tx: Transaction, *, fold: bool = False) -> float:
    """Reap expired leases and age low tasks, and `fold` the tallies; return the store time
    it ran at."""
    await tx.read_clock()
    aging = await send_aging(tx)
    if await outcomes.reap(tx):
        aging = await send_aging(tx)  # tasks made ready again may age as well
    await age(tx, aging)
    if fold:
        await tx.run("fold_tallies")
    return tx.now


async def read_claim_start(tx: Transaction, sent: Pending) -> float | None:
    """The time `claim_start` fixed for the claim's statements and the counters it read;
    return when something may come due: the earliest future run_at of a ready task (reaping
    and leasing cannot change it) or lease to run out (a later claim's sweep makes its task
    ready again; a lease out already, the next sweep's time at the latest)."""
    found = await sent.fetchone()
    if found is None:
        raise StoreError(f"{tx.driver.name} store: claim_start returned no row")
    tx.now = max(tx.now, float(found["now"]))
    tx.dispatches = int(found["dispatches"])
    tx.virtual_time = float(found["virtual_time"])
    if found["sweep_due"]:
        raise SweepDue
    next_at = None if found["next_at"] is None else float(found["next_at"])
    if found["lease_ends"] is None:
        return next_at
    lease_ends = float(found["lease_ends"])
    return earliest(next_at, lease_ends if lease_ends > tx.now else tx.now + SWEEP_EVERY)


async def rounds(
    tx: Transaction,
    run: Taking,
    kinds: list[str] | None,
    excluded: set[str],
    wanted: tuple[int, int],
    chosen: Sequence[Candidate],
) -> AsyncGenerator[list[Candidate], None]:
    """Ready tasks due now, a batch at a time (the first just big enough for the claim, then
    growing), in (tier, tag) order and in turns within a round of equal (tier, tag): the lane
    served least recently first (`fairness.take_turns`, ordered by the statement, the turns
    this claim took given). In one statement, each batch's gates are locked first, then its
    tasks whose gates this claim holds. Gate keys in `excluded` (refused so far) are left out
    of later batches.

    A batch's range runs to the end of the last round it reaches, but the tasks it locks are
    only as many as the claim still needs past `chosen` (`first_batch`), the best turns
    first: with several workers, a later batch is mostly rows other claims hold, and every
    row a claim locks and does not lease is skipped by the others until it commits. When a
    batch locks that many, the next one reads that round again from its start, past the
    tasks read already (a round of 100 read in turns is not read whole to take one task).

    Once the claim has its limit (`wanted`: a limit, and how many more may wait in the
    worker), a batch reads only tasks that may wait for a slot (`dispatch.may_wait`): the
    others would be read past, batch after batch, to the end of the queue."""
    own, ahead = wanted
    limit = own + ahead
    after: tuple[int, float, int] = (-1, 0.0, 0)
    skip: list[int] = []  # the tasks read already of the round `after` starts
    size = first_batch(limit)
    while True:
        open_kinds = run.budget.open_kinds(kinds)
        if open_kinds == []:  # every kind asked for is in a full group
            return
        batch = {
            "tier": after[0],
            "tag": after[1],
            "id": after[2],
            "kinds": open_kinds,
            "memory": run.memory.most(),
            "waiting": len(chosen) >= own,
            "skip": skip,
        }
        take = min(size, first_batch(max(0, limit - len(chosen))))
        peeked, last, tasks = await claim_batch(tx, run, batch, sorted(excluded), size, take)
        if tasks:
            yield tasks
        if len(tasks) >= take:  # its last round may have more tasks, in later turns
            cut = (tasks[-1].tier, tasks[-1].tag)
            if (after[0], after[1]) != cut:
                skip = []
            skip = [*skip, *(task.id for task in tasks if (task.tier, task.tag) == cut)]
            after = (cut[0], cut[1], 0)
        elif peeked < size:
            return
        else:
            assert last is not None
            after, skip = (last[0], last[1], PAST_ROUND), []
        size = min(CLAIM_BATCH, size * 4)


async def claim_batch(
    tx: Transaction,
    run: Taking,
    batch: Mapping[str, object],
    refused: list[str],
    size: int,
    take: int,
) -> tuple[int, tuple[int, float] | None, list[Candidate]]:
    """The next batch of up to `size` candidates and the rest of its last round: its gates
    locked (the first time, the clock read once they are held), then the first `take` of
    its tasks in turn order whose gates are all held. Returns how many tasks the range had
    before its last round's rest, that round's (tier, tag) and the tasks taken. A gate used
    for the first time has no row to lock yet: it is made, and the batch read again."""
    served = sorted(run.served_now)
    for _ in range(2):
        # Until the claim holds (or met busy) a gate of its own, the clock is read again
        # once the batch's gates are held: it may have waited for them. Gates that outcomes
        # in the same transaction hold do not count.
        first = len(tx.gates.states) + len(tx.gates.busy) == run.gates_before
        sent = await tx.send(
            "claim_batch",
            **batch,
            refused=refused,
            batch=size,
            take=take,
            held=sorted(tx.gates.states),
            top=max(tx.gates.states, default=""),
            served_names=served,
            served_at=[run.served[name] for name in served],
        )
        columns, rows = await sent.table()
        edge = dict(zip(columns, rows[0], strict=True))
        if first:  # `now`: the server's clock once the batch's gates were held
            tx.clock_read(edge["now"])
        tx.gates.take(edge["gate_rows"])
        others = [name for name in edge["wanted"] if name not in tx.gates.states]
        if not others or not await tx.gates.make(others):
            tx.gates.busy.update(others)  # another claim holds them: its tasks are its
            break
    # when each flow and lane was last served, read with the candidates
    id_, flow, lane, flow_served, lane_served = positions(
        columns, ("id", "flow", "lane", "flow_served", "lane_served")
    )
    for row in rows:
        if row[id_] is not None:
            run.served.setdefault(row[flow], int(row[flow_served]))
            run.served.setdefault(row[lane], int(row[lane_served]))
    tasks = candidates_of(columns, rows)
    if edge["last_tier"] is None:
        return 0, None, tasks
    return int(edge["peeked"]), (int(edge["last_tier"]), float(edge["last_tag"])), tasks


def admit(
    tx: Transaction,
    run: Taking,
    book: GateBook,
    candidates: Sequence[Candidate],
    chosen: list[Candidate],
    excluded: set[str],
    size: tuple[int, int],
    alone: bool,
) -> bool:
    """Choose among `candidates` in turn, up to `size` (a limit, and how many more may
    wait in the worker); True once the claim is complete."""
    limit, ahead = size
    ordered = fairness.take_turns(
        candidates,
        rank=lambda task: (task.tier, task.tag),
        flow=lambda task: task.flow,
        last_served=run.last_served,
        lane=lambda task: task.lane,
    )
    for task in ordered:
        if len(chosen) >= limit + ahead:
            break
        if not takes(task, len(chosen), limit, ahead):
            continue
        key = gate_key(task.gates)
        if key in excluded or key in book.refused_keys:
            continue
        if not fits(run, task, len(chosen), alone):
            run.solo_waiting = run.solo_waiting or waits_for_alone(task, len(chosen), alone)
            continue
        if tx.gates.busy.intersection(task.gates):
            excluded.add(key)  # another claim holds one of its gates: next claim
        elif book.admit(task.gates):
            chosen.append(task)
            run.budget.take(task.kind)
            run.memory.take(task.memory)
            dispatched(tx, run, task)
            if task.solo:
                return True
    excluded.update(book.refused_keys)
    return len(chosen) >= limit + ahead


def fits(run: Taking, task: Candidate, chosen: int, alone: bool) -> bool:
    """Whether the worker may take `task` beside the `chosen` ones: alone if it must be, a
    slot of its class free, its memory within what is left."""
    return (
        fits_claim(task, chosen, alone)
        and run.budget.fits(task.kind)
        and run.memory.fits(task.memory)
    )


def dispatched(tx: Transaction, run: Taking, task: Candidate) -> None:
    tx.virtual_time = fairness.advance(tx.virtual_time or 0.0, task.tag)
    tx.dispatches = (tx.dispatches or 0) + 1
    run.served[task.lane] = tx.dispatches
    run.served_now.add(task.lane)
    run.last_tags[task.lane] = max(run.last_tags.get(task.lane, task.tag), task.tag)


async def lease(
    tx: Transaction,
    run: Taking,
    chosen: Sequence[Candidate],
    worker: str,
    lease_for: float,
    wake_at: float | None,
) -> Claimed:
    """Lease `chosen`; the leased rows are read once the transaction has committed (they
    come back with the commit: one round trip for both)."""
    until = tx.now + lease_for
    if not chosen:
        return Claimed(None, [], until, tx.now, wake_at, run.solo_waiting)
    ids = [task.id for task in chosen]
    if any(task.kind in run.held_back for task in chosen):
        tx.wake = True  # room downstream: claims that backpressure held back may go on
    rated = sorted({name for task in chosen for name in task.gates if tickets.rated(tx, name)})
    # The flows are served in the same statement, once the tasks are leased: other claims
    # serving the same flow wait for its row from there to the commit, not while this one
    # leases (on PostgreSQL, a claim of a few hundred tasks that locked its flows first held
    # them through its whole lease, and four workers on one flow queued for it). Its turns
    # are numbered once its flows are held, so in the order flows are served.
    flows = sorted(run.served_now)
    leased = await tx.send(
        "lease_tasks",
        ids=ids,
        rated=rated,
        worker=worker,
        until=until,
        virtual_time=tx.virtual_time or 0.0,
        # turns numbered up to this claim's count (`base`), renumbered once it is counted
        base=tx.dispatches or 0,
        flows=flows,
        served=[run.served[flow] for flow in flows],
        tags=[run.last_tags[flow] for flow in flows],
    )
    return Claimed(leased, ids, until, tx.now, wake_at, run.solo_waiting)


async def send_aging(tx: Transaction) -> Pending | None:
    """Ready tasks below the aging ceiling that may have waited an aging step."""
    step = tx.settings.aging_step
    if step <= 0:
        return None
    cutoff = tx.now - step + AGING_SLACK
    return await tx.send("aging_candidates", ceiling=int(AGING_CEILING), cutoff=cutoff)


async def age(tx: Transaction, candidates: Pending | None) -> None:
    if candidates is None:
        return
    promoted: dict[int, int] = {}
    for found in await candidates.fetchall():
        tier = Tier(found["tier"])
        aged = aged_tier(tier, tx.now - found["ready_since"], tx.settings.aging_step)
        if aged != tier:
            promoted[int(found["id"])] = int(aged)
    if promoted:
        await tx.run("promote", ids=list(promoted), tiers=list(promoted.values()))


async def claim_polls(
    tx: Transaction, worker: str, limit: int, lease_for: float, kinds: list[str] | None
) -> ClaimResult:
    due = [int(row["id"]) for row in await tx.rows("due_polls", kinds=kinds, limit=max(0, limit))]
    leases: list[Lease] = []
    if due:
        until = tx.now + lease_for
        found = await tx.rows("lease_polls", ids=due, worker=worker, until=until)
        leased = {record.id: record for record in map(task_of, found)}
        leases = [Lease(leased[i], leased[i].lease_token, until) for i in due]
    later = (await tx.one("next_poll_at"))["at"]
    return ClaimResult(tuple(leases), tx.now, later)


def first_batch(limit: int) -> int:
    """How many candidates a claim for `limit` tasks reads first: its limit and an eighth more
    (and a few), for those a gate refuses. Each one read is locked until the claim commits,
    whether it takes it or not: every other claim skips it meanwhile. (Twice the limit and 8
    locked 247 rows for 144 leased in a sampled plan.)"""
    return min(CLAIM_BATCH, limit + limit // 8 + FIRST_BATCH_MARGIN)
