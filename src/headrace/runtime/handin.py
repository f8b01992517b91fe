"""How a worker hands outcomes to the store: through the group commit (runtime/completions.py),
waiting out an outage while the lease may still hold; and at shutdown, what it holds goes back
at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection

from headrace.policy.errors import ErrorClass, LeaseLost, StoreUnavailable
from headrace.runtime.app import App
from headrace.runtime.slots import Slots
from headrace.store.protocol.types import AttemptError, Lease, Outcome, PollAgain, Retry, TaskState

log = logging.getLogger("headrace.worker")

INTERRUPTED = "interrupted"
OUTAGE_PAUSE = 0.25
OUTAGE_PAUSE_MAX = 5.0


class HandIn:
    """Writes the outcomes of the tasks in `slots` (their leases as last renewed)."""

    def __init__(self, app: App, slots: Slots) -> None:
        self.app = app
        self.slots = slots

    def _current(self, lease: Lease) -> Lease:
        return self.slots.leases.get(lease.task_id, lease)

    async def record(self, lease: Lease, outcome: Outcome) -> None:
        """Write the outcome, waiting out a store outage while the lease may still hold it."""
        pause = OUTAGE_PAUSE
        while True:
            try:
                await self.slots.completions().finish(self._current(lease), outcome)
                return
            except StoreUnavailable as error:
                log.warning("task %s: outcome not written yet (%s)", lease.task_id, error)
                if await self._ran_out(self._current(lease)):
                    raise LeaseLost(lease.task_id) from error
                await asyncio.sleep(pause)
                pause = min(OUTAGE_PAUSE_MAX, pause * 2)

    async def _ran_out(self, lease: Lease) -> bool:
        try:
            return await self.app.store.now() >= lease.until
        except StoreUnavailable:
            return False

    async def release(self, lease: Lease) -> None:
        """Hand an interrupted task back at once (shutdown), without waiting for its lease; a
        waiting task keeps its remote job, to be polled again."""
        error = AttemptError.of(ErrorClass.TRANSIENT, INTERRUPTED, "worker shut down")
        outcome: Outcome = Retry(error, delay=0.0)
        if lease.task.state is TaskState.WAITING:
            outcome = PollAgain(0.0)
        with contextlib.suppress(LeaseLost):
            await asyncio.shield(self.app.store.finish(self._current(lease), outcome))

    async def hand_back_queued(self) -> None:
        """Tasks claimed ahead that never started go back to the queue at once, in one write,
        their attempt not counted."""
        queued = list(self.slots.queued)
        self.slots.queued.clear()
        if queued:
            await self._hand_back(queued)

    async def _hand_back(self, queued: Collection[Lease]) -> None:
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
                self.slots.leases.pop(lease.task_id, None)
