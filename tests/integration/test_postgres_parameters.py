"""Array parameters as the PostgreSQL store sends them (`connection.adapted`) reach the server
as they were. Needs the test server (skips without it, fails when `CI` is set)."""

from __future__ import annotations

import psycopg

from headrace.store.postgres.connection import adapted
from tests.integration.postgres import reachable
from tests.unit.test_postgres_parameters import AWKWARD


def test_arrays_sent_as_literals_are_read_back_as_they_were() -> None:
    sent = adapted({"names": AWKWARD, "none": [], "ids": [3, -1, 10**12]})
    with psycopg.connect(reachable()) as conn:
        found = conn.execute(
            "SELECT %(names)s::text[], %(none)s::text[], %(none)s::bigint[], %(ids)s::bigint[]",
            sent,
        ).fetchone()
    assert found == (AWKWARD, [], [], [3, -1, 10**12])
