"""Peak memory of a worker while at-limit media arrive at once, through the real service.

`python -m bench.media_memory [--out bench/results/media-memory.json] [-- SERVE OPTIONS]`

Six RGBA PNGs of 7071x7071 (just under the image class's 50 Mpx), six 24 Mpx JPEGs and two
1080p videos are uploaded at once to `headrace serve` on the default SQLite store, its workers
in the serving process, as contributors would send them (the PNGs first, then the videos, then
the JPEGs, all in flight together; the PNGs from one contributor, the videos from another, each
JPEG from a guest of its own). The serving process and every process under it (decode
children count against the worker that started them) are sampled every 20 ms from /proc: the
tree's proportional set size (PSS: shared pages counted once over the processes sharing them,
what the tree really holds) and its summed RSS (shared pages counted in every process: an upper
bound), and the serving process's own RSS.

The photos' delay: the same six JPEGs are first sent alone to a fresh server, then inside the
burst; the burst's cost to a photo is its latency (upload to reviewable) in the burst less its
latency without the PNGs and videos, compared with one JPEG's processing on an idle server, all
measured in the same run. Printed as a table, saved as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from bench.serving import Server, serving, tokens
from headrace.pipelines.moderation import samples

DEFAULT_OUT = Path(__file__).parent / "results" / "media-memory.json"
ROOT = Path(__file__).parents[1]
EVENT = "gala"
PNG_SIDE = 7071  # 49,999,041 pixels: just under the image class's 50 Mpx
JPEG_SIZE = (6000, 4000)  # 24 Mpx
VIDEO_SIZE = (1920, 1080)
VIDEO_SECONDS = 4.0
SAMPLE_EVERY = 0.02
SETTLE_TIMEOUT = 600.0
MIB = 1 << 20
GOAL = 1 << 30  # bytes per worker process


@dataclass
class Upload:
    name: str
    kind: str  # png, jpeg, video
    data: bytes
    session: str  # who sends it: each contributor keeps a session (a cookie) of its own


@dataclass
class Memory:
    """The largest figures sampled, in bytes."""

    tree_pss: int = 0
    tree_rss: int = 0
    process_rss: int = 0
    processes: int = 0  # the most processes the tree had at once
    samples: int = 0
    after_pss: int = 0  # the tree once every item settled


@dataclass
class Run:
    case: str
    uploads: int
    seconds: float
    states: dict[str, int]
    latency: dict[str, float]  # upload name -> seconds from sending to reviewable
    memory: Memory = field(default_factory=Memory)


# -- media


def at_limit_png(shade: int) -> bytes:
    """An RGBA PNG of PNG_SIDE x PNG_SIDE: a few hundred KB that decode to 200 MB. Written row
    by row; `shade` makes each file's bytes its own (originals are kept by content)."""
    compressor = zlib.compressobj(6)
    row = b"\x00" + bytes((shade, 128, 255 - shade, 255)) * PNG_SIDE
    body = b"".join(compressor.compress(row) for _ in range(PNG_SIDE)) + compressor.flush()
    header = struct.pack(">IIBBBBB", PNG_SIDE, PNG_SIDE, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", body)
        + _chunk(b"IEND", b"")
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def burst_media() -> tuple[list[Upload], list[Upload], list[Upload]]:
    """One contributor's six PNGs, another's two videos, six guests' one JPEG each."""
    pngs = [Upload(f"png-{n}", "png", at_limit_png(n * 20), "heavy") for n in range(6)]
    jpegs = [
        Upload(f"jpeg-{n}", "jpeg", samples.jpeg(*JPEG_SIZE, shade=n * 20), f"guest-{n}")
        for n in range(6)
    ]
    videos = [
        Upload(f"video-{n}", "video", samples.mp4(VIDEO_SECONDS, *VIDEO_SIZE, fps=25 + n), "films")
        for n in range(2)
    ]
    return pngs, jpegs, videos


# -- the server


# -- memory


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        parent = int(stat[stat.rindex(b")") + 2 :].split()[1])
        tree.setdefault(parent, []).append(int(entry.name))
    return tree


def _descendants(root: int) -> list[int]:
    tree, found, todo = _children(), [root], [root]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _field(path: str, name: bytes) -> int:
    """A `Name:   123 kB` line of a /proc file, in bytes (0 when the process is gone)."""
    try:
        with open(path, "rb") as handle:
            for line in handle:
                if line.startswith(name):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_memory(root: int) -> tuple[int, int, int, int]:
    """The tree's PSS and RSS sums, the root's RSS and the number of processes."""
    pids = _descendants(root)
    pss = sum(_field(f"/proc/{pid}/smaps_rollup", b"Pss:") for pid in pids)
    rss = sum(_field(f"/proc/{pid}/status", b"VmRSS:") for pid in pids)
    return pss, rss, _field(f"/proc/{root}/status", b"VmRSS:"), len(pids)


class Sampler(threading.Thread):
    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peak = Memory()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(SAMPLE_EVERY):
            pss, rss, own, count = tree_memory(self.root)
            peak = self.peak
            peak.tree_pss, peak.tree_rss = max(peak.tree_pss, pss), max(peak.tree_rss, rss)
            peak.process_rss, peak.processes = (
                max(peak.process_rss, own),
                max(peak.processes, count),
            )
            peak.samples += 1

    def stop(self) -> Memory:
        self._done.set()
        self.join()
        self.peak.after_pss = tree_memory(self.root)[0]
        return self.peak


# -- one run


async def send(client: httpx.AsyncClient, server: Server, upload: Upload) -> str:
    answer = await client.post(
        f"{server.url}/v1/events/{EVENT}/uploads",
        headers={
            **server.auth("uploader"),
            "Idempotency-Key": upload.name,
        },
        files={"file": (upload.name, upload.data)},
    )
    if answer.status_code != 202:
        raise SystemExit(f"upload {upload.name}: {answer.status_code} {answer.text}")
    media_id: str = answer.json()["media_id"]
    return media_id


async def states(client: httpx.AsyncClient, server: Server) -> dict[str, str]:
    found: dict[str, str] = {}
    after = 0
    while True:
        answer = await client.get(
            f"{server.url}/v1/events/{EVENT}/items",
            params={"after": after, "limit": 500},
            headers=server.auth("moderator"),
        )
        page = answer.json()
        found.update({item["media_id"]: item["state"] for item in page["items"]})
        if not page["newer"]:
            return found
        after = page["next"]


SETTLED = {"reviewable", "approved", "rejected", "quarantined", "refused"}


async def burst(server: Server, case: str, uploads: Sequence[Upload]) -> Run:
    sampler = Sampler(server.process.pid)
    sampler.start()
    limits = httpx.Limits(max_connections=len(uploads) + 2)
    sessions = {
        upload.session: httpx.AsyncClient(timeout=SETTLE_TIMEOUT, limits=limits)
        for upload in uploads
    }
    async with contextlib.AsyncExitStack() as stack, httpx.AsyncClient(timeout=60) as client:
        for each in sessions.values():
            await stack.enter_async_context(each)
        started = time.monotonic()
        sent_at: dict[str, float] = {}

        async def one(upload: Upload) -> tuple[str, str]:
            sent_at[upload.name] = time.monotonic()
            return upload.name, await send(sessions[upload.session], server, upload)

        names = dict(
            (media_id, name) for name, media_id in await asyncio.gather(*map(one, uploads))
        )
        reviewable_at: dict[str, float] = {}
        seen: dict[str, str] = {}
        while time.monotonic() - started < SETTLE_TIMEOUT:
            seen = await states(client, server)
            now = time.monotonic()
            for media_id, state in seen.items():
                if state == "reviewable" and media_id not in reviewable_at:
                    reviewable_at[media_id] = now
            if len(seen) >= len(uploads) and all(s in SETTLED for s in seen.values()):
                break
            await asyncio.sleep(0.05)
        seconds = time.monotonic() - started
    memory = sampler.stop()
    counts: dict[str, int] = {}
    for state in seen.values():
        counts[state] = counts.get(state, 0) + 1
    latency = {
        names[m]: round(at - sent_at[names[m]], 3) for m, at in reviewable_at.items() if m in names
    }
    return Run(case, len(uploads), round(seconds, 2), counts, latency, memory)


def fresh_run(case: str, uploads: Sequence[Upload], options: Sequence[str]) -> Run:
    with tempfile.TemporaryDirectory(prefix="headrace-memory-") as scratch:
        db = f"sqlite:///{Path(scratch) / 'serve.db'}"
        roles = {"uploader": ("contributor", EVENT), "moderator": ("moderator", EVENT)}
        with serving(db, str(Path(scratch) / "media"), tokens(db, roles), options) as server:
            return asyncio.run(burst(server, case, uploads))


# -- report


def mib(n: int) -> str:
    return f"{n / MIB:,.0f}"


def table(runs: Sequence[Run]) -> Table:
    shown = Table(title="A worker's memory while at-limit media arrive at once (real time)")
    columns = ("case", "uploads", "settled", "tree PSS MiB", "tree RSS MiB", "serve RSS MiB")
    for column in (*columns, "after MiB", "procs", "states"):
        shown.add_column(column, justify="left" if column in ("case", "states") else "right")
    for run in runs:
        m = run.memory
        shown.add_row(
            run.case,
            str(run.uploads),
            f"{run.seconds:.1f}s",
            mib(m.tree_pss),
            mib(m.tree_rss),
            mib(m.process_rss),
            mib(m.after_pss),
            str(m.processes),
            ", ".join(f"{k} {v}" for k, v in sorted(run.states.items())),
        )
    return shown


def photo_delay(alone: Run, without: Run, within: Run) -> dict[str, float]:
    own = max(alone.latency.values(), default=0.0)
    delays = [
        within.latency[name] - without.latency[name]
        for name in without.latency
        if name in within.latency
    ]
    return {
        "one_photo_processing_s": own,
        "burst_delay_max_s": round(max(delays, default=float("nan")), 3),
        "photos_alone_max_s": max(without.latency.values(), default=float("nan")),
        "photos_in_burst_max_s": max(
            (v for k, v in within.latency.items() if k.startswith("jpeg")), default=float("nan")
        ),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.media_memory", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("serve_options", nargs="*", help="passed to headrace serve (after --)")
    args = parser.parse_args(argv)
    console = Console()
    console.print("making the media (6 PNGs of 7071x7071 RGBA, 6 JPEGs of 24 Mpx, 2 1080p videos)")
    pngs, jpegs, videos = burst_media()
    runs = []
    for case, uploads in (
        ("one photo, idle server", jpegs[:1]),
        ("six photos alone", jpegs),
        ("the burst", [*pngs, *videos, *jpegs]),
    ):
        console.print(f"running: {case}")
        runs.append(fresh_run(case, uploads, args.serve_options))
        console.print(table(runs[-1:]))
    console.print(table(runs))
    delay = photo_delay(*runs)
    burst_run = runs[-1]
    goal_met = burst_run.memory.tree_pss <= GOAL and burst_run.states == {
        "reviewable": burst_run.uploads
    }
    console.print(
        f"photos: one alone {delay['one_photo_processing_s']:.2f} s; the burst's delay on a "
        f"photo at most {delay['burst_delay_max_s']:.2f} s; tree PSS peak "
        f"{mib(burst_run.memory.tree_pss)} MiB (goal <= {mib(GOAL)}): "
        + (
            "met"
            if goal_met and delay["burst_delay_max_s"] <= delay["one_photo_processing_s"]
            else "NOT met"
        )
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "serve_options": args.serve_options,
                "runs": [asdict(run) for run in runs],
                "photo_delay": delay,
            },
            indent=2,
        )
        + "\n"
    )
    console.print(f"saved {args.out}")


if __name__ == "__main__":
    main()
