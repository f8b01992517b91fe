"""How long a worker's lease lasts and how often the worker renews it.

A lease that runs out while its holder still works makes the task ready for another worker, so
the holder must renew it before then: the renewal interval is shorter than the lease, by default
a third of it (two renewals may fail before the lease is lost).
"""

from __future__ import annotations

from headrace.policy.durations import Duration, positive_seconds
from headrace.policy.errors import ConfigError

RENEWALS_PER_LEASE = 3


def lease_timing(lease: Duration, renew: Duration | None = None) -> tuple[float, float]:
    """A lease's length and how often its holder renews it (default: a third of the length),
    in seconds; a renewal must come before the lease runs out."""
    lease_for = positive_seconds(lease, field="worker.lease")
    if renew is None:
        if not lease_for / RENEWALS_PER_LEASE > 0:  # a third of it rounds to nothing
            raise ConfigError(f"worker.lease: too short to be renewed, got {lease!r}")
        return lease_for, lease_for / RENEWALS_PER_LEASE
    renew_every = positive_seconds(renew, field="worker.renew")
    if renew_every >= lease_for:
        raise ConfigError(
            f"worker.renew: must be shorter than worker.lease ({lease!r}) so that a lease is "
            f"renewed before it runs out, got {renew!r}"
        )
    return lease_for, renew_every
