"""The producer process of one case, on the site in its environment:

    python -m bench.peers.produce SYSTEM prepare
    python -m bench.peers.produce SYSTEM noops COUNT
    python -m bench.peers.produce SYSTEM timed SAMPLES

`timed` enqueues one timed task at a time, each 10 ms after the previous one started (after 10
unmeasured ones, which also wait out the worker's start), and writes, for each, the wall-clock
times of the enqueue call, of its return and of the task's start to `samples.json` in the site's
scratch directory. Starts arrive as datagrams on the socket whose descriptor is in
`REPORTS_FD`, bound by the harness before the worker started.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path

from bench.peers import probe
from bench.peers.base import Producer, Site
from bench.peers.systems import load

REPORTS_FD = "HEADRACE_BENCH_REPORTS_FD"
WARM_UP = 10
GAP = 0.01  # idle time before each enqueue
START_TIMEOUT = 60.0

Sample = tuple[float, float, float]  # enqueue called, enqueue returned, task started


async def sample(producer: Producer, samples: int) -> list[Sample]:
    reports = socket.socket(fileno=int(os.environ[REPORTS_FD]))
    reports.setblocking(False)
    times: list[Sample] = []
    for n in range(-WARM_UP, samples):
        await asyncio.sleep(GAP)
        ref = f"t{n}"
        before = time.time()
        await producer.timed(ref)
        after = time.time()
        started = await asyncio.wait_for(_start_of(reports, ref), START_TIMEOUT)
        if n >= 0:
            times.append((before, after, started))
    return times


async def _start_of(reports: socket.socket, ref: str) -> float:
    loop = asyncio.get_running_loop()
    while True:
        found, at = probe.report(await loop.sock_recv(reports, 256))
        if found == ref:
            return at


async def main(system: str, command: str, count: int) -> None:
    site = Site.from_env()
    async with load(system).producer(site) as producer:
        if command in ("prepare", "noops"):
            await producer.prepare()
        if command == "noops":
            await producer.noops(count)
        elif command == "timed":
            times = await sample(producer, count)
            (Path(site.scratch) / "samples.json").write_text(json.dumps(times))


if __name__ == "__main__":
    system, command, *rest = sys.argv[1:]
    asyncio.run(main(system, command, int(rest[0]) if rest else 0))
