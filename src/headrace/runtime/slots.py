"""A worker's slots: the tasks it claimed ahead, runs, checks (remote waits) and writes the
outcomes of, with their leases and memory charges, and what these say about claiming now.

A slot frees when its handler returns; the outcome is written meanwhile (group commit,
runtime/completions.py), but no more than the worker may hold wait to be written at once. The
claim for freed slots records the outcomes waiting by then, in its own transaction.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from headrace.runtime.app import App
from headrace.runtime.completions import Completions
from headrace.runtime.prefetch import Prefetch
from headrace.runtime.settings import WorkerSettings
from headrace.runtime.stats import WorkerStats
from headrace.store.protocol.types import ClaimResult, Lease

Body = Callable[[Lease], Coroutine[Any, Any, None]]
Registry = dict[int, asyncio.Task[None]]


@dataclass
class LoopState:
    """What the worker's loop shares with its parts: `wake` ends its sleep (a slot freed, room
    for outcomes, `stop()`), `stopping` once it stops claiming, `outage` while the store is
    down (store errors in a row)."""

    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    outage: int = 0


class Slots:
    """The worker's tasks in hand by task id; `execute` runs a task claimed into a slot."""

    def __init__(
        self,
        app: App,
        settings: WorkerSettings,
        stats: WorkerStats,
        state: LoopState,
        execute: Body,
    ) -> None:
        self.app = app
        self.size = settings.slots
        self.stats = stats
        self.state = state
        self.execute = execute
        self.prefetch = Prefetch(settings.prefetch, settings.slots)
        self.queued: deque[Lease] = deque()  # claimed ahead, in claim order, not started
        self.running: Registry = {}
        self.charged: dict[int, int] = {}  # running tasks' memory charges, by task id
        self.polling: Registry = {}
        self.recording: Registry = {}  # outcomes being written, no slot
        self.leases: dict[int, Lease] = {}
        self.more = False  # the last claim filled every free slot
        self.claiming = False  # a claim (with the outcomes it records) is in flight
        self.backlog = False  # claiming stopped: more outcomes wait than the worker may hold
        self.solo: int | None = None  # a task running alone: nothing else is claimed meanwhile
        # The last claim passed over a task that must run alone: nothing new is claimed until
        # this worker runs nothing, then it claims alone.
        self.solo_waiting = False
        self._group_commit: Completions | None = None

    def completions(self) -> Completions:
        if self._group_commit is None or self._group_commit.store is not self.app.store:
            self._group_commit = Completions(self.app.store, claim_coming=self.claim_coming)
        return self._group_commit

    @property
    def busy(self) -> bool:
        return bool(self.running or self.polling or self.recording)

    def pending(self) -> set[asyncio.Task[None]]:
        return {*self.running.values(), *self.polling.values(), *self.recording.values()}

    # -- tasks in and out

    def took(self, claimed: ClaimResult, free: int) -> None:
        """Hold what a claim for `free` slots returned, and start what the slots take."""
        self.solo_waiting = claimed.solo_waiting
        for lease in claimed.leases:
            if lease.task.solo:  # it lost a lease beside others: it runs alone here
                self.solo = lease.task_id
            self.leases[lease.task_id] = lease
            self.queued.append(lease)
        self.stats.claimed += len(claimed.leases)
        self.stats.claimed_ahead += max(0, len(claimed.leases) - free)
        self.start_queued()
        self.charge()
        self.stats.peak_busy = max(self.stats.peak_busy, len(self.running))

    def start_queued(self) -> None:
        """Start tasks claimed ahead in the slots that are free, in claim order."""
        while self.queued and len(self.running) < self.size and not self.state.stopping:
            lease = self.queued.popleft()
            self.start(self.leases.get(lease.task_id, lease), self.running, self.execute)

    def start(self, lease: Lease, registry: Registry, body: Body) -> None:
        self.leases[lease.task_id] = lease
        task = asyncio.create_task(body(lease), name=f"task-{lease.task_id}")
        registry[lease.task_id] = task
        if registry is self.running and lease.task.memory:
            self.charged[lease.task_id] = lease.task.memory
        task.add_done_callback(lambda _: self._done(registry, lease.task_id))

    def _done(self, registry: Registry, task_id: int) -> None:
        """The asyncio task ended: a slot freed now (not when its handler returned), or room
        for more outcomes."""
        freed_now = self._leave(registry, task_id) is not None
        recorded = self.recording.pop(task_id, None) is not None
        self.leases.pop(task_id, None)
        if freed_now:
            if registry is self.running:
                self.start_queued()
            self.charge()
        if freed_now or (recorded and (self.backlog or self.solo_waiting)):
            self.state.wake.set()  # a slot, or room for more outcomes

    def freed(self, task_id: int, registry: Registry) -> None:
        """The handler is done: its slot takes new work while its outcome is written (the lease
        and the gate tickets stay held until then)."""
        task = self._leave(registry, task_id)
        if task is None:
            return
        self.recording[task_id] = task
        charged = self.stats.memory_charged
        if registry is self.running:
            self.start_queued()
        self.charge()
        # Memory freed may make room for a task the last claim passed over.
        more_room = self.stats.memory_charged < charged
        claim_more = self.more and (len(self.running) < self.size or self.low())
        solo_next = self.solo_waiting and self.idle(self.completions())
        if registry is self.polling or task_id == self.solo or more_room or claim_more or solo_next:
            self.state.wake.set()

    def _leave(self, registry: Registry, task_id: int) -> asyncio.Task[None] | None:
        """Take `task_id` out of `registry`; out of the running ones, its charge ends too."""
        if registry is self.running:
            self.charged.pop(task_id, None)
        return registry.pop(task_id, None)

    def drop(self, task_id: int) -> None:
        """Another worker owns the task now: forget it if it waits here, cancel it if it runs."""
        for queued in [lease for lease in self.queued if lease.task_id == task_id]:
            self.queued.remove(queued)  # claimed ahead and never started
            self.leases.pop(task_id, None)
        for registry in (self.running, self.polling):
            running = registry.get(task_id)
            if running is not None:
                running.cancel()

    # -- memory and cost classes

    def charges(self) -> list[int]:
        """What each running task that declared memory is charged: a task's charge ends with
        its slot (kept as tasks start and end, not read off every running task per task)."""
        return list(self.charged.values())

    def charge(self) -> None:
        """Count what the running tasks are charged."""
        now = sum(self.charges())
        self.stats.memory_charged = now
        self.stats.peak_memory_charged = max(self.stats.peak_memory_charged, now)

    def running_kinds(self) -> list[str]:
        return [self.leases[i].task.kind for i in self.running if i in self.leases]

    # -- whether to claim

    def may_claim(self) -> bool:
        if self.solo in self.running:
            return False  # a task that must run alone is running
        self.solo = None
        if self.draining():
            return False
        return self.room()

    def draining(self) -> bool:
        """A task that must run alone waits for this worker: it lets what it holds finish."""
        return self.solo_waiting and not self.idle(self.completions())

    def idle(self, completions: Completions) -> bool:
        """Nothing runs or waits to run here, and no outcome is being written apart from the
        claim about to carry the waiting ones: a task claimed now runs alone, and if it kills
        the process, the store finds no other task of this worker still running."""
        return not (self.running or self.queued or completions.writing)

    def room(self) -> bool:
        """A free slot (or, with tasks claimed ahead, fewer than half of them still waiting),
        and no more outcomes waiting to be recorded than the worker may hold."""
        if len(self.running) >= self.size and not self.low():
            return False
        self.backlog = self.completions().waiting > self.outcomes_held()
        return not self.backlog

    def outcomes_held(self) -> int:
        """The most outcomes that wait to be written (or are being written) before the worker
        stops claiming and writes them on their own: its slots' worth, and while it claims
        ahead, two rounds' (those a claim carries, and those that end meanwhile)."""
        if not self.prefetch.ahead:
            return self.size
        return 2 * (self.size + self.prefetch.ahead)

    def low(self) -> bool:
        """Tasks claimed ahead run low: half or fewer of those the worker holds ahead wait."""
        return self.prefetch.low(len(self.queued))

    def claim_coming(self) -> bool:
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
        if self.state.stopping or self.state.outage or self.draining():
            return False
        woken = self.state.wake.is_set()
        if (self.queued or self.claiming or woken) and self.more and self.prefetch.ahead:
            return self.completions().waiting <= self.outcomes_held()
        if not self.running:
            return False
        return (
            (woken or (self.claiming and self.more))
            and self.solo not in self.running
            and self.room()
        )
