"""Gates: a concurrency cap and a rate, asked before a task is dispatched, never waited on.

The functions here are pure: they take a `GateConfig`, a `GateState` and `now`, and return a
decision or a new state. The stores persist `GateState` and call these inside their claim
transaction; `Gate` wraps them with a mutable state for in-process use.

A vendor counts a request when it arrives, not when we decide to send it. So a ticket granted
on a rated gate reserves a start (`unstarted`) that counts in every window until it is stamped:
by `start` when the handler is about to call (`ctx.started()`), or at the attempt's outcome
when it never said (the call, if any, arrived before then). A start then counts for the window
plus the gate's guard, which absorbs the time between our stamp and the vendor's arrival.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from headrace.policy import rate as rating
from headrace.policy.errors import ConfigError, UnknownGate
from headrace.policy.rate import Rate

TEMPLATE_SUFFIX = ":*"
# The default guard: a share of the window, at most GUARD_MAX seconds (docs/explanation.md).
GUARD_SHARE = 0.02
GUARD_MAX = 0.25


@dataclass(frozen=True, init=False)
class GateConfig:
    """What a gate admits. `name` may be a template like `session:*` (one gate per key).

    `rate` is a `Rate` or its string form (`"30/6s"`, see `policy/rate.py`), kept as a `Rate`.
    `guard` lengthens how long each start counts, to absorb the time between our stamp of a
    call and its arrival where the vendor counts it; None is the default (`default_guard`).
    """

    name: str
    concurrency: int | None
    rate: Rate | None
    guard: float | None

    def __init__(
        self,
        name: str,
        concurrency: int | None = None,
        rate: Rate | str | None = None,
        guard: float | None = None,
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "concurrency", concurrency)
        object.__setattr__(self, "guard", guard)
        self._check()
        object.__setattr__(self, "rate", rating.rate_of(rate, field=f"gate {name}: rate"))

    def _check(self) -> None:
        if not isinstance(self.name, str) or not self.name or any(ch.isspace() for ch in self.name):
            raise ConfigError(f"gate.name: expected a name without spaces, got {self.name!r}")
        if "*" in self.name and not self.name.endswith(TEMPLATE_SUFFIX):
            raise ConfigError(f"gate.name: a template ends in ':*', got {self.name!r}")
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or self.concurrency < 1
        ):
            raise ConfigError(
                f"gate {self.name}: concurrency must be a positive integer, "
                f"got {self.concurrency!r}"
            )
        if self.guard is not None and (
            isinstance(self.guard, bool)
            or not isinstance(self.guard, int | float)
            or not 0 <= self.guard < math.inf
        ):
            raise ConfigError(
                f"gate {self.name}: guard must be a finite number >= 0, got {self.guard!r}"
            )

    @property
    def is_template(self) -> bool:
        return self.name.endswith(TEMPLATE_SUFFIX)

    @property
    def counted_rate(self) -> Rate | None:
        """The rate as the store counts it: the window lengthened by the guard."""
        if self.rate is None:
            return None
        guard = default_guard(self.rate) if self.guard is None else self.guard
        if not guard:
            return self.rate
        return Rate(self.rate.n, per=self.rate.window + guard)

    def for_key(self, name: str) -> GateConfig:
        return replace(self, name=name)


def default_guard(rate: Rate) -> float:
    """How much longer than its window a start counts unless the gate says otherwise: the
    spread, on a loaded host, between stamping a call and the vendor seeing it arrive."""
    return min(GUARD_MAX, rate.window * GUARD_SHARE)


def resolve(name: str, configs: Mapping[str, GateConfig]) -> GateConfig:
    """The config for gate `name`: an exact spec, else the template with the longest prefix."""
    exact = configs.get(name)
    if exact is not None:
        return exact
    prefix, sep, key = name.rpartition(":")
    while sep:
        template = configs.get(prefix + TEMPLATE_SUFFIX)
        if template is not None and key:
            return template.for_key(name)
        prefix, sep, _ = prefix.rpartition(":")
    raise UnknownGate(name)


def declared_as(name: str, configs: Mapping[str, GateConfig]) -> str | None:
    """The declaration gate `name` comes from: its own name, or its template's (`session:*`
    for `session:s1`); None for a gate no spec matches."""
    config = find(name, configs)
    if config is None or name in configs:
        return None if config is None else name
    prefix, _, _ = name.rpartition(":")
    while prefix + TEMPLATE_SUFFIX not in configs:
        prefix, _, _ = prefix.rpartition(":")
    return prefix + TEMPLATE_SUFFIX


def find(name: str, configs: Mapping[str, GateConfig]) -> GateConfig | None:
    """`resolve`, or None for a gate no spec matches (one this process does not declare)."""
    try:
        return resolve(name, configs)
    except UnknownGate:
        return None


class Refusal(enum.Enum):
    CONCURRENCY = "concurrency"
    TOKEN = "token"


@dataclass(frozen=True)
class GateState:
    in_flight: int = 0
    starts: tuple[float, ...] = ()
    penalized_until: float = -math.inf
    granted: int = 0
    blocked_by_token: int = 0
    blocked_by_concurrency: int = 0
    rate_limited: int = 0
    peak_in_flight: int = 0
    first_blocked_at: float | None = None
    unstarted: int = 0  # tickets granted on a rated gate whose call start is not stamped yet


@dataclass(frozen=True)
class GateStatistics:
    """A snapshot of one gate, for reports and metrics."""

    name: str
    concurrency: int | None
    rate: Rate | None
    granted: int
    blocked_by_token: int
    blocked_by_concurrency: int
    rate_limited: int
    in_flight: int
    peak_in_flight: int
    penalized_until: float | None
    first_blocked_at: float | None = field(default=None)
    # the declaration it comes from (a template's name for one of its gates), as any process
    # sharing the store declared it; None when the store does not know (a gate used before
    # stores kept it). `concurrency` and `rate` are None for a gate this process does not declare.
    declared: str | None = field(default=None)


def check(config: GateConfig, state: GateState, now: float) -> Refusal | None:
    """Why the gate would refuse a start at `now`, or None when it admits one."""
    if config.concurrency is not None and state.in_flight >= config.concurrency:
        return Refusal.CONCURRENCY
    counted = config.counted_rate
    if counted is not None and not rating.admits(
        counted, state.starts, now, state.penalized_until, state.unstarted
    ):
        return Refusal.TOKEN
    return None


def grant(config: GateConfig, state: GateState, now: float) -> GateState:
    """The state after a ticket is granted at `now` (the caller has checked first). On a rated
    gate the ticket reserves a start, stamped later by `start`."""
    in_flight = state.in_flight + 1
    return replace(
        state,
        in_flight=in_flight,
        unstarted=state.unstarted + (config.rate is not None),
        granted=state.granted + 1,
        peak_in_flight=max(state.peak_in_flight, in_flight),
    )


def start(config: GateConfig | None, state: GateState, now: float) -> GateState:
    """The state after a reserved start is stamped at `now`: the call is about to leave (or,
    stamped at an outcome, has left already). With no config (a process that does not declare
    the gate), every start is kept; the next stamp by a process that knows the rate keeps the
    newest n."""
    if config is None:
        starts = (*sorted(state.starts), now)
    elif (counted := config.counted_rate) is not None:
        starts = rating.record(counted, state.starts, now)
    else:
        return state
    return replace(state, starts=starts, unstarted=max(0, state.unstarted - 1))


def refuse(state: GateState, refusal: Refusal, now: float) -> GateState:
    first = state.first_blocked_at if state.first_blocked_at is not None else now
    if refusal is Refusal.TOKEN:
        return replace(state, blocked_by_token=state.blocked_by_token + 1, first_blocked_at=first)
    return replace(
        state, blocked_by_concurrency=state.blocked_by_concurrency + 1, first_blocked_at=first
    )


def release(state: GateState, count: int = 1) -> GateState:
    return replace(state, in_flight=max(0, state.in_flight - count))


def penalize(config: GateConfig, state: GateState, now: float) -> GateState:
    """A rate-limit response: count it, and halve the rate for the next two windows."""
    penalized_until = state.penalized_until
    if config.rate is not None:
        penalized_until = rating.penalty_end(config.rate, now, state.penalized_until)
    return replace(state, rate_limited=state.rate_limited + 1, penalized_until=penalized_until)


def next_admission(config: GateConfig, state: GateState, now: float) -> float | None:
    """When the rate next admits a start; None when only a released ticket can help."""
    if config.concurrency is not None and state.in_flight >= config.concurrency:
        return None
    counted = config.counted_rate
    if counted is None:
        return now
    return rating.next_admission(counted, state.starts, now, state.penalized_until, state.unstarted)


def opens_sooner(
    config: GateConfig | None, before: GateState, after: GateState, now: float
) -> bool:
    """Whether a change of state (a stamp) moved the gate's next admission earlier: a reserved
    start counts in every window until it is stamped, so a claim it refused was told a later
    time, or none (only a stamp or a release could help), and waits to be woken."""
    if config is None:  # a gate this process does not declare: it cannot tell
        return False
    was = next_admission(config, before, now)
    then = next_admission(config, after, now)
    return then is not None and (was is None or then < was)


def statistics(
    config: GateConfig, state: GateState, now: float, declared: str | None = None
) -> GateStatistics:
    penalized = state.penalized_until if state.penalized_until > now else None
    return GateStatistics(
        name=config.name,
        concurrency=config.concurrency,
        rate=config.rate,
        granted=state.granted,
        blocked_by_token=state.blocked_by_token,
        blocked_by_concurrency=state.blocked_by_concurrency,
        rate_limited=state.rate_limited,
        in_flight=state.in_flight,
        peak_in_flight=state.peak_in_flight,
        penalized_until=penalized,
        first_blocked_at=state.first_blocked_at,
        declared=declared,
    )


class Gate:
    """One gate with its state in memory: non-blocking `try_acquire`, then `release`."""

    def __init__(self, config: GateConfig) -> None:
        self.config = config
        self.state = GateState()

    def try_acquire(self, now: float) -> bool:
        """Take a ticket to start at once: the start is stamped with the grant."""
        refusal = check(self.config, self.state, now)
        if refusal is not None:
            self.state = refuse(self.state, refusal, now)
            return False
        self.state = start(self.config, grant(self.config, self.state, now), now)
        return True

    def release(self) -> None:
        self.state = release(self.state)

    def penalize(self, now: float) -> None:
        self.state = penalize(self.config, self.state, now)

    def next_admission(self, now: float) -> float | None:
        return next_admission(self.config, self.state, now)

    def statistics(self, now: float) -> GateStatistics:
        return statistics(self.config, self.state, now)


def rated(configs: Iterable[GateConfig]) -> list[str]:
    """Names of the gates that carry a rate: the ones a rate-limit response penalises."""
    return [config.name for config in configs if config.rate is not None]
