"""`headrace worker` for the moderation pipeline checks its media store before it takes work, as
`headrace serve` does: given one that holds none of the waiting items' originals, or one that
does not answer, it stops with one line naming HEADRACE_MEDIA, its value and what to do, and no
task is touched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import headrace as hr
from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.media import DirectoryBackend, MediaStore
from headrace.pipelines.moderation.pipeline import Moderation
from headrace.pipelines.moderation.scan import BuiltinScanner
from headrace.store.protocol.types import TaskState
from tests.objectstore import CREDENTIALS

from .commands import failure_line, headrace

APP = "headrace.pipelines.moderation.deploy:make_app"
UPLOADS = 5


def waiting_uploads(url: str, media: Path) -> None:
    """Uploads accepted into `media`, their validation queued in the store at `url`."""

    async def accept() -> None:
        app = hr.App(url)
        moderation = Moderation(app, MediaStore(DirectoryBackend(media)), BuiltinScanner())
        async with app:
            for n in range(UPLOADS):
                data = samples.jpeg(64 + n, 48, gps=False)
                await moderation.submit(
                    await moderation.accept_bytes(data, event="gala", session=f"s{n}")
                )

    asyncio.run(accept())


def tasks_as_they_are(url: str) -> list[tuple[TaskState, int]]:
    async def read() -> list[tuple[TaskState, int]]:
        async with hr.App(url) as app:
            return [(task.state, task.attempt) for task in await app.store.tasks(limit=100)]

    return asyncio.run(read())


@pytest.mark.parametrize(
    ("media", "says"),
    [
        ("{tmp}/elsewhere", f"holds none of the originals of the {UPLOADS} items waiting"),
        (
            "s3://media?endpoint=http://127.0.0.1:9",
            "HEADRACE_MEDIA s3://media/ at http://127.0.0.1:9:",
        ),
    ],
)
def test_a_worker_given_a_wrong_media_store_stops_in_one_line_touching_nothing(
    tmp_path: Path, media: str, says: str
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    waiting_uploads(url, tmp_path / "media")
    given = media.format(tmp=tmp_path)
    # Credentials given, so no instance role is looked for.
    env = {"HEADRACE_URL": url, "HEADRACE_MEDIA": given, **CREDENTIALS}
    done = headrace("worker", APP, env=env, timeout=120)
    line = failure_line(done)
    print(line)
    assert done.returncode == 1
    assert line.startswith("Error: HEADRACE_MEDIA ") and says in line
    assert "; set HEADRACE_MEDIA to" in line or "; check that this host reaches it" in line
    assert tasks_as_they_are(url) == [(TaskState.READY, 0)] * UPLOADS
