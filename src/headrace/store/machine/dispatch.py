"""The dispatch decision, written once for every backend.

A store opens its claim transaction, feeds candidates in `(tier, tag, id)` order to `GateBook`,
and persists what the book changed. The book asks each candidate's gates; a refusing gate skips
only that candidate (no head-of-line blocking), and a task is granted tickets on all of its gates
or on none. `KindBudget` and `MemoryBudget` skip, the same way, a candidate the claiming worker
has no slot of its class or no memory for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from headrace.policy import gate as gating
from headrace.policy.gate import GateConfig, GateState, Refusal
from headrace.store.protocol.types import KindLimit, MemoryRoom


@dataclass
class GateBook:
    """The gate states one claim transaction works on: loaded on first use, written back after."""

    configs: Mapping[str, GateConfig]
    load: Callable[[str], GateState]
    now: float
    states: dict[str, GateState] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)
    refused_keys: set[str] = field(default_factory=set)
    token_refused: set[str] = field(default_factory=set)

    def config(self, name: str) -> GateConfig:
        return gating.resolve(name, self.configs)

    def state(self, name: str) -> GateState:
        if name not in self.states:
            self.states[name] = self.load(name)
        return self.states[name]

    def admit(self, gates: Sequence[str]) -> bool:
        """Grant a ticket on every gate in `gates`, or refuse (counting it) and grant none."""
        for name in gates:
            refusal = gating.check(self.config(name), self.state(name), self.now)
            if refusal is not None:
                self._refuse(name, refusal, gates)
                return False
        for name in gates:
            self.states[name] = gating.grant(self.config(name), self.state(name), self.now)
            self.changed.add(name)
        return True

    def _refuse(self, name: str, refusal: Refusal, gates: Sequence[str]) -> None:
        self.states[name] = gating.refuse(self.state(name), refusal, self.now)
        self.changed.add(name)
        self.refused_keys.add(gate_key(gates))
        if refusal is Refusal.TOKEN:
            self.token_refused.add(name)

    def wake_at(self) -> float | None:
        """When a gate that refused for tokens in this claim admits again."""
        times = [
            gating.next_admission(self.config(name), self.state(name), self.now)
            for name in self.token_refused
        ]
        return min((t for t in times if t is not None), default=None)


class MayRunAlone(Protocol):
    @property
    def solo(self) -> bool: ...


class MayWait(MayRunAlone, Protocol):
    @property
    def gates(self) -> tuple[str, ...]: ...

    @property
    def memory(self) -> int: ...


def fits_claim(task: MayRunAlone, chosen: int, alone: bool) -> bool:
    """A task that must run alone goes only to a worker running nothing, and by itself."""
    return not task.solo or (alone and chosen == 0)


def waits_for_alone(task: MayRunAlone, chosen: int, alone: bool) -> bool:
    """A task that must run alone, passed over by this claim only for want of an idle worker:
    the worker is told (`ClaimResult.solo_waiting`) and runs nothing new until it is idle."""
    return task.solo and not fits_claim(task, chosen, alone)


def takes(task: MayWait, chosen: int, limit: int, ahead: int) -> bool:
    """Whether a claim for `limit` tasks, and `ahead` more that may wait in the worker for a
    slot, takes `task` after `chosen` others: within `limit` any task; past it only one that
    may wait (`may_wait`)."""
    return chosen < limit or (chosen < limit + ahead and may_wait(task))


def may_wait(task: MayWait) -> bool:
    """A task a worker may hold before one of its slots is free (claimed ahead): it passes no
    gate, so nothing a provider counts (a call in flight, a start in the window) waits in a
    worker; it charges no memory; it need not run alone."""
    return not task.gates and not task.memory and not task.solo


def gate_key(gates: Iterable[str]) -> str:
    return " ".join(sorted(gates))


def earliest(*times: float | None) -> float | None:
    present = [t for t in times if t is not None]
    return min(present) if present else None


class KindBudget:
    """What a claim may still take of each group of kinds (`KindLimit`s: a cost class's free
    slots, a downstream stage's room); a kind may be in several groups and is taken only while
    each has room. Kinds in no group are limited only by the claim's own limit."""

    def __init__(self, within: Sequence[KindLimit]) -> None:
        self._groups: dict[str, list[int]] = {}
        self._room = [limit.limit for limit in within]
        for number, limit in enumerate(within):
            for kind in limit.kinds:
                self._groups.setdefault(kind, []).append(number)

    def fits(self, kind: str) -> bool:
        return all(self._room[group] > 0 for group in self._groups.get(kind, ()))

    def take(self, kind: str) -> None:
        for group in self._groups.get(kind, ()):
            self._room[group] -= 1

    def open_kinds(self, kinds: Sequence[str] | None) -> list[str] | None:
        """`kinds` (None: every kind) less those in a full group; None stays None."""
        if kinds is None:
            return None
        return [kind for kind in kinds if self.fits(kind)]


class MemoryBudget:
    """What a claim may still charge of the claiming worker's memory (`MemoryRoom`; None: the
    worker keeps no budget). A task that does not fit is skipped and stays ready in its place,
    so a smaller one behind it may be taken; a task larger than the whole room is taken only
    into a worker that runs nothing charged, and then nothing charged goes beside it. A large
    task (past `MemoryRoom.large`) must also fit in what is left of the large tasks' share."""

    def __init__(self, room: MemoryRoom | None) -> None:
        self._free = None if room is None else room.free
        self._idle = room is None or room.idle
        self._large = None if room is None else room.large
        self._large_free = 0 if room is None else room.large_free

    def fits(self, memory: int) -> bool:
        if memory == 0 or self._idle or self._free is None:
            return True
        return memory <= self._free and (not self._is_large(memory) or memory <= self._large_free)

    def take(self, memory: int) -> None:
        if memory == 0:
            return
        self._idle = False
        if self._free is not None:
            self._free = max(0, self._free - memory)
        if self._is_large(memory):
            self._large_free = max(0, self._large_free - memory)

    def most(self) -> int | None:
        """The most memory a task may have and still fit (None: any): a claim need not read
        tasks larger than this, and it only ever shrinks during a claim."""
        return None if self._idle or self._free is None else self._free

    def _is_large(self, memory: int) -> bool:
        return self._large is not None and memory > self._large
