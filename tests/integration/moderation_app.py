"""The moderation pipeline as `headrace worker` runs it, for crash tests: its store and media
directory from the environment, and a derive that holds its finished derivative set for
HEADRACE_HOLD seconds before the outcome is written (where a worker killed -9 leaves work done
and not acknowledged)."""

from __future__ import annotations

import os
import time

import headrace as hr
from headrace.pipelines.moderation.media import Derived, MediaStore
from headrace.pipelines.moderation.pipeline import Moderation
from headrace.pipelines.moderation.scan import BuiltinScanner


class HoldingMedia(MediaStore):
    def finish_deriving(self, made: Derived, media_id: str, stage: str, version: int) -> Derived:
        found = super().finish_deriving(made, media_id, stage, version)
        time.sleep(float(os.environ.get("HEADRACE_HOLD", "0")))  # in place, not acknowledged
        return found


def make_moderation() -> Moderation:
    app = hr.App(os.environ["HEADRACE_DB"])
    return Moderation(app, HoldingMedia(os.environ["HEADRACE_MEDIA"]), BuiltinScanner())


def make_app() -> hr.App:
    return make_moderation().app
