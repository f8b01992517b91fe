"""The client's side of each PostgreSQL connection: a connect timeout, keepalive probes and a
limit on unacknowledged data by default (`connection.CLIENT_SIDE`), a value the URL gives
winning. Read back from the sockets the store's pool, migration and listener connections use.
Needs the test server (skips without it, fails when `CI` is set)."""

from __future__ import annotations

import os
import socket
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from headrace.store.postgres import PostgresStore
from headrace.store.postgres.connection import CLIENT_SIDE, client_side
from tests.integration.postgres import opened_store, reachable

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": False})


def socket_options(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    """The keepalive and unacknowledged-data options of the connection's socket, as the kernel
    has them."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        return {
            "keepalives": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "keepalives_idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "keepalives_interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "keepalives_count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "tcp_user_timeout": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        }
    finally:
        sock.close()


async def pooled(store: PostgresStore) -> tuple[dict[str, int], dict[str, str]]:
    """A pooled connection's socket options and the parameters it was opened with."""
    async with store.sessions.pool().connection() as conn:
        return socket_options(conn), conn.info.get_parameters()


def expected(**given: int) -> dict[str, int]:
    options = {name: int(CLIENT_SIDE[name]) for name in CLIENT_SIDE if name != "connect_timeout"}
    return {**options, **given}


async def test_every_pooled_connection_has_the_client_timeouts_and_keepalives() -> None:
    reachable()
    async with opened_store("client_side") as store:
        found, parameters = await pooled(store)
        listener = conninfo_to_dict(store._listener._dsn)
    assert found == {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 25_000,
    }
    assert parameters["connect_timeout"] == "5"
    assert {name: str(listener[name]) for name in CLIENT_SIDE} == CLIENT_SIDE


async def test_a_value_the_url_gives_wins() -> None:
    reachable()
    options = "keepalives_idle=30&connect_timeout=9&tcp_user_timeout=0"
    async with opened_store("client_side", options=options) as store:
        found, parameters = await pooled(store)
    assert found == expected(keepalives_idle=30, tcp_user_timeout=0)
    assert parameters["connect_timeout"] == "9"


async def test_the_migration_connection_has_them_too() -> None:
    store = PostgresStore.from_url(reachable())  # `upgrade` opens what `_conninfo` names
    async with await psycopg.AsyncConnection.connect(store.sessions.conninfo("headrace")) as conn:
        assert socket_options(conn) == expected()


def test_client_side_adds_only_what_the_dsn_leaves_out() -> None:
    dsn = "postgresql://u@db.example:5432/app?keepalives=0&sslmode=require"
    added = conninfo_to_dict(client_side(dsn))
    assert added["keepalives"] == "0" and added["sslmode"] == "require"
    assert added["connect_timeout"] == "5" and added["tcp_user_timeout"] == "25000"
    assert client_side(client_side(dsn)) == client_side(dsn)
