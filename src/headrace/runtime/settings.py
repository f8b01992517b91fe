"""A worker's configuration: what `Worker(app, **options)` (or `headrace worker`) was given,
checked once and resolved against the app into a frozen value (`WorkerSettings`).

The options (`WorkerOptions`): `slots` handlers at once; `poll_slots` remote-job checks at
once. Leases last `lease` and are renewed every `renew` (default: a third of the lease), which
must be shorter. `idle`: the longest sleep between looks at the store; `grace`: how long running
handlers get at shutdown; `timeout`: the limit of an attempt whose stage sets none. `memory`:
the bytes the running tasks may be charged at once (`NewTask.memory`; runtime/memory.py), an int
or a size such as "768MiB"; None: no budget. `classes`: slots per cost class
(runtime/classes.py), lent to other classes while idle when `borrow`. `prune`: while it runs
(not in a drain), prune the store when a run is due by the app's retention
(runtime/pruner.py). `report_every`: seconds between progress lines (runtime/progress.py).

`prefetch`: the most tasks the worker claims ahead of its slots, to start the moment a slot
frees, without a round trip to the store (default: 16 per slot; 0: none). Only tasks that pass
no gate, charge no memory and need not run alone are claimed ahead (`dispatch.may_wait`), only
while there is a backlog, and only as many as the slots finish while a claim is on its way
(runtime/prefetch.py): short tasks are claimed ahead, long ones are not. A worker with cost
classes claims no more than its classes' free slots. Tasks still waiting at shutdown are handed
back at once, their attempt not counted.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict, Unpack

from headrace.policy.durations import Duration, positive_seconds, seconds
from headrace.policy.errors import ConfigError
from headrace.policy.leases import lease_timing
from headrace.runtime.app import App
from headrace.runtime.classes import ClassBudget
from headrace.runtime.memory import DEFAULT_MEMORY, WorkerMemory
from headrace.runtime.progress import DEFAULT_EVERY

DEFAULT_SLOTS = 4
PREFETCH_PER_SLOT = 16  # the default most tasks claimed ahead, per slot


class WorkerOptions(TypedDict, total=False):
    """The keywords of `Worker(app, ...)` and `WorkerSettings.of(app, ...)` (see the module)."""

    slots: int | None
    poll_slots: int | None
    name: str | None
    lease: Duration
    renew: Duration | None
    idle: Duration
    grace: Duration
    timeout: Duration | None
    seed: int | None
    classes: Mapping[str, int] | None
    borrow: bool
    memory: int | str | None
    prune: bool
    prefetch: int | None
    report_every: Duration | None


@dataclass(frozen=True)
class WorkerSettings:
    """A worker's configuration, checked and resolved (durations in seconds); made once by
    `of`, read by the running worker's parts and never changed."""

    name: str
    slots: int
    poll_slots: int
    lease_for: float
    renew_every: float
    idle: float
    grace: float
    timeout: float | None  # an attempt's limit when its stage sets none (None: no limit)
    seed: int | None
    classes: ClassBudget | None  # slots per cost class, for the app's classed stages
    borrow: bool  # slots a class leaves idle run a class with more slots meanwhile
    memory: WorkerMemory
    prune: bool  # run the pruner when a run is due (`run` only, never `drain`)
    prefetch: int  # the most tasks claimed ahead of the slots
    report_every: float | None  # seconds between progress lines (None: none)

    @classmethod
    def of(cls, app: App, **options: Unpack[WorkerOptions]) -> WorkerSettings:
        """Check `options` (a ConfigError names the field) and resolve them for `app`."""
        _check_counts(options.get("slots"), options.get("prefetch"))
        classes = ClassBudget.for_stages(app.cost_classes(), options.get("classes"))
        slots = _slots(app, classes, options.get("slots"))
        prefetch = _prefetch(options.get("prefetch"), slots, classes)
        lease_for, renew_every = lease_timing(options.get("lease", "30s"), options.get("renew"))
        return cls(
            name=options.get("name") or _default_name(),
            slots=slots,
            poll_slots=options.get("poll_slots") or slots,
            lease_for=lease_for,
            renew_every=renew_every,
            idle=positive_seconds(options.get("idle", "0.5s"), field="worker.idle"),
            grace=seconds(options.get("grace", "30s"), field="worker.grace"),
            timeout=_optional(options.get("timeout"), "worker.timeout"),
            seed=options.get("seed"),
            classes=classes,
            borrow=options.get("borrow", True),
            memory=WorkerMemory(options.get("memory", DEFAULT_MEMORY)),
            prune=options.get("prune", True) and app.retention.every is not None,
            prefetch=prefetch,
            report_every=_optional(
                options.get("report_every", DEFAULT_EVERY), "worker.report_every"
            ),
        )


def _check_counts(slots: int | None, prefetch: int | None) -> None:
    if slots is not None and (isinstance(slots, bool) or slots < 1):
        raise ConfigError(f"worker.slots: expected a positive integer, got {slots!r}")
    if prefetch is not None and (isinstance(prefetch, bool) or prefetch < 0):
        raise ConfigError(f"worker.prefetch: expected 0 or more, got {prefetch!r}")


def _slots(app: App, classes: ClassBudget | None, slots: int | None) -> int:
    """`slots`; without them 4, or with cost classes their slots, and 4 more for the app's
    unclassed stages if it has any."""
    if slots:
        return slots
    if classes is None:
        return DEFAULT_SLOTS
    unclassed = any(kind not in classes.classes_of for kind in app.definitions)
    return classes.total + (DEFAULT_SLOTS if unclassed else 0)


def _prefetch(prefetch: int | None, slots: int, classes: ClassBudget | None) -> int:
    """`prefetch`; by default 16 per slot, none with cost classes (they count slots by the
    kinds running in them: nothing waits outside them)."""
    if prefetch is not None:
        return prefetch
    return 0 if classes else PREFETCH_PER_SLOT * slots


def _optional(value: Duration | None, field: str) -> float | None:
    return None if value is None else positive_seconds(value, field=field)


def _default_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
