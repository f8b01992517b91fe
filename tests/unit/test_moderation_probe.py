"""What a file is, from its content: real files of every kind taken, and the ones refused with
their safe codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.derive import PREVIEW, THUMBNAIL, derive
from headrace.pipelines.moderation.probe import (
    CORRUPT,
    DEFAULT_LIMITS,
    TOO_LARGE,
    UNSUPPORTED,
    Limits,
    MediaClass,
    Refused,
    inspect,
    probe,
    sniff,
)


@pytest.mark.parametrize(
    ("name", "media_class", "kind"),
    [
        ("photo.jpg", MediaClass.IMAGE, "jpeg"),
        ("graphic.png", MediaClass.IMAGE, "png"),
        ("sticker.webp", MediaClass.IMAGE, "webp"),
        ("voice.wav", MediaClass.AUDIO, "wav"),
        ("song.mp3", MediaClass.AUDIO, "mp3"),
        ("clip.mp4", MediaClass.VIDEO, "mp4"),
    ],
)
def test_media_is_known_by_its_content(
    media_samples: dict[str, Path], name: str, media_class: MediaClass, kind: str
) -> None:
    found = probe(media_samples[name])
    assert (found.media_class, found.format) == (media_class, kind)
    assert found.size == media_samples[name].stat().st_size


def test_dimensions_duration_and_codecs_are_read(media_samples: dict[str, Path]) -> None:
    photo = probe(media_samples["photo.jpg"])
    assert (photo.width, photo.height) == (640, 480)
    clip = probe(media_samples["clip.mp4"])
    assert (clip.width, clip.height) == (320, 240)
    assert clip.seconds == pytest.approx(1.0, abs=0.1)
    assert clip.codecs == ("h264", "aac")
    assert probe(media_samples["voice.wav"]).seconds == pytest.approx(1.0, abs=0.01)


def test_a_name_that_lies_changes_nothing(media_samples: dict[str, Path]) -> None:
    found = probe(media_samples["lying-extension.jpg"])  # a WAV named .jpg
    assert (found.media_class, found.format) == (MediaClass.AUDIO, "wav")


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("truncated.jpg", CORRUPT),
        ("bomb.png", TOO_LARGE),
        ("eicar.txt", UNSUPPORTED),
    ],
)
def test_refused_samples_carry_a_safe_code(
    media_samples: dict[str, Path], name: str, code: str
) -> None:
    with pytest.raises(Refused) as refused:
        probe(media_samples[name])
    assert refused.value.code == code
    assert str(media_samples[name]) not in str(refused.value)  # no path in the message


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (samples.mp4()[:20_000], CORRUPT),  # its index (moov) never arrived
        (samples.mp3()[:3_000], CORRUPT),  # ends after a fifth of its declared length
        (samples.wav()[:8_000], CORRUPT),
        (b"", CORRUPT),
        (b"just some text\n" * 50, UNSUPPORTED),
        (b"GIF87a" + b"\x00" * 5, CORRUPT),
    ],
)
def test_cut_or_foreign_files_are_refused(tmp_path: Path, data: bytes, code: str) -> None:
    path = tmp_path / "upload"
    path.write_bytes(data)
    with pytest.raises(Refused) as refused:
        probe(path)
    assert refused.value.code == code


def test_each_class_has_its_own_limits(tmp_path: Path, media_samples: dict[str, Path]) -> None:
    tight = dict(DEFAULT_LIMITS)
    tight[MediaClass.IMAGE] = Limits(max_bytes=1 << 20, max_pixels=100_000, max_side=1000)
    tight[MediaClass.VIDEO] = Limits(
        max_bytes=1 << 20, max_pixels=10**7, max_side=4096, max_seconds=0.5
    )
    tight[MediaClass.AUDIO] = Limits(max_bytes=1000)
    for name in ("photo.jpg", "clip.mp4", "voice.wav"):
        with pytest.raises(Refused) as refused:
            probe(media_samples[name], tight)
        assert refused.value.code == TOO_LARGE
    assert probe(media_samples["graphic.png"], tight).width == 320  # 76,800 pixels: taken


def test_heif_and_avif_are_images_never_video(tmp_path: Path) -> None:
    """Both are ISO base media files, as an MP4 is: their brand says image, so they wait and
    are decoded as images (FFmpeg once made a "video / mp4" item of a HEIF photo)."""
    avif, heic = tmp_path / "photo.avif", tmp_path / "photo.heic"
    avif.write_bytes(samples.avif(320, 240))
    heic.write_bytes(samples.heic(4032, 3024))
    assert sniff(avif) is sniff(heic) is MediaClass.IMAGE
    found = probe(avif)  # taken: libvips reads AV1
    assert (found.media_class, found.format, found.width, found.height) == (
        MediaClass.IMAGE,
        "avif",
        320,
        240,
    )
    made = derive(avif, found, tmp_path)
    assert made["files"] == [PREVIEW, THUMBNAIL] and (tmp_path / PREVIEW).stat().st_size > 0
    header = inspect(heic)
    assert (header.media_class, header.format, header.width) == (MediaClass.IMAGE, "heic", 4032)
    with pytest.raises(Refused) as refused:  # this build's libheif has no HEVC: named
        probe(heic)
    assert refused.value.code == UNSUPPORTED
    assert refused.value.message.startswith("HEIC images are not taken")


def test_heif_and_avif_image_sequences_are_refused_by_name(tmp_path: Path) -> None:
    sequence = tmp_path / "animated.avifs"
    sequence.write_bytes(samples.avif().replace(b"ftypavif", b"ftypavis", 1))
    assert sniff(sequence) is MediaClass.IMAGE
    with pytest.raises(Refused) as refused:
        probe(sequence)
    assert (refused.value.code, "image sequences" in refused.value.message) == (UNSUPPORTED, True)
