"""A worker's claims: work for its free slots (and some ahead of them, runtime/prefetch.py),
within its cost classes' room and its memory budget, carrying the outcomes waiting to be
written in the same transaction.

A claim that left slots free is an answer that stands (`Standing`): nothing else is
claimable for what the worker asked until the time the store named (`wake_at`), unless the
store sees a write that may have made work claimable (`Store.wakes`: its own, or another
process's notice) or what the worker asks changes (a task of its starts or ends). Until
then the worker claims nothing, and the outcomes a claim would have carried are written on
their own: waking for a remote check, or writing its outcome, is no reason to ask again (a
studio run made 4,491 claims that leased nothing of 5,247, most of them so). On a store that
sees every write (in memory) the answer needs no look every `idle`: it stands until its time."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from headrace.policy.errors import StoreUnavailable
from headrace.runtime.app import App
from headrace.runtime.completions import Completions
from headrace.runtime.settings import WorkerSettings
from headrace.runtime.slots import Slots
from headrace.store.machine.dispatch import earliest
from headrace.store.protocol.types import ClaimResult, KindLimit, MemoryRoom


@dataclass(frozen=True)
class Standing:
    """The answer of a claim that left slots free, while it stands: until `until` (the event
    loop's clock: the store's `wake_at`, and no later than the worker's `idle` unless the
    store sees every write), while the store has seen no wake-up since the claim began
    (`wakes`), for the same `kinds` asked, with the same tasks running and none waiting to
    start."""

    until: float
    wakes: int
    kinds: tuple[str, ...]
    running: frozenset[int]
    wake_at: float | None  # the store's time the answer named

    def holds(self, now: float, wakes: int, kinds: list[str], running: frozenset[int]) -> bool:
        return (
            now < self.until
            and self.wakes == wakes
            and self.running == running
            and self.kinds == tuple(kinds)
        )


class Claims:
    """Claims work into `slots` for the worker `settings` describe."""

    def __init__(self, app: App, settings: WorkerSettings, slots: Slots) -> None:
        self.app = app
        self.settings = settings
        self.slots = slots
        self.standing: Standing | None = None
        # When the last `fill`'s claim, or the answer that stood for it, said something may
        # come due (store time); None when it asked nothing (no room, or no kind open).
        self.wake_at: float | None = None

    async def fill(self) -> tuple[ClaimResult | None, list[str]]:
        """Claim for the free slots if the worker may; what was claimed (None: nothing asked)
        and the kinds the worker has room for now."""
        kinds = list(self.app.definitions)
        classes = self.settings.classes
        completions = self.slots.completions()
        room = classes.room(self.slots.running_kinds()) if classes else {}
        if classes:
            kinds = classes.open_kinds(kinds, room)
        claimed, self.wake_at = None, None
        if not (kinds and self.slots.may_claim()):
            completions.kick()
        elif (standing := self._still_standing(kinds)) is not None:
            self.wake_at = standing.wake_at
            # What the claim would have carried, written before the loop looks at its checks
            # (a check's next time is the one its outcome set).
            await completions.write_now()
        else:
            wakes = self.app.store.wakes  # before the claim: a wake-up during it is not seen
            claimed = await self._fill_slots(completions, kinds, room)
            self.wake_at = claimed.wake_at
            self._stand(claimed, kinds, wakes)
        if not self.slots.claim_coming():
            completions.kick()  # outcomes left waiting that no claim is about to take
        return claimed, kinds

    def _still_standing(self, kinds: list[str]) -> Standing | None:
        """The last claim's answer, if it still holds for `kinds` now."""
        standing = self.standing
        if standing is None:
            return None
        now, running = asyncio.get_running_loop().time(), frozenset(self.slots.running)
        if self.slots.queued or not standing.holds(now, self.app.store.wakes, kinds, running):
            self.standing = None
        return self.standing

    def _stand(self, claimed: ClaimResult, kinds: list[str], wakes: int) -> None:
        """Keep the answer of a claim that left slots free (and passed over no task that
        must run alone) until it may change."""
        slots = self.slots
        if slots.more or slots.queued or slots.solo_waiting or claimed.solo_waiting:
            self.standing = None
            return
        self.standing = Standing(
            until=self._stands_until(claimed),
            wakes=wakes,
            kinds=tuple(kinds),
            running=frozenset(slots.running),
            wake_at=claimed.wake_at,
        )

    def _stands_until(self, claimed: ClaimResult) -> float:
        """Until when (the event loop's clock) the answer of `claimed` stands, at most: the time
        the store named, and no later than `idle` (for a notice lost, or another process's
        write) unless the store sees every write (in memory)."""
        stands_for = math.inf if self.app.store.sees_every_write else self.settings.idle
        if claimed.wake_at is not None:
            stands_for = min(stands_for, claimed.wake_at - claimed.now)
        return asyncio.get_running_loop().time() + stands_for

    async def _fill_slots(
        self, completions: Completions, kinds: list[str], room: Mapping[str, int]
    ) -> ClaimResult:
        slots, classes = self.slots, self.settings.classes
        free = self.settings.slots - len(slots.running)
        ahead = slots.prefetch.room(len(slots.queued))
        within = classes.limits(room) if classes else ()
        memory = self.settings.memory.room(slots.charges())
        alone = slots.idle(completions)
        claimed = await self._claim(
            completions, free, kinds, within, alone=alone, memory=memory, ahead=ahead
        )
        # Every free slot filled (or every free one of a class): more may be ready, to claim
        # as soon as a slot frees.
        slots.more = len(claimed.leases) >= free or bool(
            classes and classes.filled((x.task.kind for x in claimed.leases), room)
        )
        if classes and self.settings.borrow and len(claimed.leases) < free:
            claimed = await self._borrow(completions, free, claimed, room, memory)
            slots.more = slots.more or len(claimed.leases) >= free
        slots.prefetch.pace(len(claimed.leases), free, ahead)
        slots.took(claimed, free)
        return claimed

    async def _claim(
        self,
        completions: Completions,
        free: int,
        kinds: list[str],
        within: Sequence[KindLimit],
        *,
        alone: bool,
        memory: MemoryRoom | None,
        ahead: int = 0,
    ) -> ClaimResult:
        taken = completions.take()
        self.slots.claiming = True
        began = asyncio.get_running_loop().time()
        try:
            claimed = await self.app.store.claim(
                self.settings.name,
                free,
                lease_for=self.settings.lease_for,
                kinds=kinds,
                alone=alone,
                finished=taken.outcomes,
                within=within,
                memory=memory,
                ahead=ahead,
            )
        except Exception as error:  # none of the outcomes was recorded: their writers retry
            taken.fail(error)
            raise
        except BaseException as error:
            taken.fail(StoreUnavailable(f"claim interrupted ({type(error).__name__})"))
            raise
        finally:
            self.slots.claiming = False
        self.slots.prefetch.claimed(asyncio.get_running_loop().time() - began)
        taken.settle(claimed.finished)
        return claimed

    async def _borrow(
        self,
        completions: Completions,
        free: int,
        claimed: ClaimResult,
        room: Mapping[str, int],
        memory: MemoryRoom | None,
    ) -> ClaimResult:
        """A second claim, for classes whose room was full, in the slots other classes left
        idle (`ClassBudget.lendable`), within the memory the first claim left (`memory` less
        what it took); `claimed` with its leases added."""
        assert self.settings.classes is not None
        lendable = self.settings.classes.lendable((x.task.kind for x in claimed.leases), room)
        if not lendable:
            return claimed
        kinds = sorted({kind for limit in lendable for kind in limit.kinds})
        left = free - len(claimed.leases)
        memory = self.settings.memory.after(memory, claimed.leases)
        more = await self._claim(completions, left, kinds, lendable, alone=False, memory=memory)
        self.slots.stats.borrowed += len(more.leases)
        return replace(
            claimed,
            leases=(*claimed.leases, *more.leases),
            wake_at=earliest(claimed.wake_at, more.wake_at),
        )
