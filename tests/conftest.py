"""Shared fixtures: async tests run on anyio's plugin, on the virtual-time loop by default."""

from __future__ import annotations

from typing import Any

import pytest

from headrace.sim.loop import VirtualTimeLoop


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"loop_factory": VirtualTimeLoop, "debug": True})
