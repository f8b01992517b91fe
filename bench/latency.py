"""What a moderator's click waits for: GETs of an event's item list (20 reviewable items, a
moderator's bearer token) from a real `headrace serve` on its default SQLite store, on one
kept-alive connection and on a new connection each, with two floors measured in the same run,
their blocks of requests taking turns with the list's: `/healthz` on the same server, and a bare
Starlette endpoint under uvicorn (`bench/floor_app.py`). Every request goes to 127.0.0.1.

`python -m bench.latency [--requests N] [--loop asyncio|auto]` prints the table and saves
bench/results/latency.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from bench.claims import percentile
from headrace.pipelines.moderation import samples

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).parent / "results" / "latency.json"
HOST = "127.0.0.1"
EVENT = "gala"
ITEMS = 20
REQUESTS = 1000
WARM_UP = 20  # unmeasured GETs of each target first: imports, caches, the store's first reads
BLOCK = 100  # GETs of one target back to back before the next target's turn
DEADLINE = 120.0  # seconds for a server to announce itself, and for the uploads to settle
TIMEOUT = 10.0  # seconds for one request
KEPT, NEW = "kept alive", "new each"
LOOPS = ("asyncio", "auto")


@dataclass(frozen=True)
class Latency:
    case: str
    connection: str
    requests: int
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True)
class Target:
    """One row of the table: a GET of `path` at `url`, on a connection kept alive or not."""

    case: str
    url: str
    path: str
    connection: str
    headers: Mapping[str, str]

    def client(self) -> httpx.Client:
        # Connection: close makes the server end each connection, so httpx opens a new one.
        close = {"Connection": "close"} if self.connection == NEW else {}
        return httpx.Client(
            base_url=self.url, headers={**self.headers, **close}, timeout=TIMEOUT, trust_env=False
        )


def environment() -> dict[str, str]:
    """This process's environment without headrace's variables: each command is told its store."""
    return {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}


class Announced:
    """A server in a subprocess, and the URL it wrote to stderr when it started listening."""

    def __init__(self, name: str, command: list[str], pattern: str) -> None:
        self.name = name
        self.pattern = re.compile(pattern)
        self.url: str | None = None
        self.found = threading.Event()
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=environment(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            matched = self.pattern.search(line)
            if matched and self.url is None:
                self.url = matched[1]
                self.found.set()
        self.found.set()  # it ended: nobody waits for an address that will never come

    def wait(self) -> str:
        if not self.found.wait(DEADLINE) or self.url is None:
            raise RuntimeError(f"{self.name} did not start:\n{''.join(self.lines)}")
        return self.url

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.reader.join(timeout=10)


@contextmanager
def announced(name: str, command: list[str], pattern: str) -> Iterator[str]:
    server = Announced(name, command, pattern)
    try:
        yield server.wait()
    finally:
        server.stop()


def headrace(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "headrace", *args],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"headrace {' '.join(args[:2])} failed: {done.stderr}")
    return done.stdout.strip()


def token(db: Path, name: str, role: str) -> dict[str, str]:
    made = headrace("token", "create", "--db", str(db), name, "--role", role, "--event", EVENT)
    return {"Authorization": f"Bearer {made}"}


def upload_items(url: str, uploader: dict[str, str], moderator: dict[str, str]) -> None:
    """`ITEMS` photos, uploaded and then waited for until each is reviewable: the workers are
    idle while the list is measured."""
    with httpx.Client(base_url=url, timeout=TIMEOUT, trust_env=False) as client:
        for shade in range(ITEMS):
            photo = samples.jpeg(320, 240, shade=shade)
            sent = client.post(
                f"/v1/events/{EVENT}/uploads", headers=uploader, files={"file": ("p.jpg", photo)}
            )
            sent.raise_for_status()
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            page = client.get(
                f"/v1/events/{EVENT}/items", headers=moderator, params={"state": "reviewable"}
            ).json()
            if len(page["items"]) == ITEMS:
                return
            time.sleep(0.2)
    raise RuntimeError(f"{ITEMS} uploads were not all reviewable within {DEADLINE:.0f} s")


def measure(targets: list[Target], requests: int) -> list[Latency]:
    """`requests` GETs of each target, in blocks of `BLOCK` back to back (as a page's requests
    follow each other), the targets' blocks taking turns: whatever else the machine does falls
    on every row alike."""
    spent: list[list[float]] = [[] for _ in targets]
    with ExitStack() as stack:
        clients = [stack.enter_context(target.client()) for target in targets]
        for target, client in zip(targets, clients, strict=True):
            timed_gets(target, client, WARM_UP)
        for start in range(0, requests, BLOCK):
            for target, client, times in zip(targets, clients, spent, strict=True):
                times += timed_gets(target, client, min(BLOCK, requests - start))
    return [
        Latency(t.case, t.connection, len(ms), _ms(ms, 0.5), _ms(ms, 0.99))
        for t, ms in zip(targets, spent, strict=True)
    ]


def timed_gets(target: Target, client: httpx.Client, count: int) -> list[float]:
    """Milliseconds for each of `count` GETs of `target`, one after the other."""
    times = []
    for _ in range(count):
        began = time.perf_counter()
        answer = client.get(target.path)
        times.append((time.perf_counter() - began) * 1000)
        if answer.status_code != 200:
            raise RuntimeError(f"{target.case}: {answer.status_code} {answer.text[:200]}")
    return times


def _ms(values: list[float], q: float) -> float:
    return round(percentile(values, q), 2)


def targets(headrace_url: str, floor_url: str, moderator: dict[str, str]) -> list[Target]:
    endpoints = [
        (
            f"GET /v1/events/{{event}}/items ({ITEMS} items)",
            headrace_url,
            f"/v1/events/{EVENT}/items",
            moderator,
        ),
        ("GET /healthz, same server", headrace_url, "/healthz", {}),
        ("bare Starlette under uvicorn", floor_url, "/", {}),
    ]
    return [
        Target(case, url, path, connection, headers)
        for case, url, path, headers in endpoints
        for connection in (KEPT, NEW)
    ]


def run_module(module: str, loop: str) -> list[str]:
    """`python -m module` on `loop`. uvicorn runs on uvloop whenever it can import it (the bench
    extra installs it, a plain install does not), and uvloop sets TCP_NODELAY on every
    connection itself: `asyncio` hides it, so both servers run on the loop a plain install
    gives them."""
    if loop == "auto":
        return [sys.executable, "-m", module]
    hide = "import runpy, sys; sys.modules['uvloop'] = None; "  # None: `import uvloop` fails
    return [sys.executable, "-c", f"{hide}runpy.run_module({module!r}, run_name='__main__')"]


def latency_figures(requests: int = REQUESTS, loop: str = "asyncio") -> list[Latency]:
    """`requests` timed GETs of each target, against fresh servers in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="hrbench-latency-") as scratch, ExitStack() as stack:
        db, media = Path(scratch) / "serve.db", Path(scratch) / "media"
        moderator = token(db, "bench-moderator", "moderator")
        uploader = token(db, "bench-uploader", "contributor")
        serve = [*run_module("headrace", loop), "serve", "--db", str(db), "--media", str(media)]
        serve += ["--host", HOST, "--port", "0"]
        headrace_url = stack.enter_context(
            announced("headrace serve", serve, r"serving (http://\S+): store")
        )
        floor = [*run_module("uvicorn", loop), "bench.floor_app:app", "--host", HOST]
        floor += ["--port", "0", "--no-access-log"]
        floor_url = stack.enter_context(announced("uvicorn", floor, r"running on (http://\S+)"))
        upload_items(headrace_url, uploader, moderator)
        return measure(targets(headrace_url, floor_url, moderator), requests)


def latency_table(figures: list[Latency]) -> Table:
    table = Table(title="GET latency against `headrace serve` on SQLite, 127.0.0.1 (real time)")
    for column in ("case", "connection", "requests", "p50 ms", "p99 ms", "p50 vs floor"):
        table.add_column(column, justify="left" if column in ("case", "connection") else "right")
    floors = {f.connection: f for f in figures if f.case.startswith("bare")}
    for f in figures:
        ratio = f.p50_ms / floors[f.connection].p50_ms
        table.add_row(
            f.case,
            f.connection,
            str(f.requests),
            f"{f.p50_ms:.2f}",
            f"{f.p99_ms:.2f}",
            f"{ratio:.2f}",
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=REQUESTS, help="timed GETs per row")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to save the JSON")
    parser.add_argument(
        "--loop",
        choices=LOOPS,
        default="asyncio",
        help="the servers' event loop: asyncio's, or uvloop's when it is installed (auto)",
    )
    args = parser.parse_args()
    console = Console(width=110)
    figures = latency_figures(args.requests, args.loop)
    console.print(latency_table(figures))
    results = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "cores": os.cpu_count()},
        "load_1m": round(os.getloadavg()[0], 2),
        "loop": args.loop,
        "latency": [asdict(f) for f in figures],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"saved {args.out}")


if __name__ == "__main__":
    main()
