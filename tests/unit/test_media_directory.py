"""The directory media backend: a write whose directory another attempt's sweep removes
meanwhile makes it again."""

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
