"""What the suite does when a real service it needs is missing: skip, saying why, on a
developer's machine; fail when `CI` is set, where `.ci/run` provides every service."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(reason: str, what: str) -> NoReturn:
    """Skip with `reason` (printed), or fail with it when `CI` is set: `what` must run there."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: {what} must run)", pytrace=False)
    print(reason)
    pytest.skip(reason)
