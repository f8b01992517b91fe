"""The moderation stages on real files: every sample ends in the state a moderator should see,
with the safe code or the scan's finding as its reason."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import headrace as hr
from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.media import MediaStore
from headrace.pipelines.moderation.pipeline import (
    DERIVE_VERSION,
    Item,
    ItemState,
    Moderation,
    derive_stage,
)
from headrace.pipelines.moderation.scan import EICAR_NAME, BuiltinScanner
from headrace.policy import ConfigError
from headrace.store.types import TaskState

pytestmark = pytest.mark.anyio

EXPECTED = {  # sample -> (item state, class, reason)
    "photo.jpg": (ItemState.REVIEWABLE, "image", None),
    "graphic.png": (ItemState.REVIEWABLE, "image", None),
    "sticker.webp": (ItemState.REVIEWABLE, "image", None),
    "voice.wav": (ItemState.REVIEWABLE, "audio", None),
    "song.mp3": (ItemState.REVIEWABLE, "audio", None),
    "clip.mp4": (ItemState.REVIEWABLE, "video", None),
    "lying-extension.jpg": (ItemState.REVIEWABLE, "audio", None),
    "truncated.jpg": (ItemState.REFUSED, None, "media.corrupt"),
    "bomb.png": (ItemState.REFUSED, None, "media.too_large"),
    "eicar.txt": (ItemState.REFUSED, None, "media.unsupported"),
}


async def test_every_sample_ends_where_a_moderator_expects_it(
    media_samples: dict[str, Path], tmp_path: Path
) -> None:
    app = hr.App("memory://")
    media = MediaStore(tmp_path / "media")
    moderation = Moderation(app, media, BuiltinScanner())
    infected = samples.jpeg() + samples.eicar()  # a photo that carries the test virus
    async with app:
        items: dict[str, Item] = {}
        for name in EXPECTED:
            with media_samples[name].open("rb") as upload:
                items[name] = moderation.accept(upload, event="gala", session=f"s-{len(items)}")
        items["infected.jpg"] = moderation.accept(io.BytesIO(infected), event="gala", session="s-x")
        for item in items.values():
            await moderation.submit(item)
        await hr.Worker(app).drain(fail_fast=False)
        dead = {t.ref: t for t in await app.store.tasks(state=TaskState.DEAD)}
    for name, (state, media_class, reason) in EXPECTED.items():
        record = moderation.records.get(items[name].media_id)
        assert (record.state, record.media_class, record.reason) == (state, media_class, reason)
        if state is ItemState.REFUSED:  # its validate task is dead with the same safe code
            assert dead[record.media_id].error_code == reason
        if state is ItemState.REVIEWABLE:
            assert record.derived == f"derived/{record.media_id}/derive.v{DERIVE_VERSION}"
            assert (media.root / record.derived / "metadata.json").is_file()
    quarantined = moderation.records.get(items["infected.jpg"].media_id)
    assert (quarantined.state, quarantined.reason) == (ItemState.QUARANTINED, EICAR_NAME)
    assert media.derived(quarantined.media_id, "derive", DERIVE_VERSION) is None  # never derived


async def test_a_derive_run_again_reuses_what_the_first_made(
    media_samples: dict[str, Path], tmp_path: Path
) -> None:
    app = hr.App("memory://")
    media = MediaStore(tmp_path / "media")
    moderation = Moderation(app, media, BuiltinScanner())
    async with app:
        with media_samples["photo.jpg"].open("rb") as upload:
            item = moderation.accept(upload, event="gala", session="s1")
        await moderation.submit(item)
        await hr.Worker(app).drain()
        made = media.derived(item.media_id, "derive", DERIVE_VERSION)
        assert made is not None
        before = {p.name: p.stat().st_mtime_ns for p in made.path.iterdir()}
        # The same stage again, as after a worker died before its outcome was written.
        await app.definition(derive_stage_of(moderation, item.media_id)).submit(item.media_id)
        await hr.Worker(app).drain()
    after = {p.name: p.stat().st_mtime_ns for p in made.path.iterdir()}
    assert after == before
    assert [p.name for p in (media.root / "derived" / item.media_id).iterdir()] == ["derive.v1"]


def derive_stage_of(moderation: Moderation, media_id: str) -> str:
    from headrace.pipelines.moderation.probe import MediaClass

    record = moderation.records.get(media_id)
    assert record.media_class is not None
    return derive_stage(MediaClass(record.media_class))


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "x" * 65])
def test_events_and_sessions_are_labels_not_paths(bad: str, tmp_path: Path) -> None:
    moderation = Moderation(hr.App("memory://"), MediaStore(tmp_path), BuiltinScanner())
    with pytest.raises(ConfigError, match="event"):
        moderation.accept(io.BytesIO(b"x"), event=bad, session="s1")
    with pytest.raises(ConfigError, match="session"):
        moderation.accept(io.BytesIO(b"x"), event="gala", session=bad)
