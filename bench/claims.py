"""What a PostgreSQL claim of 16 tasks costs against the size of the ready queue: 10^3 and 10^6
ready tasks, each in a database of its own."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import psycopg
from psycopg import sql

from headrace.store.postgres import PostgresStore
from headrace.store.protocol.types import NewTask, Settings

T = TypeVar("T")

SERVER = "postgresql://postgres@127.0.0.1:5432"
SLOTS = 16


@dataclass(frozen=True)
class ClaimCost:
    ready: int
    claims: int
    p50_ms: float
    p99_ms: float


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _admin(statement: sql.Composed) -> None:
    async with await psycopg.AsyncConnection.connect(f"{SERVER}/postgres", autocommit=True) as c:
        await c.execute(statement)


class FreshDatabase:
    """A database of its own for one case, dropped afterwards."""

    def __init__(self, prefix: str) -> None:
        self.name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self.url = f"{SERVER}/{self.name}"

    async def __aenter__(self) -> str:
        await _admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        return self.url

    async def __aexit__(self, *exc: object) -> None:
        await _admin(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(self.name)))


async def claim_cost(url: str, ready: int, claims: int) -> ClaimCost:
    store = PostgresStore.from_url(url)
    await store.open(Settings())
    try:
        for start in range(0, ready, 5000):
            batch = [NewTask("noop", f"r{i}") for i in range(start, min(ready, start + 5000))]
            await store.submit(batch)
        costs = []
        for _ in range(claims):
            began = time.perf_counter()
            result = await store.claim("bench", SLOTS, lease_for=300.0)
            costs.append((time.perf_counter() - began) * 1000)
            assert len(result.leases) == SLOTS
        return ClaimCost(
            ready, claims, round(percentile(costs, 0.5), 2), round(percentile(costs, 0.99), 2)
        )
    finally:
        await store.close()


async def _in_database(prefix: str, body: Callable[[str], Awaitable[T]]) -> T:
    async with FreshDatabase(prefix) as url:
        return await body(url)


async def measure(quick: bool) -> list[ClaimCost]:
    big = 10_000 if quick else 1_000_000
    return [
        await _in_database("hr_small", lambda u: claim_cost(u, 1000, 50)),
        await _in_database("hr_big", lambda u: claim_cost(u, big, 50)),
    ]


def claim_figures(quick: bool) -> list[ClaimCost]:
    return asyncio.run(measure(quick))
