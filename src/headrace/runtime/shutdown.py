"""How a worker stops: SIGINT or SIGTERM stops claiming (a second one says hurry), and the
tasks still in hand get `grace` seconds before they are cancelled and handed back."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Collection

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Shutdown:
    """A worker's way out: `stop` stops its claiming; `hurry` is set by a second signal."""

    def __init__(self, stop: Callable[[], None], stopping: Callable[[], bool]) -> None:
        self.stop = stop
        self.stopping = stopping
        self.hurry = asyncio.Event()

    def install_signals(self) -> Callable[[], None]:
        """Handle SIGINT and SIGTERM on the running loop; what puts the old handling back."""
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self._on_signal)

        def restore() -> None:
            for sig in SIGNALS:
                loop.remove_signal_handler(sig)

        return restore

    def _on_signal(self) -> None:
        if self.stopping():  # a second signal: hand running tasks back now
            self.hurry.set()
        self.stop()

    async def finish(self, pending: Collection[asyncio.Task[None]], grace: float) -> None:
        """Until every task in `pending` is done, `grace` seconds passed, or a second signal
        says hurry; then what still runs is cancelled (and hands itself back)."""
        if not pending:
            return
        everything = asyncio.ensure_future(asyncio.wait(pending))
        hurry = asyncio.ensure_future(self.hurry.wait())
        try:
            await asyncio.wait(
                {everything, hurry}, timeout=grace, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            everything.cancel()  # stops waiting; the handlers themselves are not cancelled
            hurry.cancel()
        late = [task for task in pending if not task.done()]
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
