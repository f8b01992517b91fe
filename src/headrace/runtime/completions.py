"""Group commit for outcomes: handlers that finish while a batch is being written wait for the
next batch, so a busy worker writes many outcomes per transaction and an idle one writes each
at once.

A worker about to claim for the slots those handlers freed takes the waiting outcomes into its
claim (`take`, `Store.claim(finished=...)`): one transaction records them and leases the next
tasks. Outcomes no claim is about to take are written on their own (`kick`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from headrace.policy.errors import HeadraceError
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import Lease, Outcome

MAX_BATCH = 256

_Item = tuple[Lease, Outcome, "asyncio.Future[None]"]


def _never() -> bool:
    return False


@dataclass
class Taken:
    """Outcomes a claim records: settled with its results, or failed with its error."""

    items: list[_Item]
    owner: Completions

    @property
    def outcomes(self) -> list[tuple[Lease, Outcome]]:
        return [(lease, outcome) for lease, outcome, _ in self.items]

    def settle(self, results: Sequence[HeadraceError | None]) -> None:
        for (_, _, future), result in zip(self.items, results, strict=True):
            _settle(future, result)
        self.owner.waiting -= len(self.items)

    def fail(self, error: BaseException) -> None:
        for _, _, future in self.items:
            _settle(future, error)
        self.owner.waiting -= len(self.items)


class Completions:
    def __init__(
        self,
        store: Store,
        max_batch: int = MAX_BATCH,
        *,
        claim_coming: Callable[[], bool] = _never,
    ) -> None:
        """`claim_coming()`: whether a claim that will take the waiting outcomes is about to
        run (then a new outcome waits for it rather than starting a write of its own)."""
        self.store = store
        self.max_batch = max_batch
        self.batches = 0
        self.waiting = 0  # outcomes handed in and not settled yet (queued or being written)
        self._claim_coming = claim_coming
        self._queue: list[_Item] = []
        self._writer: asyncio.Task[None] | None = None

    async def finish(self, lease: Lease, outcome: Outcome) -> None:
        """Record `outcome`; raises what `Store.finish` would (e.g. LeaseLost)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((lease, outcome, future))
        self.waiting += 1
        if not self._claim_coming():
            self.kick()
        await future

    @property
    def writing(self) -> int:
        """Outcomes being written now (taken by a write or a claim, not settled yet)."""
        return self.waiting - len(self._queue)

    def take(self) -> Taken:
        """The waiting outcomes (at most a batch) for a claim to record; the claim settles
        them."""
        items = self._queue[: self.max_batch]
        del self._queue[: self.max_batch]
        if items:
            self.batches += 1
        return Taken(items, self)

    def kick(self) -> None:
        """Write the waiting outcomes now, unless a write is under way (it takes them next)."""
        if self._queue and (self._writer is None or self._writer.done()):
            self._writer = asyncio.create_task(self.write_now())

    async def write_now(self) -> None:
        """Write the waiting outcomes, a batch at a time, until none waits (in the caller's
        turn where a claim would have carried them; `kick` runs it as a task of its own)."""
        while self._queue:
            await self._write_batch(self.take())

    async def _write_batch(self, taken: Taken) -> None:
        try:
            results = await self.store.finish_many(taken.outcomes)
        except Exception as error:  # the whole batch failed (e.g. the store is unreachable)
            taken.fail(error)
            return
        taken.settle(results)

    async def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():  # the waiting handler was cancelled
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
