"""Writers sharing one PostgreSQL store, each with its own pool, as processes on other hosts
would: what one of them commits first decides and the other's transaction runs again, and idle
workers hear of new work by NOTIFY. Needs the test server (skips without it, fails when `CI` is
set)."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
from collections.abc import AsyncIterator
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

import psycopg
import pytest
from psycopg import sql

from headrace.policy import GateConfig, Tier
from headrace.policy.errors import KeyConflict
from headrace.store.machine.claim import first_batch
from headrace.store.postgres import PostgresStore
from headrace.store.protocol.types import NewTask, Settings, Sibling, Succeeded, TaskState
from headrace.store.sqlite import SQLiteStore
from tests.integration.postgres import fresh_schema

pytestmark = pytest.mark.anyio

ROUNDS = 20
WRITERS = 12  # at once, over two stores' pools


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real sockets need real time


@pytest.fixture
async def stores() -> AsyncIterator[list[PostgresStore]]:
    with fresh_schema("headrace_race") as url:
        opened = [PostgresStore.from_url(url) for _ in range(2)]
        for store in opened:
            await store.open(Settings())
        try:
            yield opened
        finally:
            for store in opened:
                await store.close()


async def test_a_key_submitted_by_two_writers_at_once_names_one_task(
    stores: list[PostgresStore],
) -> None:
    first, second = stores
    for n in range(ROUNDS):
        # Overlapping batches: the shared keys come with the same payload (one flow per key).
        mine = [NewTask("shot", f"r{n}", key=f"k{n}/{i}", flow=f"f{n}/{i}") for i in range(4)]
        theirs = [NewTask("shot", f"r{n}", key=f"k{n}/{i}", flow=f"f{n}/{i}") for i in range(2, 6)]
        a, b = await asyncio.gather(first.submit(mine), second.submit(theirs))
        assert [s.id for s in a[2:]] == [s.id for s in b[:2]]  # the shared keys
        assert sum(s.created for s in [*a, *b]) == 6  # each key created once
    counts = await first.counts()
    assert counts[TaskState.READY] == 6 * ROUNDS


async def test_a_key_submitted_by_two_writers_with_two_payloads_names_the_first(
    stores: list[PostgresStore],
) -> None:
    """The writer that loses the race for a key runs again, finds the winner's task and is
    refused, since its payload differs: exactly one task per key, one KeyConflict per round."""
    first, second = stores
    for n in range(ROUNDS):
        mine = [NewTask("shot", f"r{n}", key=f"k{n}", flow=f"a{n}")]
        theirs = [NewTask("shot", f"other{n}", key=f"k{n}", flow=f"b{n}")]
        results = await asyncio.gather(
            first.submit(mine), second.submit(theirs), return_exceptions=True
        )
        refused = [r for r in results if isinstance(r, KeyConflict)]
        created = [r for r in results if isinstance(r, list)]
        assert len(refused) == 1 and len(created) == 1, results
        assert refused[0].task_id == created[0][0].id
        assert refused[0].field == "ref"  # the first field that differs
        found = await first.find(f"k{n}")
        assert found is not None and found.id == created[0][0].id
    counts = await first.counts()
    assert counts[TaskState.READY] == ROUNDS


async def test_producers_over_the_same_keys_never_fail_from_contention() -> None:
    """Twenty producers, each with its own pool, submit the same 500 keys in batches of ten,
    in orders of their own: no batch fails (a writer waits for the keys another is inserting,
    then finds its tasks), and each key names one task for every producer."""
    keys = [f"upload-{n}" for n in range(500)]
    with fresh_schema("headrace_keys") as url:
        producers = [PostgresStore.from_url(f"{url}&pool_max=2") for _ in range(20)]
        for store in producers:
            await store.open(Settings())
        try:
            named = await asyncio.gather(
                *(produce(store, keys, seed) for seed, store in enumerate(producers))
            )
            counts = await producers[0].counts()
        finally:
            for store in producers:
                await store.close()
    assert counts[TaskState.READY] == len(keys)
    assert all(each == named[0] for each in named)


async def produce(store: PostgresStore, keys: list[str], seed: int) -> dict[str, int]:
    """Submit `keys` in batches of ten, in an order drawn from `seed`; the task each names."""
    order = random.Random(seed).sample(keys, len(keys))
    named: dict[str, int] = {}
    for start in range(0, len(order), 10):
        batch = order[start : start + 10]
        tasks = [NewTask("upload", key, key=key, flow=f"event-{key[-1]}") for key in batch]
        for key, submitted in zip(batch, await store.submit(tasks), strict=True):
            named[key] = submitted.id
    return named


async def notified(store: PostgresStore, write: Any) -> bool:
    """Whether `write()` makes the store NOTIFY its channel (listened to on a connection of its
    own, as an idle worker's store does)."""
    async with await psycopg.AsyncConnection.connect(store.dsn, autocommit=True) as listener:
        await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(store.channel)))
        await write()
        heard = [n async for n in listener.notifies(timeout=0.5, stop_after=1)]
    return bool(heard)


async def test_a_write_notifies_idle_workers_only_when_work_may_be_ready(
    stores: list[PostgresStore],
) -> None:
    store = stores[0]
    assert await notified(store, lambda: store.submit([NewTask("shot", "alone")]))
    [alone] = (await store.claim("w", 1, lease_for=30.0)).leases
    # A success that returns no ticket and leaves no dependent frees nothing for anyone.
    assert not await notified(store, lambda: store.finish_many([(alone, Succeeded())]))
    pair = [NewTask("script", "ep"), NewTask("assembly", "ep", after=(Sibling(0),))]
    await store.submit(pair)
    [script] = (await store.claim("w", 1, lease_for=30.0)).leases
    assert await notified(store, lambda: store.finish_many([(script, Succeeded())]))
    [assembly] = (await store.claim("w", 1, lease_for=30.0)).leases
    assert assembly.task.kind == "assembly"


async def plain_results(store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each submit from now on was written by the one-statement path."""
    results: list[bool] = []
    one_statement = store._submit_plain

    async def recorded(batch: Any) -> Any:
        submitted = await one_statement(batch)
        results.append(submitted is not None)
        return submitted

    monkeypatch.setattr(store, "_submit_plain", recorded)
    return results


async def test_a_plain_submit_is_one_statement_once_its_flows_exist(
    stores: list[PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = stores[0]
    plain = await plain_results(store, monkeypatch)
    [first] = await store.submit([NewTask("shot", "1", flow="a")])
    [second] = await store.submit([NewTask("shot", "2", flow="a")])
    # A new flow in the batch: nothing written by the one statement, all of it by the general
    # path (the known flow's finish tag moves once).
    both = await store.submit([NewTask("shot", "3", flow="a"), NewTask("shot", "4", flow="b")])
    await store.submit([NewTask("shot", "5", flow="a"), NewTask("shot", "6", flow="b")])
    # Not plain at all: a key, a dependency, two tasks of one flow.
    await store.submit([NewTask("shot", "7", flow="a", key="k7")])
    await store.submit([NewTask("shot", "8", flow="a", after=(first.id,))])
    await store.submit([NewTask("shot", "9", flow="b"), NewTask("shot", "10", flow="b")])
    assert plain == [False, True, False, True]
    assert first.id < second.id < both[0].id < both[1].id
    tags = {t.ref: t.tag for t in await store.tasks()}
    assert [tags[str(n)] for n in (1, 2, 3, 5, 7, 8)] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert [tags[str(n)] for n in (4, 6, 9, 10)] == [0.0, 1.0, 2.0, 3.0]
    assert (await store.counts())[TaskState.READY] == 9
    assert (await store.counts())[TaskState.PENDING] == 1


async def test_the_one_statement_submit_tags_as_the_policy_does(
    stores: list[PostgresStore],
) -> None:
    """Tags from SQL and from `fairness.tag` agree to the bit, weights and virtual time moving."""
    store, model = stores[0], SQLiteStore.in_memory()
    await model.open(Settings())
    weights = {"a": 1.0, "b": 3.0, "c": 0.7, "d": 2.5}
    for n in range(12):
        batch = [NewTask("shot", f"{flow}{n}", flow=flow, weight=w) for flow, w in weights.items()]
        parts = [batch] if n % 2 else [batch[:2], batch[2:]]
        for target in (store, model):
            for part in parts:
                await target.submit(part)
            await target.claim("w", 3, lease_for=30.0)  # moves the virtual time
    ours = {t.ref: t.tag for t in await store.tasks()}
    theirs = {t.ref: t.tag for t in await model.tasks()}
    assert ours == theirs
    assert len(ours) == 4 * 12


async def test_a_claim_draws_its_turns_only_once_it_holds_its_flows(
    stores: list[PostgresStore],
) -> None:
    """Another transaction holds the flow while the claim leases: the claim waits for it, and
    only then draws its dispatch numbers. The other one draws and serves the flow meanwhile,
    so the claim's turn comes after it (drawn before the lock, it would move the flow's turn
    back when it commits)."""
    store = stores[0]
    await store.submit([NewTask("shot", "1", flow="a")])
    async with await psycopg.AsyncConnection.connect(store.dsn) as other:
        await other.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
        await other.execute("SELECT served FROM flows WHERE flow = 'a' FOR UPDATE")
        claim = asyncio.create_task(store.claim("w", 1, lease_for=30.0))
        await waiting_for_a_lock(other, f"headrace/{store.schema}"[:63])
        cursor = await other.execute("SELECT nextval('dispatches') AS n")
        drawn = await cursor.fetchone()
        assert drawn is not None
        await other.execute("UPDATE flows SET served = %s WHERE flow = 'a'", [drawn[0]])
        await other.commit()
        claimed = await claim
        cursor = await other.execute("SELECT served FROM flows WHERE flow = 'a'")
        found = await cursor.fetchone()
    assert [lease.task.ref for lease in claimed.leases] == ["1"]
    assert found is not None
    assert found[0] == drawn[0] + 1


async def waiting_for_a_lock(conn: psycopg.AsyncConnection[Any], application: str) -> None:
    """Until a session of `application` waits for a lock (10 s at most)."""
    for _ in range(1000):
        cursor = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND wait_event_type = 'Lock'",
            [application],
        )
        found = await cursor.fetchone()
        if found is not None and found[0]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no session of {application} waited for a lock")


async def test_an_idle_claim_is_five_statements_in_two_round_trips(
    stores: list[PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """BEGIN, the claim's start and its batch (the clock read in the batch, once its gates
    are held); then the lease, which serves the flows too, and COMMIT."""
    store = stores[0]
    await store.submit([NewTask("shot", "warm")])
    await store.claim("w", 1, lease_for=30.0)  # the first sweep and the clock: before counting
    await store.submit([NewTask("shot", "counted")])
    sent: list[str] = []
    syncs: list[int] = []
    execute, sync = psycopg.AsyncConnection.execute, psycopg.AsyncPipeline.sync

    async def counted_execute(
        conn: psycopg.AsyncConnection[Any], query: Any, *a: Any, **kw: Any
    ) -> Any:
        sent.append(str(query).split()[0])
        return await execute(conn, query, *a, **kw)

    async def counted_sync(pipeline: psycopg.AsyncPipeline) -> None:
        syncs.append(len(sent))
        await sync(pipeline)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", counted_execute)
    monkeypatch.setattr(psycopg.AsyncPipeline, "sync", counted_sync)
    claimed = await store.claim("w", 1, lease_for=30.0)
    assert [lease.task.ref for lease in claimed.leases] == ["counted"]
    assert len(sent) == 5, sent
    assert sent[0] == "BEGIN" and sent[-1] == "COMMIT"
    assert syncs == [3]  # the batch read; the commit's sync ends the pipeline


PROBES = 24
CLAIMERS = 2
LOW_TASKS = 40  # more than one claim's first batch: the other claim reads past it
ORDERED_GATE = GateConfig("lane:*", concurrency=3)  # a gate of its own for each probe


def claim_probes(url: str, name: str, start: Barrier, out: Queue[tuple[int, list[str]]]) -> None:
    """One worker process: at each probe, wake with the others and claim up to three tasks."""

    async def run() -> None:
        store = PostgresStore.from_url(url)
        await store.open(Settings(gates=(ORDERED_GATE,)))
        try:
            await store.now()
            for probe in range(PROBES):
                start.wait(timeout=30)
                claimed = await store.claim(name, 3, lease_for=30.0, kinds=[f"k{probe}"])
                out.put((probe, [lease.task.ref for lease in claimed.leases]))
        finally:
            await store.close()

    asyncio.run(run())


async def submit_probe(url: str, probe: int) -> None:
    store = PostgresStore.from_url(url)
    await store.open(Settings(gates=(ORDERED_GATE,)))
    try:
        kind, gate = f"k{probe}", (f"lane:{probe}",)
        await store.submit([NewTask(kind, "rush", gates=gate, tier=Tier.RUSH)])
        await store.submit(
            [NewTask(kind, f"low{i}", gates=gate, tier=Tier.LOW) for i in range(LOW_TASKS)]
        )
    finally:
        await store.close()


@pytest.mark.realtime
def test_claims_from_two_processes_at_once_keep_tier_order_for_a_gates_tickets() -> None:
    """Two worker processes wake together and claim, over and over: whichever takes the gate's
    three tickets, the rush task ahead of the low ones is among them, never skipped because the
    other claim held it while that one handed the tickets to low tasks."""
    context = multiprocessing.get_context("spawn")
    with fresh_schema("headrace_order") as url:
        start = context.Barrier(CLAIMERS + 1)
        out: Queue[tuple[int, list[str]]] = context.Queue()
        workers = [
            context.Process(target=claim_probes, args=(url, f"w{n}", start, out))
            for n in range(CLAIMERS)
        ]
        for worker in workers:
            worker.start()
        try:
            for probe in range(PROBES):
                asyncio.run(submit_probe(url, probe))
                start.wait(timeout=30)
                granted = [ref for _ in workers for ref in out.get(timeout=30)[1]]
                assert len(granted) == 3, f"probe {probe}: {granted}"
                assert "rush" in granted, f"probe {probe}: the rush task lost to {granted}"
        finally:
            for worker in workers:
                worker.join(timeout=30)
                if worker.is_alive():
                    worker.kill()


async def test_a_claim_reads_past_a_batch_another_transaction_holds(
    stores: list[PostgresStore],
) -> None:
    """Every task of a claim's first batch is locked by someone else: the claim goes on to the
    next batch instead of giving up (or failing)."""
    store = stores[0]
    subs = await store.submit([NewTask("shot", f"t{i:02d}") for i in range(30)])
    size = first_batch(1)  # rounds(): the first batch is just big enough for the limit
    async with await psycopg.AsyncConnection.connect(store.dsn) as other:
        await other.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
        ids = [s.id for s in subs[:size]]
        await other.execute("SELECT id FROM tasks WHERE id = ANY(%s) FOR UPDATE", [ids])
        claimed = await store.claim("w", 1, lease_for=30.0)
        await other.rollback()
    assert [lease.task.ref for lease in claimed.leases] == [f"t{size:02d}"]


async def test_a_list_of_records_never_gains_one_before_what_it_has_shown(
    stores: list[PostgresStore],
) -> None:
    """Writers on two stores make and move records at once while a reader lists them again
    and again: whatever a list shows that the one before it did not comes after everything the
    one before showed (seqs commit in the order they are taken), and a change returns the seq
    it committed with."""
    writers = stores
    done = asyncio.Event()
    returned: dict[tuple[str, int], int] = {}
    broken: list[tuple[int, int]] = []

    async def write(store: PostgresStore, name: str) -> None:
        for n in range(40):
            made = await store.records.put_record("item", f"{name}{n}", scope="s", state="new")
            returned[(made.record.id, 0)] = made.record.seq
            moved = await store.records.change_record("item", f"{name}{n}", state="seen")
            returned[(moved.record.id, 1)] = moved.record.seq

    async def read() -> None:
        shown: set[tuple[str, int]] = set()
        top = 0
        while not done.is_set():
            found = await writers[0].records.list_records("item", limit=10_000)
            now = {(r.id, r.seq) for r in found}
            broken.extend((seq, top) for _, seq in now - shown if seq <= top)
            shown, top = now, max((seq for _, seq in now), default=0)

    reader = asyncio.create_task(read())
    try:
        await asyncio.gather(*(write(writers[n % 2], f"w{n}-") for n in range(WRITERS)))
    finally:
        done.set()
        await reader
    assert broken == []
    final = {r.id: r.seq for r in await writers[0].records.list_records("item", limit=10_000)}
    assert all(final[record_id] == returned[(record_id, 1)] for record_id in final)
