"""A real `headrace serve` for the benchmarks that upload through it (`corpus`, `media_memory`):
tokens made with the CLI, the server on a free port, stopped when the block ends."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[1]


@dataclass(frozen=True)
class Server:
    """A running `headrace serve`: its process, its URL and a token by name."""

    process: subprocess.Popen[str]
    url: str
    tokens: Mapping[str, str]

    def auth(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[name]}"}


def headrace(*args: str) -> str:
    """What `headrace ARGS` printed; the benchmark stops with its error when it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "headrace", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"headrace {args[0]} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def tokens(db: str, roles: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """A token for each name: `roles` maps a name to its (role, event)."""
    return {
        name: headrace("token", "create", "--db", db, name, "--role", role, "--event", event)
        for name, (role, event) in roles.items()
    }


@contextlib.contextmanager
def serving(
    db: str, media: str, made: Mapping[str, str], options: Sequence[str] = ()
) -> Iterator[Server]:
    """`headrace serve` on `db` and `media` on a free port, until the block ends."""
    command = [sys.executable, "-m", "headrace", "serve", "--db", db, "--media", media]
    process = subprocess.Popen(
        [*command, "--port", "0", *options],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert process.stderr is not None
    for line in process.stderr:
        found = re.search(r"serving (http://\S+): store", line)
        if found:
            break
    else:
        raise SystemExit("headrace serve did not start")
    drain = threading.Thread(target=process.stderr.read, daemon=True)
    drain.start()
    try:
        yield Server(process, found[1], made)
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        drain.join(timeout=10)
        process.stderr.close()
