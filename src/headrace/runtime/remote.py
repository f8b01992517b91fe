"""Checking a remote job: the poller's answer, and what to do with a job that outlived its
timeout.

A remote job whose outcome is unknown is never submitted again: the task keeps its remote id and
its tickets until the poller says the job is done (`Result`) or failed (`RemoteFailed`, or
`Fatal`), or the stage's cancel hook stops it. A check that fails any other way (the vendor's
status call timed out, answered 5xx or 429) leaves the job's outcome unknown: the task is polled
again. A job that outlived its timeout is cancelled through the hook when the stage has one
(then the task retries, with a new job); otherwise it is polled on, marked `remote_timeout`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import TYPE_CHECKING

from headrace.policy.errors import ConfigError, Fatal, RemoteFailed, TaskFailure, Transient
from headrace.runtime.calls import call
from headrace.runtime.results import Pending, Result
from headrace.store.types import Outcome, PollAgain, Succeeded

if TYPE_CHECKING:
    from headrace.runtime.app import TaskDefinition
    from headrace.runtime.context import Context

log = logging.getLogger("headrace.worker")

REMOTE_TIMEOUT = "remote_timeout"
DEFAULT_POLL_EVERY = 1.0


def settled(failure: TaskFailure) -> bool:
    """Whether a failure raised while checking a job says how the job ended (so a new job may
    be submitted), rather than that the check itself failed."""
    return isinstance(failure, RemoteFailed | Fatal | Cancelled)


async def check(definition: TaskDefinition, ctx: Context, limit: float | None) -> Outcome:
    """Ask the stage's poller about the task's remote job; past the job's timeout, cancel it
    through the stage's hook. Raises what the poller or the hook raised."""
    task = ctx.task
    if definition.poller is None or task.remote_id is None:
        raise ConfigError(f"task {task.kind}: awaits a remote job but has no poller")
    poller = definition.poller
    answer = await call(
        poller, ctx, task.remote_id, is_async=inspect.iscoroutinefunction(poller), limit=limit
    )
    if isinstance(answer, Result):
        return Succeeded(cost=answer.cost, successors=tuple(ctx.successors))
    if not isinstance(answer, Pending):
        raise ConfigError(
            f"task {task.kind}: a poller returns Result or Pending, not {type(answer).__name__}"
        )
    every = answer.delay if answer.delay is not None else task.poll_every or DEFAULT_POLL_EVERY
    if task.remote_deadline is None or ctx.now < task.remote_deadline:
        return PollAgain(every)
    if definition.canceller is None or not await cancelled(definition, ctx, limit):
        return PollAgain(every, code=REMOTE_TIMEOUT)  # unknown still: keep it, keep polling
    raise Cancelled("the remote job outlived its timeout and was cancelled", code=REMOTE_TIMEOUT)


class Cancelled(Transient):
    """The stage's cancel hook stopped a job that outlived its timeout: a new one may be tried."""


async def cancelled(definition: TaskDefinition, ctx: Context, limit: float | None) -> bool:
    """Whether the stage's cancel hook stopped the task's remote job; whatever it raised, the
    job may still run."""
    cancel, job = definition.canceller, ctx.task.remote_id
    assert cancel is not None and job is not None
    try:
        await call(cancel, ctx, job, is_async=inspect.iscoroutinefunction(cancel), limit=limit)
    except asyncio.CancelledError:
        raise
    except Exception as error:
        log.warning("task %s: remote job not cancelled (%s); checking it again", ctx.task.id, error)
        return False
    return True


def check_failed(failure: TaskFailure, ctx: Context) -> PollAgain:
    """The check failed, not the job: poll again after the poll interval (or the vendor's
    Retry-After), saying why on the task."""
    every = ctx.task.poll_every or DEFAULT_POLL_EVERY
    retry_after = getattr(failure, "retry_after", None)
    return PollAgain(max(every, retry_after or 0.0), code=failure.code)
