"""What a pruner's run reports (`Store.prune`: `Pruned`, by the kinds of row below) and its
lease (`PrunerState`); what it removes, in what order, is the machine's (store/machine/plans.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

UPSTREAM_PRUNED = "upstream_pruned"  # cancelled for a task since pruned: no longer restorable

# Record kinds headrace itself writes, and the retention age each goes by (the modules that
# write them name them too: service/api/auth.py LOGIN, service/api/webhooks.py DELIVERY,
# runtime/remote.py REMOTE; a test pins that they agree).
LOGIN = "login"
DELIVERY = "delivery"
REMOTE = "remote"

# What a run reports, per kind of row removed (or, in a dry run, that would be).
SUCCEEDED_TASKS = "succeeded tasks"
CANCELLED_TASKS = "cancelled tasks"
DEAD_TASKS = "dead tasks"
ATTEMPTS = "attempts"
NOTICES = "delivered notices"
AUDIT_ROWS = "audit rows"
SIGN_INS = "sign-ins"
DELIVERIES = "webhook deliveries"


LABELS = (
    SUCCEEDED_TASKS,
    CANCELLED_TASKS,
    DEAD_TASKS,
    ATTEMPTS,
    NOTICES,
    AUDIT_ROWS,
    SIGN_INS,
    DELIVERIES,
)


@dataclass(frozen=True)
class Pruned:
    """A run's result: rows removed (or, in a dry run, that would be) per kind, in the order
    they went, and the transactions that removed them."""

    removed: Mapping[str, int] = field(default_factory=dict)
    batches: int = 0

    @property
    def total(self) -> int:
        return sum(self.removed.values())

    def plus(self, removed: Mapping[str, int], batches: int = 0) -> Pruned:
        merged = dict(self.removed)
        for label, count in removed.items():
            merged[label] = merged.get(label, 0) + count
        return Pruned(merged, self.batches + batches)


@dataclass(frozen=True)
class PrunerState:
    """The pruner's lease row: who holds (or last held) it, until when, when a run last ended
    and how many rows it removed."""

    holder: str
    until: float
    done_at: float | None
    removed: int
