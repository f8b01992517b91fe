"""Three hosts, tested as three hosts: `headrace serve --workers 0` on one network namespace and
a `headrace worker` on each of two others, PostgreSQL and the S3 server reachable only over
their links, no directory shared between them. During a burst of real uploads one worker host's
link is cut for longer than a lease, and the other worker is killed with -9 once (and started
again, as a supervisor would). Then:

- every acknowledged upload is kept and reaches a final state;
- each (media id, stage version) has exactly one derivative set in the bucket;
- tasks are claimed again only from the cut or the killed host, each within a lease and the
  sweep of the moment it was lost; a task lost beside others runs alone, so those lost together
  run one after another on the worker that takes them, each within the sweep's slack of the
  one before it ending;
- the cut host, when its link returns, talks to PostgreSQL again within about 10 s, has its
  late outcomes refused and logs that it lost its leases.

A second test cuts a host's link while it waits for the server's answer: with keepalives and a
limit on unacknowledged data on its side (`connection.CLIENT_SIDE`) it finds the connection
dead while the link is down and asks again on a new one once it is back; without them it waits
for ever.

Default worker settings (a 30 s lease). Needs root for the namespaces; skips without, with the
reason printed, and fails when `CI` is set.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.pipeline import ITEM, ItemState
from headrace.store.protocol.records import Record
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import Attempt, AttemptOutcome, Settings, TaskRecord, TaskState
from headrace.store.urls import open_store
from tests import objectstore
from tests.integration.postgres import fresh_schema
from tests.services import unavailable

from . import hosts
from .commands import ROOT, environment, headrace
from .server import make_tokens

pytestmark = [pytest.mark.realtime, pytest.mark.timeout(600)]

LEASE = 30.0  # the worker's default
# A claim sweeps expired leases every 0.1 s and an idle worker claims every 0.5 s at most; the
# rest is room for a loaded machine.
SWEEP = 5.0
CUT_FOR = LEASE + 15.0
APP = "headrace.pipelines.moderation.deploy:make_app"
PORT = 8080
UPLOADS = 60
# Seconds from the cut link's return to the cut host's first bytes to PostgreSQL: a connection
# attempt gives up after 5 s (`connect_timeout`), a worker waits at most 5 s between tries.
RESUMES_WITHIN = 12.0


@dataclass
class Burst:
    acknowledged: dict[str, str] = field(default_factory=dict)  # key -> media id
    resent: int = 0
    cut_at: float | None = None  # store time
    mended_at: float | None = None
    mended_wall: float | None = None  # time.time(), as the forwarder notes what it hears
    killed_at: float | None = None

    def lost_at(self, worker: str) -> float | None:
        """When `worker`'s host was lost: w1's link cut, w2 killed."""
        return self.cut_at if worker == "w1" else self.killed_at


def skip_without_namespaces() -> None:
    reason = hosts.available()
    if reason is not None:
        unavailable(reason, "the multi-host test")


def media_of(n: int) -> tuple[str, bytes]:
    """The burst: mostly photos, a voice note in ten, a short video in twenty."""
    if n % 20 == 7:
        return f"{n}.mp4", samples.mp4(1.0 + n / 100, 320, 240)
    if n % 10 == 3:
        return f"{n}.wav", samples.wav(1.0 + n / 100)
    return f"{n}.jpg", samples.jpeg(1024 + n, 768, shade=n % 200)


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """A PostgreSQL schema, a bucket, and the network: (store URL, bucket, S3 endpoint)."""
    skip_without_namespaces()
    with fresh_schema("hosts") as url, objectstore.fresh_bucket() as bucket:
        yield url, bucket, objectstore.reachable()


def on_link(url: str, gateway: str) -> str:
    """`url` with its host the bridge's address, where the forwarder listens."""
    parts = urlsplit(url)
    netloc = parts.netloc.replace(parts.hostname or "", gateway, 1)
    return parts._replace(netloc=netloc).geturl()


def test_a_burst_across_three_hosts_survives_a_cut_link_and_a_killed_worker(
    tmp_path: Path, services: tuple[str, str, str]
) -> None:
    url, bucket, endpoint = services
    assert headrace("db", "upgrade", "--db", url).returncode == 0
    tokens = make_tokens(url)
    s3 = urlsplit(endpoint)
    pg_port = urlsplit(url).port or 5432
    with hosts.network(["api", "w1", "w2"]) as net:
        gateway = net.gateway
        routes = {
            (gateway, pg_port): ("127.0.0.1", pg_port),
            (gateway, s3.port or 80): (s3.hostname or "127.0.0.1", s3.port or 80),
        }
        with hosts.Forwarder(routes) as forwarder:
            env = host_env(tmp_path, on_link(url, gateway), bucket, on_link(endpoint, gateway))
            burst = run_burst(net, env, tmp_path, tokens["uploader"], url)
        cut_host = net.hosts["w1"].address
    assert burst.mended_wall is not None
    heard = forwarder.heard(cut_host, pg_port, after=burst.mended_wall)
    resumed = None if heard is None else heard - burst.mended_wall
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in ("api", "w1", "w2", "w2b")}
    tasks, attempts, items = read_everything(url)
    keys = objectstore.keys_in(bucket)
    report(burst, tasks, attempts, items, keys)
    print(f"the cut host talked to PostgreSQL again {resumed} s after its link returned")
    check(burst, tasks, attempts, items, keys, logs)
    assert resumed is not None and resumed <= RESUMES_WITHIN, resumed


def host_env(tmp_path: Path, db: str, bucket: str, endpoint: str) -> dict[str, str]:
    env = environment(
        {
            "HEADRACE_URL": db,
            "HEADRACE_MEDIA": f"s3://{bucket}/media?endpoint={endpoint}&region=us-east-1",
            **objectstore.CREDENTIALS,
            "PYTHONPATH": str(ROOT),
        }
    )
    return env


def start_host(
    net: hosts.Network, host: str, name: str, command: list[str], env: dict[str, str], tmp: Path
) -> subprocess.Popen[bytes]:
    """`command` on `host`, with a scratch directory of its own (no directory is shared)."""
    scratch = tmp / f"host-{name}"
    scratch.mkdir(exist_ok=True)
    return net.start(
        host,
        [sys.executable, "-m", "headrace", *command],
        env={**env, "TMPDIR": str(scratch)},
        log=str(tmp / f"{name}.log"),
        cwd=str(scratch),
    )


def run_burst(net: hosts.Network, env: dict[str, str], tmp: Path, token: str, url: str) -> Burst:
    api = net.hosts["api"].address
    serve = ["serve", "--workers", "0", "--host", api, "--port", str(PORT)]
    processes = {"api": start_host(net, "api", "api", serve, env, tmp)}
    for name in ("w1", "w2"):
        worker = ["worker", APP, "--name", name]
        processes[name] = start_host(net, name, name, worker, env, tmp)
    try:
        wait_until_answering(f"http://{api}:{PORT}/healthz")
        return asyncio.run(drive(net, processes, env, tmp, f"http://{api}:{PORT}", token, url))
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_until_answering(address: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(address, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"nothing answered at {address}")


async def drive(
    net: hosts.Network,
    processes: dict[str, subprocess.Popen[bytes]],
    env: dict[str, str],
    tmp: Path,
    base: str,
    token: str,
    url: str,
) -> Burst:
    burst = Burst()
    store = open_store(url)
    await store.open(Settings())
    try:
        chaos = asyncio.create_task(make_chaos(net, processes, env, tmp, store, burst))
        await upload_all(base, token, burst)
        await chaos
        await until_settled(store, burst)
    finally:
        await store.close()
    return burst


async def upload_all(base: str, token: str, burst: Burst) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(UPLOADS):
        queue.put_nowait(n)

    async def client() -> None:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            while not queue.empty():
                await upload(http, token, queue.get_nowait(), burst)
                await asyncio.sleep(0.2)  # a burst spread over the cut, as phones send

    await asyncio.gather(*(client() for _ in range(4)))


async def upload(http: httpx.AsyncClient, token: str, n: int, burst: Burst) -> None:
    name, data = media_of(n)
    key = f"upload-{n}"
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": key}
    while True:
        try:
            answer = await http.post(
                "/v1/events/gala/uploads", headers=headers, files={"file": (name, data)}
            )
        except httpx.TransportError:
            answer = None
        if answer is not None and answer.status_code == 202:
            burst.acknowledged[key] = answer.json()["media_id"]
            return
        assert answer is None or answer.status_code in (429, 503), answer.text
        burst.resent += 1
        await asyncio.sleep(1.0)


async def running_on(store: Store, worker: str) -> int:
    found = await store.tasks(state=TaskState.RUNNING, limit=10_000)
    return sum(1 for task in found if task.worker == worker)


async def when_running(store: Store, worker: str, most: int = 3) -> None:
    """Return once `worker` holds running tasks (so losing it loses work): `most` of them, or
    after ten seconds as many as it has, at least one."""
    for n in range(2400):  # two minutes
        running = await running_on(store, worker)
        if running >= most or (running and n > 200):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{worker} never ran anything")


async def cut_while_running(net: hosts.Network, store: Store, host: str) -> None:
    """Cut `host`'s link while it runs something. What the store shows running once the link
    is cut is what the host will lose: its tasks can have ended between the look that found
    them and the cut (they take a few tens of milliseconds), and then it is mended and tried
    again."""
    for _ in range(50):
        await when_running(store, host)
        net.cut(host)
        if await running_on(store, host):
            return
        net.mend(host)
    raise AssertionError(f"{host} never ran anything at the moment its link was cut")


async def make_chaos(
    net: hosts.Network,
    processes: dict[str, subprocess.Popen[bytes]],
    env: dict[str, str],
    tmp: Path,
    store: Store,
    burst: Burst,
) -> None:
    """Kill w2 with -9 while it runs something (and start it again, as `w2b`); then cut w1's
    link while it runs something, for longer than a lease, and mend it."""
    await when_running(store, "w2")
    processes["w2"].kill()
    burst.killed_at = await store.now()
    processes["w2b"] = start_host(net, "w2", "w2b", ["worker", APP, "--name", "w2b"], env, tmp)
    await cut_while_running(net, store, "w1")
    burst.cut_at = await store.now()
    await asyncio.sleep(CUT_FOR)
    net.mend("w1")
    burst.mended_wall = time.time()
    burst.mended_at = await store.now()


async def until_settled(store: Store, burst: Burst) -> None:
    """Wait until every acknowledged item is settled and no task is left to run, then long
    enough for the mended host to renew (and learn it lost its leases)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        items = {r.id: r for r in await store.records.list_records(ITEM, limit=10_000)}
        settled = all(
            media_id in items and ItemState(items[media_id].state).settled
            for media_id in burst.acknowledged.values()
        )
        counts = await store.counts()
        busy = sum(counts.get(state, 0) for state in UNFINISHED)
        if settled and busy == 0:
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(LEASE / 3 + 5)  # the mended worker's next renewal, and its log line


UNFINISHED = (TaskState.PENDING, TaskState.READY, TaskState.RUNNING, TaskState.WAITING)


def read_everything(url: str) -> tuple[list[TaskRecord], list[Attempt], dict[str, Record]]:
    async def read() -> tuple[list[TaskRecord], list[Attempt], dict[str, Record]]:
        store = open_store(url)
        await store.open(Settings())
        try:
            tasks = await store.tasks(limit=100_000)
            attempts = [a for task in tasks for a in await store.attempts(task.id)]
            items = {r.id: r for r in await store.records.list_records(ITEM, limit=10_000)}
            return tasks, attempts, items
        finally:
            await store.close()

    return asyncio.run(read())


@dataclass
class DerivativeSet:
    """What the bucket holds of one (media id, stage version): its manifests, and the attempts
    whose objects are there (`derived/<media id>/<stage>.v<n>/<attempt>/<file>`)."""

    manifests: int = 0
    attempts: set[str] = field(default_factory=set)


def derivative_sets(keys: list[str]) -> dict[tuple[str, str], DerivativeSet]:
    """Per (media id, stage version), what the listing `keys` holds of it."""
    sets: dict[tuple[str, str], DerivativeSet] = defaultdict(DerivativeSet)
    for key in keys:
        parts = key.split("/")
        if len(parts) < 5 or parts[1] != "derived":
            continue
        found = sets[(parts[2], parts[3])]
        if parts[4] == "manifest.json":
            found.manifests += 1
        else:
            found.attempts.add(parts[4])
    return dict(sets)


def check_one_set_each(keys: list[str], derived: Mapping[str, str]) -> None:
    """Each (media id, stage version) in the listing has one manifest and the objects of one
    attempt, the one its item's record names (`derived`: media id -> the set's prefix): a
    second attempt's objects beside them, or none, fail. Every item that names a set has it."""
    sets = derivative_sets(keys)
    for (media_id, stage), found in sets.items():
        assert found.manifests == 1, (media_id, stage, found)
        assert len(found.attempts) == 1, (media_id, stage, found)  # one attempt's objects
        named = derived.get(media_id, "")
        assert named.endswith(f"/{stage}/{next(iter(found.attempts))}"), (media_id, named, found)
    assert {media_id for media_id, _ in sets} >= derived.keys()


def history(
    media_ids: list[str],
    tasks: list[TaskRecord],
    attempts: list[Attempt],
    items: dict[str, Record],
) -> str:
    """What happened to the items `media_ids`: their records, tasks and attempts."""
    lines = []
    for media_id in media_ids:
        lines.append(f"{media_id}: {items[media_id].state} {dict(items[media_id].body)}")
        for task in (t for t in tasks if t.ref == media_id):
            lines.append(f"  task {task.id} {task.kind} {task.state.value} {task.error_code}")
            for a in (a for a in attempts if a.task_id == task.id):
                lines.append(f"    {a.number} {a.worker} {a.outcome.value} {a.code} {a.message}")
    return "\n".join(lines)


def lost_leases(attempts: list[Attempt]) -> list[tuple[Attempt, Attempt | None]]:
    """Each attempt that lost its lease, with the attempt of its task that came next."""
    by_task = {(a.task_id, a.number): a for a in attempts}
    return [
        (a, by_task.get((a.task_id, a.number + 1)))
        for a in attempts
        if a.outcome is AttemptOutcome.LEASE_EXPIRED
    ]


def report(
    burst: Burst,
    tasks: list[TaskRecord],
    attempts: list[Attempt],
    items: dict[str, Record],
    keys: list[str],
) -> None:
    states = Counter(record.state for record in items.values())
    lost = Counter(a.worker for a, _ in lost_leases(attempts))
    sets = derivative_sets(keys)
    extra = sum(len(found.attempts) - 1 for found in sets.values() if len(found.attempts) > 1)
    delays = [
        after.started_at - lost_at
        for gone, after in lost_leases(attempts)
        if after is not None and (lost_at := burst.lost_at(gone.worker)) is not None
    ]
    print(
        f"cut {burst.cut_at}, mended {burst.mended_at}, killed {burst.killed_at}; "
        f"{len(burst.acknowledged)} uploads acknowledged ({burst.resent} sent again), "
        f"{len(tasks)} tasks, {len(attempts)} attempts; items {dict(states)}; "
        f"leases lost by host {dict(lost)}; {len(sets)} derivative sets, "
        f"{extra} attempts' objects beside them; claimed again at most "
        f"{max(delays, default=0.0):.1f} s after the loss"
    )
    print("lost tasks run again (task, host that lost it, started and ended s after the loss):")
    for gone, after in sorted(lost_leases(attempts), key=lambda pair: _start_of(pair[1])):
        lost_at = burst.lost_at(gone.worker)
        if after is None or lost_at is None:
            print(f"  {gone.task_id} {gone.worker}: not run again")
            continue
        ended = "-" if after.ended_at is None else f"{after.ended_at - lost_at:.2f}"
        print(
            f"  {gone.task_id} {gone.worker} -> {after.worker}: "
            f"{after.started_at - lost_at:.2f} .. {ended}"
        )


def _start_of(attempt: Attempt | None) -> float:
    return attempt.started_at if attempt is not None else float("inf")


def check_claimed_again_in_time(
    burst: Burst, reclaimed: list[tuple[Attempt, Attempt | None]]
) -> None:
    """Each lost task runs again within the sweep's slack of the later of its lease's end and
    the end of the lost task that ran before it on the same worker: tasks lost beside others run
    alone (`solo`), one after another, so the last of ten lost together waits for nine."""
    runs: list[tuple[Attempt, Attempt]] = []
    for gone, after in reclaimed:
        assert after is not None, gone  # every lost task ran again
        runs.append((gone, after))
    runs.sort(key=lambda pair: pair[1].started_at)
    for n, (gone, after) in enumerate(runs):
        assert gone.worker in ("w1", "w2"), gone  # only the cut and the killed host lose leases
        assert after.worker != gone.worker
        lost_at = burst.lost_at(gone.worker)
        assert lost_at is not None
        before = [
            a.ended_at for _, a in runs[:n] if a.worker == after.worker and a.ended_at is not None
        ]
        due = max([lost_at + LEASE, *before])
        assert after.started_at - due <= SWEEP, (gone, after, due - lost_at)


def check(
    burst: Burst,
    tasks: list[TaskRecord],
    attempts: list[Attempt],
    items: dict[str, Record],
    keys: list[str],
    logs: dict[str, str],
) -> None:
    assert len(burst.acknowledged) == UPLOADS
    lost = [key for key, media_id in burst.acknowledged.items() if media_id not in items]
    assert lost == []  # acknowledged uploads lost: 0
    unsettled = [r.id for r in items.values() if not ItemState(r.state).settled]
    assert unsettled == [], history(unsettled, tasks, attempts, items)  # every item is final
    assert all(task.state.terminal for task in tasks)
    derived = {r.id: str(r.body["derived"]) for r in items.values() if r.body.get("derived")}
    assert derived  # photos were derived
    check_one_set_each(keys, derived)  # one set per (media id, stage version), what it wrote
    assert burst.cut_at is not None and burst.killed_at is not None
    reclaimed = lost_leases(attempts)
    assert {a.worker for a, _ in reclaimed} >= {"w1", "w2"}  # both hosts lost work
    check_claimed_again_in_time(burst, reclaimed)
    assert "lease lost" in logs["w1"]  # the mended host was refused, and says so
    assert "Traceback" not in logs["api"]


# A host whose link goes while it waits for the server's answer: once the link is back, the
# host must not wait on for an answer that will never come.

# Seconds the link stays down: longer than the server's side takes to give up on the host
# (the forwarder, standing in for it, does as the server does) and than the client's own
# keepalives take to find the connection dead (10 s, then 3 probes 5 s apart).
DOWN_FOR = 35.0
ASKING = """
import asyncio, sys, time
import psycopg
from headrace.store.postgres import PostgresStore
from headrace.store.protocol.types import Settings

async def main(url: str) -> None:
    store = PostgresStore.from_url(url)
    await store.open(Settings())
    print("asking", flush=True)
    while True:  # as the store runs a verb again on another connection when one breaks
        try:
            async with store.sessions.pool().connection() as conn:
                await conn.execute("SELECT pg_sleep(2)")
            break
        except psycopg.OperationalError:
            await asyncio.sleep(0.5)
    print("answered", time.time(), flush=True)
    await store.close()

asyncio.run(main(sys.argv[1]))
"""


def test_a_host_cut_off_mid_question_is_answered_within_seconds_of_its_links_return(
    tmp_path: Path,
) -> None:
    """Without keepalives on its side, the client waits for ever on a connection whose other
    end is gone (the worker that stayed without a store 72 s after its link came back)."""
    skip_without_namespaces()
    log = tmp_path / "asking.log"
    with fresh_schema("hosts_asking") as url:
        assert headrace("db", "upgrade", "--db", url).returncode == 0
        pg_port = urlsplit(url).port or 5432
        with hosts.network(["w"]) as net:
            routes = {(net.gateway, pg_port): ("127.0.0.1", pg_port)}
            with hosts.Forwarder(routes):
                command = [sys.executable, "-c", ASKING, on_link(url, net.gateway)]
                env = environment({"PYTHONPATH": ":".join(sys.path)})
                asking = net.start("w", command, env=env, log=str(log))
                until_logged(log, "asking", asking)
                time.sleep(0.5)  # the question is on its way, its answer two seconds off
                net.cut("w")
                time.sleep(DOWN_FOR)
                net.mend("w")
                mended = time.time()
                try:
                    asking.wait(timeout=RESUMES_WITHIN + 10)
                except subprocess.TimeoutExpired:
                    pass  # still waiting for its answer: the assertion below says so
                finally:
                    asking.kill()
                    asking.wait()
    said = log.read_text()
    assert "answered" in said, f"no answer {RESUMES_WITHIN + 10:g} s after the link returned"
    answered = float(said.split("answered")[-1].split()[0])
    print(f"answered {answered - mended:.2f} s after the link returned")
    assert answered - mended <= RESUMES_WITHIN


def until_logged(log: Path, word: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if log.exists() and word in log.read_text():
            return
        time.sleep(0.1)
    raise AssertionError(log.read_text() if log.exists() else f"{word!r} never logged")


# The check of the bucket's listing, on listings made here (no hosts needed).

MEDIA = "0123456789abcdef0123456789abcdef"
SET = f"media/derived/{MEDIA}/derive.v2"


def listing(*attempts: str, manifest: bool = True) -> list[str]:
    keys = [f"{SET}/manifest.json"] if manifest else []
    for attempt in attempts:
        keys += [f"{SET}/{attempt}/preview.webp", f"{SET}/{attempt}/metadata.json"]
    return sorted(keys)


RECORDS = {MEDIA: f"derived/{MEDIA}/derive.v2/attempt-aaaa"}


def test_the_listing_check_passes_one_attempts_set() -> None:
    check_one_set_each(listing("attempt-aaaa"), RECORDS)


@pytest.mark.parametrize(
    "keys",
    [
        listing("attempt-aaaa", "attempt-bbbb"),  # a second attempt's files beside the set
        listing("attempt-bbbb"),  # not the attempt the item's record names
        listing("attempt-aaaa", manifest=False),
        listing(),
    ],
)
def test_the_listing_check_fails_anything_but_one_set_per_stage_version(keys: list[str]) -> None:
    with pytest.raises(AssertionError):
        check_one_set_each(keys, RECORDS)
