"""Cost classes: a worker's slots split by what a task costs to run, so heavy media cannot take
every slot. A stage names its class (`@app.task(cost_class="video")`); a worker gives each class
a number of slots (by default image 6, audio 2, video 2) and claims a class's stages only while
that class has a slot free. Photos keep flowing while videos use their own two slots, and a
burst of videos waits for those slots without holding anything else.

A class's slots are its own, not walls: slots a class leaves idle (nothing of it to claim) are
lent to the classes with more slots than it whose own are all taken, and come back when the
borrowing task ends. So once the videos are done their two slots run photos, and a video that
arrives then waits for one photo at most; a heavy class never borrows a light class's slots,
which would keep photos waiting behind a video."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping

from headrace.policy.errors import ConfigError
from headrace.store.protocol.types import KindLimit

DEFAULT_CLASSES: Mapping[str, int] = {"image": 6, "audio": 2, "video": 2}
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def check_class_name(name: object, *, field: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{field}: expected a short lower-case class name, got {name!r}")
    return name


class ClassBudget:
    """A worker's slots per cost class, and the stages (kinds) of each class."""

    def __init__(self, slots: Mapping[str, int], classes_of: Mapping[str, str]) -> None:
        """`slots`: slots per class; `classes_of`: each classed stage's class."""
        for name, count in slots.items():
            check_class_name(name, field="worker.classes")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ConfigError(
                    f"worker.classes[{name!r}]: expected a positive number of slots, got {count!r}"
                )
        for kind, name in classes_of.items():
            if name not in slots:
                raise ConfigError(
                    f"task {kind}: cost class {name!r} has no slots in this worker; give it "
                    f"some, e.g. Worker(classes={{..., {name!r}: 2}})"
                )
        self.slots = dict(slots)
        self.classes_of = dict(classes_of)
        self._kinds: dict[str, frozenset[str]] = {
            name: frozenset(k for k, c in classes_of.items() if c == name) for name in slots
        }

    @classmethod
    def for_stages(
        cls, classes_of: Mapping[str, str], slots: Mapping[str, int] | None
    ) -> ClassBudget | None:
        """The budget a worker runs `classes_of` with: `slots`, or the defaults when the app
        has classed stages and the worker gave none; None when neither has any."""
        if slots is None:
            if not classes_of:
                return None
            slots = DEFAULT_CLASSES
        return cls(slots, classes_of)

    @property
    def total(self) -> int:
        return sum(self.slots.values())

    def room(self, running: Iterable[str]) -> dict[str, int]:
        """Free slots of each class, given the kinds of the tasks running."""
        used = Counter(self.classes_of[k] for k in running if k in self.classes_of)
        return {name: max(0, count - used[name]) for name, count in self.slots.items()}

    def limits(self, room: Mapping[str, int]) -> list[KindLimit]:
        return [KindLimit(self._kinds[name], room[name]) for name in self.slots]

    def open_kinds(self, kinds: Iterable[str], room: Mapping[str, int]) -> list[str]:
        """`kinds` less the stages of classes with no slot free."""
        return [k for k in kinds if k not in self.classes_of or room[self.classes_of[k]] > 0]

    def lendable(self, claimed: Iterable[str], room: Mapping[str, int]) -> list[KindLimit]:
        """What a claim made after `claimed` may borrow, class by class: the slots each class
        left idle (it had room, and its stages had no more to claim) go to every class with
        more slots than it that took all its own room (more of its stages may be ready). A
        borrowed slot needs no return: the lender's room counts only its own tasks, and the
        worker's slots in all stay as they are, so the next slot to free goes to the lender
        if it has work."""
        taken = Counter(self.classes_of[k] for k in claimed if k in self.classes_of)
        idle = {name: room[name] - taken[name] for name in self.slots if taken[name] < room[name]}
        limits = []
        for name, count in self.slots.items():
            if taken[name] < room[name]:
                continue  # it has idle slots of its own
            share = sum(n for lender, n in idle.items() if self.slots[lender] < count)
            if share and self._kinds[name]:
                limits.append(KindLimit(self._kinds[name], share))
        return limits

    def filled(self, claimed: Iterable[str], room: Mapping[str, int]) -> bool:
        """Whether a claim took every free slot of some class (more of it may be ready)."""
        taken = Counter(self.classes_of[k] for k in claimed if k in self.classes_of)
        return any(taken[name] >= room[name] for name in taken)
