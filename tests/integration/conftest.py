"""Fixtures the API tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .postgres import fresh_schema, reachable


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The service's store: an SQLite file, or a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'api.db'}"
        return
    reachable()
    with fresh_schema("api") as url:
        yield url
