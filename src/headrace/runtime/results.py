"""What handlers and pollers return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headrace.policy.durations import Duration, seconds
from headrace.policy.errors import ConfigError


@dataclass(frozen=True)
class Result:
    """The task is done. `cost` overrides the task's ledger units (e.g. seconds of audio made)."""

    cost: float | None = None

    def __post_init__(self) -> None:
        if self.cost is not None and self.cost < 0:
            raise ConfigError(f"Result.cost: expected >= 0, got {self.cost!r}")


@dataclass(frozen=True)
class RemoteWait:
    """Made by `ctx.await_remote`: the remote job runs on; free the slot, keep the tickets."""

    remote_id: str
    every: float
    timeout: float | None


@dataclass(frozen=True)
class Pending:
    """A poller's answer while the remote job still runs; `after` (seconds or "30s")
    overrides the poll interval."""

    after: Duration | None = None

    def __post_init__(self) -> None:
        if self.after is not None:
            object.__setattr__(self, "after", seconds(self.after, field="Pending.after"))

    @property
    def delay(self) -> float | None:
        return None if self.after is None else float(self.after)


@dataclass(frozen=True)
class Delivery:
    """How a provider said a remote job ended, in a webhook (`remote.deliver`)."""

    provider: str
    succeeded: bool
    result: Any
