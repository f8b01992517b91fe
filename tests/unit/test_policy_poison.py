"""The poison verdict: a task is charged a death only when it ran alone."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from headrace.policy.poison import Expiry, verdict


def test_a_death_beside_others_is_never_charged() -> None:
    """However many leases it lost and however spent its budget, a task that died beside others
    runs again, alone."""
    assert (
        verdict(alone=False, expiries=9, poison_expiries=3, attempts_used=5, max_attempts=5)
        is Expiry.SOLO
    )


def test_a_task_that_kills_its_worker_alone_is_poison_at_the_limit() -> None:
    common = {"poison_expiries": 3, "attempts_used": 1, "max_attempts": 5}
    assert verdict(alone=True, expiries=2, **common) is Expiry.REQUEUE
    assert verdict(alone=True, expiries=3, **common) is Expiry.POISON


def test_an_alone_death_with_its_attempts_spent_is_dead() -> None:
    assert (
        verdict(alone=True, expiries=1, poison_expiries=3, attempts_used=2, max_attempts=2)
        is Expiry.SPENT
    )


@given(st.lists(st.booleans(), min_size=1, max_size=20))
def test_a_poison_task_is_dead_within_the_limit_once_it_runs_alone(alone: list[bool]) -> None:
    """A poison task's first death may be beside others; from then on it runs alone (`SOLO`),
    so it is dead after at most `poison_expiries` deaths: three with the default."""
    expiries, shared_first = 0, not alone[0]
    history = [not shared_first] + [True] * 10  # after a shared death it always runs alone
    for ran_alone in history:
        expiries += 1
        found = verdict(
            alone=ran_alone, expiries=expiries, poison_expiries=3, attempts_used=0, max_attempts=99
        )
        if found is Expiry.POISON:
            break
    assert expiries <= 3
