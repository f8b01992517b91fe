"""The context a handler or poller receives."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from headrace.policy.durations import Duration, seconds
from headrace.policy.tiers import Tier
from headrace.runtime.results import Delivery, RemoteWait
from headrace.store.protocol.types import Lease, NewTask, Sibling, TaskRecord

if TYPE_CHECKING:
    from headrace.runtime.app import App, TaskDefinition


@dataclass
class Context:
    """One attempt of one task. Successors made with `spawn` are created in the same transaction
    as this attempt's outcome, and only if it succeeds."""

    app: App
    lease: Lease
    worker: str
    now: float
    successors: list[NewTask] = field(default_factory=list)
    # How a provider said this task's remote job ended (a webhook), for its poller: when set,
    # the poller can answer from it instead of asking the provider.
    delivery: Delivery | None = None

    @property
    def task(self) -> TaskRecord:
        return self.lease.task

    @property
    def attempt(self) -> int:
        return self.lease.task.attempt

    @property
    def idempotency_key(self) -> str:
        """A key to send with a remote job's submission (an `Idempotency-Key` header): the same
        for every attempt until a job of this task is known to have failed, so a submission
        whose answer was lost is found again by the vendor instead of made twice."""
        task = self.task
        seed = f"{task.id}|{task.created_at!r}|{task.kind}|{task.ref}".encode()
        return f"hr-{hashlib.sha256(seed).hexdigest()[:24]}-{task.remote_jobs}"

    async def leaving(self) -> None:
        """Say the call is about to leave, before it does: raises LeaseLost when another worker
        owns the task now (then do not make the call). Its start stays reserved, counting in
        every window, until `started` stamps it once the call has left: however long this
        process takes to send it (a loaded machine), the gate counts it no later than the
        vendor does. A provider adapter calls both for you when given `stamps=ctx`."""
        await self.app.store.fence(self.lease)

    async def started(self, *gates: str) -> None:
        """Stamp the start this attempt reserved on its rated gates (those named, or every one
        not stamped yet), so the gates count it from now rather than from the attempt's end.
        Call it once the request has left (after `leaving`), or right before it goes; it
        raises LeaseLost when another worker owns the task now."""
        await self.app.store.start(self.lease, gates or None)

    def spawn(
        self,
        definition: TaskDefinition | str,
        ref: str,
        *,
        after: Sequence[Sibling | int] = (),
        group: str | None = None,
        flow: str | None = None,
        tier: Tier | str | None = None,
        key: str | None = None,
        cost: float | None = None,
        weight: float = 1.0,
        continues: bool = False,
        memory: int = 0,
    ) -> Sibling:
        """A successor task; returns a handle that later successors can name in `after`.
        Group, flow and tier default to this task's; the key defaults to one derived from this
        task and the successor, so a successor is never created twice. `weight`: its share of
        its flow's turns (fairness), 1 unless given. `continues`: it carries this task's item on
        to its next stage, so it takes its turn in its flow's lane for that stage
        (`fairness.lane`) instead of going to the back of its flow's line. If its stage has no
        room when this task ends, this task is deferred: it runs again later, its attempt not
        counted. `memory`: the bytes its attempt may use at its peak (`NewTask.memory`)."""
        target = self.app.definition(definition) if isinstance(definition, str) else definition
        spec = target.spec(
            ref,
            group=group if group is not None else self.task.group,
            flow=flow if flow is not None else self.task.flow,
            tier=tier if tier is not None else self.task.submitted_tier,
            key=key or f"{self.task.key or self.task.id}>{target.name}:{ref}",
            cost=cost,
            weight=weight,
            memory=memory,
        )
        if continues:
            spec = replace(spec, continues=self.task.tag)
        self.successors.append(replace(spec, after=tuple(after)))
        return Sibling(len(self.successors) - 1)

    def await_remote(
        self, remote_id: str, *, every: Duration = "10s", timeout: Duration | None = None
    ) -> RemoteWait:
        """Return this from the handler: the task waits on `remote_id` without a worker slot,
        keeping its gate tickets; the task's poller checks it every `every`, and at once when
        a webhook delivers its outcome (`remote.deliver`). A stage without a poller waits for
        that delivery (checked every `every` for one)."""
        return RemoteWait(
            remote_id=str(remote_id),
            every=seconds(every, field="await_remote.every"),
            timeout=None if timeout is None else seconds(timeout, field="await_remote.timeout"),
        )
