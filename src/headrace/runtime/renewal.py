"""A worker's lease renewal: every `renew_every` seconds, the leases of everything it holds in
one write; a lease the store refuses means another worker owns the task now."""

from __future__ import annotations

import asyncio
import logging

from headrace.policy.errors import StoreUnavailable
from headrace.runtime.app import App
from headrace.runtime.settings import WorkerSettings
from headrace.runtime.slots import Slots
from headrace.store.protocol.types import Lease

log = logging.getLogger("headrace.worker")


class Renewal:
    """Renews the leases of the tasks in `slots`."""

    def __init__(self, app: App, settings: WorkerSettings, slots: Slots) -> None:
        self.app = app
        self.settings = settings
        self.slots = slots

    async def forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.renew_every)
            leases = list(self.slots.leases.values())
            if not leases:
                continue
            try:
                renewed = await self.app.store.renew(leases, lease_for=self.settings.lease_for)
            except StoreUnavailable as error:
                log.warning("lease renewal failed (%s); trying again", error)
                continue
            self._renewed(leases, renewed)

    def _renewed(self, leases: list[Lease], renewed: list[Lease | None]) -> None:
        held = self.slots.leases
        for old, new in zip(leases, renewed, strict=True):
            if old.task_id not in held:
                continue  # finished while the renewal was in flight
            if new is not None:
                held[old.task_id] = new
            elif old.task_id not in self.slots.recording:
                self._lost(old)
            # else: its outcome is being written and may have been committed before the
            # renewal ran; the write itself says whether the lease still held.

    def _lost(self, lease: Lease) -> None:
        """Another worker owns the task now: stop working on it here."""
        self.slots.stats.leases_lost += 1
        log.warning("task %s: lease lost; abandoning the attempt", lease.task_id)
        self.slots.drop(lease.task_id)
