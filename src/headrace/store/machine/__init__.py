"""The store's state machine, written once (`Transaction`), in layers by concern, each built on
the one before: core.py (the driver, statements, clock, gate rows), tickets.py (gate tickets,
dependency trees), submit.py, outcomes.py (what lease holders write; cancellation, reaping),
claim.py, and transaction.py (the reads, and the whole)."""

from headrace.store.machine.claim import Claimed, LeasedRows, SweepDue
from headrace.store.machine.core import (
    AGING_SLACK,
    CLAIM_BATCH,
    FOLD_EVERY,
    SWEEP_EVERY,
    Driver,
    GateRows,
    Json,
    Pending,
    Sweeps,
)
from headrace.store.machine.submit import Planned, check_gates, task_row
from headrace.store.machine.transaction import Transaction

__all__ = [
    "AGING_SLACK",
    "CLAIM_BATCH",
    "FOLD_EVERY",
    "SWEEP_EVERY",
    "Claimed",
    "Driver",
    "GateRows",
    "Json",
    "LeasedRows",
    "Pending",
    "Planned",
    "SweepDue",
    "Sweeps",
    "Transaction",
    "check_gates",
    "task_row",
]
