"""What a lost lease does to its task: the poison verdict.

A worker that dies takes every task it was running with it, but at most one of them killed it.
So a task is charged a death only when it ran alone: a task whose lease expired beside others
is made to run alone next (`solo`), and that attempt does not count against its budget. A task
that keeps killing its worker when alone is poison: dead after `poison_expiries` lost leases,
the last of them alone. A healthy neighbour is never dead-lettered for another task's crash.
"""

from __future__ import annotations

import enum


class Expiry(enum.Enum):
    REQUEUE = "requeue"  # ready again at once
    SOLO = "solo"  # ready again, to run alone; the lost attempt does not count
    POISON = "poison"  # dead: it keeps killing its workers
    SPENT = "spent"  # dead: its attempts are spent


def verdict(
    *, alone: bool, expiries: int, poison_expiries: int, attempts_used: int, max_attempts: int
) -> Expiry:
    """The verdict on a task whose lease just expired; `expiries` counts this one, `alone` says
    whether its worker was running nothing else."""
    if not alone:
        return Expiry.SOLO
    if expiries >= poison_expiries:
        return Expiry.POISON
    if attempts_used >= max_attempts:
        return Expiry.SPENT
    return Expiry.REQUEUE
