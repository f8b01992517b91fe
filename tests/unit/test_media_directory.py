"""The directory media backend: a write whose directory another attempt's sweep removes
meanwhile makes it again, and a listing walking a directory the sweep removes leaves it out."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from headrace.pipelines.moderation.media.directory import DirectoryBackend

pytestmark = pytest.mark.anyio


def removing_the_directory_once(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """os.link as the directory module calls it, with the target's directory removed just
    before the first call, as a sweep running beside the write would."""
    removed: list[Path] = []
    link = os.link

    def racing(source: Any, target: Any) -> None:
        if not removed:
            removed.append(Path(target).parent)
            shutil.rmtree(Path(target).parent)
        link(source, target)

    monkeypatch.setattr(os, "link", racing)  # the module calls os.link
    return removed


async def test_a_write_makes_its_directory_again_after_a_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = DirectoryBackend(tmp_path / "media")
    made = tmp_path / "made"
    made.write_bytes(b"preview")
    removed = removing_the_directory_once(monkeypatch)
    await backend.put_file("derived/m1/derive.v1/attempt-a/preview.webp", made)
    assert removed  # the race happened
    assert await backend.read("derived/m1/derive.v1/attempt-a/preview.webp") == b"preview"


async def test_a_conditional_write_makes_its_directory_again_after_a_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = DirectoryBackend(tmp_path / "media")
    (tmp_path / "media").mkdir()
    removed = removing_the_directory_once(monkeypatch)
    assert await backend.create("derived/m1/derive.v1/manifest.json", b"{}")
    assert removed
    assert not await backend.create("derived/m1/derive.v1/manifest.json", b"{}")
    assert await backend.read("derived/m1/derive.v1/manifest.json") == b"{}"


async def test_a_listing_leaves_out_a_directory_a_sweep_removes_while_it_walks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = DirectoryBackend(tmp_path / "media")
    made = tmp_path / "made"
    made.write_bytes(b"x")
    for attempt in ("attempt-a", "attempt-b"):
        await backend.put_file(f"derived/m1/derive.v1/{attempt}/preview.webp", made)
    await backend.put_file("derived/m1/derive.v1/manifest.json", made)
    scandir = os.scandir
    removed: list[str] = []

    def racing(path: Any) -> Any:
        if not isinstance(path, int) and Path(path).name == "attempt-b" and not removed:
            removed.append(str(path))
            shutil.rmtree(path)  # the sweep of the attempt that won, just before the walk
        return scandir(path)

    monkeypatch.setattr(os, "scandir", racing)  # os.walk calls os.scandir
    keys = await backend.keys("derived/m1/derive.v1")
    assert removed
    assert keys == [
        "derived/m1/derive.v1/attempt-a/preview.webp",
        "derived/m1/derive.v1/manifest.json",
    ]
