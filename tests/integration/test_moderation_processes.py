"""A moderation worker killed -9 while it derives: the survivor runs the stage again and reuses
the derivative set already in place, so each (media id, stage version) has exactly one.

Real time on purpose: separate OS processes, real leases, a real kill -9; bounded by a short
lease and a handful of photos.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.pipeline import DERIVE_VERSION, ItemState
from headrace.store.protocol.types import AttemptOutcome

from .moderation_app import make_moderation
from .processes import ROOT, everything, read, settled, stop, wait_until

pytestmark = pytest.mark.realtime

PHOTOS = 6
APP = "tests.integration.moderation_app:make_app"


def start(env: dict[str, str], name: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "headrace", "worker", APP, "--name", name]
    command += ["--lease", "2s", "--idle", "0.1s"]
    return subprocess.Popen(command, cwd=ROOT, env=env, text=True)


def test_a_worker_killed_during_derive_leaves_one_derivative_set_per_item(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "HEADRACE_DB": f"sqlite:///{tmp_path / 'moderation.db'}",
        "HEADRACE_MEDIA": str(tmp_path / "media"),
    }
    with pytest.MonkeyPatch.context() as patch:
        for name in ("HEADRACE_DB", "HEADRACE_MEDIA"):
            patch.setenv(name, env[name])
        moderation = make_moderation()

    async def submit() -> list[str]:
        ids = []
        async with moderation.app:
            for n in range(PHOTOS):
                data = samples.jpeg(800, 600, shade=n * 40)
                item = await moderation.accept_bytes(data, event="gala", session=f"s{n}")
                await moderation.submit(item)
                ids.append(item.media_id)
        return ids

    media_ids = asyncio.run(submit())
    derived = tmp_path / "media" / "derived"

    def sets_in_place() -> int:
        manifests = derived.glob(f"*/derive.v{DERIVE_VERSION}/manifest.json")
        return sum(1 for _ in manifests) if derived.exists() else 0

    # Each derive holds its finished set for 30 s before its outcome: the first set in place
    # means the worker is between writing and acknowledging.
    doomed = start({**env, "HEADRACE_HOLD": "30"}, "doomed")
    try:
        wait_until(lambda: sets_in_place() >= 1, 60, "a derivative set in place, unacknowledged")
    finally:
        stop(doomed, signal.SIGKILL)
    held = sets_in_place()
    survivor = start(env, "survivor")
    try:
        wait_until(lambda: settled(tmp_path / "moderation.db"), 90, "every task to end")
    finally:
        stop(survivor)

    async def states() -> set[ItemState]:
        async with moderation.app:
            return {(await moderation.records.get(media_id)).state for media_id in media_ids}

    for media_id in media_ids:  # and nothing half written left beside it
        sets = [p.name for p in (derived / media_id).iterdir()]
        assert sets == [f"derive.v{DERIVE_VERSION}"], media_id
        kept = sorted(p.name for p in (derived / media_id / sets[0]).iterdir())
        assert len(kept) == 2 and kept[0].startswith("attempt-") and kept[1] == "manifest.json"
    assert asyncio.run(states()) == {ItemState.REVIEWABLE}
    history = read(tmp_path / "moderation.db", everything)
    derives = [(task, runs) for task, runs in history if ".derive." in task.kind]
    assert len(derives) == PHOTOS and Counter(task.ref for task, _ in derives) == Counter(media_ids)
    # The killed worker's derives ran again on the survivor, which found their sets in place.
    lost = [runs for _, runs in derives if runs[0].outcome is AttemptOutcome.LEASE_EXPIRED]
    assert len(lost) >= held >= 1
    assert all(runs[-1].worker == "survivor" for runs in lost)
