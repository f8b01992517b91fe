"""Derivatives made from real files: previews and thumbnails without EXIF (so without the GPS
position the original carries), a poster and a short low-resolution preview of a video, a
waveform of audio, and the metadata of each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from headrace.pipelines.moderation import derive, samples
from headrace.pipelines.moderation.probe import probe

GPS_IFD = 0x8825


def made(source: Path, into: Path) -> dict[str, object]:
    into.mkdir()
    return derive.derive(source, probe(source), into)


def test_a_photo_gets_a_preview_and_a_thumbnail_without_its_location(
    media_samples: dict[str, Path], tmp_path: Path
) -> None:
    original = media_samples["photo.jpg"]
    with Image.open(original) as image:
        assert image.getexif().get_ifd(GPS_IFD)  # the original says where it was taken
    metadata = made(original, tmp_path / "out")
    for name, side in ((derive.PREVIEW, 640), (derive.THUMBNAIL, derive.THUMBNAIL_SIDE)):
        with Image.open(tmp_path / "out" / name) as image:
            assert image.format == "WEBP"
            assert max(image.size) == side
            assert not image.getexif()  # no EXIF at all, so no position
            assert "exif" not in image.info
    assert metadata["class"] == "image" and metadata["width"] == 640
    assert json.loads((tmp_path / "out" / derive.METADATA).read_text()) == metadata


def test_a_large_photo_is_shrunk_to_the_preview_size(tmp_path: Path) -> None:
    original = tmp_path / "big.jpg"
    original.write_bytes(samples.jpeg(3000, 2000))
    made(original, tmp_path / "out")
    with Image.open(tmp_path / "out" / derive.PREVIEW) as image:
        assert image.size == (derive.PREVIEW_SIDE, round(2000 * derive.PREVIEW_SIDE / 3000))


def test_a_video_gets_a_poster_and_a_playable_low_resolution_copy_with_its_sound(
    tmp_path: Path,
) -> None:
    original = tmp_path / "long.mp4"
    original.write_bytes(samples.mp4(seconds=8.0, width=640, height=480))
    metadata = made(original, tmp_path / "out")
    with Image.open(tmp_path / "out" / derive.POSTER) as poster:
        assert poster.size == (640, 480) and not poster.getexif()
    playable = probe(tmp_path / "out" / derive.VIDEO_PREVIEW)
    assert max(playable.width, playable.height) == derive.VIDEO_PREVIEW_SIDE
    assert playable.seconds == pytest.approx(8.0, abs=0.3)  # the whole clip, not a glimpse
    assert playable.codecs == ("h264", "aac")  # with its sound
    assert metadata["codecs"] == ["h264", "aac"] and metadata["playback_sound"] is True
    assert metadata["seconds"] == pytest.approx(8.0, abs=0.2)
    boxes = (tmp_path / "out" / derive.VIDEO_PREVIEW).read_bytes()
    assert boxes.index(b"moov") < boxes.index(b"mdat")  # the index first: plays while it loads


@pytest.mark.parametrize("name", ["voice.wav", "song.mp3"])
def test_audio_gets_its_duration_a_waveform_and_a_playable_copy(
    media_samples: dict[str, Path], tmp_path: Path, name: str
) -> None:
    metadata = made(media_samples[name], tmp_path / "out")
    assert metadata["decoded_seconds"] == pytest.approx(1.0, abs=0.1)
    with Image.open(tmp_path / "out" / derive.WAVEFORM) as image:
        assert image.size == derive.WAVEFORM_SIZE
        middle = image.getpixel((derive.WAVEFORM_SIZE[0] // 2, derive.WAVEFORM_SIZE[1] // 2))
        assert middle != (250, 250, 248)  # the tone drew a line through the middle
    playable = probe(tmp_path / "out" / derive.AUDIO_PLAYBACK)
    assert playable.codecs == ("aac",) and playable.seconds == pytest.approx(1.0, abs=0.15)
    assert metadata["files"] == [derive.WAVEFORM, derive.AUDIO_PLAYBACK]


def test_the_waveform_shows_where_the_sound_is(tmp_path: Path) -> None:
    """On a fixed decibel scale: the words stand up from the middle line, the silences
    between them and at the end are flat, and a louder word is drawn taller."""
    original = tmp_path / "note.wav"
    original.write_bytes(samples.voice_note(seconds=2.0))
    made(original, tmp_path / "out")
    width, height = derive.WAVEFORM_SIZE
    with Image.open(tmp_path / "out" / derive.WAVEFORM) as image:
        rgb = image.convert("RGB")

    def reach(at: float) -> int:
        """How far above the middle the drawing goes, `at` seconds in."""
        x = int(at / 2.0 * width)
        column = [rgb.getpixel((x, y)) for y in range(height // 2 - 1)]
        drawn = [y for y, pixel in enumerate(column) if sum(pixel) < 3 * 235]  # type: ignore[arg-type]
        return height // 2 - min(drawn) if drawn else 0

    quiet, loud = reach(0.12), reach(0.62)  # the first word, and the second (four times louder)
    assert loud > quiet > 10
    assert reach(0.37) == 0 and reach(1.8) == 0  # between words, and the silent end
    assert derive.level(1.0) == 1.0 and derive.level(0.0) == 0.0
    assert derive.level(10 ** (derive.WAVEFORM_FLOOR_DB / 20)) == pytest.approx(0.0, abs=1e-9)
