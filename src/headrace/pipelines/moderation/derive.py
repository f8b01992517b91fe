"""Derivatives a moderator looks at: for a photo a preview and a thumbnail; for a video a poster
frame and a playable low-resolution copy with its sound; for audio a waveform and a playable
AAC copy. A playable copy covers the first PLAYBACK_SECONDS (five minutes) of the original.

Everything is written as WebP (images) or MP4 (playable copies: H.264 and AAC, the index at the
front so a browser plays while it loads) with no metadata carried over: no EXIF, so no GPS
position, camera serial or capture time leaves the original. The functions
are plain CPU work over files: the pipeline runs them in a decoding child (`isolate`). Each
writes into the directory it is given (`MediaStore.derive_once`) and returns the metadata it found.

A photo's preview is made by libvips' `thumbnail` (see `probe` for why libvips): it shrinks while
it loads (a JPEG at 1/2 to 1/8 scale in libjpeg, a PNG row by row), turns the picture upright by
its EXIF orientation, then alpha is flattened on white and the preview is kept in memory once;
the thumbnail is made from the preview, not from the original again. An audio waveform's peaks
and loudness are taken as the samples stream by, in columns sized from the duration the header
declares, so no more than one decoded frame of samples is held, however long the recording. It is
drawn on a fixed decibel scale (WAVEFORM_FLOOR_DB to 0 dBFS) with a tick every few seconds:
silence is a flat line and a steady tone a steady band, wherever they are in the recording.
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

from headrace.pipelines.moderation.probe import OPEN_OPTIONS, MediaClass, Probed, decoder_refusal

PREVIEW_SIDE = 1280
THUMBNAIL_SIDE = 320
VIDEO_PREVIEW_SIDE = 360
PLAYBACK_SECONDS = 300.0  # how much of a recording its playable copy covers
VIDEO_PREVIEW_FPS = 12
PLAYBACK_AUDIO_RATE = 44_100
PLAYBACK_AUDIO_BITRATE = 96_000
AAC_FRAME = 1024  # samples per AAC frame
WAVEFORM_SIZE = (800, 160)
WAVEFORM_FLOOR_DB = -48.0  # the quietest level drawn above the middle line
WEBP_QUALITY = 80
WAVEFORM_RATE = 8000  # samples per second the waveform is taken from
WHITE = [255, 255, 255]
ORIENTATION = "orientation"  # libvips' name for the EXIF orientation tag

PREVIEW = "preview.webp"
THUMBNAIL = "thumbnail.webp"
POSTER = "poster.webp"
VIDEO_PREVIEW = "preview.mp4"  # the video's playable copy, with its sound
AUDIO_PLAYBACK = "playback.m4a"
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
    """A poster (the first frame) and a playable copy: at most VIDEO_PREVIEW_SIDE pixels a side,
    VIDEO_PREVIEW_FPS frames a second, its first sound track in AAC, PLAYBACK_SECONDS long."""
    with (
        av.open(str(original), options=OPEN_OPTIONS) as source,
        av.open(str(into / VIDEO_PREVIEW), "w", options=FASTSTART) as target,
    ):
        stream = source.streams.video[0]
        stream.thread_type = "AUTO"
        picture = _VideoTrack(target, stream)
        sound = _AacTrack(target, source.streams.audio[0]) if source.streams.audio else None
        streams = [stream] if sound is None else [stream, sound.source]
        for packet in source.demux(*streams):
            for decoded in packet.decode():
                if isinstance(decoded, av.VideoFrame):
                    picture.add(decoded)
                elif isinstance(decoded, av.AudioFrame) and sound is not None:
                    sound.add(decoded)
        picture.finish()
        if sound is not None:
            sound.finish()
    if picture.poster is None:
        raise ValueError("the video has no frame")
    _save_webp(_fit(_rgb(picture.poster), PREVIEW_SIDE), into / POSTER)
    return {
        "files": [POSTER, VIDEO_PREVIEW],
        "preview_frames": picture.frames,
        "playback_sound": sound is not None,
    }


class _VideoTrack:
    """The picture of a playable copy: `add` decoded frames as they come; the first frame is
    kept as the poster, and the first PLAYBACK_SECONDS are encoded at VIDEO_PREVIEW_FPS."""

    def __init__(self, target: av.container.OutputContainer, source: av.VideoStream) -> None:
        width, height = _even(_fitted(source.codec_context.width, source.codec_context.height))
        self.out = target.add_stream("libx264", rate=VIDEO_PREVIEW_FPS)
        self.out.width, self.out.height, self.out.pix_fmt = width, height, "yuv420p"
        self.out.options = {"preset": "veryfast", "crf": "30"}
        self.target = target
        self.poster: Image.Image | None = None
        self.frames = 0
        self._next_at = 0.0

    def add(self, frame: av.VideoFrame) -> None:
        at = _time_of(frame)
        if at > PLAYBACK_SECONDS:
            return
        if self.poster is None:
            self.poster = frame.to_image()  # type: ignore[no-untyped-call]
        if at + 1e-6 < self._next_at:
            return  # fewer frames per second than the original
        self._next_at += 1 / VIDEO_PREVIEW_FPS
        small = frame.reformat(width=self.out.width, height=self.out.height, format="yuv420p")
        small.pts = self.frames
        small.time_base = Fraction(1, VIDEO_PREVIEW_FPS)
        self._mux(small)
        self.frames += 1

    def finish(self) -> None:
        self._mux(None)

    def _mux(self, frame: av.VideoFrame | None) -> None:
        for packet in self.out.encode(frame):
            self.target.mux(packet)


FASTSTART = {"movflags": "+faststart"}  # the index first: a browser plays while it loads


def _time_of(frame: av.VideoFrame | av.AudioFrame) -> float:
    base = frame.time_base
    return float(frame.pts * base) if frame.pts is not None and base is not None else 0.0


class _AacTrack:
    """A sound track of a playable copy: `add` decoded frames of `source` as they come; the
    first PLAYBACK_SECONDS are encoded as AAC (mono or stereo, as the original) into `target`."""

    def __init__(self, target: av.container.OutputContainer, source: av.AudioStream) -> None:
        self.source = source
        channels = source.codec_context.channels or 1
        layout = "stereo" if channels >= 2 else "mono"
        self.out = target.add_stream("aac", rate=PLAYBACK_AUDIO_RATE, layout=layout)
        self.out.bit_rate = PLAYBACK_AUDIO_BITRATE
        self.target = target
        self.resampler = av.AudioResampler(
            format="fltp", layout=layout, rate=PLAYBACK_AUDIO_RATE, frame_size=AAC_FRAME
        )
        self.written = 0  # samples encoded

    def add(self, frame: av.AudioFrame | None) -> None:
        if self.written >= PLAYBACK_SECONDS * PLAYBACK_AUDIO_RATE:
            return
        for chunk in self.resampler.resample(frame):
            chunk.pts = self.written
            chunk.time_base = Fraction(1, PLAYBACK_AUDIO_RATE)
            self.written += chunk.samples
            for packet in self.out.encode(chunk):
                self.target.mux(packet)

    def finish(self) -> None:
        self.add(None)
        for packet in self.out.encode(None):
            self.target.mux(packet)


def audio_derivatives(original: Path, into: Path, *, seconds: float) -> dict[str, object]:
    """A waveform (each column's peak and loudness, columns sized from the header's `seconds`,
    taken as the samples stream by) and a playable AAC copy of the first PLAYBACK_SECONDS."""
    expected = max(1, math.ceil(seconds * WAVEFORM_RATE))
    peaks = Peaks(WAVEFORM_SIZE[0], per_column=max(1, math.ceil(expected / WAVEFORM_SIZE[0])))
    with (
        av.open(str(original), options=OPEN_OPTIONS) as source,
        av.open(str(into / AUDIO_PLAYBACK), "w", format="mp4", options=FASTSTART) as target,
    ):
        stream = source.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=WAVEFORM_RATE)
        playback = _AacTrack(target, stream)
        for frame in source.decode(stream):
            playback.add(frame)
            for mono in resampler.resample(frame):
                peaks.add(_samples(mono))
        for mono in resampler.resample(None):
            peaks.add(_samples(mono))
        playback.finish()
    decoded = peaks.count / WAVEFORM_RATE
    _save_webp(_waveform(peaks.finish(), seconds=decoded), into / WAVEFORM)
    return {"files": [WAVEFORM, AUDIO_PLAYBACK], "decoded_seconds": round(decoded, 3)}


def _samples(mono: av.AudioFrame) -> array[float]:
    samples = array("f")
    samples.frombytes(bytes(mono.planes[0])[: mono.samples * 4])
    return samples


class Peaks:
    """The loudest sample and the mean square of each run of `per_column` samples, fed a frame
    at a time. A file longer than its header said doubles the run (merging columns in pairs)
    rather than grow past twice `columns`: what it holds stays bounded."""

    def __init__(self, columns: int, *, per_column: int) -> None:
        self.columns = columns
        self.per_column = per_column
        self.peaks: list[float] = []
        self.squares: list[float] = []  # each column's mean square
        self.count = 0  # samples seen
        self._loudest = 0.0
        self._sum = 0.0
        self._filled = 0

    def add(self, samples: array[float]) -> None:
        self.count += len(samples)
        at = 0
        while at < len(samples):
            take = min(self.per_column - self._filled, len(samples) - at)
            window = samples[at : at + take]
            self._loudest = max(self._loudest, max(window), -min(window))
            self._sum += math.fsum(x * x for x in window)
            self._filled += take
            at += take
            if self._filled == self.per_column:
                self._close_column()

    def finish(self) -> list[tuple[float, float]]:
        """Each column's (peak, RMS)."""
        if self._filled:
            self._close_column()
        return [
            (peak, math.sqrt(square)) for peak, square in zip(self.peaks, self.squares, strict=True)
        ]

    def _close_column(self) -> None:
        self.peaks.append(self._loudest)
        self.squares.append(self._sum / max(1, self._filled))
        self._loudest, self._sum, self._filled = 0.0, 0.0, 0
        if len(self.peaks) >= 2 * self.columns:
            pairs = zip(self.peaks[::2], self.peaks[1::2], strict=True)
            self.peaks = [max(pair) for pair in pairs]
            halves = zip(self.squares[::2], self.squares[1::2], strict=True)
            self.squares = [(a + b) / 2 for a, b in halves]
            self.per_column *= 2


def level(amplitude: float) -> float:
    """Where `amplitude` (0 to 1) is drawn on the waveform's decibel scale: 0 at or below
    WAVEFORM_FLOOR_DB, 1 at full scale."""
    if amplitude <= 0:
        return 0.0
    decibels = 20 * math.log10(min(1.0, amplitude))
    return max(0.0, 1 - decibels / WAVEFORM_FLOOR_DB)


def _waveform(columns: list[tuple[float, float]], *, seconds: float) -> Image.Image:
    """Peaks light, loudness dark, mirrored about the middle line, on a fixed decibel scale;
    a tick below every `_tick_every(seconds)` seconds."""
    width, height = WAVEFORM_SIZE
    image = Image.new("RGB", (width, height), (250, 250, 248))
    draw = ImageDraw.Draw(image)
    middle = height / 2
    reach = middle - 6
    drawn = columns[:width]
    scale = width / max(1, len(drawn))  # a short recording's columns are drawn wider
    for n, (peak, rms) in enumerate(drawn):
        left, right = n * scale, max(n * scale, (n + 1) * scale - 1)
        for amplitude, colour in ((peak, (150, 175, 205)), (rms, (40, 70, 110))):
            half = level(amplitude) * reach
            if half >= 0.5:
                draw.rectangle([(left, middle - half), (right, middle + half)], fill=colour)
    draw.line([(0, middle), (width, middle)], fill=(200, 200, 196))
    if seconds > 0:
        every = _tick_every(seconds)
        tick = every
        while tick < seconds:
            x = tick / seconds * width
            draw.line([(x, height - 5), (x, height)], fill=(120, 120, 116))
            tick += every
    return image


def _tick_every(seconds: float) -> float:
    """Seconds between ticks: about ten along the recording, at a round step."""
    for step in (1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0):
        if seconds / step <= 12:
            return step
    return 600.0


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
