"""Start-time fair queueing across flows.

Every task gets a start tag when it is created: `max(virtual time, its flow's last finish tag)`,
and its flow's finish tag moves on by `1 / weight`. Dispatch takes the smallest tag first (within
a tier) and moves the virtual time to the tag it dispatched. So flows that both have ready work
take turns in proportion to their weights, whatever each submitted, and a flow that was idle
comes back at the current virtual time rather than with saved-up credit.

A task that carries an item on to its next stage (`continues`) is tagged in its flow's lane for
that stage instead: each stage is a fair queue of its own, with the same virtual time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from headrace.policy.errors import ConfigError

C = TypeVar("C")

SERVICE_PER_TASK = 1.0
LANE_SEPARATOR = "\x1f"  # between a flow and a stage in a lane's name


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
    """The start tag of a new task and the finish tag of its lane afterwards (see `lane`). (The
    PostgreSQL store's one-statement submit applies the same rule in SQL, with `service` from
    here.)

    `continues`: the tag of the task whose work this one carries on (the next stage of the
    same item). It takes no new turn in its flow and does not queue behind its flow's backlog:
    its lane is its flow's at that stage, where it starts at the virtual time (or that tag, if
    later) unless the flow's earlier items at that stage are still ahead of it. So an item
    started goes through its stages before its flow's later items start, and at every stage the
    flows take turns: a flow with many items in flight has one of them in each round, not all of
    them. Within a round, a lane never served goes first (`take_turns`): a flow that joins now,
    and then its item at each next stage."""
    start = max(virtual_time, flow_finish)
    if continues is not None:
        start = max(start, continues)
    return Tagged(start=start, flow_finish=start + service(weight))


def lane(flow: str, kind: str, continues: float | None) -> str:
    """Whose finish tag a task's tag is drawn from and moves: its flow's, or for a task that
    carries an item on (`continues`), its flow's at that stage (its kind). The stores keep lanes
    beside flows, under this name."""
    return flow if continues is None else f"{flow}{LANE_SEPARATOR}{kind}"


def advance(virtual_time: float, dispatched_tag: float) -> float:
    """The virtual time after dispatching a task tagged `dispatched_tag`."""
    return max(virtual_time, dispatched_tag)


def take_turns(
    candidates: Iterable[C],
    rank: Callable[[C], tuple[float, ...]],
    flow: Callable[[C], str],
    last_served: Callable[[str], int],
    lane: Callable[[C], str] | None = None,
) -> Iterator[C]:
    """`candidates` in `rank` order, except that among candidates of equal rank (the same tier
    and tag) the lane served least recently goes first, a lane never served first of all, and
    between lanes alike the flow served least recently. (A task's lane is its flow unless it
    continues an item: see `lane`.)

    Equal tags are a round: each lane has at most one task in it. Taking the round in
    least-recently-served order is what keeps two equal flows within one dispatch of each other
    when one of them joins while the other is being served (plain SFQ allows two), and what lets
    a newcomer's item through each stage first rather than behind the round it joined."""
    lane_of = flow if lane is None else lane
    for _, tied in itertools.groupby(candidates, rank):
        yield from sorted(tied, key=lambda c: (last_served(lane_of(c)), last_served(flow(c))))
