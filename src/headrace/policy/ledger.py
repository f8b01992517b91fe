"""What a succeeded task costs its group: the units it reported, else those it was submitted
with. The ledger keeps units per group and kind; a store adds them as tasks succeed."""

from __future__ import annotations


def units_spent(submitted: float, reported: float | None) -> float:
    """The units a success adds to its group's ledger."""
    return submitted if reported is None else reported
