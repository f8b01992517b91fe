"""Start-time fair queueing across flows.

Every task gets a start tag when it is created: `max(virtual time, its flow's last finish tag)`,
and its flow's finish tag moves on by `1 / weight`. Dispatch takes the smallest tag first (within
a tier) and moves the virtual time to the tag it dispatched. So flows that both have ready work
take turns in proportion to their weights, whatever each submitted, and a flow that was idle
comes back at the current virtual time rather than with saved-up credit.
"""

from __future__ import annotations

from dataclasses import dataclass

from headrace.policy.errors import ConfigError

SERVICE_PER_TASK = 1.0


@dataclass(frozen=True)
class Tagged:
    start: float
    flow_finish: float


def check_weight(weight: float) -> float:
    if isinstance(weight, bool) or not weight > 0 or weight == float("inf"):
        raise ConfigError(f"flow weight: expected a positive number, got {weight!r}")
    return float(weight)


def tag(virtual_time: float, flow_finish: float, weight: float = 1.0) -> Tagged:
    """The start tag of a new task and its flow's finish tag afterwards."""
    start = max(virtual_time, flow_finish)
    return Tagged(start=start, flow_finish=start + SERVICE_PER_TASK / check_weight(weight))


def advance(virtual_time: float, dispatched_tag: float) -> float:
    """The virtual time after dispatching a task tagged `dispatched_tag`."""
    return max(virtual_time, dispatched_tag)
