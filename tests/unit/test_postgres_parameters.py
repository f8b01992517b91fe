"""Parameters as the PostgreSQL store sends them (`connection.adapted`)."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from headrace.store.machine import Json
from headrace.store.postgres.connection import adapted


def test_a_list_of_integers_goes_as_an_array_literal() -> None:
    sent = adapted({"ids": [3, 1, 2], "numbers": [-1, 0, 10**12]})
    assert sent == {"ids": "{3,1,2}", "numbers": "{-1,0,1000000000000}"}


def test_other_values_go_as_they_are() -> None:
    flows = ["ep-1", 'a "quoted", name']
    mixed = [1, 2.5]
    flags = [True, False]  # bools are ints to Python, not to PostgreSQL
    sent = adapted({"flows": flows, "mixed": mixed, "flags": flags, "none": [], "n": 3})
    assert sent == {"flows": flows, "mixed": mixed, "flags": flags, "none": [], "n": 3}


def test_a_json_value_goes_as_jsonb() -> None:
    sent = adapted({"doc": Json({"a": [1]})})
    assert isinstance(sent["doc"], Jsonb) and sent["doc"].obj == {"a": [1]}
