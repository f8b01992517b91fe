"""The worker: claims for its free slots, runs handlers, renews leases, resolves remote waits.

It never sleeps inside a slot: a task that must wait for tokens is simply not claimed (the store
asks its gates first), a retry waits in the store with a `run_at`, and a remote job waits in the
`waiting` state with its tickets but without a slot. Between claims the worker sleeps until the
store's next known event (a run_at, a gate's next token), until the store says a write made work
claimable, until one of its own slots frees, or at most `idle` seconds.

`Worker` is the loop; its configuration is a frozen `WorkerSettings` (runtime/settings.py), and
its parts each keep their own state: the tasks in hand (`Slots`, runtime/slots.py), claiming
(`Claims`, runtime/claiming.py), remote checks (`Polls`, runtime/polls.py), attempts
(`Attempts`, runtime/attempts.py), writing outcomes (`HandIn`, runtime/handin.py), lease
renewal (`Renewal`, runtime/renewal.py) and the way out (`Shutdown`, runtime/shutdown.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any, Unpack

from headrace.policy.errors import ConfigError, StoreUnavailable
from headrace.runtime.app import App
from headrace.runtime.attempts import Attempts
from headrace.runtime.claiming import Claims
from headrace.runtime.classes import ClassBudget
from headrace.runtime.handin import OUTAGE_PAUSE, OUTAGE_PAUSE_MAX, HandIn
from headrace.runtime.polls import Polls
from headrace.runtime.progress import Progress
from headrace.runtime.pruner import Pruner
from headrace.runtime.renewal import Renewal
from headrace.runtime.settings import WorkerOptions, WorkerSettings
from headrace.runtime.shutdown import Shutdown
from headrace.runtime.slots import LoopState, Slots
from headrace.runtime.stats import WorkerStats
from headrace.store.machine.dispatch import earliest
from headrace.store.protocol.types import ACTIVE, Lease

log = logging.getLogger("headrace.worker")

MIN_SLEEP = 0.001
PRUNE_CHECKS = 4  # looks per `retention.every` for a due run
PRUNE_CHECK_MIN = 1.0  # seconds


class Worker:
    """Runs `app`'s tasks: `Worker(app, slots=4, lease="30s", ...)` with the keywords of
    `WorkerOptions` (runtime/settings.py), or `Worker(app, settings=WorkerSettings.of(...))`."""

    def __init__(
        self,
        app: App,
        *,
        settings: WorkerSettings | None = None,
        **options: Unpack[WorkerOptions],
    ) -> None:
        if settings is not None and options:
            raise ConfigError("worker: give its settings or its options, not both")
        self.app = app
        self.settings = settings or WorkerSettings.of(app, **options)
        self.stats = WorkerStats(memory_budget=self.settings.memory.budget)
        self._state = LoopState()
        self._fail_fast = False
        self._parts()

    def _parts(self) -> None:
        app, settings = self.app, self.settings
        self._slots = Slots(app, settings, self.stats, self._state, execute=self._execute)
        self._claims = Claims(app, settings, self._slots)
        self._polls = Polls(app, settings, self._slots, check=self._check)
        self._handin = HandIn(app, self._slots)
        self._attempts = Attempts(app, settings, self._slots, self._handin, self._polls)
        self._renewal = Renewal(app, settings, self._slots)
        self._shutdown = Shutdown(self.stop, lambda: self._state.stopping)
        self.progress = Progress(settings.name, self.stats, busy=self._busy_now, log=log)

    async def _execute(self, lease: Lease) -> None:
        await self._attempts.execute(lease)

    async def _check(self, lease: Lease) -> None:
        await self._attempts.check(lease)

    def _busy_now(self) -> tuple[int, int]:
        return len(self._slots.running), len(self._slots.queued)

    # -- what callers read

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def slots(self) -> int:
        return self.settings.slots

    @property
    def classes(self) -> ClassBudget | None:
        return self.settings.classes

    @property
    def lease_for(self) -> float:
        return self.settings.lease_for

    @property
    def renew_every(self) -> float:
        return self.settings.renew_every

    @property
    def idle(self) -> float:
        return self.settings.idle

    @property
    def grace(self) -> float:
        return self.settings.grace

    @property
    def timeout(self) -> float | None:
        return self.settings.timeout

    # -- running

    async def run(self, *, handle_signals: bool = False) -> None:
        """Work until `stop()` (or SIGINT/SIGTERM with `handle_signals`), then shut down
        gracefully: running handlers get `grace` seconds, the rest are released for others.
        The app's start checks (`App.on_start`) run first: what they raise stops the worker
        before it claims anything."""
        await self.app.check_start()  # before anything is claimed
        restore = self._shutdown.install_signals() if handle_signals else None
        try:
            await self._serve(until_idle=False)
        finally:
            if restore is not None:
                restore()

    async def drain(self, *, fail_fast: bool = True) -> WorkerStats:
        """Work until no task is pending, ready, running or waiting. With `fail_fast`, an error
        a handler raised that is not a TaskFailure is re-raised here (after it was recorded)."""
        self._fail_fast = fail_fast
        await self._serve(until_idle=True)
        if self._attempts.crash is not None and fail_fast:
            raise self._attempts.crash
        return self.stats

    def stop(self) -> None:
        """Stop claiming; running tasks finish (or are released after the grace period)."""
        self._state.stopping = True
        self._state.wake.set()

    async def _serve(self, *, until_idle: bool) -> None:
        await self.app.open()
        self.app.listen(self._state.wake)
        helpers = self._start_helpers(until_idle)
        try:
            await self._loop(until_idle)
        finally:
            self.app.unlisten(self._state.wake)
            self._slots.completions().kick()  # no claim comes now: waiting outcomes are written
            await self._handin.hand_back_queued()
            await self._shutdown.finish(self._slots.pending(), self.settings.grace)
            await _cancel(helpers)
            if self.settings.report_every is not None:
                self.progress.report(final=True)

    def _start_helpers(self, until_idle: bool) -> list[asyncio.Task[None]]:
        """Lease renewal; the pruner (not in a drain); the progress line."""
        helpers = [self._helper(self._renewal.forever(), "renew")]
        if not until_idle and self.settings.prune:
            helpers.append(self._helper(self._prune_forever(), "prune"))
        if self.settings.report_every is not None:
            self.progress.start()
            helpers.append(self._helper(self._report_forever(self.settings.report_every), "report"))
        return helpers

    def _helper(self, body: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        return asyncio.create_task(body, name=f"{self.name}:{what}")

    async def _report_forever(self, every: float) -> None:
        """A progress line every `report_every` seconds in which a task ended here."""
        while True:
            await asyncio.sleep(every)
            self.progress.report()

    async def _prune_forever(self) -> None:
        """Prune when a run is due: checked at the start and four times per `every`, so the
        store's lease row lets one process of the fleet in about once per period."""
        every = self.app.retention.every
        assert every is not None
        pruner = Pruner(self.app, holder=self.name)
        while True:
            try:
                await pruner.run_if_due()
            except StoreUnavailable as error:
                log.warning("pruner: store unavailable (%s); trying at the next check", error)
            except Exception:
                log.exception("pruner: the run failed; trying at the next check")
            await asyncio.sleep(max(PRUNE_CHECK_MIN, every / PRUNE_CHECKS))

    async def _loop(self, until_idle: bool) -> None:
        state = self._state
        while not state.stopping:
            state.wake.clear()
            try:
                wake_at, now = await self._fill()
                if self._attempts.crash is not None and self._fail_fast:
                    return
                if until_idle and not self._slots.busy and await self._finished():
                    return
            except StoreUnavailable as error:
                await self._store_down(error)
                continue
            state.outage = 0
            await self._sleep(wake_at, now)

    async def _store_down(self, error: StoreUnavailable) -> None:
        """Keep running handlers going and try the store again after a growing pause."""
        self._state.outage += 1
        pause = min(OUTAGE_PAUSE_MAX, OUTAGE_PAUSE * 2 ** (self._state.outage - 1))
        log.warning("store unavailable (%s); trying again in %.1fs", error, pause)
        await asyncio.sleep(pause)

    async def _finished(self) -> bool:
        counts = await self.app.store.counts(kinds=list(self.app.definitions))
        return not any(counts[state] for state in ACTIVE)

    async def _fill(self) -> tuple[float | None, float]:
        """Claim work for free slots and remote checks that are due; return when to look again
        (store time) and the store's time now."""
        claimed, kinds = await self._claims.fill()
        now = claimed.now if claimed else await self.app.store.now()
        polls = await self._polls.fill(kinds, now)
        wake_at = earliest(self._claims.wake_at, self._polls.due)
        return wake_at, polls.now if polls else now

    async def _sleep(self, wake_at: float | None, now: float | None) -> None:
        delay = self.settings.idle
        if wake_at is not None and now is not None:
            delay = min(delay, max(MIN_SLEEP, wake_at - now))
        if self._state.wake.is_set():
            return
        # Whichever comes first: work from this process, a notice from the store (another
        # process submitted or released), or the time the store said something comes due.
        waits = {
            asyncio.ensure_future(self._state.wake.wait()),
            asyncio.ensure_future(self.app.store.wait_for_work(delay)),
        }
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)


async def _cancel(helpers: list[asyncio.Task[None]]) -> None:
    for helper in helpers:
        helper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await helper


__all__ = ["Worker", "WorkerSettings", "WorkerStats"]
