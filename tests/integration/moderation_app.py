"""The moderation pipeline as `headrace worker` runs it, for crash tests: its store and media
store from the environment, and a derive that holds its finished derivative set for
HEADRACE_HOLD seconds before the outcome is written (where a worker killed -9 leaves work done
and not acknowledged)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import headrace as hr
from headrace.pipelines.moderation.media import Derived, MediaStore, open_media
from headrace.pipelines.moderation.pipeline import Moderation
from headrace.pipelines.moderation.scan import BuiltinScanner


class HoldingMedia(MediaStore):
    async def keep_derived(self, media_id: str, stage: str, version: int, made: Path) -> Derived:
        found = await super().keep_derived(media_id, stage, version, made)
        await asyncio.sleep(float(os.environ.get("HEADRACE_HOLD", "0")))  # kept, unacknowledged
        return found


def make_moderation() -> Moderation:
    app = hr.App(os.environ["HEADRACE_DB"])
    media = HoldingMedia(open_media(os.environ["HEADRACE_MEDIA"]).backend)
    return Moderation(app, media, BuiltinScanner())


def make_app() -> hr.App:
    return make_moderation().app
