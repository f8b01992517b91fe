"""Derivatives a moderator looks at: for a photo a preview and a thumbnail; for a video a poster
frame, a short low-resolution preview and its metadata; for audio its duration and a waveform.

Everything is written as WebP (images) or MP4 (the video preview) with no metadata carried over:
no EXIF, so no GPS position, camera serial or capture time leaves the original. The functions
are plain CPU work over files: the pipeline runs them off the event loop. Each writes into the
directory it is given (`MediaStore.deriving`) and returns the metadata it found.
"""

from __future__ import annotations

import json
import math
from array import array
from fractions import Fraction
from pathlib import Path

import av
from PIL import Image, ImageDraw, ImageOps

from headrace.pipelines.moderation.probe import MediaClass, Probed

PREVIEW_SIDE = 1280
THUMBNAIL_SIDE = 320
VIDEO_PREVIEW_SIDE = 360
VIDEO_PREVIEW_SECONDS = 6.0
VIDEO_PREVIEW_FPS = 12
WAVEFORM_SIZE = (800, 160)
WEBP_QUALITY = 80

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
        metadata = audio_derivatives(original, into)
    metadata = {**probed.as_dict(), **metadata}
    (into / METADATA).write_text(json.dumps(metadata, sort_keys=True))
    return metadata


def image_derivatives(original: Path, into: Path) -> dict[str, object]:
    with Image.open(original) as image:
        upright = ImageOps.exif_transpose(image)  # as it was shot, then no EXIF at all
        rgb = _rgb(upright)
    _save_webp(_fit(rgb, PREVIEW_SIDE), into / PREVIEW)
    _save_webp(_fit(rgb, THUMBNAIL_SIDE), into / THUMBNAIL)
    return {"files": [PREVIEW, THUMBNAIL], "upright": list(rgb.size)}


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


def audio_derivatives(original: Path, into: Path) -> dict[str, object]:
    """A waveform: the peak of each column's share of the samples, mirrored about the middle."""
    columns = WAVEFORM_SIZE[0]
    peaks: list[float] = []
    seconds = 0.0
    with av.open(str(original)) as source:
        stream = source.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=8000)
        samples = array("f")
        for frame in source.decode(stream):
            for mono in resampler.resample(frame):
                samples.frombytes(bytes(mono.planes[0])[: mono.samples * 4])
        for mono in resampler.resample(None):
            samples.frombytes(bytes(mono.planes[0])[: mono.samples * 4])
        seconds = len(samples) / 8000
    per_column = max(1, math.ceil(len(samples) / columns))
    for start in range(0, len(samples), per_column):
        window = samples[start : start + per_column]
        peaks.append(max((abs(v) for v in window), default=0.0))
    _save_webp(_waveform(peaks), into / WAVEFORM)
    return {"files": [WAVEFORM], "decoded_seconds": round(seconds, 3)}


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
    if image.mode in ("RGBA", "LA", "P"):
        background = Image.new("RGB", image.size, (255, 255, 255))
        rgba = image.convert("RGBA")
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")


def _fit(image: Image.Image, side: int) -> Image.Image:
    fitted = image.copy()
    fitted.thumbnail((side, side), Image.Resampling.LANCZOS)
    return fitted


def _fitted(width: int, height: int) -> tuple[int, int]:
    scale = min(1.0, VIDEO_PREVIEW_SIDE / max(width, height))
    return max(2, round(width * scale)), max(2, round(height * scale))


def _even(size: tuple[int, int]) -> tuple[int, int]:
    return size[0] - size[0] % 2, size[1] - size[1] % 2


def _save_webp(image: Image.Image, path: Path) -> None:
    image.save(path, "WEBP", quality=WEBP_QUALITY)  # no exif= given: none is written
