"""Lease timing: a lease is longer than zero and renewed before it runs out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.policy.errors import ConfigError
from headrace.policy.leases import RENEWALS_PER_LEASE, lease_timing

durations = st.floats(-10.0, 1e6, allow_nan=False) | st.integers(-10, 10**6)


@given(durations, st.none() | durations)
@settings(max_examples=500, deadline=None)
def test_a_lease_timing_renews_before_the_lease_runs_out(lease: float, renew: float | None) -> None:
    valid = lease / RENEWALS_PER_LEASE > 0 if renew is None else 0 < renew < lease
    if not valid:
        with pytest.raises(ConfigError, match=r"^worker\.(lease|renew): "):
            lease_timing(lease, renew)
        return
    lease_for, renew_every = lease_timing(lease, renew)
    assert lease_for == lease
    assert 0 < renew_every < lease_for
    assert renew_every == (lease / RENEWALS_PER_LEASE if renew is None else renew)


def test_durations_are_read_as_everywhere() -> None:
    assert lease_timing("30s") == (30.0, 10.0)
    assert lease_timing("1m", "45s") == (60.0, 45.0)
    assert lease_timing("500ms", 0.25) == (0.5, 0.25)
