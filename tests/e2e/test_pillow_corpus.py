"""Pillow's own test images uploaded through the real `headrace serve`, on each store: the files
of that corpus that once misbehaved, with a few beside them that never did. No answer is a 5xx,
every upload settles (reviewable, or refused with a safe code), no original stays without an
item that needs it, and no task is dead.

What they did before: the three `unimplemented_*.dds` answered 500 on every try, each try leaving
its bytes in the media store with no item (Pillow's NotImplementedError escaped the probe);
`avif/hopper.heif` became a "video / mp4" item with a playable copy; files of identical bytes
sent at once (the two `tga/common/200x32_rgb_tl_*.tga`, the four `fli_oob/*/reproducing`) met
an item of the same bytes being refused (`500 internal`, `OriginalGone`): the whole corpus
answered 500 four times. `python -m bench.corpus` sends the whole corpus the same way.

The corpus is the Tests/images directory of pillow 13.0.0's sdist: `.ci/run` fetches it from
PyPI (`.ci/corpus`) and names it in HEADRACE_PILLOW_CORPUS. Without it this test skips, saying
so; with CI set, it fails.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.corpus import (
    CORPUS,
    Upload,
    corpus_files,
    corpus_server,
    unnamed_originals,
    upload_all,
)

from tests.integration.postgres import fresh_schema
from tests.objectstore import CREDENTIALS, fresh_bucket, media_url
from tests.services import unavailable

pytestmark = pytest.mark.realtime

REFUSED = "refused"
EXPECTED = {  # file -> (final state, reason, media type)
    "unimplemented_dxgi_format.dds": (REFUSED, "media.unsupported", "image"),
    "unimplemented_pfflags.dds": (REFUSED, "media.unsupported", "image"),
    "unimplemented_pixel_format.dds": (REFUSED, "media.unsupported", "image"),
    "avif/hopper.heif": (REFUSED, "media.unsupported", "image"),  # HEVC: no decoder here
    "avif/hopper.avif": ("reviewable", None, "image"),
    "avif/star.avifs": (REFUSED, "media.unsupported", "image"),  # an image sequence
    "fli_oob/03r/reproducing": (REFUSED, "media.unsupported", "image"),
    "fli_oob/04r/reproducing": (REFUSED, "media.unsupported", "image"),
    "fli_oob/05r/reproducing": (REFUSED, "media.unsupported", "image"),
    "fli_oob/06r/reproducing": (REFUSED, "media.unsupported", "image"),
    "tga/common/200x32_rgb_tl_raw.tga": (REFUSED, "media.unsupported", "image"),
    "tga/common/200x32_rgb_tl_rle.tga": (REFUSED, "media.unsupported", "image"),  # the same bytes
    "hopper.jpg": ("reviewable", None, "image"),
    "truncated_jpeg.jpg": (REFUSED, "media.corrupt", "image"),
}


def corpus() -> Path:
    given = os.environ.get(CORPUS)
    if not given or not Path(given).is_dir():
        unavailable(
            f"no Pillow test-image corpus: {CORPUS} is not set to a directory "
            "(bash .ci/corpus fetches it from PyPI and prints where)",
            "the Pillow corpus test",
        )
    return Path(given)


@pytest.fixture(params=["sqlite+directory", "postgresql+s3"])
def stores(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str]]:
    """A store and a media store: SQLite with a directory, as on one host; PostgreSQL with a
    bucket, as across hosts."""
    if request.param == "sqlite+directory":
        yield f"sqlite:///{tmp_path / 'corpus.db'}", str(tmp_path / "media")
        return
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)  # the server's, as every S3 tool reads them
    with fresh_schema("corpus") as db, fresh_bucket() as bucket:
        yield db, media_url(bucket)


def outcome(upload: Upload) -> tuple[str | None, str | None, str | None]:
    return (upload.state, upload.reason, upload.media_type)


def test_the_files_of_pillows_corpus_that_misbehaved_settle_on_every_store(
    stores: tuple[str, str],
) -> None:
    root = corpus()
    db, media = stores
    with corpus_server(db, media) as server:
        # Four at once: the identical files arrive while the first of them is refused.
        run = asyncio.run(upload_all(server, corpus_files(root, list(EXPECTED)), root=root))
    run.unnamed_originals = asyncio.run(unnamed_originals(db, media))
    assert run.server_errors == 0, run.statuses()
    assert {upload.name: outcome(upload) for upload in run.uploads} == EXPECTED
    assert run.unnamed_originals == []
    assert run.dead_tasks == 0
