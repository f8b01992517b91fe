"""Rich tables over store records that more than one command prints.

Every value that comes from the store (a ref, a group, a message) goes in as `Text`, never as a
string: rich would read `[...]` in it as markup, drop the text or fail on a stray `[/]`.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from headrace.store.protocol.types import GroupReport


def plain(value: str | None, empty: str = "-") -> Text:
    """`value` shown verbatim (`empty` when it is None or blank)."""
    return Text(value or empty)


def groups_table(groups: Sequence[GroupReport], *, title: str = "Groups") -> Table:
    """Counts per group; `complete` is the share that succeeded, dead and cancelled apart."""
    table = Table(title=title, title_justify="left")
    table.add_column("group", no_wrap=True)
    for column in ("tasks", "succeeded", "dead", "cancelled", "complete"):
        table.add_column(column, justify="right")
    table.add_column("cost ledger")
    for group in groups:
        ledger = " ".join(f"{kind} {units:g}" for kind, units in group.cost.items())
        table.add_row(
            plain(group.group),
            str(group.total),
            str(group.succeeded),
            str(group.dead),
            str(group.cancelled),
            f"{group.percent:.0f}%",
            plain(ledger),
        )
    return table
