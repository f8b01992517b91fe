"""The moderation pipeline as a deployment runs it, configured from the environment, so that
`headrace serve` and any number of `headrace worker headrace.pipelines.moderation.deploy:make_app`
processes (on this host or others) agree:

| variable | default | |
| --- | --- | --- |
| `HEADRACE_URL` | `sqlite:///headrace.db` | the store (`--db` overrides it) |
| `HEADRACE_MEDIA` | `headrace-media` | the media directory (shared by every process) |
| `HEADRACE_CLAMD` | unset | clamd's socket path or `host:port`; unset: the built-in scanner |
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import headrace as hr
from headrace.pipelines.moderation.media import MediaStore
from headrace.pipelines.moderation.pipeline import Admission, Moderation
from headrace.pipelines.moderation.probe import Limits, MediaClass
from headrace.pipelines.moderation.scan import BuiltinScanner, ClamdScanner, Scanner

DEFAULT_URL = "sqlite:///headrace.db"
DEFAULT_MEDIA = "headrace-media"


def make_moderation(
    url: str | None = None,
    media: str | None = None,
    clamd: str | None = None,
    *,
    admission: Admission | None = None,
    limits: Mapping[MediaClass, Limits] | None = None,
) -> Moderation:
    """The pipeline over a store and a media directory (each from the environment when not
    given)."""
    clamd = clamd or os.environ.get("HEADRACE_CLAMD") or None
    scanner: Scanner = ClamdScanner(clamd) if clamd else BuiltinScanner()
    app = hr.App(url or os.environ.get("HEADRACE_URL") or DEFAULT_URL)
    root = media or os.environ.get("HEADRACE_MEDIA") or DEFAULT_MEDIA
    return Moderation(app, MediaStore(root), scanner, admission=admission, limits=limits)


def make_app() -> hr.App:
    """The app `headrace worker` runs (`headrace.pipelines.moderation.deploy:make_app`)."""
    return make_moderation().app
