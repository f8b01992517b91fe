"""What a pipeline's prune hook is given and returns (`App.on_prune`; runtime/pruner.py runs
them): values only, so the app declares its hooks without importing the pruner."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from headrace.policy.retention import Retention


@dataclass(frozen=True)
class PruneRun:
    """What a prune hook is given: the ages to apply, whether to count only (`dry_run`: change
    nothing, say what would go), and the store's time the run started at."""

    retention: Retention
    dry_run: bool
    now: float


# A prune hook returns how many of each kind of thing it removed (or would), by kind name.
PruneHook = Callable[[PruneRun], Awaitable[Mapping[str, int]]]
