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
import hashlib
import inspect
import logging
from typing import Any

from headrace.policy.errors import ConfigError, Fatal, RemoteFailed, TaskFailure, Transient
from headrace.runtime.app import TaskDefinition
from headrace.runtime.calls import call
from headrace.runtime.context import Context
from headrace.runtime.results import Delivery as Delivery  # remote.Delivery, as before
from headrace.runtime.results import Pending, Result
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import Outcome, PollAgain, Succeeded

log = logging.getLogger("headrace.worker")

REMOTE = "remote"  # the record kind of a remote job's outcome, delivered by a webhook
REMOTE_TIMEOUT = "remote_timeout"
DEFAULT_POLL_EVERY = 1.0


def settled(failure: TaskFailure) -> bool:
    """Whether a failure raised while checking a job says how the job ended (so a new job may
    be submitted), rather than that the check itself failed."""
    return isinstance(failure, RemoteFailed | Fatal | Cancelled)


def remote_key(remote_id: str) -> str:
    """The record id of a remote job's delivery (a remote id may hold any character)."""
    return hashlib.sha256(remote_id.encode()).hexdigest()


async def deliver(
    store: Store, provider: str, remote_id: str, *, succeeded: bool, result: Any = None
) -> int:
    """Keep how a remote job ended (the first word on it stands) and make the tasks waiting on
    it due for a check now; return how many. Their check reads it (`Context.delivery`) instead
    of asking the provider; a stage without a poller is resolved by it alone."""
    await store.records.put_record(
        REMOTE,
        remote_key(remote_id),
        scope=provider,
        state="succeeded" if succeeded else "failed",
        body={"provider": provider, "result": result},
    )
    return await store.wake_remote(remote_id)


async def delivery_of(store: Store, remote_id: str) -> Delivery | None:
    found = await store.records.get_record(REMOTE, remote_key(remote_id))
    if found is None:
        return None
    return Delivery(found.scope, found.state == "succeeded", found.body.get("result"))


async def check(definition: TaskDefinition, ctx: Context, limit: float | None) -> Outcome:
    """Ask about the task's remote job (its delivery, then the stage's poller, if it has one);
    past the job's timeout, cancel it through the stage's hook. Raises what the poller or the
    hook raised, or RemoteFailed for a delivery that says the job failed."""
    task = ctx.task
    if task.remote_id is None:
        raise ConfigError(f"task {task.kind}: checked for a remote job it has not got")
    ctx.delivery = await delivery_of(ctx.app.store, task.remote_id)
    answer = await ask(definition, ctx, task.remote_id, limit)
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


async def ask(
    definition: TaskDefinition, ctx: Context, remote_id: str, limit: float | None
) -> object:
    """The poller's answer; without a poller, the delivery's (Pending until one comes)."""
    poller = definition.poller
    if poller is not None:
        answer: object = await call(
            poller, ctx, remote_id, is_async=inspect.iscoroutinefunction(poller), limit=limit
        )
        return answer
    if ctx.delivery is None:
        return Pending()
    if ctx.delivery.succeeded:
        return Result()
    raise RemoteFailed(f"{ctx.delivery.provider} reported the remote job failed")


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
