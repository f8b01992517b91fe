"""The API process killed with -9 while 500 uploads and 500 webhooks arrive: clients send each
one again (the same Idempotency-Key, the same event id) until they get a 2xx. Every answer
acknowledged is durable, and nothing is scheduled twice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.pipeline import ITEM
from headrace.service.api.webhooks import DELIVERY, sign
from headrace.store.protocol.records import Record
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import TaskRecord
from tests.integration.processes import read

from .server import WEBHOOK_SECRET, Server, start, stop

pytestmark = [pytest.mark.realtime, pytest.mark.timeout(600)]

UPLOADS = int(os.environ.get("CRASH_UPLOADS", "500"))
WEBHOOKS = int(os.environ.get("CRASH_WEBHOOKS", "500"))
CLIENTS = 16
KILLS = 3
# The API alone (no workers to drain the queue), with room for every upload: what is measured
# is what the API acknowledges across kills, not admission.
SERVE = ("--workers", "0", "--per-event", "100000", "--per-session", "100000")


@dataclass
class Run:
    server: Server
    acknowledged: dict[str, str] = field(default_factory=dict)  # key -> media id
    delivered: set[str] = field(default_factory=set)  # webhook event ids acknowledged
    answered: int = 0
    retries: int = 0
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    def note_answer(self) -> None:
        self.answered += 1
        self.progress.set()


async def upload(run: Run, client: httpx.AsyncClient, n: int, photo: bytes) -> None:
    key = f"upload-{n}"
    while True:
        try:
            answer = await client.post(
                f"{run.server.url}/v1/events/gala/uploads",
                headers={**run.server.auth("uploader"), "Idempotency-Key": key},
                files={"file": (f"{n}.jpg", photo + n.to_bytes(4, "big"))},
            )
        except httpx.TransportError:
            run.retries += 1
            await asyncio.sleep(0.05)
            continue
        if 200 <= answer.status_code < 300:
            run.acknowledged[key] = answer.json()["media_id"]
            run.note_answer()
            return
        assert answer.status_code >= 500, answer.text
        run.retries += 1
        await asyncio.sleep(0.05)


async def webhook(run: Run, client: httpx.AsyncClient, n: int) -> None:
    event_id = f"evt-{n}"
    raw = json.dumps({"id": event_id, "type": "job.done"}).encode()
    while True:
        headers = {"Webhook-Signature": sign(WEBHOOK_SECRET, raw, int(time.time()))}
        try:
            answer = await client.post(
                f"{run.server.url}/webhooks/vidgen", content=raw, headers=headers
            )
        except httpx.TransportError:
            run.retries += 1
            await asyncio.sleep(0.05)
            continue
        if answer.status_code == 200:
            run.delivered.add(event_id)
            run.note_answer()
            return
        assert answer.status_code >= 500, answer.text
        run.retries += 1
        await asyncio.sleep(0.05)


async def killer(run: Run, tmp_path: Path, port: int) -> int:
    """Kill the server with -9 each time another sixth of the work is answered, and start it
    again on the same port."""
    kills = 0
    total = UPLOADS + WEBHOOKS
    while kills < KILLS:
        while run.answered < total * (kills + 1) / (KILLS + 2):
            await run.progress.wait()
            run.progress.clear()
        stop(run.server, signal.SIGKILL)
        kills += 1
        tokens = run.server.tokens
        run.server = await asyncio.to_thread(
            start, tmp_path, *SERVE, "--port", str(port), tokens=tokens
        )
    return kills


async def drive(run: Run, tmp_path: Path, port: int) -> int:
    photo = samples.jpeg(160, 120)
    jobs = [("upload", n) for n in range(UPLOADS)] + [("webhook", n) for n in range(WEBHOOKS)]
    jobs.sort(key=lambda job: (job[1], job[0]))  # interleaved
    queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)

    async def client_loop() -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            while not queue.empty():
                kind, n = queue.get_nowait()
                if kind == "upload":
                    await upload(run, client, n, photo)
                else:
                    await webhook(run, client, n)

    kills = asyncio.create_task(killer(run, tmp_path, port))
    await asyncio.gather(*(client_loop() for _ in range(CLIENTS)))
    return await kills


async def everything(store: Store) -> tuple[list[TaskRecord], list[Record], list[Record]]:
    tasks = await store.tasks(limit=100_000)
    items = await store.records.list_records(ITEM, limit=10_000)
    deliveries = await store.records.list_records(DELIVERY, limit=10_000)
    return tasks, items, deliveries


def test_no_acknowledged_upload_or_webhook_is_lost_or_doubled_across_kill_9(
    tmp_path: Path,
) -> None:
    server = start(tmp_path, *SERVE)
    port = int(server.url.rsplit(":", 1)[1])
    run = Run(server)
    try:
        kills = asyncio.run(drive(run, tmp_path, port))
    finally:
        stop(run.server)
    print(f"{kills} kills, {run.retries} requests sent again, {len(run.acknowledged)} uploads")
    assert kills == KILLS and run.retries > 0
    assert len(run.acknowledged) == UPLOADS and len(run.delivered) == WEBHOOKS

    tasks, items, deliveries = read(server.db, everything)
    kept = {item.id for item in items}
    missing = [key for key, media_id in run.acknowledged.items() if media_id not in kept]
    assert missing == []
    validates = Counter(task.ref for task in tasks if ".validate." in task.kind)
    assert set(validates) == set(run.acknowledged.values())  # each acknowledged one, queued
    assert [ref for ref, n in validates.items() if n > 1] == []  # and queued once
    assert len({i.body["digest"] for i in items}) == len(items) == UPLOADS
    assert sorted(d.body["event_id"] for d in deliveries) == sorted(run.delivered)
