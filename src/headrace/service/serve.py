"""`headrace serve`: the HTTP service under uvicorn, with workers in the same process unless
told to leave the work to `headrace worker` processes."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType

import uvicorn

from headrace.pipelines.moderation.pipeline import Moderation
from headrace.policy.errors import ConfigError
from headrace.policy.redact import hide_passwords
from headrace.runtime.memory import DEFAULT_MEMORY
from headrace.runtime.worker import Worker
from headrace.service import logs
from headrace.service.api.app import create_api
from headrace.service.api.deps import ApiSettings, Service
from headrace.service.notify import OutboxRelay

log = logging.getLogger("headrace.serve")
GRACE = 30.0


@dataclass(frozen=True)
class ServeOptions:
    host: str
    port: int
    workers: int
    settings: ApiSettings
    relay: OutboxRelay | None = None
    memory: int | None = DEFAULT_MEMORY  # each worker's memory budget (runtime/memory.py)


def webhook_secrets(given: Sequence[str]) -> dict[str, str]:
    """`PROVIDER=SECRET` pairs (from options, or whitespace-separated in the environment)."""
    secrets: dict[str, str] = {}
    for pair in given:
        provider, _, secret = pair.partition("=")
        if not provider or not secret or provider in secrets:
            raise ConfigError(
                "--webhook-secret: expected PROVIDER=SECRET once per provider "
                "(the secret is not shown here)"
            )
        secrets[provider] = secret
    return secrets


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before uvicorn starts: a port in use is an OSError the
    command reports in one line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Named IPPROTO_TCP, not left 0: asyncio sets TCP_NODELAY only on accepted sockets whose
    # protocol says TCP, and without it Nagle and the client's delayed ACK hold each answer on
    # a kept-alive connection for about 40 ms.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        error.filename = f"{host}:{port}"
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(moderation: Moderation, options: ServeOptions) -> None:
    app = moderation.app
    workers = [
        Worker(app, name=f"serve-{n}", grace=GRACE, memory=options.memory)
        for n in range(options.workers)
    ]
    api = create_api(moderation, options.settings, workers=workers, relay=options.relay)
    sock = bind(options.host, options.port)
    config = uvicorn.Config(
        api,
        access_log=False,  # headrace.http logs each request without its query string
        log_config=None,
        timeout_graceful_shutdown=int(GRACE),
        proxy_headers=False,
        server_header=False,
    )
    host, port = sock.getsockname()[:2]
    where = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    log.info(
        "serving %s: store %s, media %s, %d worker%s in this process",
        where,
        hide_passwords(app.url),
        moderation.media.describe(),
        options.workers,
        "" if options.workers == 1 else "s",
    )
    for worker in workers:
        logs.worker_started(worker, "headrace serve")
    QuietExit(config, api.state.service, workers=len(workers)).run(sockets=[sock])


class QuietExit(uvicorn.Server):
    """uvicorn's server, whose graceful stop on SIGINT or SIGTERM ends with status 0, as
    `headrace worker`'s does (uvicorn raises the signal again once it has stopped), and
    marks the service draining as it begins, so /readyz turns a proxy away at once. It says
    when it begins to drain, and when it has stopped, with what it waited for."""

    def __init__(self, config: uvicorn.Config, service: Service, *, workers: int = 0) -> None:
        super().__init__(config)
        self.service = service
        self.workers = workers
        self.signal: str | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = signal.Signals(sig).name
        self.service.draining = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        started = time.monotonic()
        # Requests being answered now: each runs in a task of the server's until it is done.
        requests = len(self.server_state.tasks)
        waits = f"{plural(requests, 'request')} in flight, {plural(self.workers, 'worker')}"
        log.info(
            "%s: draining: no new connections, /readyz answers 503; waiting for %s (up to %gs)",
            self.signal or "told to stop",
            waits,
            GRACE,
        )
        await super().shutdown(sockets)
        log.info("stopped after %.1fs: waited for %s", time.monotonic() - started, waits)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def describe(secrets: Mapping[str, str]) -> str:
    return ", ".join(sorted(secrets)) or "none"
