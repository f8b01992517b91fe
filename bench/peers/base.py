"""What each system of the peer benchmark provides, and the place one case of it runs in."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Protocol

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379/11"  # a database of its own; every key also holds the case's name
SITE_ENV = "HEADRACE_BENCH_SITE"

Store = Literal["postgres", "redis", "sqlite"]


@dataclass(frozen=True)
class Site:
    """One case's own place. `name` is its PostgreSQL schema and is in each of its Redis keys;
    `scratch` holds its SQLite file, its tasks' marks and its processes' logs; `port` is where
    its timed tasks report their start (UDP on the loopback)."""

    name: str
    scratch: str
    port: int = 0
    postgres: str = POSTGRES
    redis: str = REDIS

    @property
    def marks(self) -> Path:
        return Path(self.scratch) / "marks"

    @property
    def postgres_in_schema(self) -> str:
        """The server's URL with the case's schema first on the search path."""
        return f"{self.postgres}?options=-csearch_path%3D{self.name}"

    def env(self) -> dict[str, str]:
        """How the site reaches the worker and producer processes."""
        return {SITE_ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls) -> Site:
        return cls(**json.loads(os.environ[SITE_ENV]))


class Producer(Protocol):
    """How a system is fed, in the producer process."""

    async def prepare(self) -> None:
        """Install what the system keeps in the site (tables, functions), before any worker."""

    async def noops(self, count: int) -> None:
        """Enqueue `count` no-op tasks."""

    async def timed(self, ref: str) -> None:
        """Enqueue one timed task; return once the system has accepted it."""


def no_env(site: Site) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Peer:
    """One system: its name, its store, the worker settings it runs with (in words, for the
    tables and the docs), the commands that start `processes` worker processes, and its
    producer. `env` is what its processes need in their environment besides the site."""

    name: str
    store: Store
    settings: str
    workers: Callable[[Site, int], list[list[str]]]
    producer: Callable[[Site], AbstractAsyncContextManager[Producer]]
    env: Callable[[Site], dict[str, str]] = field(default=no_env)
