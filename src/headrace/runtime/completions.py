"""Group commit for outcomes: handlers that finish while a batch is being written wait for the
next batch, so a busy worker writes many outcomes per transaction and an idle one writes each
at once."""

from __future__ import annotations

import asyncio
import contextlib

from headrace.store.base import Store
from headrace.store.types import Lease, Outcome

MAX_BATCH = 256

_Item = tuple[Lease, Outcome, "asyncio.Future[None]"]


class Completions:
    def __init__(self, store: Store, max_batch: int = MAX_BATCH) -> None:
        self.store = store
        self.max_batch = max_batch
        self.batches = 0
        self._queue: list[_Item] = []
        self._writer: asyncio.Task[None] | None = None

    async def finish(self, lease: Lease, outcome: Outcome) -> None:
        """Record `outcome`; raises what `Store.finish` would (e.g. LeaseLost)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((lease, outcome, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())
        await future

    async def _write(self) -> None:
        while self._queue:
            batch = self._queue[: self.max_batch]
            del self._queue[: self.max_batch]
            await self._write_batch(batch)

    async def _write_batch(self, batch: list[_Item]) -> None:
        self.batches += 1
        try:
            results = await self.store.finish_many(
                [(lease, outcome) for lease, outcome, _ in batch]
            )
        except Exception as error:  # the whole batch failed (e.g. the store is unreachable)
            for _, _, future in batch:
                _settle(future, error)
            return
        for (_, _, future), result in zip(batch, results, strict=True):
            _settle(future, result)

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
