"""Media work that only takes time: the moderation pipeline's stages, every rule of them (classes,
bounds, admission, fairness, records, derivative sets), with the media code replaced by a wait
as long as the real code takes. On the virtual clock (`headrace.sim.loop`) it replays a burst
a hundred times the size this machine could process in real time.

The files are still real (tiny samples): their first bytes decide their class, as uploads' do.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.burst import CROWD, HEAVY, LATECOMER, VIDEO, VOICE
from headrace.pipelines.moderation.derive import METADATA
from headrace.pipelines.moderation.probe import UNSUPPORTED, MediaClass, Probed, Refused, sniff
from headrace.pipelines.moderation.scan import CLEAN, Verdict
from headrace.runtime.calls import off_loop


@dataclass(frozen=True)
class StageCosts:
    """Seconds each stage takes for one item of a class."""

    validate: float
    scan: float
    derive: float

    @property
    def total(self) -> float:
        return self.validate + self.scan + self.derive


# Medians measured with `headrace demo moderation` on a 2-core machine, the stages running
# side by side (a 1600x1200 JPEG, a 20 s MP3, a 12 s 960x540 H.264 video).
MEASURED = {
    MediaClass.IMAGE: StageCosts(validate=0.08, scan=0.04, derive=0.55),
    MediaClass.AUDIO: StageCosts(validate=0.15, scan=0.05, derive=0.30),
    MediaClass.VIDEO: StageCosts(validate=1.20, scan=0.10, derive=1.60),
}


class ModelWork:
    """`MediaWork` that waits as long as each stage takes for the file's class."""

    def __init__(self, costs: Mapping[MediaClass, StageCosts] | None = None) -> None:
        self.costs = dict(costs or MEASURED)

    async def estimate(self, original: Path) -> int | None:
        return None  # modelled work holds no decoder

    async def probe(self, original: Path) -> Probed:
        media_class = await off_loop(sniff, original)
        if media_class is None:
            raise Refused(UNSUPPORTED, "neither an image nor audio or video this pipeline takes")
        await asyncio.sleep(self.costs[media_class].validate)
        return Probed(media_class, media_class.value, 0)

    async def scan(self, original: Path) -> Verdict:
        await asyncio.sleep(self.costs[await self._class(original)].scan)
        return CLEAN

    async def derive(self, original: Path, into: Path) -> None:
        media_class = await self._class(original)
        await asyncio.sleep(self.costs[media_class].derive)
        text = json.dumps({"class": media_class.value, "modelled": True})
        await off_loop((into / METADATA).write_text, text)

    @staticmethod
    async def _class(original: Path) -> MediaClass:
        return await off_loop(sniff, original) or MediaClass.IMAGE


def tiny_payloads() -> dict[str, bytes]:
    """A small real file per burst role: what a modelled run uploads."""
    return {
        CROWD: samples.jpeg(64, 48, gps=False),
        HEAVY: samples.jpeg(64, 48, gps=False, shade=90),
        LATECOMER: samples.jpeg(64, 48, gps=False, shade=180),
        VIDEO: samples.mp4(0.25, 64, 48),
        VOICE: samples.wav(0.1),
    }
