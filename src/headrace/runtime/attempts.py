"""One attempt of a task in a worker's slot: its handler (or a remote job's check) called
through `calls.call` (time limits, sync code in daemon threads), what it returned or raised
turned into an outcome (retry decisions by the stage's policy), and that outcome handed in."""

from __future__ import annotations

import asyncio
import logging
import random
import traceback

from headrace.policy.errors import ConfigError, LeaseLost, TaskFailure
from headrace.policy.redact import redact
from headrace.policy.retry import Action
from headrace.runtime import outcomes, remote
from headrace.runtime.app import App, TaskDefinition
from headrace.runtime.calls import call
from headrace.runtime.context import Context
from headrace.runtime.handin import HandIn
from headrace.runtime.polls import Polls
from headrace.runtime.results import RemoteWait, Result
from headrace.runtime.settings import WorkerSettings
from headrace.runtime.slots import Slots
from headrace.store.protocol.types import (
    AttemptError,
    AwaitRemote,
    Dead,
    Lease,
    Outcome,
    Retry,
    Succeeded,
)

log = logging.getLogger("headrace.worker")


class Attempts:
    """Runs the attempts of the tasks in `slots`; `crash` keeps the first error a handler
    raised that was not a TaskFailure (a bug: retried like a transient failure)."""

    def __init__(
        self, app: App, settings: WorkerSettings, slots: Slots, handin: HandIn, polls: Polls
    ) -> None:
        self.app = app
        self.settings = settings
        self.slots = slots
        self.stats = slots.stats
        self.handin = handin
        self.polls = polls
        self.rng = random.Random(settings.seed)
        self.crash: BaseException | None = None

    async def execute(self, lease: Lease) -> None:
        definition = self.app.definition(lease.task.kind)
        ctx = Context(self.app, lease, self.settings.name, await self.app.store.now())
        began = asyncio.get_running_loop().time()
        try:
            returned = await call(
                definition.handler,
                ctx,
                ctx.task.ref,
                is_async=definition.is_async,
                limit=self._limit(definition),
            )
            outcome = self._outcome(ctx, returned)
        except TaskFailure as failure:
            outcome = self._failed(lease, definition, failure)
        except LeaseLost:  # ctx.started() was refused: another worker owns the task now
            self.slots.freed(lease.task_id, self.slots.running)
            self._abandoned(lease, "before its call")
            return
        except asyncio.CancelledError:
            await self.handin.release(lease)
            raise
        except Exception as error:  # a handler bug: retried like a transient failure
            self._note_crash(error)
            outcome = self._failed(lease, definition, outcomes.unexpected(error))
        took = asyncio.get_running_loop().time() - began
        self.slots.prefetch.ran(took)
        self.slots.freed(lease.task_id, self.slots.running)
        await self._finish(lease, outcome, took)

    async def check(self, lease: Lease) -> None:
        """Ask whether a waiting task's remote job is done (runtime/remote.py)."""
        definition = self.app.definition(lease.task.kind)
        ctx = Context(self.app, lease, self.settings.name, await self.app.store.now())
        began = asyncio.get_running_loop().time()
        self.stats.polls += 1
        try:
            outcome = await remote.check(definition, ctx, self._limit(definition))
        except TaskFailure as failure:
            if remote.settled(failure):
                outcome = self._failed(lease, definition, failure)  # a new job may be tried
            else:
                outcome = remote.check_failed(failure, ctx)  # the job's outcome still unknown
        except asyncio.CancelledError:
            await self.handin.release(lease)
            raise
        except Exception as error:
            self._note_crash(error)
            outcome = remote.check_failed(outcomes.unexpected(error), ctx)
        self.slots.freed(lease.task_id, self.slots.polling)
        await self._finish(lease, outcome, asyncio.get_running_loop().time() - began)

    def _limit(self, definition: TaskDefinition) -> float | None:
        """Seconds an attempt of `definition` may take: the stage's limit, or the worker's."""
        return definition.options.timeout or self.settings.timeout

    def _outcome(self, ctx: Context, returned: object) -> Outcome:
        if isinstance(returned, RemoteWait):
            if ctx.successors:
                raise ConfigError("spawn: successors of a remote wait are made by its poller")
            self.polls.waiting()
            return AwaitRemote(returned.remote_id, returned.every, returned.timeout)
        if returned is not None and not isinstance(returned, Result):
            raise ConfigError(
                f"task {ctx.task.kind}: a handler returns None, Result or ctx.await_remote(...),"
                f" not {type(returned).__name__}"
            )
        cost = returned.cost if isinstance(returned, Result) else None
        return Succeeded(cost=cost, successors=tuple(ctx.successors))

    def _failed(self, lease: Lease, definition: TaskDefinition, failure: TaskFailure) -> Outcome:
        if failure.outage:
            return self._outage_retry(lease, definition, failure)
        retry_after = getattr(failure, "retry_after", None)
        decision = definition.options.retry.decide(
            lease.task.attempts_used, failure.error_class, self.rng, retry_after
        )
        error = AttemptError.of(failure.error_class, failure.code, failure.message)
        penalize = self._penalized(lease, failure) if decision.penalize else ()
        if decision.action is Action.DEAD:
            return Dead(error, penalize)
        self.stats.backoffs.append(decision.delay)
        return Retry(error, decision.delay, penalize)

    def _outage_retry(
        self, lease: Lease, definition: TaskDefinition, failure: TaskFailure
    ) -> Outcome:
        """A service the task needs is down: retried later, the attempt not counted, backing
        off by the attempts not counted so far (mostly earlier outages)."""
        task = lease.task
        outages = task.attempt - task.attempts_used + 1
        decision = definition.options.retry.after_outage(outages, self.rng)
        self.stats.backoffs.append(decision.delay)
        error = AttemptError.of(failure.error_class, failure.code, failure.message)
        return Retry(error, decision.delay, counted=False)

    def _penalized(self, lease: Lease, failure: TaskFailure) -> tuple[str, ...]:
        named = getattr(failure, "gate", None)
        if named is not None and named in lease.task.gates:
            return (named,)
        return self.app.rated_gates(lease.task.gates)

    async def _finish(self, lease: Lease, outcome: Outcome, took: float) -> None:
        try:
            try:
                await self.handin.record(lease, outcome)
            except ConfigError as refused:  # e.g. a bad successor: the task cannot go on
                outcome = outcomes.refused(refused)
                await self.handin.record(lease, outcome)
        except LeaseLost:
            self._abandoned(lease, "before its outcome was recorded")
            return
        finally:
            # Renewals stop here, not when the asyncio task's done-callback runs later.
            self.slots.leases.pop(lease.task_id, None)
        self._count(outcome)
        level = outcomes.level(outcome)
        if log.isEnabledFor(level):  # a line per outcome: built only when it is written
            log.log(level, "%s", outcomes.describe(lease, outcome, took))
        # No wake-up from here: the store's own wait_for_work returns when a write made work
        # claimable (a ticket back, a task ready), so an outcome that freed nothing costs no claim.

    def _count(self, outcome: Outcome) -> None:
        if isinstance(outcome, Succeeded):
            self.stats.succeeded += 1
        elif isinstance(outcome, Retry):
            self.stats.retried += 1
        elif isinstance(outcome, Dead):
            self.stats.dead += 1
        elif isinstance(outcome, AwaitRemote):
            self.stats.remote_waits += 1

    def _abandoned(self, lease: Lease, when: str) -> None:
        self.stats.leases_lost += 1
        log.warning("task %s: lease lost %s; another worker owns it now", lease.task_id, when)

    def _note_crash(self, error: BaseException) -> None:
        # The traceback helps whoever fixes the handler; its messages may carry secrets.
        trace = redact("".join(traceback.format_exception(error)), limit=None)
        log.error("handler raised %s\n%s", type(error).__name__, trace)
        if self.crash is None:
            self.crash = error
