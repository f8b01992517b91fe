"""A worker's remote-job checks: claimed into their own slots (`poll_slots`) only when one may
be due, so a worker with nothing waiting does not ask the store at every turn."""

from __future__ import annotations

from headrace.runtime.app import App
from headrace.runtime.settings import WorkerSettings
from headrace.runtime.slots import Body, Slots
from headrace.store.protocol.types import ClaimResult


class Polls:
    """Claims the checks that are due into `slots.polling`; `check` runs one."""

    def __init__(self, app: App, settings: WorkerSettings, slots: Slots, check: Body) -> None:
        self.app = app
        self.settings = settings
        self.slots = slots
        self.check = check
        self.due: float | None = None  # store time the next remote check may be due
        self._polled_at = float("-inf")

    def waiting(self) -> None:
        """A task of this worker just began waiting on a remote job: ask at the next turn."""
        self.due = None

    async def fill(self, kinds: list[str], now: float) -> ClaimResult | None:
        """Claim the checks that are due for the free poll slots; None when none may be."""
        # Ask only when a check may be due: the store said when, this worker just left a task
        # waiting (due None), or `idle` passed (another process may have done so).
        polling = self.slots.polling
        if len(polling) >= self.settings.poll_slots:
            return None
        if self.due is not None and now < min(self.due, self._polled_at + self.settings.idle):
            return None
        free = self.settings.poll_slots - len(polling)
        polls = await self.app.store.claim_polls(
            self.settings.name, free, lease_for=self.settings.lease_for, kinds=kinds
        )
        for lease in polls.leases:
            self.slots.start(lease, polling, self.check)
        self._polled_at = polls.now
        self.due = polls.wake_at if not polls.leases else None
        if self.due is None and not polls.leases:
            self.due = polls.now + self.settings.idle
        return polls
