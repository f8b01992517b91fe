"""The systems of the peer benchmark, by name, each imported only when it is used."""

from __future__ import annotations

import importlib

from bench.peers.base import Peer

SYSTEMS = {
    "headrace-postgres": "bench.peers.headrace:POSTGRES",
    "headrace-sqlite": "bench.peers.headrace:SQLITE",
    "procrastinate": "bench.peers.procrastinate:PEER",
    "pgqueuer": "bench.peers.pgqueuer:PEER",
    "dramatiq": "bench.peers.dramatiq:PEER",
    "taskiq": "bench.peers.taskiq:PEER",
    "saq": "bench.peers.saq:PEER",
    "celery": "bench.peers.celery:PEER",
    "bare-postgres": "bench.peers.bare:ONE_TRIP",
    "bare-postgres-2rt": "bench.peers.bare:TWO_TRIPS",
}


def load(name: str) -> Peer:
    module, _, attribute = SYSTEMS[name].partition(":")
    found = getattr(importlib.import_module(module), attribute)
    if not isinstance(found, Peer):
        raise TypeError(f"{SYSTEMS[name]} is not a Peer")
    return found
