"""`headrace serve` in a subprocess on a free port, over an SQLite store in a scratch directory
(or the store given), with a token of each role made by `headrace token create`; `env`: more
environment variables for it."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .commands import ROOT, environment, headrace

WEBHOOK_SECRET = "whsec-e2e-0123456789abcdef"
ROLES = {
    "admin": ("admin", "*"),
    "moderator": ("moderator", "gala"),
    "moderator-2": ("moderator", "gala"),
    "moderator-3": ("moderator", "gala"),
    "other-moderator": ("moderator", "fair"),
    "uploader": ("contributor", "gala"),
}


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str
    db: Path  # the SQLite file, when the store is one
    store: str  # what `--db` names
    media: Path
    tokens: dict[str, str]
    log: list[str] = field(default_factory=list)  # every line it wrote to stderr
    reader: threading.Thread | None = None

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}


def make_tokens(db: Path | str) -> dict[str, str]:
    tokens = {}
    for name, (role, event) in ROLES.items():
        done = headrace("token", "create", "--db", str(db), name, "--role", role, "--event", event)
        assert done.returncode == 0, done.stderr
        tokens[name] = done.stdout.strip()
    return tokens


def start(
    tmp_path: Path,
    *options: str,
    tokens: dict[str, str] | None = None,
    verbose: bool = False,
    store: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Server:
    db, media = tmp_path / "serve.db", tmp_path / "media"
    store = store or f"sqlite:///{db}"
    tokens = tokens if tokens is not None else make_tokens(store)
    command = [sys.executable, "-m", "headrace", *(["-v"] if verbose else [])]
    command += ["serve", "--db", store, "--media", str(media)]
    command += ["--port", "0", *options]
    variables = {"HEADRACE_WEBHOOK_SECRETS": f"vidgen={WEBHOOK_SECRET}", **(env or {})}
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=environment(variables),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert process.stderr is not None
    log: list[str] = []
    for line in process.stderr:
        log.append(line)
        found = re.search(r"serving (http://\S+): store", line)
        if found:
            break
    else:
        raise AssertionError(f"headrace serve did not start: {''.join(log)}")
    server = Server(process, found[1], db, store, media, tokens, log)
    server.reader = threading.Thread(target=_keep_reading, args=(process, log), daemon=True)
    server.reader.start()
    return server


def _keep_reading(process: subprocess.Popen[str], log: list[str]) -> None:
    assert process.stderr is not None
    for line in process.stderr:
        log.append(line)


def stop(server: Server, sig: int = signal.SIGTERM) -> int:
    if server.process.poll() is None:
        server.process.send_signal(sig)
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    if server.reader is not None:
        server.reader.join(timeout=10)
    if server.process.stderr is not None:
        server.process.stderr.close()
    return server.process.returncode


@contextlib.contextmanager
def serving(
    tmp_path: Path,
    *options: str,
    tokens: dict[str, str] | None = None,
    verbose: bool = False,
    store: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[Server]:
    server = start(tmp_path, *options, tokens=tokens, verbose=verbose, store=store, env=env)
    try:
        yield server
    finally:
        stop(server)
