"""Derivatives a moderator looks at: for a photo a preview and a thumbnail; for a video a poster
frame, a short low-resolution preview and its metadata; for audio its duration and a waveform.

Everything is written as WebP (images) or MP4 (the video preview) with no metadata carried over:
no EXIF, so no GPS position, camera serial or capture time leaves the original. The functions
are plain CPU work over files: the pipeline runs them in a decoding child (`isolate`). Each
writes into the directory it is given (`MediaStore.derive_once`) and returns the metadata it found.

A photo's preview is made by libvips' `thumbnail` (see `probe` for why libvips): it shrinks while
it loads (a JPEG at 1/2 to 1/8 scale in libjpeg, a PNG row by row), turns the picture upright by
its EXIF orientation, then alpha is flattened on white and the preview is kept in memory once;
the thumbnail is made from the preview, not from the original again. An audio waveform's peaks
are taken as the samples stream by, in columns sized from the duration the header declares, so
no more than one decoded frame of samples is held, however long the recording.
"""

from __future__ import annotations

import json
import math
from array import array
from fractions import Fraction
from pathlib import Path

import av
import pyvips
from PIL import Image, ImageDraw

from headrace.pipelines.moderation.probe import MediaClass, Probed, decoder_refusal

PREVIEW_SIDE = 1280
THUMBNAIL_SIDE = 320
VIDEO_PREVIEW_SIDE = 360
VIDEO_PREVIEW_SECONDS = 6.0
VIDEO_PREVIEW_FPS = 12
WAVEFORM_SIZE = (800, 160)
WEBP_QUALITY = 80
WAVEFORM_RATE = 8000  # samples per second the waveform is taken from
WHITE = [255, 255, 255]
ORIENTATION = "orientation"  # libvips' name for the EXIF orientation tag

PREVIEW = "preview.webp"
THUMBNAIL = "thumbnail.webp"
POSTER = "poster.webp"
VIDEO_PREVIEW = "preview.mp4"
WAVEFORM = "waveform.webp"
METADATA = "metadata.json"


def derive(original: Path, probed: Probed, into: Path) -> dict[str, object]:
    """Write the derivatives of `original` (as `probe` found it) into `into`; return its
    metadata, also written as metadata.json."""
    if probed.media_class is MediaClass.IMAGE:
        metadata = image_derivatives(original, into)
    elif probed.media_class is MediaClass.VIDEO:
        metadata = video_derivatives(original, into)
    else:
        metadata = audio_derivatives(original, into, seconds=probed.seconds)
    metadata = {**probed.as_dict(), **metadata}
    (into / METADATA).write_text(json.dumps(metadata, sort_keys=True))
    return metadata


def image_derivatives(original: Path, into: Path) -> dict[str, object]:
    preview = _preview(original, PREVIEW_SIDE)
    _save_vips(preview, into / PREVIEW)
    _save_vips(preview.thumbnail_image(THUMBNAIL_SIDE, size="down"), into / THUMBNAIL)
    return {"files": [PREVIEW, THUMBNAIL], "upright": list(_upright_size(original))}


def _preview(original: Path, side: int) -> pyvips.Image:
    """`original` shrunk to fit `side` (never enlarged), upright, flattened on white, 8-bit
    sRGB, computed once into memory (it is a few megabytes)."""
    try:
        image = pyvips.Image.thumbnail(str(original), side, size="down", fail_on="truncated")
        if image.hasalpha():
            image = image.flatten(background=WHITE)
        if image.interpretation != "srgb" or image.format != "uchar":
            image = image.colourspace("srgb").cast("uchar")
        return image.copy_memory()
    except pyvips.Error as error:
        raise decoder_refusal(error, "the image does not decode to its end") from error


def _upright_size(original: Path) -> tuple[int, int]:
    """The image's size as it was shot (its header only: EXIF orientations 5 to 8 turn it)."""
    header = pyvips.Image.new_from_file(str(original))
    turned = ORIENTATION in header.get_fields() and header.get(ORIENTATION) in (5, 6, 7, 8)
    return (header.height, header.width) if turned else (header.width, header.height)


def _save_vips(image: pyvips.Image, path: Path) -> None:
    image.webpsave(str(path), Q=WEBP_QUALITY, keep="none")  # no EXIF, XMP or ICC: nothing


def video_derivatives(original: Path, into: Path) -> dict[str, object]:
    poster: Image.Image | None = None
    frames = 0
    with av.open(str(original)) as source, av.open(str(into / VIDEO_PREVIEW), "w") as target:
        stream = source.streams.video[0]
        stream.thread_type = "AUTO"
        width, height = _even(_fitted(stream.codec_context.width, stream.codec_context.height))
        out = target.add_stream("libx264", rate=VIDEO_PREVIEW_FPS)
        out.width, out.height, out.pix_fmt = width, height, "yuv420p"
        out.options = {"preset": "veryfast", "crf": "30"}
        next_at = 0.0
        for frame in source.decode(stream):
            base = frame.time_base
            at = float(frame.pts * base) if frame.pts is not None and base is not None else 0.0
            if at > VIDEO_PREVIEW_SECONDS:
                break
            if poster is None:
                poster = frame.to_image()  # type: ignore[no-untyped-call]
            if at + 1e-6 < next_at:
                continue  # fewer frames per second than the original
            next_at += 1 / VIDEO_PREVIEW_FPS
            small = frame.reformat(width=width, height=height, format="yuv420p")
            small.pts = frames
            small.time_base = Fraction(1, VIDEO_PREVIEW_FPS)
            for packet in out.encode(small):
                target.mux(packet)
            frames += 1
        for packet in out.encode():
            target.mux(packet)
    if poster is None:
        raise ValueError("the video has no frame")
    _save_webp(_fit(_rgb(poster), PREVIEW_SIDE), into / POSTER)
    return {"files": [POSTER, VIDEO_PREVIEW], "preview_frames": frames}


def audio_derivatives(original: Path, into: Path, *, seconds: float) -> dict[str, object]:
    """A waveform: the peak of each column's share of the samples, mirrored about the middle;
    columns sized from the header's `seconds`, peaks taken as the samples stream by."""
    expected = max(1, math.ceil(seconds * WAVEFORM_RATE))
    peaks = Peaks(WAVEFORM_SIZE[0], per_column=max(1, math.ceil(expected / WAVEFORM_SIZE[0])))
    with av.open(str(original)) as source:
        stream = source.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=WAVEFORM_RATE)
        for frame in source.decode(stream):
            for mono in resampler.resample(frame):
                peaks.add(_samples(mono))
        for mono in resampler.resample(None):
            peaks.add(_samples(mono))
    _save_webp(_waveform(peaks.finish()), into / WAVEFORM)
    return {"files": [WAVEFORM], "decoded_seconds": round(peaks.count / WAVEFORM_RATE, 3)}


def _samples(mono: av.AudioFrame) -> array[float]:
    samples = array("f")
    samples.frombytes(bytes(mono.planes[0])[: mono.samples * 4])
    return samples


class Peaks:
    """The loudest sample of each run of `per_column` samples, fed a frame at a time. A file
    longer than its header said doubles the run (merging columns in pairs) rather than grow
    past twice `columns`: what it holds stays bounded."""

    def __init__(self, columns: int, *, per_column: int) -> None:
        self.columns = columns
        self.per_column = per_column
        self.peaks: list[float] = []
        self.count = 0  # samples seen
        self._loudest = 0.0
        self._filled = 0

    def add(self, samples: array[float]) -> None:
        self.count += len(samples)
        at = 0
        while at < len(samples):
            take = min(self.per_column - self._filled, len(samples) - at)
            window = samples[at : at + take]
            self._loudest = max(self._loudest, max(window), -min(window))
            self._filled += take
            at += take
            if self._filled == self.per_column:
                self._close_column()

    def finish(self) -> list[float]:
        if self._filled:
            self._close_column()
        return self.peaks

    def _close_column(self) -> None:
        self.peaks.append(self._loudest)
        self._loudest, self._filled = 0.0, 0
        if len(self.peaks) >= 2 * self.columns:
            pairs = zip(self.peaks[::2], self.peaks[1::2], strict=True)
            self.peaks = [max(pair) for pair in pairs]
            self.per_column *= 2


def _waveform(peaks: list[float]) -> Image.Image:
    width, height = WAVEFORM_SIZE
    image = Image.new("RGB", (width, height), (250, 250, 248))
    draw = ImageDraw.Draw(image)
    middle = height / 2
    loudest = max(peaks, default=0.0) or 1.0
    for x, peak in enumerate(peaks[:width]):
        half = max(1.0, (peak / loudest) * (middle - 4))
        draw.line([(x, middle - half), (x, middle + half)], fill=(40, 70, 110))
    return image


def _rgb(image: Image.Image) -> Image.Image:
    return image if image.mode == "RGB" else image.convert("RGB")


def _fit(image: Image.Image, side: int) -> Image.Image:
    image.thumbnail((side, side), Image.Resampling.LANCZOS)  # in place: no second copy
    return image


def _fitted(width: int, height: int) -> tuple[int, int]:
    scale = min(1.0, VIDEO_PREVIEW_SIDE / max(width, height))
    return max(2, round(width * scale)), max(2, round(height * scale))


def _even(size: tuple[int, int]) -> tuple[int, int]:
    return size[0] - size[0] % 2, size[1] - size[1] % 2


def _save_webp(image: Image.Image, path: Path) -> None:
    image.save(path, "WEBP", quality=WEBP_QUALITY)  # no exif= given: none is written
