"""The errors headrace raises, and the failures a handler may raise to steer its retry.

HeadraceError
├── ConfigError            bad configuration or input at an edge (also a ValueError)
│   ├── UnknownGate        a task names a gate no spec matches
│   └── KeyConflict        an idempotency key already names a task with another payload
├── TaskFailure            raised by handlers and adapters: what went wrong with an attempt
│   ├── RateLimited        retry later and penalise the gate (vendor said "slow down")
│   ├── Transient          retry later (timeouts, 5xx, unknown vendor codes)
│   │   └── Unavailable    a service the task needs is down: retry later, attempts not spent
│   ├── Fatal              never retry (auth, balance, bad parameters, moderation)
│   └── RemoteFailed       a poller's word that the remote job itself ended in failure
└── StoreError             the durable store refused an operation
    ├── LeaseLost          the caller no longer owns the task (expired, re-claimed, cancelled)
    ├── UnknownTask        no task with that id
    ├── UnknownRecord      no record of that kind and id
    ├── QueueFull          a stage's waiting bound is reached and the producer asked to refuse
    ├── SchemaTooNew       the store was migrated by a newer headrace than this one
    ├── PrunerBusy         another process holds the pruner's lease: one prunes at a time
    └── StoreUnavailable   the store cannot be reached (connection lost): retry the verb later
"""

from __future__ import annotations

import enum


class HeadraceError(Exception):
    """Root of every error headrace raises."""


class ConfigError(HeadraceError, ValueError):
    """A configuration value or an input at an edge is invalid; the message names the field."""


class UnknownGate(ConfigError):
    def __init__(self, gate: str) -> None:
        super().__init__(f"gates: no gate spec matches {gate!r}; declare it with app.gate()")
        self.gate = gate


class KeyConflict(ConfigError):
    """An idempotency key was submitted again with a different payload: the key names the task
    first submitted with it (`task_id`, or an earlier task of the same batch when None), whose
    `field` differs. A different task needs a different key."""

    def __init__(self, key: str, field: str, task_id: int | None = None) -> None:
        first = "an earlier task of this batch" if task_id is None else f"task {task_id}"
        super().__init__(
            f"task.key: {key!r} already names {first}, whose {field} differs from this "
            "submission's; submit the same task again, or give a different task a new key"
        )
        self.key = key
        self.field = field
        self.task_id = task_id


class ErrorClass(enum.Enum):
    """What a retry can do about a failure."""

    RATE_LIMITED = "rate_limited"
    TRANSIENT = "transient"
    FATAL = "fatal"


class TaskFailure(HeadraceError):
    """A failed attempt. `code` is safe to store and show; `message` is redacted before storing."""

    error_class: ErrorClass = ErrorClass.TRANSIENT
    # True: a service the task needs is down (`Unavailable`), which is no fault of the task's
    outage: bool = False

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or type(self).__name__.lower()


class RateLimited(TaskFailure):
    """The provider refused for rate: retry after a backoff and halve the gate's rate for a while.

    `retry_after` (seconds) is the earliest next attempt the provider asked for; `gate` names the
    gate to penalise when it is not every rated gate of the task.
    """

    error_class = ErrorClass.RATE_LIMITED

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        retry_after: float | None = None,
        gate: str | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after
        self.gate = gate


class Transient(TaskFailure):
    """A failure a later attempt may not see: retried with backoff."""

    error_class = ErrorClass.TRANSIENT


class Unavailable(Transient):
    """A service the task needs cannot be reached (a media store, a scanner): nothing is wrong
    with the task, so its attempt is not counted against `max_attempts`; it is retried with a
    growing backoff (at most `RetryPolicy.outage_max_delay` apart) until the service answers."""

    outage = True


class Fatal(TaskFailure):
    """A failure no retry can fix: the task goes to the dead letters after one attempt."""

    error_class = ErrorClass.FATAL


class RemoteFailed(TaskFailure):
    """Raised by a poller: the remote job ended in failure, so its outcome is known and a new
    job may be submitted (retried like a transient failure; `retry=False`: dead at once).

    Any other error a poller raises means the check itself failed: the job's outcome is still
    unknown, so the task keeps waiting (its ticket and remote id kept) and is polled again."""

    def __init__(self, message: str = "", *, code: str | None = None, retry: bool = True) -> None:
        super().__init__(message, code=code or "remote_failed")
        self.error_class = ErrorClass.TRANSIENT if retry else ErrorClass.FATAL


class StoreError(HeadraceError):
    """The store refused an operation."""


class LeaseLost(StoreError):
    """The worker's lease on a task expired or was superseded; its write was not applied."""

    def __init__(self, task_id: int) -> None:
        super().__init__(f"task {task_id}: lease lost (expired, re-claimed or cancelled)")
        self.task_id = task_id


class UnknownTask(StoreError):
    def __init__(self, task_id: int) -> None:
        super().__init__(f"task {task_id}: no such task")
        self.task_id = task_id


class UnknownRecord(StoreError):
    def __init__(self, kind: str, record_id: str) -> None:
        super().__init__(f"{kind} {record_id!r}: no such record")
        self.kind = kind
        self.record_id = record_id


class QueueFull(StoreError):
    """A stage's waiting bound is reached (`scope` "stage"), or its cap for one flow ("flow",
    `label` the flow) or one group ("group"); the producer asked to be refused rather than wait."""

    def __init__(
        self, kind: str, bound: int, scope: str = "stage", label: str | None = None
    ) -> None:
        whose = "" if label is None else f" of {scope} {label!r}"
        super().__init__(f"stage {kind!r}: {bound} tasks{whose} already waiting")
        self.kind = kind
        self.bound = bound
        self.scope = scope
        self.label = label


class SchemaTooNew(StoreError):
    """The store's schema has a version this headrace does not know: a newer one migrated it."""

    def __init__(self, store: str, version: int, known: int) -> None:
        super().__init__(
            f"{store} has schema version {version}; this headrace knows up to {known}: "
            "use a headrace at least as new as the one that migrated it"
        )
        self.version = version
        self.known = known


class PrunerBusy(StoreError):
    """Another process holds the pruner's lease (store/protocol/pruning.py): one prunes at a
    time."""

    def __init__(self, holder: str, left: float) -> None:
        super().__init__(
            f"another pruner is running ({holder}, its lease ends in {max(0.0, left):.0f}s); "
            "try again once it is done"
        )
        self.holder = holder
        self.left = left


class StoreUnavailable(StoreError):
    """The store could not be reached (connection lost, server restarting); nothing was applied
    unless the loss came during the commit. The caller may retry the verb after a pause."""
