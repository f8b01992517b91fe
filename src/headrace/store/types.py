"""The records a store keeps and the values its verbs take. All frozen."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from headrace.policy.errors import ConfigError, ErrorClass
from headrace.policy.fairness import check_weight
from headrace.policy.gate import GateConfig
from headrace.policy.redact import redact
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
CANCELLED = "cancelled"
ACTIVE = frozenset(TaskState) - TERMINAL


@dataclass(frozen=True)
class Sibling:
    """Refers to the task at `index` in the same submitted batch (for `after`)."""

    index: int


@dataclass(frozen=True)
class NewTask:
    """A task to create. `ref` is a stable record id: never bytes, credentials or signed URLs."""

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

    def __post_init__(self) -> None:
        for name in ("kind", "ref", "flow"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"task.{name}: expected a non-empty string, got {value!r}")
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise ConfigError(f"task.key: expected a non-empty string or None, got {self.key!r}")
        if len(set(self.gates)) != len(self.gates):
            twice = sorted({g for g in self.gates if self.gates.count(g) > 1})
            raise ConfigError(f"task.gates: {', '.join(twice)} named more than once")
        if len(self.ref) > 512:
            raise ConfigError("task.ref: a stable record id, at most 512 characters")
        if isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise ConfigError(f"task.max_attempts: expected >= 1, got {self.max_attempts!r}")
        _check_amount("cost", self.cost)
        _check_amount("delay", self.delay)
        if not isinstance(self.tier, Tier):
            raise ConfigError(f"task.tier: expected a Tier, got {self.tier!r}")
        check_weight(self.weight)

    @property
    def gate_key(self) -> str:
        """The task's gates as one string: tasks with the same key are admitted alike."""
        return " ".join(sorted(self.gates))


def _check_amount(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"task.{name}: expected a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"task.{name}: expected a finite number >= 0, got {value!r}")


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
class ClaimResult:
    leases: tuple[Lease, ...]
    now: float
    # The earliest store time at which something not claimable now may become claimable
    # (a retry's run_at, a gate's next token); None when only a submit or a release can help.
    wake_at: float | None = None


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
    """The remote job is still running: poll again after `delay` (only for a waiting task)."""

    delay: float


Outcome = Succeeded | Retry | Dead | AwaitRemote | PollAgain


class AttemptOutcome(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    RETRY = "retry"
    DEAD = "dead"
    WAITING = "waiting"
    LEASE_EXPIRED = "lease_expired"
    CANCELLED = "cancelled"


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
class Settings:
    """Store-wide scheduling settings the app hands to the store when it opens it."""

    gates: tuple[GateConfig, ...] = ()
    aging_step: float = 60.0
    poison_expiries: int = 3
