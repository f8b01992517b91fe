"""Idempotency keys, written once for every backend: which tasks of a batch a key already names,
and whether the payload submitted with a known key is the one it was first submitted with.

A keyed task is stored with a digest of its payload: one short hash per field, in `FIELDS`
order, so two digests tell which field differs first without keeping the values twice. The
payload is what the task does and where it goes: `kind`, `ref`, `gates` (as a set), `flow`,
`group`, the submitted `tier`, `cost`, `max_attempts`, `weight` and `after` (the task ids it
waits on, as a set, siblings resolved). `delay` is left out: it counts from the moment of each
submission, so a retried submit never matches it. `memory` is left out too: it is an estimate of
what an attempt will use, not part of what the task does, and a retried submit may estimate it
anew (another decoder, a better probe) for the same work; the task keeps its first estimate.
A key submitted again with the same payload names the first task (`created=False`); with
another payload it raises `KeyConflict`. A stored digest of another version (or none, for tasks
stored before digests were kept) is not compared.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from headrace.policy.errors import KeyConflict
from headrace.store.protocol.types import NewTask, Sibling, Submitted

VERSION = "1"
FIELDS = (
    "kind",
    "ref",
    "gates",
    "flow",
    "group",
    "tier",
    "cost",
    "max_attempts",
    "weight",
    "after",
)
HASH_BYTES = 6  # per field: a different value goes unnoticed once in 2**48

# What `plan` says of each task of a batch: None, create it; an int, the id of the stored task
# its key names; a Sibling, the earlier task of the batch that has its key.
Planned = int | Sibling | None


@dataclass(frozen=True)
class KnownKey:
    """A stored task's key: the task's id and its payload digest (None before digests)."""

    task_id: int
    digest: str | None


def payload_digest(task: NewTask, after: Iterable[int]) -> str:
    """The digest stored with a keyed task; `after` is its dependencies as task ids."""
    return _digest(task, tuple(after))


@functools.lru_cache(maxsize=1024)
def _digest(task: NewTask, after: tuple[int, ...]) -> str:
    """`payload_digest`, worked out once: a batch's keys are checked (`plan`), then the same
    digests stored with the new tasks (`stored_digest`), in one transaction."""
    values = _payload(task, after)
    hashes = (_hash(json.dumps(values[name], sort_keys=True)) for name in FIELDS)
    return f"{VERSION}:" + ".".join(hashes)


def first_difference(stored: str, submitted: str) -> str | None:
    """The first field whose hash differs between two digests; None when they agree (or the
    stored one has another version, which cannot be compared)."""
    version, _, stored_hashes = stored.partition(":")
    old = stored_hashes.split(".")
    if version != VERSION or len(old) != len(FIELDS):
        return None
    new = submitted.partition(":")[2].split(".")
    return next((name for name, a, b in zip(FIELDS, old, new, strict=True) if a != b), None)


def plan(tasks: Sequence[NewTask], known: Mapping[str, KnownKey]) -> list[Planned]:
    """For each task of a batch: None to create it, or what its key already names (a stored
    task's id, or an earlier task of the batch). Raises KeyConflict, naming the key and the
    first differing field, when a key comes with another payload than the one it names."""
    planned: list[Planned] = []
    first_in_batch: dict[str, tuple[int, str]] = {}
    for index, task in enumerate(tasks):
        if task.key is None:
            planned.append(None)
            continue
        digest = payload_digest(task, _planned_after(task, planned))
        stored = known.get(task.key)
        if stored is not None:
            check(task.key, stored.digest, digest, stored.task_id)
            planned.append(stored.task_id)
        elif task.key in first_in_batch:
            earlier, earlier_digest = first_in_batch[task.key]
            check(task.key, earlier_digest, digest, None)
            planned.append(Sibling(earlier))
        else:
            first_in_batch[task.key] = (index, digest)
            planned.append(None)
    return planned


def reused(step: int | Sibling, results: Sequence[Submitted]) -> Submitted:
    """The result for a task whose key names a task already (`step` from `plan`), given the
    results of the batch's earlier tasks."""
    task_id = results[step.index].id if isinstance(step, Sibling) else step
    return Submitted(task_id, created=False)


def created_of_kind(tasks: Sequence[NewTask], planned: Sequence[Planned], kind: str) -> int:
    """How many tasks of `kind` the batch creates (what a stage's bound counts)."""
    return sum(1 for t, p in zip(tasks, planned, strict=True) if t.kind == kind and p is None)


def stored_digest(task: NewTask, after: Iterable[int]) -> str | None:
    """What a backend stores with a new task: its payload digest if it has a key, else None."""
    return None if task.key is None else payload_digest(task, after)


def check(key: str, stored: str | None, submitted: str, task_id: int | None) -> None:
    """Raise KeyConflict if the digest `submitted` with `key` differs from the `stored` one of
    the task the key names (`task_id`; None: an earlier task of the batch)."""
    field = None if stored is None else first_difference(stored, submitted)
    if field is not None:
        raise KeyConflict(key, field, task_id)


def _planned_after(task: NewTask, planned: Sequence[Planned]) -> list[int]:
    """`task.after` as ids, where a sibling that will be created has no id yet: it stands as a
    negative number of its own, which no stored task's dependency can equal (a dependency on a
    task created now is never one a stored task had)."""
    return [
        _planned_id(dep.index, planned) if isinstance(dep, Sibling) else dep for dep in task.after
    ]


def _planned_id(index: int, planned: Sequence[Planned]) -> int:
    step = planned[index]
    if step is None:
        return -1 - index
    if isinstance(step, Sibling):
        return _planned_id(step.index, planned)
    return step


def _payload(task: NewTask, after: Iterable[int]) -> dict[str, object]:
    return {
        "kind": task.kind,
        "ref": task.ref,
        "gates": sorted(task.gates),
        "flow": task.flow,
        "group": task.group,
        "tier": int(task.tier),
        "cost": float(task.cost) + 0.0,  # + 0.0: -0.0 and 0.0 are the same cost
        "max_attempts": task.max_attempts,
        "weight": float(task.weight),
        "after": sorted(set(after)),
    }


def _hash(text: str) -> str:
    digest = hashlib.blake2b(text.encode(), digest_size=HASH_BYTES).digest()
    return base64.urlsafe_b64encode(digest).decode()  # 8 characters, never a "." or ":"
