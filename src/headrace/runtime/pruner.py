"""The pruner: removes what an app's `Retention` says is old enough (store/protocol/pruning.py),
then runs the prune hooks its pipelines registered (`App.on_prune`: a pipeline's records and files,
its own sweeps), one process of a store at a time.

Workers run it every `retention.every` (`Worker` checks a few times per period; the store's
lease row says whether a run is due and lets one process in), `headrace prune` runs it at once.
A run logs one INFO line saying what it removed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from headrace.policy.errors import PrunerBusy
from headrace.policy.retention import Retention
from headrace.runtime.app import App
from headrace.runtime.prunehooks import PruneRun

log = logging.getLogger("headrace.pruner")

# Seconds a run holds the lease; renewed after each step, so a run that outlives it is rare.
LEASE = 600.0


@dataclass(frozen=True)
class PruneReport:
    """What a run removed (or, `dry_run`, would), per kind in the order it went: the store's
    rows, then what the hooks removed; and the store's transactions that removed rows."""

    removed: Mapping[str, int] = field(default_factory=dict)
    batches: int = 0
    dry_run: bool = False

    @property
    def total(self) -> int:
        return sum(self.removed.values())

    def line(self) -> str:
        """The run in one line, as the log says it."""
        verb = "would remove" if self.dry_run else "removed"
        found = [f"{label} {count}" for label, count in self.removed.items() if count]
        said = ", ".join(found) if found else "nothing"
        return f"pruner {verb} {said} ({batches(self.batches)})"


def batches(count: int) -> str:
    """`1 store batch`, `3 store batches`."""
    return f"{count} store batch" + ("" if count == 1 else "es")


class Pruner:
    """Prunes an app's store under the lease of `holder` (a worker's name)."""

    def __init__(self, app: App, *, holder: str, retention: Retention | None = None) -> None:
        self.app = app
        self.holder = holder
        self.retention = retention or app.retention

    async def run(self, *, dry_run: bool = False) -> PruneReport:
        """Prune now, whenever the last run was. A dry run takes no lease and writes nothing.
        Raises PrunerBusy when another process prunes."""
        if dry_run:
            return await self._prune(dry_run=True)
        store = await self.app.open()
        if not await store.take_pruner(self.holder, lease_for=LEASE):
            raise await self._busy()
        return await self._held()

    async def run_if_due(self) -> PruneReport | None:
        """Prune if a run is due (the last one ended `retention.every` ago) and no other
        process prunes; None when not."""
        every = self.retention.every
        store = await self.app.open()
        if every is None or not await store.take_pruner(self.holder, lease_for=LEASE, every=every):
            return None
        return await self._held()

    async def _held(self) -> PruneReport:
        """A run under the lease, given back however it ends."""
        store = self.app.store
        removed = None
        try:
            report = await self._prune(dry_run=False)
            removed = report.total
        finally:
            await store.release_pruner(self.holder, removed=removed)
        log.info("%s", report.line())
        return report

    async def _prune(self, *, dry_run: bool) -> PruneReport:
        store = await self.app.open()
        run = PruneRun(self.retention, dry_run, await store.now())
        pruned = await store.prune(self.retention, dry_run=dry_run)
        removed = dict(pruned.removed)
        for hook in self.app.prune_hooks:
            if not dry_run:
                await store.take_pruner(self.holder, lease_for=LEASE)  # renewed: still ours
            for label, count in (await hook(run)).items():
                removed[label] = removed.get(label, 0) + count
        return PruneReport(removed, pruned.batches, dry_run)

    async def _busy(self) -> PrunerBusy:
        held = await self.app.store.pruner_state()
        now = await self.app.store.now()
        if held is None:  # released between the two reads: say so, the caller may try again
            return PrunerBusy("another process", 0.0)
        return PrunerBusy(held.holder, held.until - now)
