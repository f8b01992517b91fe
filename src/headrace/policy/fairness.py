"""Start-time fair queueing across flows.

Every task gets a start tag when it is created: `max(virtual time, its flow's last finish tag)`,
and its flow's finish tag moves on by `1 / weight`. Dispatch takes the smallest tag first (within
a tier) and moves the virtual time to the tag it dispatched. So flows that both have ready work
take turns in proportion to their weights, whatever each submitted, and a flow that was idle
comes back at the current virtual time rather than with saved-up credit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from headrace.policy.errors import ConfigError

C = TypeVar("C")

SERVICE_PER_TASK = 1.0


@dataclass(frozen=True)
class Tagged:
    start: float
    flow_finish: float


def check_weight(weight: float) -> float:
    if isinstance(weight, bool) or not weight > 0 or weight == float("inf"):
        raise ConfigError(f"flow weight: expected a positive number, got {weight!r}")
    return float(weight)


def service(weight: float = 1.0) -> float:
    """How far a task of this weight moves its flow's finish tag."""
    return SERVICE_PER_TASK / check_weight(weight)


def tag(
    virtual_time: float, flow_finish: float, weight: float = 1.0, continues: float | None = None
) -> Tagged:
    """The start tag of a new task and its flow's finish tag afterwards. (The PostgreSQL
    store's one-statement submit applies the same rule in SQL, with `service` from here.)

    `continues`: the tag of the task whose work this one carries on (the next stage of the
    same item). It takes no new turn from its flow and does not queue behind its flow's
    backlog: it starts just after the virtual time (or that tag, if later). So an item started
    goes through its stages before its flow's later items start, and a flow that joins now
    (tagged at the virtual time) still goes before it: work in progress never keeps a
    newcomer's first task waiting."""
    if continues is not None:
        start = math.nextafter(max(virtual_time, continues), math.inf)
        return Tagged(start=start, flow_finish=flow_finish)
    start = max(virtual_time, flow_finish)
    return Tagged(start=start, flow_finish=start + service(weight))


def advance(virtual_time: float, dispatched_tag: float) -> float:
    """The virtual time after dispatching a task tagged `dispatched_tag`."""
    return max(virtual_time, dispatched_tag)


def take_turns(
    candidates: Iterable[C],
    rank: Callable[[C], tuple[float, ...]],
    flow: Callable[[C], str],
    last_served: Callable[[str], int],
) -> Iterator[C]:
    """`candidates` in `rank` order, except that among candidates of equal rank (the same tier
    and tag) the flow served least recently goes first, a flow never served first of all.

    Equal tags are a round: each flow has at most one task in it. Taking the round in
    least-recently-served order is what keeps two equal flows within one dispatch of each other
    when one of them joins while the other is being served (plain SFQ allows two)."""
    for _, tied in itertools.groupby(candidates, rank):
        yield from sorted(tied, key=lambda candidate: last_served(flow(candidate)))
