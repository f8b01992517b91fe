"""The socket `headrace serve` listens on: the connections asyncio accepts from it send each
answer at once (TCP_NODELAY), so a kept-alive connection does not wait for a delayed ACK."""

from __future__ import annotations

import asyncio
import socket

import pytest

from headrace.service.serve import bind

pytestmark = pytest.mark.realtime  # a real event loop over real sockets


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


async def accepted_nodelay(host: str) -> int:
    """TCP_NODELAY on the server's side of one connection to a server on `bind(host, 0)`."""
    accepted: asyncio.Queue[int] = asyncio.Queue()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        await accepted.put(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    listening = bind(host, 0)
    server = await asyncio.start_server(on_connection, sock=listening)
    async with server:
        port = listening.getsockname()[1]
        _, writer = await asyncio.open_connection(host, port)
        nodelay = await accepted.get()
        writer.close()
        await writer.wait_closed()
    return nodelay


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_accepted_connections_send_without_waiting(host: str) -> None:
    if ":" in host and not ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    assert asyncio.run(asyncio.wait_for(accepted_nodelay(host), timeout=10)) != 0
