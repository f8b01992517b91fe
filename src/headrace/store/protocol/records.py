"""Records: the documents kept beside the tasks, in the same store, so that a change to one, the
audit row that says who made it and the notification it owes commit in one transaction.

A record is an upload's item, an API token, the first answer to an idempotent request, a
webhook delivery: `kind` names the sort, `id` is unique within it, `scope` (an event) says who
may see it, `state` is what lists filter on and `body` the rest, a JSON object. `seq` orders
records by their last change of state: a record that changes state later has a larger one, so
a list read in `seq` order past a cursor never reorders what was read before it.

`change` applies only from the states it names (`when`): two moderators approving one item at
once make one change, and both attempts are audited. It may also ask how long ago the record
last changed, by the store's clock (`Age`): a claim nobody renewed for its TTL may be taken, a
decision may be undone only within its window. A change that applies may owe a `Notice`,
written to the outbox with it; one that does not writes none. The rule is `decide`, written
once for every backend.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from headrace.policy.errors import ConfigError
from headrace.policy.text import check_document

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}")
APPLIED = "applied"
STORED_DEPTH = 256  # the nesting a body may have: within what every store's JSON reads back


@dataclass(frozen=True)
class Record:
    kind: str
    id: str
    scope: str
    state: str
    body: Mapping[str, Any]
    seq: int  # the order of the last change of state
    created_at: float
    changed_at: float


@dataclass(frozen=True)
class Audit:
    """What to write to the audit log about a change: who (`actor`) did what (`action`)."""

    action: str
    actor: str
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditRow:
    id: int
    at: float
    kind: str
    record_id: str
    scope: str
    action: str
    actor: str
    outcome: str  # "applied", or why not: "unchanged: <state>", "denied"
    detail: Mapping[str, Any]


@dataclass(frozen=True)
class Notice:
    """A notification a change owes the outside world (`topic`, e.g. "item.approved"), kept
    in the outbox until a relay delivers it."""

    topic: str
    body: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OutboxRow:
    id: int
    at: float
    topic: str
    kind: str
    record_id: str
    scope: str
    body: Mapping[str, Any]
    delivered_at: float | None


@dataclass(frozen=True)
class Changed:
    """A change's result: the record as it now is, and whether the change applied."""

    record: Record
    applied: bool


@dataclass(frozen=True)
class Age:
    """A change's condition on the time since the record last changed (its `changed_at`, by
    the store's clock): at least `at_least` seconds, at most `at_most` (None: no bound)."""

    at_least: float | None = None
    at_most: float | None = None

    def __post_init__(self) -> None:
        for name in ("at_least", "at_most"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ConfigError(f"age.{name}: expected seconds >= 0, got {value!r}")

    def holds(self, elapsed: float) -> bool:
        return (self.at_least is None or elapsed >= self.at_least) and (
            self.at_most is None or elapsed <= self.at_most
        )


@dataclass(frozen=True)
class Decision:
    state: str
    body: dict[str, Any]
    applied: bool
    outcome: str
    moved: bool  # its state changed: it takes a new seq


def decide(
    record: Record,
    state: str | None,
    body: Mapping[str, Any] | None,
    when: Collection[str] | None,
    age: Age | None = None,
    now: float = 0.0,
) -> Decision:
    """Whether a change applies to `record` (its state is among `when`, or `when` is None; it
    last changed as long before `now` as `age` asks, when given), and what the record becomes:
    `state` if given, `body`'s keys over its own."""
    if when is not None and record.state not in when:
        return Decision(record.state, dict(record.body), False, f"unchanged: {record.state}", False)
    elapsed = max(0.0, now - record.changed_at)
    if age is not None and not age.holds(elapsed):
        outcome = f"unchanged: {record.state}, changed {elapsed:.3g} s before"
        return Decision(record.state, dict(record.body), False, outcome, False)
    new_state = record.state if state is None else state
    merged = {**record.body, **(body or {})}
    return Decision(new_state, merged, True, APPLIED, new_state != record.state)


def check_name(value: object, what: str) -> str:
    """A record's kind, id or scope, a state, an action or an actor: 1 to 200 characters of
    letters, digits and `._:@/-`, starting with a letter or digit."""
    if not isinstance(value, str) or _NAME.fullmatch(value) is None:
        raise ConfigError(
            f"{what}: expected 1 to 200 letters, digits or ._:@/- (starting with a letter or "
            f"digit), got {value!r}"
        )
    return value


def dump(document: Mapping[str, Any]) -> str:
    """A body as stored: JSON, keys sorted (a body that is not JSON, or holds text not every
    store can keep, is refused here, at the edge, with the field named)."""
    check_document(document, "record.body", depth=STORED_DEPTH)
    try:
        return json.dumps(dict(document), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"record.body: not a JSON object ({exc})") from None


def load(stored: object) -> dict[str, Any]:
    """A stored body (JSON text, or a document the driver already decoded)."""
    found = json.loads(stored) if isinstance(stored, str | bytes) else stored
    return dict(found) if isinstance(found, Mapping) else {}


def check_record(kind: str, record_id: str, scope: str | None, state: str | None) -> None:
    """The names of a record a verb is given, checked at the edge (None: not given)."""
    check_name(kind, "record.kind")
    check_name(record_id, "record.id")
    if scope is not None:
        check_name(scope, "record.scope")
    if state is not None:
        check_name(state, "record.state")


def check_audit(audit: Audit | None) -> None:
    if audit is not None:
        check_name(audit.action, "audit.action")
        check_name(audit.actor, "audit.actor")
        dump(audit.detail)


def check_notice(notice: Notice | None) -> None:
    if notice is not None:
        check_name(notice.topic, "notice.topic")
        dump(notice.body)


def check_page(after: int, limit: int) -> None:
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ConfigError(f"after: expected a seq >= 0, got {after!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= 10_000:
        raise ConfigError(f"limit: expected 1 to 10000, got {limit!r}")


class RecordStore(Protocol):
    """A pipeline's records, their audit rows and the outbox, kept beside a task `Store` in the
    same database (`Store.records`). Every verb is one transaction."""

    async def put_record(
        self,
        kind: str,
        record_id: str,
        *,
        scope: str,
        state: str,
        body: Mapping[str, Any] | None = None,
        audit: Audit | None = None,
    ) -> Changed:
        """Create a record unless one of this kind and id exists: then return that one, not
        applied, and write nothing. `audit` is written with a record created."""
        ...

    async def change_record(
        self,
        kind: str,
        record_id: str,
        *,
        state: str | None = None,
        body: Mapping[str, Any] | None = None,
        when: Collection[str] | None = None,
        age: Age | None = None,
        audit: Audit | None = None,
        notice: Notice | None = None,
    ) -> Changed:
        """Set a record's state and `body`'s keys, if its state is among `when` (or always)
        and, given `age`, it last changed that long ago by the store's clock (`records.Age`),
        in one transaction with `audit` (written either way, with the outcome) and `notice`
        (to the outbox, only when the change applied). Raise UnknownRecord if there is none."""
        ...

    async def write_audit(
        self, kind: str, record_id: str, *, scope: str, audit: Audit, outcome: str
    ) -> None:
        """An audit row for an attempt that changed nothing (one denied, say)."""
        ...

    async def get_record(self, kind: str, record_id: str) -> Record | None: ...

    async def list_records(
        self,
        kind: str,
        *,
        scope: str | None = None,
        state: str | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> list[Record]:
        """Records of a kind whose seq is past `after`, in seq order."""
        ...

    async def count_records(
        self,
        kind: str,
        *,
        scope: str | None = None,
        state: str | None = None,
        after: int = 0,
    ) -> int: ...

    async def audit_log(
        self,
        *,
        kind: str | None = None,
        record_id: str | None = None,
        scope: str | None = None,
        limit: int = 1000,
    ) -> list[AuditRow]:
        """Audit rows in the order written."""
        ...

    async def outbox(
        self, *, after: int = 0, pending: bool = True, limit: int = 100
    ) -> list[OutboxRow]:
        """Notifications past id `after` in the order written (not yet delivered: `pending`)."""
        ...

    async def mark_delivered(self, ids: Collection[int]) -> int:
        """Mark notifications delivered; return how many were not before."""
        ...

    async def delete_records(
        self, kind: str, ids: Collection[str], *, when: Collection[str] | None = None
    ) -> int:
        """Delete the records of `kind` among `ids` (those whose state is in `when`, when
        given; never the newest record, whose seq the next one counts on from); how many."""
        ...
