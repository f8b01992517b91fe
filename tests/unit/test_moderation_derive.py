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


def test_a_video_gets_a_poster_a_short_low_resolution_preview_and_metadata(tmp_path: Path) -> None:
    original = tmp_path / "long.mp4"
    original.write_bytes(samples.mp4(seconds=8.0, width=640, height=480))
    metadata = made(original, tmp_path / "out")
    with Image.open(tmp_path / "out" / derive.POSTER) as poster:
        assert poster.size == (640, 480) and not poster.getexif()
    preview = probe(tmp_path / "out" / derive.VIDEO_PREVIEW)
    assert max(preview.width, preview.height) == derive.VIDEO_PREVIEW_SIDE
    assert preview.seconds == pytest.approx(derive.VIDEO_PREVIEW_SECONDS, abs=0.5)
    assert metadata["codecs"] == ["h264", "aac"]
    assert metadata["seconds"] == pytest.approx(8.0, abs=0.2)


@pytest.mark.parametrize("name", ["voice.wav", "song.mp3"])
def test_audio_gets_its_duration_and_a_waveform(
    media_samples: dict[str, Path], tmp_path: Path, name: str
) -> None:
    metadata = made(media_samples[name], tmp_path / "out")
    assert metadata["decoded_seconds"] == pytest.approx(1.0, abs=0.1)
    with Image.open(tmp_path / "out" / derive.WAVEFORM) as image:
        assert image.size == derive.WAVEFORM_SIZE
        middle = image.getpixel((derive.WAVEFORM_SIZE[0] // 2, derive.WAVEFORM_SIZE[1] // 2))
        assert middle != (250, 250, 248)  # the tone drew a line through the middle
