"""The records a store keeps and the values its verbs take. All frozen."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from headrace.policy import fairness, text
from headrace.policy.errors import ConfigError, ErrorClass, HeadraceError
from headrace.policy.gate import GateConfig
from headrace.policy.redact import credential_in, redact
from headrace.policy.tiers import Tier


class TaskState(enum.Enum):
    PENDING = "pending"  # waits on `after`
    READY = "ready"  # accepted, queued (maybe until run_at)
    RUNNING = "running"  # a worker holds its lease and a slot
    WAITING = "waiting"  # a remote job runs: tickets held, no slot
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({TaskState.SUCCEEDED, TaskState.DEAD, TaskState.CANCELLED})

# Error codes the store itself records.
UPSTREAM_FAILED = "upstream_failed"  # cancelled: a task it waited on died or was cancelled
LEASE_EXPIRED = "lease_expired"  # its worker stopped renewing the lease
POISON = "poison_lease_expired"  # dead: its workers died while running it too many times
STAGE_FULL = "stage_full"  # deferred: a stage its successors go to had no room for them
DEFER_DELAY = 0.25  # seconds a deferred task waits before it may be claimed again
CANCELLED = "cancelled"
ACTIVE = frozenset(TaskState) - TERMINAL


@dataclass(frozen=True)
class Sibling:
    """Refers to the task at `index` in the same submitted batch (for `after`)."""

    index: int


MAX_DELAY = 366 * 24 * 3600.0  # a task's first run is at most a year (and a day) away
MAX_REF = 512


@dataclass(frozen=True)
class NewTask:
    """A task to create. `ref` is a stable record id: never bytes, credentials or signed URLs.

    Every field is checked here, so bad input is refused with its field named before a store
    sees it: `kind`, `ref` and `flow` are non-empty strings (`ref` at most 512 characters),
    `group` and `key` a non-empty string or None, `gates` distinct non-empty names, `after` task
    ids or `Sibling`s, `max_attempts` a whole number >= 1, `cost` a finite number >= 0, `delay`
    seconds from 0 to `MAX_DELAY`, `weight` a finite number > 0. `continues`: the fair tag of
    the task whose item this one carries on (policy/fairness.py: it keeps that place in its
    flow's line); a finite number >= 0 or None. `memory`: the bytes its attempt may use at its
    peak (an estimate known before it runs), charged against the memory budget of the worker
    that claims it (`MemoryRoom`); a whole number >= 0, 0 = not charged.
    """

    kind: str
    ref: str
    gates: tuple[str, ...] = ()
    flow: str = "default"
    group: str | None = None
    tier: Tier = Tier.NORMAL
    cost: float = 1.0
    key: str | None = None
    after: tuple[int | Sibling, ...] = ()
    max_attempts: int = 5
    delay: float = 0.0
    weight: float = 1.0
    continues: float | None = None
    memory: int = 0

    def __post_init__(self) -> None:
        for name in ("kind", "ref", "flow"):
            check_text(name, getattr(self, name))
        for name in ("group", "key"):
            check_text(name, getattr(self, name), optional=True)
        if len(self.ref) > MAX_REF:
            raise ConfigError(f"task.ref: a stable record id, at most {MAX_REF} characters")
        found = credential_in(self.ref)
        if found is not None:
            raise ConfigError(
                f"task.ref: carries a credential ({found}); pass a stable record id (an upload's "
                "or asset's id) and let the handler fetch what it needs, never a signed URL, a "
                "token or a password"
            )
        _check_gates(self.gates)
        _check_after(self.after)
        if not _whole(self.max_attempts) or self.max_attempts < 1:
            raise ConfigError(f"task.max_attempts: expected >= 1, got {self.max_attempts!r}")
        _check_amount("cost", self.cost)
        _check_amount("delay", self.delay)
        if self.delay > MAX_DELAY:
            raise ConfigError(
                f"task.delay: at most {MAX_DELAY:.0f} seconds (a year and a day), "
                f"got {self.delay!r}"
            )
        if not isinstance(self.tier, Tier):
            raise ConfigError(f"task.tier: expected a Tier, got {self.tier!r}")
        _check_amount("weight", self.weight, above_zero=True)
        if self.continues is not None:
            _check_amount("continues", self.continues)
        check_bytes("task.memory", self.memory)

    @property
    def lane(self) -> str:
        """Where its fair tag is drawn from: its flow, or its flow at this stage when it
        continues an item (`fairness.lane`)."""
        return fairness.lane(self.flow, self.kind, self.continues)

    @property
    def gate_key(self) -> str:
        """The task's gates as one string: tasks with the same key are admitted alike."""
        return " ".join(sorted(self.gates))


def check_text(name: str, value: object, *, optional: bool = False) -> None:
    """`task.<name>` is a non-empty string every store keeps alike (or None when `optional`)."""
    if optional and value is None:
        return
    if not isinstance(value, str) or not value:
        expected = "a non-empty string or None" if optional else "a non-empty string"
        raise ConfigError(f"task.{name}: expected {expected}, got {value!r}")
    text.check_text(value, f"task.{name}")


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_gates(gates: object) -> None:
    if not isinstance(gates, tuple):
        raise ConfigError(f"task.gates: expected a tuple of gate names, got {gates!r}")
    for gate in gates:
        if not isinstance(gate, str) or not gate:
            raise ConfigError(f"task.gates: expected non-empty gate names, got {gate!r}")
        text.check_text(gate, "task.gates")
    if len(set(gates)) != len(gates):
        twice = sorted({g for g in gates if gates.count(g) > 1})
        raise ConfigError(f"task.gates: {', '.join(twice)} named more than once")


def _check_after(after: object) -> None:
    if not isinstance(after, tuple):
        raise ConfigError(f"task.after: expected a tuple of task ids or Siblings, got {after!r}")
    for dep in after:
        if not _is_dependency(dep):
            raise ConfigError(f"task.after: expected task ids or Siblings, got {dep!r}")


def _is_dependency(dep: object) -> bool:
    if isinstance(dep, Sibling):
        return _whole(dep.index) and dep.index >= 0
    return isinstance(dep, int) and not isinstance(dep, bool) and dep >= 1


def check_bytes(name: str, value: object) -> None:
    """`value` is a whole number of bytes >= 0 (an int: a byte count is never fractional)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name}: expected a whole number of bytes >= 0, got {value!r}")


def _check_amount(name: str, value: object, *, above_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"task.{name}: expected a number, got {value!r}")
    if not _finite(value) or value < 0 or (above_zero and value == 0):
        least = "> 0" if above_zero else ">= 0"
        raise ConfigError(f"task.{name}: expected a finite number {least}, got {value!r}")


@dataclass(frozen=True)
class Submitted:
    id: int
    created: bool  # False when the idempotency key already named a task


@dataclass(frozen=True)
class TaskRecord:
    id: int
    kind: str
    ref: str
    gates: tuple[str, ...]
    flow: str
    group: str | None
    tier: Tier
    submitted_tier: Tier
    cost: float
    key: str | None
    state: TaskState
    attempt: int
    max_attempts: int
    tag: float
    created_at: float
    run_at: float
    ready_since: float | None = None
    promoted_at: float | None = None
    finished_at: float | None = None
    worker: str | None = None
    lease_until: float | None = None
    lease_token: int = 0
    remote_id: str | None = None
    poll_every: float | None = None
    remote_deadline: float | None = None
    error_code: str | None = None
    expiries: int = 0
    # Attempts not counted against `max_attempts`: those before the last redrive from the dead
    # letters, and those lost when the worker died running others beside it.
    attempt_base: int = 0
    solo: bool = False  # its lease expired beside others': it runs alone until it ends
    remote_jobs: int = 0  # remote jobs it submitted that ended without success
    memory: int = 0  # bytes charged against its worker's memory budget (0: not charged)

    @property
    def attempts_used(self) -> int:
        """Attempts counted against `max_attempts`: those since the last redrive."""
        return self.attempt - self.attempt_base


@dataclass(frozen=True)
class Lease:
    """A worker's hold on a task. `token` fences every write: a stale holder's writes fail."""

    task: TaskRecord
    token: int
    until: float

    @property
    def task_id(self) -> int:
        return self.task.id


@dataclass(frozen=True)
class KindLimit:
    """At most `limit` tasks of these kinds in one claim: a worker's free slots of one cost
    class, whose stages are `kinds`."""

    kinds: frozenset[str]
    limit: int

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0:
            raise ConfigError(f"claim limit: expected an integer >= 0, got {self.limit!r}")


@dataclass(frozen=True)
class MemoryRoom:
    """A worker's memory budget as one claim may charge it: `free` bytes not charged to the
    tasks it runs, and whether none of those is charged (`idle`). A task fits while its
    `memory` fits in what is free; one larger than that fits only when `idle` and the claim has
    charged nothing yet, and is then the only charged task the worker runs (a task larger than
    the whole budget is never stuck). Tasks of memory 0 are not charged: they always fit.

    `large` (bytes; None: no such line): a task charged more is large, and large tasks also
    fit only in `large_free`, what the large ones running leave of their share of the budget,
    so a burst of large tasks never holds every byte and small ones keep flowing."""

    free: int
    idle: bool = False
    large: int | None = None
    large_free: int = 0

    def __post_init__(self) -> None:
        check_bytes("claim memory", self.free)
        if self.large is not None:
            check_bytes("claim memory.large", self.large)
        check_bytes("claim memory.large_free", self.large_free)


@dataclass(frozen=True)
class ClaimResult:
    leases: tuple[Lease, ...]
    now: float
    # The earliest store time at which something not claimable now may become claimable
    # (a retry's run_at, a gate's next token); None when only a submit or a release can help.
    wake_at: float | None = None
    # The results of the outcomes written with the claim (`Store.claim(finished=...)`), in
    # their order: None when recorded, or the error `finish` would have raised.
    finished: tuple[HeadraceError | None, ...] = ()
    # A task that must run alone (`solo`) came up in order and was passed over, since the
    # worker runs (or just took) something else: it claims nothing more until it can claim
    # alone, so a task lost beside others runs next rather than when a worker happens to idle.
    solo_waiting: bool = False


@dataclass(frozen=True)
class AttemptError:
    error_class: ErrorClass
    code: str
    message: str = ""

    @classmethod
    def of(cls, error_class: ErrorClass, code: str, message: str = "") -> AttemptError:
        """An error safe to store: the message is redacted."""
        return cls(error_class, redact(code)[:100], redact(message))


# Outcomes a lease holder reports with `Store.finish`.


@dataclass(frozen=True)
class Succeeded:
    cost: float | None = None  # units for the ledger; None = the task's own cost
    successors: tuple[NewTask, ...] = ()


@dataclass(frozen=True)
class Retry:
    error: AttemptError
    delay: float
    penalize: tuple[str, ...] = ()
    # False: the attempt never began (a task claimed ahead and handed back unstarted); it is
    # recorded, and not counted against the task's `max_attempts`
    counted: bool = True


@dataclass(frozen=True)
class Dead:
    error: AttemptError
    penalize: tuple[str, ...] = ()


@dataclass(frozen=True)
class AwaitRemote:
    remote_id: str
    poll_every: float
    timeout: float | None = None

    def __post_init__(self) -> None:
        if not self.remote_id:
            raise ConfigError("await_remote: remote_id must be a non-empty string")
        if self.poll_every <= 0:
            raise ConfigError(f"await_remote: every must be > 0, got {self.poll_every!r}")


@dataclass(frozen=True)
class PollAgain:
    """The remote job is still running, or its check failed: poll again after `delay` (only for
    a waiting task). `code`, when given, says why on the task (e.g. `remote_timeout`)."""

    delay: float
    code: str | None = None


Outcome = Succeeded | Retry | Dead | AwaitRemote | PollAgain


class AttemptOutcome(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    RETRY = "retry"
    DEAD = "dead"
    WAITING = "waiting"
    LEASE_EXPIRED = "lease_expired"
    CANCELLED = "cancelled"
    # It succeeded, but a stage its successors go to had no room: it runs again, uncounted.
    DEFERRED = "deferred"


@dataclass(frozen=True)
class Attempt:
    task_id: int
    number: int
    worker: str
    started_at: float
    ended_at: float | None = None
    outcome: AttemptOutcome = AttemptOutcome.RUNNING
    error_class: ErrorClass | None = None
    code: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class Failure:
    task_id: int
    kind: str
    ref: str
    code: str | None
    attempts: int


@dataclass(frozen=True)
class GroupReport:
    group: str
    total: int
    by_state: Mapping[TaskState, int]
    cost: Mapping[str, float]  # units per kind, from succeeded tasks
    failures: tuple[Failure, ...] = field(default=())

    @property
    def done(self) -> int:
        """Tasks that reached an outcome: succeeded, dead or cancelled."""
        return sum(n for state, n in self.by_state.items() if state.terminal)

    @property
    def succeeded(self) -> int:
        return self.by_state.get(TaskState.SUCCEEDED, 0)

    @property
    def dead(self) -> int:
        return self.by_state.get(TaskState.DEAD, 0)

    @property
    def cancelled(self) -> int:
        return self.by_state.get(TaskState.CANCELLED, 0)

    @property
    def percent(self) -> float:
        """Share of the group's tasks that succeeded: a dead or cancelled task is not complete
        (see `dead` and `cancelled`)."""
        return 100.0 * self.succeeded / self.total if self.total else 100.0


@dataclass(frozen=True)
class StageStats:
    """One stage's unfinished work: its tasks per state, and for how many seconds of the
    store's clock its oldest ready task has been ready (None when none is ready)."""

    kind: str
    pending: int
    ready: int
    running: int
    waiting: int
    oldest_ready_age: float | None = None


@dataclass(frozen=True)
class StageLimits:
    """What a stage may hold waiting (pending or ready): `bound` tasks in all, `per_flow` of one
    flow (a contributor session), `per_group` of one group (an event). The store holds them on
    every submit and on the successors a completion creates. `feeds`: the stages its handler's
    successors go to; while one of those has no room left for what the stage's running tasks
    may add, a claim leaves this stage's ready tasks where they are (backpressure)."""

    kind: str
    bound: int | None = None
    per_flow: int | None = None
    per_group: int | None = None
    feeds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("bound", "per_flow", "per_group"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigError(f"task.{name}: expected a positive integer, got {value!r}")
        if isinstance(self.feeds, str):
            raise ConfigError(f"task.feeds: expected a list of stage names, got {self.feeds!r}")

    @property
    def limited(self) -> bool:
        return not (self.bound is None and self.per_flow is None and self.per_group is None)


@dataclass(frozen=True)
class Settings:
    """Store-wide scheduling settings the app hands to the store when it opens it."""

    gates: tuple[GateConfig, ...] = ()
    aging_step: float = 60.0
    poison_expiries: int = 3
    stages: tuple[StageLimits, ...] = ()
