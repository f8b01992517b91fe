"""Shared fixtures: async tests run on anyio's plugin, on the virtual-time loop by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from headrace.sim.loop import VirtualTimeLoop


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"loop_factory": VirtualTimeLoop, "debug": True})


@pytest.fixture(scope="session")
def media_samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every sample media file (pipelines/moderation/samples.py), written once per run."""
    from headrace.pipelines.moderation import samples

    return samples.write_all(tmp_path_factory.mktemp("media"))
