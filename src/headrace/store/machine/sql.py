"""SQL in one place: named queries and versioned migrations, read from the store package's files,
beside each backend (`sqlite/sql/`, `postgres/sql/`), each with `queries.sql`, `schema.sql` and
`migrations/`. A resource is named from the store package: `sqlite/sql/queries.sql`.

A query file holds statements under `-- name: <query_name>` headers, each followed by a one-line
`-- <description>` and the statement. Migrations are `migrations/NNNN_<what>.sql`, applied in
order of their number; the number is the schema version a store records once it applied them.
A script is split into whole statements by its dialect's rules: SQLite's own (a trigger's body
ends at `END;`), or PostgreSQL's (a `;` outside quotes, comments and `$$`-quoted bodies).
"""

from __future__ import annotations

import functools
import re
import sqlite3
from dataclasses import dataclass
from importlib import resources

from headrace.policy.errors import StoreError

_PACKAGE = "headrace.store"  # resources are named from here: `<dialect>/sql/...`

_HEADER = re.compile(r"^-- name: *([a-z][a-z0-9_]*) *$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    text: str


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


def read_text(resource: str) -> str:
    """The text of a file in the store package, e.g. `sqlite/sql/schema.sql`."""
    return resources.files(_PACKAGE).joinpath(resource).read_text(encoding="utf-8")


@functools.cache
def load_queries(resource: str) -> dict[str, Query]:
    """The named queries of a query file in the store package, by name."""
    return parse_queries(read_text(resource), source=resource)


def parse_queries(text: str, *, source: str = "queries") -> dict[str, Query]:
    parts = _HEADER.split(text)
    queries: dict[str, Query] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise StoreError(f"{source}: query {name!r} is defined twice")
        queries[name] = _parse_query(name, body, source)
    return queries


def _parse_query(name: str, body: str, source: str) -> Query:
    description, _, statement = body.strip().partition("\n")
    if not description.startswith("-- ") or not description[3:].strip():
        raise StoreError(f"{source}: query {name!r} needs a one-line '-- description'")
    text = statement.strip().removesuffix(";").strip()
    if not text:
        raise StoreError(f"{source}: query {name!r} has no statement")
    return Query(name, description[3:].strip(), text)


@functools.cache
def load_migrations(folder: str) -> tuple[Migration, ...]:
    """Every migration in `folder` (`<dialect>/sql/migrations`), in version order; versions run 1,
    2, 3… without gaps."""
    dialect = folder.partition("/")[0]
    found: list[Migration] = []
    for entry in resources.files(_PACKAGE).joinpath(folder).iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match is not None:
            text = entry.read_text(encoding="utf-8")
            statements = tuple(split_statements(text, dialect=dialect))
            found.append(Migration(int(match[1]), match[2], statements))
    found.sort(key=lambda migration: migration.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise StoreError(f"{folder}: migration versions must run 1, 2, 3… without gaps")
    return tuple(found)


def split_statements(script: str, *, dialect: str = "sqlite") -> list[str]:
    """The statements of a script in `dialect` (sqlite or postgres), each whole (with the
    comments before it)."""
    complete = complete_postgres if dialect == "postgres" else sqlite3.complete_statement
    statements: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if complete(pending):
            statements.append(pending.strip())
            pending = ""
    if _without_comments(pending):
        raise StoreError(f"an incomplete SQL statement ends the script: {pending.strip()[:60]!r}")
    return statements


# What may open a quoted span or a comment in PostgreSQL: 'text', "name", -- line, $tag$ body $tag$.
_PG_OPENING = re.compile(r"'|\"|--|\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$")


def complete_postgres(text: str) -> bool:
    """Whether `text` ends a PostgreSQL statement: with `;` (then only blanks and comments)
    outside quotes, comments and dollar-quoted bodies (a function's)."""
    code: list[str] = []
    position = 0
    while True:
        opening = _PG_OPENING.search(text, position)
        if opening is None:
            code.append(text[position:])
            break
        code.append(text[position : opening.start()])
        token = opening.group()
        closing = "\n" if token == "--" else token
        close = text.find(closing, opening.end())
        if close < 0:
            if token != "--":
                return False  # within a quote or a body: the statement goes on
            break
        code.append(" " if token == "--" else "x")
        position = close + len(closing)
    return "".join(code).rstrip().endswith(";")


def _without_comments(text: str) -> str:
    lines = (line for line in text.splitlines() if not line.strip().startswith("--"))
    return "\n".join(lines).strip()
