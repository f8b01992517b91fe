"""The worker: claims for its free slots, runs handlers, renews leases, resolves remote waits.

It never sleeps inside a slot: a task that must wait for tokens is simply not claimed (the store
asks its gates first), a retry waits in the store with a `run_at`, and a remote job waits in the
`waiting` state with its tickets but without a slot. Between claims the worker sleeps until the
store's next known event (a run_at, a gate's next token), until the store says a write made work
claimable, until one of its own slots frees, or at most `idle` seconds.

Handlers and pollers are called through `calls.call` (time limits, sync code in daemon threads);
what a remote job's check means is decided in `remote`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from headrace.policy.durations import Duration, positive_seconds, seconds
from headrace.policy.errors import (
    ConfigError,
    ErrorClass,
    LeaseLost,
    StoreUnavailable,
    TaskFailure,
)
from headrace.policy.leases import lease_timing
from headrace.policy.redact import redact
from headrace.policy.retry import Action
from headrace.runtime import outcomes, remote
from headrace.runtime.app import App, TaskDefinition
from headrace.runtime.calls import call
from headrace.runtime.classes import ClassBudget
from headrace.runtime.completions import Completions
from headrace.runtime.context import Context
from headrace.runtime.memory import DEFAULT_MEMORY, WorkerMemory
from headrace.runtime.prefetch import Prefetch
from headrace.runtime.progress import DEFAULT_EVERY, Progress
from headrace.runtime.pruner import Pruner
from headrace.runtime.results import RemoteWait, Result
from headrace.store.machine.dispatch import earliest
from headrace.store.protocol.types import (
    ACTIVE,
    AttemptError,
    AwaitRemote,
    ClaimResult,
    Dead,
    KindLimit,
    Lease,
    MemoryRoom,
    Outcome,
    PollAgain,
    Retry,
    Succeeded,
    TaskState,
)

log = logging.getLogger("headrace.worker")

INTERRUPTED = "interrupted"
MIN_SLEEP = 0.001
OUTAGE_PAUSE = 0.25
OUTAGE_PAUSE_MAX = 5.0
BACKOFFS_KEPT = 64  # never spin when the store's next event is "now"
DEFAULT_SLOTS = 4
PREFETCH_PER_SLOT = 16  # the default most tasks claimed ahead, per slot
PRUNE_CHECKS = 4  # looks per `retention.every` for a due run
PRUNE_CHECK_MIN = 1.0  # seconds


@dataclass
class WorkerStats:
    """Counters since the worker started; `backoffs` holds the latest retry delays decided."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    remote_waits: int = 0
    polls: int = 0
    leases_lost: int = 0
    peak_busy: int = 0
    claimed_ahead: int = 0  # tasks claimed past the free slots, to wait in the worker for one
    borrowed: int = 0  # tasks claimed into slots another cost class left idle
    memory_budget: int | None = None  # bytes its running tasks may be charged (None: no budget)
    memory_charged: int = 0  # bytes its running tasks are charged now
    peak_memory_charged: int = 0
    backoffs: deque[float] = field(default_factory=lambda: deque(maxlen=BACKOFFS_KEPT))


class Worker:
    """`slots` handlers at once; `poll_slots` remote-job checks at once. Leases last `lease` and
    are renewed every `renew` (default: a third of the lease), which must be shorter. `memory`:
    the bytes the running tasks may be charged at once (`NewTask.memory`; runtime/memory.py),
    an int or a size such as "768MiB"; None: no budget. `prune`: while it runs (not in a
    drain), prune the store when a run is due by the app's retention (runtime/pruner.py).

    `prefetch`: the most tasks the worker claims ahead of its slots, to start the moment a
    slot frees, without a round trip to the store (default: 16 per slot; 0: none). Only tasks
    that pass no gate, charge no memory and need not run alone are claimed ahead
    (`dispatch.may_wait`), only while there is a backlog, and only as many as the slots
    finish while a claim is on its way (runtime/prefetch.py): short tasks are claimed ahead,
    long ones are not. A worker with cost classes claims no more than its classes' free
    slots. Tasks still waiting at shutdown are handed back at once, their attempt not
    counted."""

    def __init__(
        self,
        app: App,
        *,
        slots: int | None = None,
        poll_slots: int | None = None,
        name: str | None = None,
        lease: Duration = "30s",
        renew: Duration | None = None,
        idle: Duration = "0.5s",
        grace: Duration = "30s",
        timeout: Duration | None = None,
        seed: int | None = None,
        classes: Mapping[str, int] | None = None,
        borrow: bool = True,
        memory: int | str | None = DEFAULT_MEMORY,
        prune: bool = True,
        prefetch: int | None = None,
        report_every: Duration | None = DEFAULT_EVERY,
    ) -> None:
        if slots is not None and (isinstance(slots, bool) or slots < 1):
            raise ConfigError(f"worker.slots: expected a positive integer, got {slots!r}")
        if prefetch is not None and (isinstance(prefetch, bool) or prefetch < 0):
            raise ConfigError(f"worker.prefetch: expected 0 or more, got {prefetch!r}")
        self.app = app
        # Slots per cost class, for the app's classed stages (as declared by now).
        self.classes = ClassBudget.for_stages(app.cost_classes(), classes)
        # Slots a class leaves idle run a class with more slots meanwhile (`ClassBudget.lendable`).
        self.borrow = borrow
        self.memory = WorkerMemory(memory)
        # Run the pruner when a run is due (`run` only, never `drain`; runtime/pruner.py).
        self.prune = prune and app.retention.every is not None
        self.slots = slots or self._default_slots()
        self.poll_slots = poll_slots or self.slots
        # Cost classes count slots by the kinds running in them: nothing waits outside them.
        default_prefetch = 0 if self.classes else PREFETCH_PER_SLOT * self.slots
        self.prefetch = Prefetch(default_prefetch if prefetch is None else prefetch, self.slots)
        self._queued: deque[Lease] = deque()  # claimed ahead, in claim order, not started
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.lease_for, self.renew_every = lease_timing(lease, renew)
        self.idle = positive_seconds(idle, field="worker.idle")
        self.grace = seconds(grace, field="worker.grace")
        # Seconds an attempt may take when its stage sets no limit (None: no limit).
        self.timeout = (
            None if timeout is None else positive_seconds(timeout, field="worker.timeout")
        )
        self.rng = random.Random(seed)
        self.stats = WorkerStats(memory_budget=self.memory.budget)
        # Seconds between progress lines (None: none); a success is a DEBUG line of its own.
        self.report_every = (
            None
            if report_every is None
            else positive_seconds(report_every, field="worker.report_every")
        )
        self.progress = Progress(
            self.name, self.stats, busy=lambda: (len(self._running), len(self._queued)), log=log
        )
        self._running: dict[int, asyncio.Task[None]] = {}
        self._charged: dict[int, int] = {}  # running tasks' memory charges, by task id
        self._polling: dict[int, asyncio.Task[None]] = {}
        self._recording: dict[int, asyncio.Task[None]] = {}  # outcomes being written, no slot
        self._leases: dict[int, Lease] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._hurry = asyncio.Event()
        self._crash: BaseException | None = None
        self._group_commit: Completions | None = None
        self._outage = 0
        self._poll_due: float | None = None  # store time the next remote check may be due
        self._polled_at = float("-inf")
        self._fail_fast = False
        self._more = False  # the last claim filled every free slot
        self._claiming = False  # a claim (with the outcomes it records) is in flight
        self._backlog = False  # claiming stopped: more than `slots` outcomes wait to be recorded
        self._solo: int | None = None  # a task running alone: nothing else is claimed meanwhile
        # The last claim passed over a task that must run alone: nothing new is claimed until
        # this worker runs nothing, then it claims alone.
        self._solo_waiting = False

    # -- running

    async def run(self, *, handle_signals: bool = False) -> None:
        """Work until `stop()` (or SIGINT/SIGTERM with `handle_signals`), then shut down
        gracefully: running handlers get `grace` seconds, the rest are released for others.
        The app's start checks (`App.on_start`) run first: what they raise stops the worker
        before it claims anything."""
        await self.app.check_start()  # before anything is claimed
        restore = self._install_signals() if handle_signals else None
        try:
            await self._serve(until_idle=False)
        finally:
            if restore is not None:
                restore()

    async def drain(self, *, fail_fast: bool = True) -> WorkerStats:
        """Work until no task is pending, ready, running or waiting. With `fail_fast`, an error
        a handler raised that is not a TaskFailure is re-raised here (after it was recorded)."""
        self._fail_fast = fail_fast
        await self._serve(until_idle=True)
        if self._crash is not None and fail_fast:
            raise self._crash
        return self.stats

    def stop(self) -> None:
        """Stop claiming; running tasks finish (or are released after the grace period)."""
        self._stopping = True
        self._wake.set()

    async def _serve(self, *, until_idle: bool) -> None:
        await self.app.open()
        self.app.listen(self._wake)
        helpers = [asyncio.create_task(self._renew_forever(), name=f"{self.name}:renew")]
        if not until_idle and self.prune:
            helpers.append(asyncio.create_task(self._prune_forever(), name=f"{self.name}:prune"))
        if self.report_every is not None:
            self.progress.start()
            helpers.append(asyncio.create_task(self._report_forever(), name=f"{self.name}:report"))
        try:
            await self._loop(until_idle)
        finally:
            self.app.unlisten(self._wake)
            self._completions().kick()  # no claim comes now: waiting outcomes are written
            await self._hand_back_queued()
            await self._shutdown()
            for helper in helpers:
                helper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await helper
            if self.report_every is not None:
                self.progress.report(final=True)

    async def _report_forever(self) -> None:
        """A progress line every `report_every` seconds in which a task ended here."""
        assert self.report_every is not None
        while True:
            await asyncio.sleep(self.report_every)
            self.progress.report()

    async def _prune_forever(self) -> None:
        """Prune when a run is due: checked at the start and four times per `every`, so the
        store's lease row lets one process of the fleet in about once per period."""
        every = self.app.retention.every
        assert every is not None
        pruner = Pruner(self.app, holder=self.name)
        while True:
            try:
                await pruner.run_if_due()
            except StoreUnavailable as error:
                log.warning("pruner: store unavailable (%s); trying at the next check", error)
            except Exception:
                log.exception("pruner: the run failed; trying at the next check")
            await asyncio.sleep(max(PRUNE_CHECK_MIN, every / PRUNE_CHECKS))

    async def _loop(self, until_idle: bool) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                wake_at, now = await self._fill()
                if self._crash is not None and self._fail_fast:
                    return
                if until_idle and not self._busy and await self._finished():
                    return
            except StoreUnavailable as error:
                await self._store_down(error)
                continue
            self._outage = 0
            await self._sleep(wake_at, now)

    async def _store_down(self, error: StoreUnavailable) -> None:
        """Keep running handlers going and try the store again after a growing pause."""
        self._outage += 1
        pause = min(OUTAGE_PAUSE_MAX, OUTAGE_PAUSE * 2 ** (self._outage - 1))
        log.warning("store unavailable (%s); trying again in %.1fs", error, pause)
        await asyncio.sleep(pause)

    @property
    def _busy(self) -> bool:
        return bool(self._running or self._polling or self._recording)

    async def _finished(self) -> bool:
        counts = await self.app.store.counts(kinds=list(self.app.definitions))
        return not any(counts[state] for state in ACTIVE)

    async def _fill(self) -> tuple[float | None, float]:
        """Claim work for free slots and remote checks that are due; return when to look again
        (store time) and the store's time now."""
        kinds = list(self.app.definitions)
        claimed = None
        # A slot frees when its handler returns; the outcome is written meanwhile (group
        # commit), but no more than `slots` outcomes wait to be written at once. The claim
        # for freed slots records the outcomes waiting by then, in its own transaction.
        completions = self._completions()
        room = self.classes.room(self._running_kinds()) if self.classes else {}
        if self.classes:
            kinds = self.classes.open_kinds(kinds, room)
        if kinds and self._may_claim():
            free = self.slots - len(self._running)
            ahead = self.prefetch.room(len(self._queued))
            within = self.classes.limits(room) if self.classes else ()
            memory = self.memory.room(self._charges())
            claimed = await self._claim(
                completions,
                free,
                kinds,
                within,
                alone=self._idle(completions),
                memory=memory,
                ahead=ahead,
            )
            # Every free slot filled (or every free one of a class): more may be ready, to
            # claim as soon as a slot frees.
            self._more = len(claimed.leases) >= free or bool(
                self.classes and self.classes.filled((x.task.kind for x in claimed.leases), room)
            )
            if self.classes and self.borrow and len(claimed.leases) < free:
                claimed = await self._borrow(completions, free, claimed, room, memory)
                self._more = self._more or len(claimed.leases) >= free
            self.prefetch.pace(len(claimed.leases), free, ahead)
            self._solo_waiting = claimed.solo_waiting
            for lease in claimed.leases:
                if lease.task.solo:  # it lost a lease beside others: it runs alone here
                    self._solo = lease.task_id
                self._leases[lease.task_id] = lease
                self._queued.append(lease)
            self.stats.claimed += len(claimed.leases)
            self.stats.claimed_ahead += max(0, len(claimed.leases) - free)
            self._start_queued()
            self._charge()
            self.stats.peak_busy = max(self.stats.peak_busy, len(self._running))
        else:
            completions.kick()
        if not self._claim_coming():
            completions.kick()  # outcomes left waiting that no claim is about to take
        now = claimed.now if claimed else await self.app.store.now()
        polls = await self._fill_polls(kinds, now)
        wake_at = earliest(claimed.wake_at if claimed else None, self._poll_due)
        return wake_at, polls.now if polls else now

    async def _claim(
        self,
        completions: Completions,
        free: int,
        kinds: list[str],
        within: Sequence[KindLimit],
        *,
        alone: bool,
        memory: MemoryRoom | None,
        ahead: int = 0,
    ) -> ClaimResult:
        taken = completions.take()
        self._claiming = True
        began = asyncio.get_running_loop().time()
        try:
            claimed = await self.app.store.claim(
                self.name,
                free,
                lease_for=self.lease_for,
                kinds=kinds,
                alone=alone,
                finished=taken.outcomes,
                within=within,
                memory=memory,
                ahead=ahead,
            )
        except Exception as error:  # none of the outcomes was recorded: their writers retry
            taken.fail(error)
            raise
        except BaseException as error:
            taken.fail(StoreUnavailable(f"claim interrupted ({type(error).__name__})"))
            raise
        finally:
            self._claiming = False
        self.prefetch.claimed(asyncio.get_running_loop().time() - began)
        taken.settle(claimed.finished)
        return claimed

    async def _borrow(
        self,
        completions: Completions,
        free: int,
        claimed: ClaimResult,
        room: Mapping[str, int],
        memory: MemoryRoom | None,
    ) -> ClaimResult:
        """A second claim, for classes whose room was full, in the slots other classes left
        idle (`ClassBudget.lendable`), within the memory the first claim left (`memory` less
        what it took); `claimed` with its leases added."""
        assert self.classes is not None
        lendable = self.classes.lendable((x.task.kind for x in claimed.leases), room)
        if not lendable:
            return claimed
        kinds = sorted({kind for limit in lendable for kind in limit.kinds})
        left = free - len(claimed.leases)
        memory = self.memory.after(memory, claimed.leases)
        more = await self._claim(completions, left, kinds, lendable, alone=False, memory=memory)
        self.stats.borrowed += len(more.leases)
        return replace(
            claimed,
            leases=(*claimed.leases, *more.leases),
            wake_at=earliest(claimed.wake_at, more.wake_at),
        )

    def _start_queued(self) -> None:
        """Start tasks claimed ahead in the slots that are free, in claim order."""
        while self._queued and len(self._running) < self.slots and not self._stopping:
            lease = self._queued.popleft()
            self._start(self._leases.get(lease.task_id, lease), self._running, self._execute)

    def _default_slots(self) -> int:
        """Without `slots`: 4, or with cost classes their slots, and 4 more for the app's
        unclassed stages if it has any."""
        if self.classes is None:
            return DEFAULT_SLOTS
        unclassed = any(kind not in self.classes.classes_of for kind in self.app.definitions)
        return self.classes.total + (DEFAULT_SLOTS if unclassed else 0)

    def _charges(self) -> list[int]:
        """What each running task that declared memory is charged: a task's charge ends with
        its slot (kept as tasks start and end, not read off every running task per task)."""
        return list(self._charged.values())

    def _leave(
        self, registry: dict[int, asyncio.Task[None]], task_id: int
    ) -> asyncio.Task[None] | None:
        """Take `task_id` out of `registry`; out of the running ones, its charge ends too."""
        if registry is self._running:
            self._charged.pop(task_id, None)
        return registry.pop(task_id, None)

    def _charge(self) -> None:
        """Count what the running tasks are charged."""
        now = sum(self._charges())
        self.stats.memory_charged = now
        self.stats.peak_memory_charged = max(self.stats.peak_memory_charged, now)

    def _running_kinds(self) -> list[str]:
        return [self._leases[i].task.kind for i in self._running if i in self._leases]

    def _may_claim(self) -> bool:
        if self._solo in self._running:
            return False  # a task that must run alone is running
        self._solo = None
        if self._draining():
            return False
        return self._room()

    def _draining(self) -> bool:
        """A task that must run alone waits for this worker: it lets what it holds finish."""
        return self._solo_waiting and not self._idle(self._completions())

    def _idle(self, completions: Completions) -> bool:
        """Nothing runs or waits to run here, and no outcome is being written apart from the
        claim about to carry the waiting ones: a task claimed now runs alone, and if it kills
        the process, the store finds no other task of this worker still running."""
        return not (self._running or self._queued or completions.writing)

    def _room(self) -> bool:
        """A free slot (or, with tasks claimed ahead, fewer than half of them still waiting),
        and no more outcomes waiting to be recorded than the worker may hold."""
        if len(self._running) >= self.slots and not self._low():
            return False
        self._backlog = self._completions().waiting > self._outcomes_held()
        return not self._backlog

    def _outcomes_held(self) -> int:
        """The most outcomes that wait to be written (or are being written) before the worker
        stops claiming and writes them on their own: its slots' worth, and while it claims
        ahead, two rounds' (those a claim carries, and those that end meanwhile)."""
        if not self.prefetch.ahead:
            return self.slots
        return 2 * (self.slots + self.prefetch.ahead)

    def _low(self) -> bool:
        """Tasks claimed ahead run low: half or fewer of those the worker holds ahead wait."""
        return self.prefetch.low(len(self._queued))

    def _claim_coming(self) -> bool:
        """Whether outcomes waiting now go with the claim the loop makes soon: it was woken (or
        is claiming, and more may be ready) and may claim, and other handlers still run. Once
        none does, the worker has nothing to do but wait for the store: the outcomes are
        written at once, beside the claim rather than inside it, so the two overlap. While
        tasks claimed ahead wait, a claim comes once they run low: outcomes wait for it too (as
        many as the worker may hold), so a round is one transaction; so do those that end
        while such a claim is on its way (the next one takes them), and those that end once
        the last of them ran but before the loop, woken for that claim, sent it (short tasks
        empty the queue in fewer loop turns than the wake-up takes: written on their own, 129
        of 145 rounds of a 20,000-task drain were two transactions)."""
        if self._stopping or self._outage or self._draining():
            return False
        coming = self._queued or self._claiming or self._wake.is_set()
        if coming and self._more and self.prefetch.ahead:
            return self._completions().waiting <= self._outcomes_held()
        if not self._running:
            return False
        return (
            (self._wake.is_set() or (self._claiming and self._more))
            and self._solo not in self._running
            and self._room()
        )

    async def _fill_polls(self, kinds: list[str], now: float) -> ClaimResult | None:
        # Ask only when a check may be due: the store said when, this worker just left a task
        # waiting (poll_due None), or `idle` passed (another process may have done so).
        if len(self._polling) >= self.poll_slots:
            return None
        due = self._poll_due
        if due is not None and now < min(due, self._polled_at + self.idle):
            return None
        free = self.poll_slots - len(self._polling)
        polls = await self.app.store.claim_polls(
            self.name, free, lease_for=self.lease_for, kinds=kinds
        )
        for lease in polls.leases:
            self._start(lease, self._polling, self._poll)
        self._polled_at = polls.now
        self._poll_due = polls.wake_at if not polls.leases else None
        if self._poll_due is None and not polls.leases:
            self._poll_due = polls.now + self.idle
        return polls

    def _start(
        self,
        lease: Lease,
        registry: dict[int, asyncio.Task[None]],
        body: Callable[[Lease], Coroutine[Any, Any, None]],
    ) -> None:
        self._leases[lease.task_id] = lease
        task = asyncio.create_task(body(lease), name=f"task-{lease.task_id}")
        registry[lease.task_id] = task
        if registry is self._running and lease.task.memory:
            self._charged[lease.task_id] = lease.task.memory

        def done(_: asyncio.Task[None]) -> None:
            # A slot freed now (not when its handler returned), or room for more outcomes.
            freed_now = self._leave(registry, lease.task_id) is not None
            recorded = self._recording.pop(lease.task_id, None) is not None
            self._leases.pop(lease.task_id, None)
            if freed_now:
                if registry is self._running:
                    self._start_queued()
                self._charge()
            if freed_now or (recorded and (self._backlog or self._solo_waiting)):
                self._wake.set()  # a slot, or room for more outcomes

        task.add_done_callback(done)

    async def _sleep(self, wake_at: float | None, now: float | None) -> None:
        delay = self.idle
        if wake_at is not None and now is not None:
            delay = min(delay, max(MIN_SLEEP, wake_at - now))
        if self._wake.is_set():
            return
        # Whichever comes first: work from this process, a notice from the store (another
        # process submitted or released), or the time the store said something comes due.
        waits = {
            asyncio.ensure_future(self._wake.wait()),
            asyncio.ensure_future(self.app.store.wait_for_work(delay)),
        }
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    # -- one attempt

    async def _execute(self, lease: Lease) -> None:
        definition = self.app.definition(lease.task.kind)
        ctx = Context(self.app, lease, self.name, await self.app.store.now())
        began = asyncio.get_running_loop().time()
        try:
            returned = await call(
                definition.handler,
                ctx,
                ctx.task.ref,
                is_async=definition.is_async,
                limit=self._limit(definition),
            )
            outcome = self._outcome(ctx, returned)
        except TaskFailure as failure:
            outcome = self._failed(lease, definition, failure)
        except LeaseLost:  # ctx.started() was refused: another worker owns the task now
            self._slot_freed(lease.task_id, self._running)
            self._abandoned(lease, "before its call")
            return
        except asyncio.CancelledError:
            await self._release(lease)
            raise
        except Exception as error:  # a handler bug: retried like a transient failure
            self._note_crash(error)
            outcome = self._failed(lease, definition, outcomes.unexpected(error))
        took = asyncio.get_running_loop().time() - began
        self.prefetch.ran(took)
        self._slot_freed(lease.task_id, self._running)
        await self._finish(lease, outcome, took)

    def _limit(self, definition: TaskDefinition) -> float | None:
        """Seconds an attempt of `definition` may take: the stage's limit, or the worker's."""
        return definition.options.timeout or self.timeout

    def _slot_freed(self, task_id: int, registry: dict[int, asyncio.Task[None]]) -> None:
        """The handler is done: its slot takes new work while its outcome is written (the lease
        and the gate tickets stay held until then)."""
        task = self._leave(registry, task_id)
        if task is not None:
            self._recording[task_id] = task
            freed = self.stats.memory_charged
            if registry is self._running:
                self._start_queued()
            self._charge()
            # Memory freed may make room for a task the last claim passed over.
            more_room = self.stats.memory_charged < freed
            claim_more = self._more and (len(self._running) < self.slots or self._low())
            solo_next = self._solo_waiting and self._idle(self._completions())
            if (
                registry is self._polling
                or task_id == self._solo
                or more_room
                or claim_more
                or solo_next
            ):
                self._wake.set()

    def _outcome(self, ctx: Context, returned: object) -> Outcome:
        if isinstance(returned, RemoteWait):
            if ctx.successors:
                raise ConfigError("spawn: successors of a remote wait are made by its poller")
            self._poll_due = None
            return AwaitRemote(returned.remote_id, returned.every, returned.timeout)
        if returned is not None and not isinstance(returned, Result):
            raise ConfigError(
                f"task {ctx.task.kind}: a handler returns None, Result or ctx.await_remote(...),"
                f" not {type(returned).__name__}"
            )
        cost = returned.cost if isinstance(returned, Result) else None
        return Succeeded(cost=cost, successors=tuple(ctx.successors))

    def _failed(self, lease: Lease, definition: TaskDefinition, failure: TaskFailure) -> Outcome:
        if failure.outage:
            return self._outage_retry(lease, definition, failure)
        retry_after = getattr(failure, "retry_after", None)
        decision = definition.options.retry.decide(
            lease.task.attempts_used, failure.error_class, self.rng, retry_after
        )
        error = AttemptError.of(failure.error_class, failure.code, failure.message)
        penalize = self._penalized(lease, failure) if decision.penalize else ()
        if decision.action is Action.DEAD:
            return Dead(error, penalize)
        self.stats.backoffs.append(decision.delay)
        return Retry(error, decision.delay, penalize)

    def _outage_retry(
        self, lease: Lease, definition: TaskDefinition, failure: TaskFailure
    ) -> Outcome:
        """A service the task needs is down: retried later, the attempt not counted, backing
        off by the attempts not counted so far (mostly earlier outages)."""
        task = lease.task
        outages = task.attempt - task.attempts_used + 1
        decision = definition.options.retry.after_outage(outages, self.rng)
        self.stats.backoffs.append(decision.delay)
        error = AttemptError.of(failure.error_class, failure.code, failure.message)
        return Retry(error, decision.delay, counted=False)

    def _penalized(self, lease: Lease, failure: TaskFailure) -> tuple[str, ...]:
        named = getattr(failure, "gate", None)
        if named is not None and named in lease.task.gates:
            return (named,)
        return self.app.rated_gates(lease.task.gates)

    async def _finish(self, lease: Lease, outcome: Outcome, took: float) -> None:
        try:
            try:
                await self._record(lease, outcome)
            except ConfigError as refused:  # e.g. a bad successor: the task cannot go on
                outcome = outcomes.refused(refused)
                await self._record(lease, outcome)
        except LeaseLost:
            self._abandoned(lease, "before its outcome was recorded")
            return
        finally:
            # Renewals stop here, not when the asyncio task's done-callback runs later.
            self._leases.pop(lease.task_id, None)
        self._count(outcome)
        level = outcomes.level(outcome)
        if log.isEnabledFor(level):  # a line per outcome: built only when it is written
            log.log(level, "%s", outcomes.describe(lease, outcome, took))
        # No wake-up from here: the store's own wait_for_work returns when a write made work
        # claimable (a ticket back, a task ready), so an outcome that freed nothing costs no claim.

    def _count(self, outcome: Outcome) -> None:
        if isinstance(outcome, Succeeded):
            self.stats.succeeded += 1
        elif isinstance(outcome, Retry):
            self.stats.retried += 1
        elif isinstance(outcome, Dead):
            self.stats.dead += 1
        elif isinstance(outcome, AwaitRemote):
            self.stats.remote_waits += 1

    def _abandoned(self, lease: Lease, when: str) -> None:
        self.stats.leases_lost += 1
        log.warning("task %s: lease lost %s; another worker owns it now", lease.task_id, when)

    async def _record(self, lease: Lease, outcome: Outcome) -> None:
        """Write the outcome, waiting out a store outage while the lease may still hold it."""
        pause = OUTAGE_PAUSE
        while True:
            try:
                await self._completions().finish(self._leases.get(lease.task_id, lease), outcome)
                return
            except StoreUnavailable as error:
                current = self._leases.get(lease.task_id, lease)
                log.warning("task %s: outcome not written yet (%s)", lease.task_id, error)
                if await self._lease_ran_out(current):
                    raise LeaseLost(lease.task_id) from error
                await asyncio.sleep(pause)
                pause = min(OUTAGE_PAUSE_MAX, pause * 2)

    async def _lease_ran_out(self, lease: Lease) -> bool:
        try:
            return await self.app.store.now() >= lease.until
        except StoreUnavailable:
            return False

    def _completions(self) -> Completions:
        if self._group_commit is None or self._group_commit.store is not self.app.store:
            self._group_commit = Completions(self.app.store, claim_coming=self._claim_coming)
        return self._group_commit

    async def _release(self, lease: Lease) -> None:
        """Hand an interrupted task back at once (shutdown), without waiting for its lease; a
        waiting task keeps its remote job, to be polled again."""
        error = AttemptError.of(ErrorClass.TRANSIENT, INTERRUPTED, "worker shut down")
        outcome: Outcome = Retry(error, delay=0.0)
        if lease.task.state is TaskState.WAITING:
            outcome = PollAgain(0.0)
        with contextlib.suppress(LeaseLost):
            await asyncio.shield(
                self.app.store.finish(self._leases.get(lease.task_id, lease), outcome)
            )

    def _note_crash(self, error: BaseException) -> None:
        # The traceback helps whoever fixes the handler; its messages may carry secrets.
        trace = redact("".join(traceback.format_exception(error)), limit=None)
        log.error("handler raised %s\n%s", type(error).__name__, trace)
        if self._crash is None:
            self._crash = error

    # -- remote waits

    async def _poll(self, lease: Lease) -> None:
        definition = self.app.definition(lease.task.kind)
        ctx = Context(self.app, lease, self.name, await self.app.store.now())
        began = asyncio.get_running_loop().time()
        self.stats.polls += 1
        try:
            outcome = await remote.check(definition, ctx, self._limit(definition))
        except TaskFailure as failure:
            if remote.settled(failure):
                outcome = self._failed(lease, definition, failure)  # a new job may be tried
            else:
                outcome = remote.check_failed(failure, ctx)  # the job's outcome still unknown
        except asyncio.CancelledError:
            await self._release(lease)
            raise
        except Exception as error:
            self._note_crash(error)
            outcome = remote.check_failed(outcomes.unexpected(error), ctx)
        self._slot_freed(lease.task_id, self._polling)
        await self._finish(lease, outcome, asyncio.get_running_loop().time() - began)

    # -- leases

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.renew_every)
            leases = list(self._leases.values())
            if not leases:
                continue
            try:
                renewed = await self.app.store.renew(leases, lease_for=self.lease_for)
            except StoreUnavailable as error:
                log.warning("lease renewal failed (%s); trying again", error)
                continue
            for old, new in zip(leases, renewed, strict=True):
                if old.task_id not in self._leases:
                    continue  # finished while the renewal was in flight
                if new is not None:
                    self._leases[old.task_id] = new
                elif old.task_id not in self._recording:
                    self._lost(old)
                # else: its outcome is being written and may have been committed before the
                # renewal ran; the write itself says whether the lease still held.

    def _lost(self, lease: Lease) -> None:
        """Another worker owns the task now: stop working on it here."""
        self.stats.leases_lost += 1
        log.warning("task %s: lease lost; abandoning the attempt", lease.task_id)
        waiting = [queued for queued in self._queued if queued.task_id == lease.task_id]
        for queued in waiting:  # claimed ahead and never started
            self._queued.remove(queued)
            self._leases.pop(lease.task_id, None)
        for registry in (self._running, self._polling):
            running = registry.get(lease.task_id)
            if running is not None:
                running.cancel()

    # -- shutdown

    async def _shutdown(self) -> None:
        pending = {*self._running.values(), *self._polling.values(), *self._recording.values()}
        if not pending:
            return
        # Until every handler is done, the grace period is over, or a second signal says hurry.
        everything = asyncio.ensure_future(asyncio.wait(pending))
        hurry = asyncio.ensure_future(self._hurry.wait())
        try:
            await asyncio.wait(
                {everything, hurry}, timeout=self.grace, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            everything.cancel()  # stops waiting; the handlers themselves are not cancelled
            hurry.cancel()
        late = [task for task in pending if not task.done()]
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _hand_back_queued(self) -> None:
        """Tasks claimed ahead that never started go back to the queue at once, in one write,
        their attempt not counted."""
        queued = list(self._queued)
        self._queued.clear()
        if not queued:
            return
        error = AttemptError.of(ErrorClass.TRANSIENT, INTERRUPTED, "worker shut down")
        unstarted = Retry(error, delay=0.0, counted=False)
        try:
            await asyncio.shield(
                self.app.store.finish_many([(lease, unstarted) for lease in queued])
            )
        except StoreUnavailable as down:
            log.warning("%d tasks claimed ahead not handed back (%s)", len(queued), down)
        finally:
            for lease in queued:
                self._leases.pop(lease.task_id, None)

    def _install_signals(self) -> Callable[[], None]:
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM)

        def on_signal() -> None:
            if self._stopping:  # a second signal: hand running tasks back now
                self._hurry.set()
            self.stop()

        for sig in signals:
            loop.add_signal_handler(sig, on_signal)

        def restore() -> None:
            for sig in signals:
                loop.remove_signal_handler(sig)

        return restore
