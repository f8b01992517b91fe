"""The media store: originals kept by content, derivatives once per (media id, stage version),
and nothing from a client ever a path."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from headrace.pipelines.moderation.media import MediaStore, TooLarge
from headrace.policy import ConfigError


def test_an_original_is_kept_once_under_its_digest(tmp_path: Path) -> None:
    media = MediaStore(tmp_path)
    first = media.put_bytes(b"the same bytes", limit=100)
    again = media.put(io.BytesIO(b"the same bytes"), limit=100)
    assert first == again and first.size == 14
    path = media.blob_path(first.digest)
    assert path.read_bytes() == b"the same bytes"
    assert [p.name for p in (tmp_path / "blobs").rglob("*") if p.is_file()] == [first.digest]
    assert not any((tmp_path / "tmp").iterdir())  # no temporary file left behind


def test_an_upload_past_its_limit_keeps_nothing(tmp_path: Path) -> None:
    media = MediaStore(tmp_path)
    with pytest.raises(TooLarge):
        media.put(io.BytesIO(b"x" * 5000), limit=4096)
    assert not any((tmp_path / "tmp").iterdir())
    assert not (tmp_path / "blobs").exists()


@pytest.mark.parametrize("bad", ["../etc/passwd", "photo.jpg", "A" * 32, "", "0" * 31])
def test_only_a_drawn_media_id_names_a_directory(tmp_path: Path, bad: str) -> None:
    media = MediaStore(tmp_path)
    with pytest.raises(ConfigError, match="media id"):
        media.derived(bad, "derive", 1)
    assert len(media.new_media_id()) == 32


def test_derivatives_are_made_once_and_reused_after(tmp_path: Path) -> None:
    media = MediaStore(tmp_path)
    media_id = media.new_media_id()
    assert media.derived(media_id, "derive", 1) is None
    with media.deriving(media_id, "derive", 1) as first:
        assert first.created
        first.file("preview.webp").write_bytes(b"one")
    with media.deriving(media_id, "derive", 1) as second:  # a retry: finds and reuses them
        assert not second.created
        assert second.file("preview.webp").read_bytes() == b"one"
    found = media.derived(media_id, "derive", 1)
    assert found is not None and found.file("preview.webp").read_bytes() == b"one"
    with media.deriving(media_id, "derive", 2) as newer:  # a new stage version: made afresh
        assert newer.created
        newer.file("preview.webp").write_bytes(b"two")
    versions = sorted(p.name for p in (tmp_path / "derived" / media_id).iterdir())
    assert versions == ["derive.v1", "derive.v2"]


def test_a_derivative_that_fails_halfway_leaves_nothing(tmp_path: Path) -> None:
    media = MediaStore(tmp_path)
    media_id = media.new_media_id()

    def fail_halfway() -> None:
        with media.deriving(media_id, "derive", 1) as attempt:
            attempt.file("preview.webp").write_bytes(b"half")
            raise RuntimeError("the worker's decoder failed")

    with pytest.raises(RuntimeError):
        fail_halfway()
    assert media.derived(media_id, "derive", 1) is None
    assert list((tmp_path / "derived" / media_id).iterdir()) == []


def test_two_attempts_racing_leave_one_set(tmp_path: Path) -> None:
    media = MediaStore(tmp_path)
    media_id = media.new_media_id()
    with media.deriving(media_id, "derive", 1) as slow:
        slow.file("preview.webp").write_bytes(b"slow")
        with media.deriving(media_id, "derive", 1) as fast:  # began later, finished first
            fast.file("preview.webp").write_bytes(b"fast")
    found = media.derived(media_id, "derive", 1)
    assert found is not None and found.file("preview.webp").read_bytes() == b"fast"
    assert [p.name for p in (tmp_path / "derived" / media_id).iterdir()] == ["derive.v1"]


@pytest.mark.parametrize("name", ["../x", "Preview.webp", "a/b", ".hidden"])
def test_derivative_names_are_the_stages_own(tmp_path: Path, name: str) -> None:
    media = MediaStore(tmp_path)
    with media.deriving(media.new_media_id(), "derive", 1) as made, pytest.raises(ConfigError):
        made.file(name)


def test_what_a_killed_attempt_left_half_written_goes_with_the_next_attempt(
    tmp_path: Path,
) -> None:
    media = MediaStore(tmp_path)
    media_id = media.new_media_id()
    killed = media.begin_deriving(media_id, "derive", 1)  # its worker dies before it ends
    (killed.path / "preview.webp").write_bytes(b"half")
    other = media.begin_deriving(media.new_media_id(), "derive", 1)  # another item's: kept
    with media.deriving(media_id, "derive", 1) as again:
        assert again.created
        again.file("preview.webp").write_bytes(b"whole")
    assert [p.name for p in (tmp_path / "derived" / media_id).iterdir()] == ["derive.v1"]
    assert other.path.is_dir()
