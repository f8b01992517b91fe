"""The moderation pipeline as a deployment runs it, configured from the environment, so that
`headrace serve` and any number of `headrace worker headrace.pipelines.moderation.deploy:make_app`
processes (on this host or others) agree:

| variable | default | |
| --- | --- | --- |
| `HEADRACE_URL` | `sqlite:///headrace.db` | the store (`--db` overrides it) |
| `HEADRACE_MEDIA` | `headrace-media` | the media: a directory all share, or `s3://BUCKET/PREFIX` |
| `HEADRACE_CLAMD` | unset | clamd's socket path or `host:port`; unset: the built-in scanner |

An `s3://` media URL takes `endpoint=`, `region=` and `path_style=` (`media/urls.py`); its
credentials are the environment's `AWS_*` variables, as every S3 tool reads them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import headrace as hr
from headrace.pipelines.moderation.media import open_media
from headrace.pipelines.moderation.pipeline import Admission, Moderation
from headrace.pipelines.moderation.probe import Limits, MediaClass
from headrace.pipelines.moderation.review import ReviewRules
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
    review: ReviewRules | None = None,
) -> Moderation:
    """The pipeline over a store and a media store (each from the environment when not
    given; a bad `media` is a ConfigError naming HEADRACE_MEDIA, or `--media` when given)."""
    clamd = clamd or os.environ.get("HEADRACE_CLAMD") or None
    scanner: Scanner = ClamdScanner(clamd) if clamd else BuiltinScanner()
    app = hr.App(url or os.environ.get("HEADRACE_URL") or DEFAULT_URL)
    if media:
        store = open_media(media, field="--media")
    else:
        where = os.environ.get("HEADRACE_MEDIA") or DEFAULT_MEDIA
        store = open_media(where, field="HEADRACE_MEDIA")
    return Moderation(app, store, scanner, admission=admission, limits=limits, review=review)


def make_app() -> hr.App:
    """The app `headrace worker` runs (`headrace.pipelines.moderation.deploy:make_app`)."""
    return make_moderation().app
