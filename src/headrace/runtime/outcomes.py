"""An attempt's outcome as the worker records and reports it: a store's refusal turned into a
verdict, a handler's bug into a failure, and one log line per outcome."""

from __future__ import annotations

import logging
import re

from headrace.policy.errors import ConfigError, ErrorClass, TaskFailure, Transient
from headrace.policy.redact import redact
from headrace.store.protocol.types import (
    AttemptError,
    AwaitRemote,
    Dead,
    Lease,
    Outcome,
    PollAgain,
    Retry,
    Succeeded,
)


def refused(error: ConfigError) -> Dead:
    """The store refused the outcome itself (a successor naming an unknown gate, a key reused
    with another payload): no attempt can do better, so the task is dead, saying why."""
    code = re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()
    return Dead(AttemptError.of(ErrorClass.FATAL, f"outcome_refused:{code}", str(error)))


def level(outcome: Outcome) -> int:
    """A success is a DEBUG line (the worker's progress line counts them: runtime/progress.py);
    a retry, a dead task and a remote wait are INFO; a failed remote check is a WARNING."""
    if isinstance(outcome, PollAgain):
        return logging.WARNING if outcome.code else logging.DEBUG
    if isinstance(outcome, Succeeded):
        return logging.DEBUG
    return logging.INFO


def describe(lease: Lease, outcome: Outcome, took: float) -> str:
    """One log line for an attempt's outcome (the ref redacted, as every logged value)."""
    task = lease.task
    head = f"task {task.id} {task.kind} {redact(task.ref, limit=80)}"
    if isinstance(outcome, Succeeded):
        count = len(outcome.successors)
        made = f", {count} successor{'s' if count != 1 else ''}" if count else ""
        return f"{head}: succeeded in {took:.3f}s (attempt {task.attempt}){made}"
    if isinstance(outcome, AwaitRemote):
        return f"{head}: waiting on remote job {redact(outcome.remote_id, limit=80)}"
    if isinstance(outcome, PollAgain):
        why = f" ({outcome.code})" if outcome.code else ""
        return f"{head}: remote job still unsettled{why}, checked again in {outcome.delay:.2f}s"
    penalize = f", penalising {', '.join(outcome.penalize)}" if outcome.penalize else ""
    error = outcome.error
    if isinstance(outcome, Retry):
        return (
            f"{head} attempt {task.attempt}: {error.code} ({error.error_class.value}), "
            f"retry in {outcome.delay:.3f}s{penalize}"
        )
    return f"{head}: dead after attempt {task.attempt}: {error.code}{penalize}"


def unexpected(error: Exception) -> TaskFailure:
    return Transient(f"{type(error).__name__}: {error}", code=type(error).__name__.lower())
