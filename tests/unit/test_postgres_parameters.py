"""Parameters as the PostgreSQL store sends them (`connection.adapted`)."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from headrace.store.machine import Json
from headrace.store.postgres.connection import adapted

# Names that need quoting in an array literal; read back as they are (tests/integration/
# test_postgres_parameters.py sends them to the server).
AWKWARD = ["ep-1", 'a "quoted", name', "back\\slash", "{braces}", " spaced ", "", "NULL", "é"]


def test_a_list_of_integers_goes_as_an_array_literal() -> None:
    sent = adapted({"ids": [3, 1, 2], "numbers": [-1, 0, 10**12], "none": []})
    assert sent == {"ids": "{3,1,2}", "numbers": "{-1,0,1000000000000}", "none": "{}"}


def test_a_list_of_strings_goes_as_an_array_literal_of_quoted_elements() -> None:
    sent = adapted({"flows": ["a", "b"], "awkward": AWKWARD})
    assert sent["flows"] == '{"a","b"}'
    assert sent["awkward"] == (
        '{"ep-1","a \\"quoted\\", name","back\\\\slash","{braces}"," spaced ","","NULL","é"}'
    )


def test_other_values_go_as_they_are() -> None:
    mixed = [1, 2.5]
    flags = [True, False]  # bools are ints to Python, not to PostgreSQL
    loose = ["a", None]
    sent = adapted({"mixed": mixed, "flags": flags, "loose": loose, "n": 3, "s": "x"})
    assert sent == {"mixed": mixed, "flags": flags, "loose": loose, "n": 3, "s": "x"}


def test_a_json_value_goes_as_jsonb() -> None:
    sent = adapted({"doc": Json({"a": [1]})})
    assert isinstance(sent["doc"], Jsonb) and sent["doc"].obj == {"a": [1]}
