"""Every conformance case runs against every backend; the store's clock is a ManualClock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from headrace.policy import GateConfig, ManualClock, Rate
from headrace.store.base import Store
from headrace.store.memory import MemoryStore
from headrace.store.types import Settings

BACKENDS = ["memory", "sqlite"]

GATES = (
    GateConfig("provider:video", concurrency=2, rate=Rate(4, per="10s")),
    GateConfig("provider:image", concurrency=3, rate=Rate(10, per="6s")),
    GateConfig("session:*", concurrency=1),
    GateConfig("free"),
)
AGING_STEP = 30.0


def make_backend(name: str, clock: ManualClock, tmp_path: Path) -> Store:
    if name == "memory":
        return MemoryStore(clock)
    if name == "sqlite":
        from headrace.store.sqlite import SQLiteStore

        return SQLiteStore(tmp_path / "conformance.db", clock=clock)
    raise ValueError(name)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
async def store(backend: str, clock: ManualClock, tmp_path: Path) -> AsyncIterator[Store]:
    opened = make_backend(backend, clock, tmp_path)
    await opened.open(Settings(gates=GATES, aging_step=AGING_STEP, poison_expiries=3))
    yield opened
    await opened.close()


@pytest.fixture
def reopen(backend: str, clock: ManualClock, tmp_path: Path) -> Callable[[], Store]:
    """A second handle on the same durable state (a restarted process); memory has none."""
    if backend == "memory":
        pytest.skip("the memory store does not outlive its process")
    return lambda: make_backend(backend, clock, tmp_path)
