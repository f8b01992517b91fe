"""The store's state machine, written once: every verb's transaction (submit, claim, the
outcomes, start stamps, renewals, cancel, redrive, reaping, the reads) as steps over named
statements, a module of plain functions per family of verbs over one `Transaction` (core.py:
the driver, statements, clock, gate rows and what the transaction writes at its end):
tickets.py (gate tickets, dependency trees), submit.py, outcomes.py (what lease holders write;
cancellation, reaping, remote jobs), claim.py, records.py, pruning.py (and named leases) and
reads.py. A backend is a `Driver`: it runs a named statement of its own dialect and hands back
its rows. `memory://` runs it too, on SQLite's in-memory database: there is no other copy.

Writers lock rows in one order: tasks (by id), then gates (by name), then flows (by name), then
the store-wide counters, and the cost ledger (a row per group, kind and worker) last. An outcome
(or a batch of them) locks all it will touch before it writes anything. Where a claim discovers
a gate out of that order it takes the row only if it is free. On a database with row locks
(PostgreSQL) the `lock_*` statements take them; on one that serialises writers (SQLite) they
only read.

Time: with no clock given, every lease, run_at and gate time is the server's clock read in the
transaction (again after waiting for gate rows), so hosts with skewed clocks agree; with a
clock (a test's, or SQLite's) its value is used in the same statements.

Statements whose rows are not read are sent without waiting (`run`); a driver in pipeline mode
sends them with the next statement whose rows are read."""

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
    Transaction,
)
from headrace.store.machine.submit import Planned, check_gates, task_row

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
