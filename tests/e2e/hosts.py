"""Hosts on this machine: network namespaces joined by veth pairs to a bridge, so processes in
them reach each other and the services only over links a test can cut.

`Network` makes a bridge in the root namespace (the "switch", at `.1` of a /24) and a namespace
per host, each with a veth pair whose root end is on the bridge. Services that listen on
127.0.0.1 in the root namespace (PostgreSQL, the S3 server) are reached through a forwarder on
the bridge's address: from a host, the only way to them is its link. `cut(host)` sets the
host's link down (its packets go nowhere, its connections hang, as with a pulled cable);
`mend(host)` sets it up again.

Needs root (CAP_NET_ADMIN) and `ip` from iproute2: `available()` says why not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from headrace.store.postgres.connection import GONE_AFTER, PROBE_IDLE, PROBE_INTERVAL, PROBES

from . import root_network


def available() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "ip (iproute2) is not installed"
    probe = f"hrprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def ip(*args: str, namespace: str | None = None) -> None:
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


@dataclass
class Host:
    name: str  # what the test calls it
    namespace: str
    address: str
    link: str  # the root end of its veth pair


@dataclass
class Network:
    """A bridge at `<prefix>.1` and hosts at `.2`, `.3`, ... (see the module's docstring)."""

    names: Sequence[str]
    prefix: str = "10.213.0"
    tag: str = field(default_factory=lambda: str(os.getpid() % 100_000))
    hosts: dict[str, Host] = field(default_factory=dict)

    @property
    def bridge(self) -> str:
        return f"hrbr{self.tag}"

    @property
    def gateway(self) -> str:
        return f"{self.prefix}.1"

    def up(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for n, name in enumerate(self.names, start=2):
            host = Host(name, f"hr{self.tag}{name}", f"{self.prefix}.{n}", f"hr{self.tag}v{n}")
            self._attach(host)
            self.hosts[name] = host

    def _attach(self, host: Host) -> None:
        ip("netns", "add", host.namespace)
        peer = ("peer", "name", "eth0", "netns", host.namespace)
        ip("link", "add", host.link, "type", "veth", *peer)
        ip("link", "set", host.link, "master", self.bridge)
        ip("link", "set", host.link, "up")
        ip("addr", "add", f"{host.address}/24", "dev", "eth0", namespace=host.namespace)
        ip("link", "set", "eth0", "up", namespace=host.namespace)
        ip("link", "set", "lo", "up", namespace=host.namespace)
        ip("route", "add", "default", "via", self.gateway, namespace=host.namespace)

    def down(self) -> None:
        for host in self.hosts.values():
            with contextlib.suppress(RuntimeError):
                ip("netns", "del", host.namespace)
            with contextlib.suppress(RuntimeError):
                ip("link", "del", host.link)
        with contextlib.suppress(RuntimeError):
            ip("link", "del", self.bridge)

    def cut(self, name: str) -> None:
        ip("link", "set", self.hosts[name].link, "down")

    def mend(self, name: str) -> None:
        ip("link", "set", self.hosts[name].link, "up")

    def start(
        self,
        name: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        log: str,
        cwd: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """`command` run on host `name` (in `cwd`), its stdout and stderr to the file `log`."""
        with open(log, "ab") as out:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.hosts[name].namespace, *command],
                env=dict(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
            )


@contextlib.contextmanager
def network(names: Sequence[str]) -> Iterator[Network]:
    """The network of `names`, made once no browser test runs (`root_network`)."""
    with root_network.changing():
        made = Network(names)
        try:
            made.up()
            yield made
        finally:
            made.down()


class Forwarder:
    """TCP from `listen` (an address on the bridge) to `target` on this host's loopback, in a
    thread of its own: how the hosts reach services that listen on 127.0.0.1 only. It notes
    when bytes came from each host to each port (`heard`, wall-clock times)."""

    def __init__(self, routes: Mapping[tuple[str, int], tuple[str, int]]) -> None:
        self.routes = dict(routes)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._servers: list[asyncio.Server] = []
        self._heard: dict[tuple[str, int], list[float]] = {}

    def heard(self, host: str, port: int, *, after: float) -> float | None:
        """When bytes first came from `host` to the forwarder's `port` after `after`."""
        return next((t for t in self._heard.get((host, port), ()) if t > after), None)

    def __enter__(self) -> Forwarder:
        self._thread.start()
        for listen, target in self.routes.items():
            made = asyncio.run_coroutine_threadsafe(self._serve(listen, target), self._loop)
            self._servers.append(made.result(timeout=10))
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _shut(self) -> None:
        """Stop listening and end every connection still open, so none outlives the loop."""
        for server in self._servers:
            server.close()
        here = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not here]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()

    async def _serve(self, listen: tuple[str, int], target: tuple[str, int]) -> asyncio.Server:
        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            probe_like_the_server(writer.get_extra_info("socket"))
            heard = self._heard.setdefault((writer.get_extra_info("peername")[0], listen[1]), [])
            try:
                up_reader, up_writer = await asyncio.open_connection(*target)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer, heard), _pipe(up_reader, writer))

        return await asyncio.start_server(connected, *listen, reuse_address=True)


def probe_like_the_server(sock: socket.socket) -> None:
    """The keepalive probes and unacknowledged-data limit a PostgreSQL store asks the server
    for on its sessions, on the forwarder's end of a host's connection. The forwarder stands in
    for the wire: without them it would answer the server's probes for a host whose link is
    cut, and the server would never learn the host is gone; with them it ends both sides when
    the host stops answering, as the server would."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, PROBE_IDLE)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, PROBE_INTERVAL)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, PROBES)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, GONE_AFTER * 1000)


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, heard: list[float] | None = None
) -> None:
    try:
        while data := await reader.read(1 << 16):
            if heard is not None:
                heard.append(time.time())
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
