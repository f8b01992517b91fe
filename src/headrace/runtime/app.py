"""The application object: gates, task definitions and the store they share.

Made by the user and handed to workers, the API and the CLI; nothing is global.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, overload

from headrace.policy import gate as gating
from headrace.policy.clock import Clock
from headrace.policy.durations import Duration, positive_seconds, seconds
from headrace.policy.errors import ConfigError, QueueFull
from headrace.policy.gate import GateConfig
from headrace.policy.rate import Rate
from headrace.policy.retention import Retention
from headrace.policy.retry import RetryPolicy
from headrace.policy.tiers import Tier
from headrace.runtime.classes import check_class_name
from headrace.runtime.context import Context
from headrace.runtime.prunehooks import PruneHook
from headrace.runtime.results import Pending, RemoteWait, Result
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import (
    NewTask,
    Settings,
    Sibling,
    StageLimits,
    Submitted,
    check_text,
)
from headrace.store.urls import open_store

HandlerResult = Result | RemoteWait | None
Handler = Callable[[Context, str], Awaitable[HandlerResult] | HandlerResult]
Poller = Callable[[Context, str], Awaitable[Result | Pending]]
Canceller = Callable[[Context, str], Awaitable[object]]
OnFull = Literal["wait", "refuse"]

PRODUCER_WAIT_MIN = 0.05
PRODUCER_WAIT_MAX = 1.0


@dataclass(frozen=True)
class TaskOptions:
    gates: tuple[str, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    tier: Tier = Tier.NORMAL
    bound: int | None = None
    on_full: OnFull = "wait"
    cost: float = 1.0
    timeout: float | None = None  # seconds an attempt (or a remote check) may take
    cost_class: str | None = None  # the worker slots it runs in (runtime/classes.py)
    per_flow: int | None = None  # waiting tasks of one flow it holds at most
    per_group: int | None = None  # waiting tasks of one group it holds at most
    feeds: tuple[str, ...] = ()  # the stages its successors go to (for backpressure)


def _check_gate_list(gates: Sequence[str]) -> None:
    """A list of gate names, not one name (a string would be read as its letters)."""
    if isinstance(gates, str):
        raise ConfigError(f"task.gates: expected a list of gate names, got the string {gates!r}")


class TaskDefinition:
    """A stage: its handler, gates, retry policy and waiting bound. Call `submit` to enqueue."""

    def __init__(
        self,
        app: App,
        name: str,
        handler: Handler,
        options: TaskOptions,
        poller: Poller | None,
        canceller: Canceller | None = None,
    ) -> None:
        self.app = app
        self.name = name
        self.handler = handler
        self.options = options
        self.poller = poller
        self.canceller = canceller
        self.is_async = inspect.iscoroutinefunction(handler)

    def poll(self, poller: Poller) -> Poller:
        """Decorator: how to check this task's remote job; used after restarts too."""
        self.poller = poller
        return poller

    def cancel(self, canceller: Canceller) -> Canceller:
        """Decorator: how to cancel this task's remote job once it outlived its timeout. It
        returns once the vendor has stopped the job (then the task may submit a new one); it
        raises when it could not (then the job is polled on, its ticket kept)."""
        self.canceller = canceller
        return canceller

    def spec(
        self,
        ref: str,
        *,
        group: str | None = None,
        flow: str | None = None,
        tier: Tier | str | None = None,
        key: str | None = None,
        after: Sequence[int | Sibling] = (),
        cost: float | None = None,
        delay: Duration = 0.0,
        weight: float = 1.0,
        gates: Sequence[str] = (),
        memory: int = 0,
    ) -> NewTask:
        """The task this stage would create; `{flow}` and `{group}` in gate names are filled in.
        `memory`: the bytes its attempt may use at its peak, charged against the budget of the
        worker that runs it (0: not charged). Bad fields raise ConfigError naming them (see
        `NewTask`)."""
        check_text("group", group, optional=True)  # before flow defaults to it
        check_text("flow", flow, optional=True)
        _check_gate_list(gates)
        flow = flow or group or self.name
        fields = {"flow": flow, "group": group or "", "ref": ref}
        names = [self._gate_name(name, fields) for name in (*self.options.gates, *gates)]
        return NewTask(
            kind=self.name,
            ref=ref,
            gates=tuple(dict.fromkeys(names)),
            flow=flow,
            group=group,
            tier=Tier.parse(tier) if tier is not None else self.options.tier,
            cost=self.options.cost if cost is None else cost,
            key=key,
            after=tuple(after),
            max_attempts=self.options.retry.max_attempts,
            delay=seconds(delay, field="task.delay"),
            weight=weight,
            memory=memory,
        )

    def _gate_name(self, template: str, fields: dict[str, str]) -> str:
        """`session:{flow}` filled in from the task; every field it names must have a value."""
        try:
            name = template.format(**fields)
        except (KeyError, IndexError, ValueError) as error:
            raise ConfigError(
                f"task {self.name}: gate {template!r} names an unknown field ({error});"
                " use {flow}, {group} or {ref}"
            ) from None
        if "{" in template and (name.endswith(":") or "::" in name):
            raise ConfigError(f"task {self.name}: gate {template!r} needs a value it was not given")
        return name

    async def submit(self, ref: str, **fields: object) -> int:
        """Enqueue one task and return its id. With a waiting bound, wait for room (or raise
        QueueFull when the stage refuses). A known `key` returns its task's id when the payload
        is the same, and raises KeyConflict when it is not."""
        spec = self.spec(ref, **fields)  # type: ignore[arg-type]
        [submitted] = await self.app.submit([spec])
        return submitted


class App:
    """`App("sqlite:///studio.db")` or `App("memory://")`: declare gates and tasks, run workers."""

    def __init__(
        self,
        url: str = "sqlite:///headrace.db",
        *,
        store: Store | None = None,
        clock: Clock | None = None,
        aging_step: Duration = "60s",
        poison_expiries: int = 3,
        retention: Retention | None = None,
    ) -> None:
        self.url = url
        self._store = store
        self._clock = clock
        self.aging_step = seconds(aging_step, field="aging_step")
        self.poison_expiries = poison_expiries
        # How long finished work is kept, and how often workers prune (runtime/pruner.py).
        self.retention = retention or Retention()
        self.prune_hooks: list[PruneHook] = []
        self.gates: dict[str, GateConfig] = {}
        self.definitions: dict[str, TaskDefinition] = {}
        self._opened: Store | None = None
        self._opening = asyncio.Lock()
        self._listeners: set[asyncio.Event] = set()
        self._on_close: list[Callable[[], Awaitable[object]]] = []
        self._on_start: list[Callable[[], Awaitable[object]]] = []
        self._started = False  # the start checks passed (they run once)

    # -- declaration

    def gate(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        rate: Rate | str | None = None,
        guard: Duration | None = None,
    ) -> GateConfig:
        """Declare a gate: a concurrency cap, a rate, or both. `session:*` makes one per key.
        `rate` is a `Rate` or its string form `"N/DURATION"` (`"30/6s"`, `"10/s"`); `guard`
        (default: `policy.gate.default_guard`) lengthens how long each start counts."""
        if self._opened is not None:
            raise ConfigError(f"gate {name}: declare gates before the app is opened")
        counted = None if guard is None else seconds(guard, field="gate.guard")
        config = GateConfig(name, concurrency, rate, counted)
        self.gates[name] = config
        return config

    @overload
    def task(self, handler: Handler, /) -> TaskDefinition: ...

    @overload
    def task(
        self,
        handler: None = None,
        /,
        *,
        name: str | None = None,
        gates: Sequence[str] = (),
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        tier: Tier | str = Tier.NORMAL,
        bound: int | None = None,
        on_full: OnFull = "wait",
        cost: float = 1.0,
        poll: Poller | None = None,
        cancel: Canceller | None = None,
        timeout: Duration | None = None,
        cost_class: str | None = None,
        per_flow: int | None = None,
        per_group: int | None = None,
        feeds: Sequence[str] = (),
    ) -> Callable[[Handler], TaskDefinition]: ...

    def task(
        self,
        handler: Handler | None = None,
        /,
        *,
        name: str | None = None,
        gates: Sequence[str] = (),
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        tier: Tier | str = Tier.NORMAL,
        bound: int | None = None,
        on_full: OnFull = "wait",
        cost: float = 1.0,
        poll: Poller | None = None,
        cancel: Canceller | None = None,
        timeout: Duration | None = None,
        cost_class: str | None = None,
        per_flow: int | None = None,
        per_group: int | None = None,
        feeds: Sequence[str] = (),
    ) -> TaskDefinition | Callable[[Handler], TaskDefinition]:
        """Declare a stage: `@app.task` or `@app.task(gates=[...], ...)`.

        `bound` caps its waiting (pending or ready) tasks, `per_flow` those of one flow and
        `per_group` those of one group: a producer waits for room (or is refused, `on_full`)
        and a completion whose successors do not fit is deferred. `feeds` names the stages its
        successors go to: while one of those is full, this stage's ready tasks stay queued.
        `poll` checks its remote jobs and `cancel` stops one that outlived its timeout;
        `timeout` limits each attempt (else the worker's default); `cost_class` names the
        worker slots it runs in (`Worker(classes=...)`)."""
        _check_gate_list(gates)
        if isinstance(feeds, str):
            raise ConfigError(f"task.feeds: expected a list of stage names, got {feeds!r}")
        limited = StageLimits(name or "", bound, per_flow, per_group, tuple(feeds))
        if self._opened is not None and (limited.limited or limited.feeds):
            raise ConfigError("task: declare bounded stages before the app is opened")
        policy = retry or RetryPolicy()
        if max_attempts is not None:
            policy = replace(policy, max_attempts=max_attempts)
        if on_full not in ("wait", "refuse"):
            raise ConfigError(f"task.on_full: expected 'wait' or 'refuse', got {on_full!r}")
        limit = None if timeout is None else positive_seconds(timeout, field="task.timeout")
        if cost_class is not None:
            check_class_name(cost_class, field="task.cost_class")
        options = TaskOptions(
            tuple(gates),
            policy,
            Tier.parse(tier),
            bound,
            on_full,
            cost,
            timeout=limit,
            cost_class=cost_class,
            per_flow=per_flow,
            per_group=per_group,
            feeds=limited.feeds,
        )

        def register(fn: Handler) -> TaskDefinition:
            kind = name or str(getattr(fn, "__name__", ""))
            if not kind:
                raise ConfigError("task.name: give the task a name")
            if kind in self.definitions:
                raise ConfigError(f"task.name: {kind!r} is already declared")
            definition = TaskDefinition(self, kind, fn, options, poll, cancel)
            self.definitions[kind] = definition
            return definition

        return register(handler) if handler is not None else register

    def cost_classes(self) -> dict[str, str]:
        """Each classed stage's cost class, by stage name."""
        return {
            kind: definition.options.cost_class
            for kind, definition in self.definitions.items()
            if definition.options.cost_class is not None
        }

    def definition(self, kind: str) -> TaskDefinition:
        try:
            return self.definitions[kind]
        except KeyError:
            raise ConfigError(f"task.kind: no task named {kind!r} in this app") from None

    def rated_gates(self, names: Sequence[str]) -> tuple[str, ...]:
        """The gates among `names` that carry a rate: what a rate-limit response penalises."""
        return tuple(n for n in names if gating.resolve(n, self.gates).rate is not None)

    # -- the store

    @property
    def settings(self) -> Settings:
        return Settings(
            tuple(self.gates.values()), self.aging_step, self.poison_expiries, self.stage_limits()
        )

    def stage_limits(self) -> tuple[StageLimits, ...]:
        """The limits and feeds of the stages that have any, for the store to hold."""
        found = []
        for kind, definition in sorted(self.definitions.items()):
            options = definition.options
            for fed in options.feeds:
                if fed not in self.definitions:
                    raise ConfigError(f"task {kind}: feeds names no declared stage: {fed!r}")
            stage = StageLimits(
                kind, options.bound, options.per_flow, options.per_group, options.feeds
            )
            if stage.limited or stage.feeds:
                found.append(stage)
        return tuple(found)

    async def open(self) -> Store:
        async with self._opening:
            if self._opened is None:
                store = self._store or open_store(self.url, clock=self._clock)
                await store.open(self.settings)
                self._opened = store
        return self._opened

    @property
    def store(self) -> Store:
        if self._opened is None:
            raise ConfigError("app: not opened yet; `await app.open()` or `async with app`")
        return self._opened

    def on_prune(self, hook: PruneHook) -> None:
        """Run `hook` in every prune, after the store's rows (a pipeline's records and files):
        it gets the run (`PruneRun`) and returns how many of each kind it removed."""
        self.prune_hooks.append(hook)

    def on_start(self, check: Callable[[], Awaitable[object]]) -> None:
        """Run `check` before this app's workers first take work (`Worker.run`, `headrace
        worker`, `headrace serve`): that a storage the handlers need answers, for instance.
        What it raises stops the worker before it claims anything."""
        self._on_start.append(check)

    async def check_start(self) -> None:
        """Run the start checks (`on_start`), once per app: a process whose checks passed
        starts its other workers without running them again."""
        if self._started:
            return
        await self.open()
        for check in self._on_start:
            await check()
        self._started = True

    def on_close(self, callback: Callable[[], Awaitable[object]]) -> None:
        """Run `callback` when the app closes (e.g. close a provider's HTTP client)."""
        self._on_close.append(callback)

    async def close(self) -> None:
        for callback in reversed(self._on_close):
            await callback()
        self._on_close.clear()
        if self._opened is not None:
            await self._opened.close()
            self._opened = None

    async def __aenter__(self) -> App:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- submission

    async def submit(self, specs: Sequence[NewTask]) -> list[int]:
        """Enqueue tasks together (all or none), honouring each stage's waiting bound."""
        return [submitted.id for submitted in await self.enqueue(specs)]

    async def enqueue(self, specs: Sequence[NewTask]) -> list[Submitted]:
        """`submit`, telling for each task whether it was created or its key named a task
        that already existed."""
        store = await self.open()
        refuse = any(self.definitions[s.kind].options.on_full == "refuse" for s in specs)
        pause = PRODUCER_WAIT_MIN
        while True:
            try:
                submitted = await store.submit(specs)  # the store holds the stages' limits
            except QueueFull:
                if refuse:
                    raise
                await asyncio.sleep(pause)
                pause = min(pause * 2, PRODUCER_WAIT_MAX)
                continue
            self.notify()
            return submitted

    # -- wake-ups within this process

    def listen(self, event: asyncio.Event) -> None:
        self._listeners.add(event)

    def unlisten(self, event: asyncio.Event) -> None:
        self._listeners.discard(event)

    def notify(self) -> None:
        """Something may have become claimable: wake this process's idle workers."""
        for event in self._listeners:
            event.set()
