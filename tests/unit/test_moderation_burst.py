"""A small event-shaped burst through the moderation pipeline on the virtual clock (the stages'
rules with `ModelWork` in place of the media code): the report's promises hold, and FIFO over
the same slots does worse where the issue says it must."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import headrace as hr
from headrace.pipelines.moderation.burst import Burst, BurstReport, jain_index, run_burst
from headrace.pipelines.moderation.media import open_media
from headrace.pipelines.moderation.model import ModelWork, tiny_payloads
from headrace.pipelines.moderation.pipeline import Moderation, Order
from headrace.runtime.classes import DEFAULT_CLASSES

pytestmark = pytest.mark.anyio

BURST = Burst(crowd_sessions=6, crowd_photos=5, heavy_photos=30, latecomers=3, videos=2)


async def replay(tmp_path: Path, burst: Burst, order: Order) -> BurstReport:
    app = hr.App("memory://")
    moderation = Moderation(app, open_media(tmp_path / order), None, work=ModelWork(), order=order)
    async with app:
        slots = sum(DEFAULT_CLASSES.values()) if order == "fifo" else None
        return await run_burst(moderation, burst, tiny_payloads(), slots=slots)


async def test_the_burst_report_holds_its_promises(tmp_path: Path) -> None:
    fair = await replay(tmp_path / "with", BURST, "fair")
    alone = await replay(tmp_path / "without", replace(BURST, heavy_photos=0), "fair")
    fifo = await replay(tmp_path / "fifo", BURST, "fifo")

    assert fair.states == {"reviewable": BURST.size}
    assert fair.first_photo_ratio <= 2.0
    assert fair.jain >= 0.98
    assert fair.duplicate_derivatives == 0
    for kind, peak in fair.peak_waiting.items():
        bound = fair.bounds[kind]
        assert bound is None or peak <= bound, kind
    # One heavy contributor delays a latecomer's first photo by less than one photo's work.
    assert fair.heavy_delay(alone) <= alone.photo_processing
    # In one arrival-order queue the latecomers wait behind the heavy contributor's photos,
    # and voice notes behind everyone's.
    assert fifo.latecomer_wait > 3 * fair.latecomer_wait
    assert fifo.queue_p95["audio"] > 3 * max(fair.queue_p95["audio"], 0.1)


def test_jains_index() -> None:
    assert jain_index([3, 3, 3]) == 1.0
    assert jain_index([6, 0, 0]) == pytest.approx(1 / 3)
    assert jain_index([]) == 1.0
