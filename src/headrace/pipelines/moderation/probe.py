"""What a file is, from its content alone, and whether it is within its class's limits.

Never the extension, never the type a client declared: Pillow identifies images by their
signature (it reads the header only, no pixel), PyAV (FFmpeg) identifies audio and video by
probing their streams. An image's size is checked from its header before a pixel is decoded, so
a decompression bomb (a small file that decodes to gigabytes) is refused unopened; then the whole
file is decoded, so a truncated or corrupt one is found here and not in a later stage. Every
refusal is a `Refused` with a safe code (`media.corrupt`, `media.too_large`,
`media.unsupported`, and from the decoding child `media.too_costly`, `media.decode_timeout`,
`media.decoder_crashed`) and a message that names no path and quotes no content. Whatever else
a decoder raises on a contributor's bytes (Pillow's `NotImplementedError` for a DDS variant it
lacks, an `IndexError` deep in a fuzzed header) is a refusal too: `decoder_failed`, applied
once where every decode runs (`isolate`), so no decoder's exception is ever a server error.

HEIF and AVIF (an ISO base media file whose `ftyp` brand is `heic`, `mif1`, `avif`, ...: see
`HEIF_BRANDS`) are images, never video, whatever FFmpeg would make of them: libvips reads them
(its heifload, through libheif). AVIF is taken. HEIC (HEVC-coded HEIF, what phones shoot) is
taken where libheif was built with an HEVC decoder; the libvips wheel headrace installs
(pyvips-binary) has none, so there it is refused by name (`media.unsupported`, "HEIC images
are not taken ..."). Image sequences (animated AVIF, HEIF bursts) are refused by name too.

Images are decoded by libvips (pyvips), not Pillow. Pillow holds every pixel of an image at once,
and each conversion (orientation, RGBA to RGB, a copy to shrink) makes another whole copy: a
7071x7071 RGBA PNG took 880 MiB to validate and derive. libvips streams: with sequential access
it decodes a PNG row by row and shrinks as the rows go by, and a JPEG is decoded at 1/2, 1/4 or
1/8 scale inside libjpeg (shrink-on-load), so the same work peaks near 100 MiB (a 24 Mpx JPEG:
450 MiB with Pillow, 50 MiB with libvips). Validation decodes a JPEG at 1/8 scale: libjpeg still
reads every entropy-coded byte, so a truncated or corrupt file is still found. Pillow stays for
identification: its header parsers name the format and size without decoding anything.

`inspect` reads headers only, and says what decoding the item will cost (`Probed.memory`, bytes,
as libvips and FFmpeg behave: see `estimate_memory`), so the cost is known before a pixel is
decoded; `probe` is `inspect` and then the full decode.
"""

from __future__ import annotations

import enum
import errno
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import av
import av.error
import pyvips
from PIL import Image, UnidentifiedImageError

from headrace.pipelines.moderation.trailing import trailing_bytes

CORRUPT = "media.corrupt"
TOO_LARGE = "media.too_large"
UNSUPPORTED = "media.unsupported"
TOO_COSTLY = "media.too_costly"  # decoding it needs more memory than a decoder may have
DECODE_TIMEOUT = "media.decode_timeout"  # decoding it ran past its time
DECODER_CRASHED = "media.decoder_crashed"  # the decoder died on it (killed by a signal)


class MediaClass(enum.Enum):
    """The cost class a media item is scheduled in."""

    IMAGE = "image"
    AUDIO = "audio"
    VIDEO = "video"


@dataclass(frozen=True)
class Limits:
    """What one class may be: bytes, pixels per image or frame, seconds."""

    max_bytes: int
    max_pixels: int = 0  # 0: no pixels (audio)
    max_side: int = 0
    max_seconds: float = 0.0  # 0: no duration (images)


DEFAULT_LIMITS = {
    MediaClass.IMAGE: Limits(max_bytes=40 << 20, max_pixels=50_000_000, max_side=12_000),
    MediaClass.AUDIO: Limits(max_bytes=100 << 20, max_seconds=30 * 60.0),
    MediaClass.VIDEO: Limits(
        max_bytes=1 << 30, max_pixels=3840 * 2160, max_side=4096, max_seconds=15 * 60.0
    ),
}

# Decoded audio or video must cover this share of the duration its header declares (less a
# little, for encoders' padding): less is a file cut short.
COMPLETE = 0.9
SLACK = 0.1
# Formats taken, by the name Pillow or FFmpeg gives them.
IMAGE_FORMATS = {"JPEG": "jpeg", "PNG": "png", "WEBP": "webp", "GIF": "gif"}
# The major brands (ISO/IEC 23008-12, AV1 Image File Format) of HEIF and AVIF files: images
# and image sequences, never video. Sequences are refused: a moderator sees one picture.
HEIF_STILL = frozenset({b"heic", b"heix", b"heim", b"heis", b"mif1", b"mif2", b"avif", b"avio"})
HEIF_SEQUENCES = frozenset({b"hevc", b"hevx", b"hevm", b"hevs", b"msf1", b"avis"})
HEIF_BRANDS = HEIF_STILL | HEIF_SEQUENCES
HEIF_CODINGS = {"av1": "avif", "hevc": "heic"}  # libvips' heif-compression -> our format name
# What libheif says when it was built without the codec an image needs.
NO_CODEC = ("not been built in", "unsupported codec")
# errno values of a failure that is the host's (its disk, its limits), not the file's.
# ENOENT: the original went from under the decode (FFmpeg opens no file but it: OPEN_OPTIONS).
HOST_ERRNOS = frozenset(
    {
        errno.ENOENT,
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
        errno.EMFILE,
        errno.ENFILE,
        errno.EACCES,
        errno.EPERM,
    }
)
CONTAINERS = {  # FFmpeg's demuxer names
    "mov,mp4,m4a,3gp,3g2,mj2": "mp4",
    "matroska,webm": "webm",
    "wav": "wav",
    "mp3": "mp3",
    "ogg": "ogg",
    "flac": "flac",
    "aac": "aac",
}
# What FFmpeg may open a contributor's file as: the demuxers of CONTAINERS and nothing else, on
# the local file alone. A playlist (HLS, concat) names other files and URLs, which FFmpeg would
# otherwise open as it probes: a file read or a request on the contributor's behalf.
OPEN_OPTIONS = {
    "format_whitelist": ",".join(name.split(",")[0] for name in CONTAINERS),
    "protocol_whitelist": "file",
}

# What the decoders hold, for `estimate_memory`. Measured with libvips 8.18 and FFmpeg 7 (the
# command is in docs/explanation.md): a fixed working set (codec tables, the WebP encoder, the
# preview held once), plus the pixels as each decoder keeps them.
DECODER_BASE = 32 << 20
STREAMED_LINES = 3072  # rows libvips' sequential pipeline keeps while it shrinks a stream
PREVIEW_TARGET = 1280  # derive's preview side: JPEG shrink-on-load stops at it
SHRINKS = (8, 4, 2)  # the scales libjpeg decodes at, besides 1
AUDIO_SECONDS_HELD = 2.0  # decoded audio in flight: FFmpeg's frames and the resampler's
FRAMES_HELD = 20  # H.264's 16 reference frames, one per decoding thread, the frame out
VIDEO_BASE = 64 << 20  # the preview's x264 encoder and its lookahead


class Refused(Exception):
    """A file the pipeline does not take: `code` is safe to show and to log."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[type[Refused], tuple[str, str]]:
        return Refused, (self.code, self.message)  # crosses from a decoding child whole


@dataclass(frozen=True)
class Probed:
    """What a file turned out to be. `memory`: the bytes decoding it is estimated to peak at;
    `trailing`: bytes past the end of an image's own data (a payload appended to it)."""

    media_class: MediaClass
    format: str  # jpeg, png, webp, gif, avif, heic, mp4, webm, wav, mp3, ogg, flac, aac
    size: int
    width: int = 0
    height: int = 0
    seconds: float = 0.0
    codecs: tuple[str, ...] = field(default=())
    memory: int = 0
    trailing: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "class": self.media_class.value,
            "format": self.format,
            "size": self.size,
            "width": self.width,
            "height": self.height,
            "seconds": round(self.seconds, 3),
            "codecs": list(self.codecs),
            "trailing": self.trailing,
        }


def probe(path: Path, limits: dict[MediaClass, Limits] | None = None) -> Probed:
    """Identify `path` from its content and check it against its class's limits; Refused when
    it is not media this pipeline takes, too large, or does not decode to its end."""
    found = inspect(path, limits)
    decode_fully(path, found)
    return found


def inspect(path: Path, limits: dict[MediaClass, Limits] | None = None) -> Probed:
    """`probe` from headers only, no pixel or sample decoded: what the file is, within its
    limits, and what decoding it will cost (`memory`). Refused as `probe` is, for what its
    headers show."""
    limits = limits or DEFAULT_LIMITS
    size = path.stat().st_size
    if size == 0:
        raise Refused(CORRUPT, "the file is empty")
    brand = heif_brand(_head(path))
    if brand is not None:
        return _inspect_heif(path, size, limits[MediaClass.IMAGE], brand)
    image = _inspect_image(path, size, limits[MediaClass.IMAGE])
    if image is not None:
        return image
    return _inspect_stream(path, size, limits)


def decode_fully(path: Path, found: Probed) -> None:
    """Decode every pixel or sample of `path` (as `inspect` found it); Refused when it does not
    decode to its end."""
    if found.media_class is MediaClass.IMAGE:
        _decode_image(path, found)
        return
    with av.open(str(path), "r", options=OPEN_OPTIONS) as container:
        decoded = _decode_all(container, found.media_class)
    what = found.media_class.value
    if decoded <= 0:
        raise Refused(CORRUPT, f"no {what} decodes from the file")
    if found.seconds > 0 and decoded < found.seconds * COMPLETE - SLACK:
        raise Refused(CORRUPT, f"the {what} ends after {decoded:.1f} of {found.seconds:.1f} s")


def _inspect_image(path: Path, size: int, limits: Limits) -> Probed | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:  # the header only
                kind = IMAGE_FORMATS.get(image.format or "")
                if kind is None:
                    raise Refused(UNSUPPORTED, f"{image.format} images are not taken")
                width, height = image.size
                _check_pixels(width, height, limits, "image")
                if size > limits.max_bytes:
                    raise Refused(TOO_LARGE, f"{size} bytes, more than {limits.max_bytes}")
                bands = len(image.getbands()) if image.mode != "P" else 4
                streamed = kind == "jpeg" or (kind == "png" and not image.info.get("interlace"))
    except UnidentifiedImageError:
        return None  # not an image Pillow knows: perhaps audio or video
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise Refused(TOO_LARGE, "the image decodes to too many pixels") from error
    except (OSError, SyntaxError, ValueError) as error:
        raise Refused(CORRUPT, "the image does not decode to its end") from error
    depth = _png_depth(path) if kind == "png" else 1
    memory = image_memory(kind, width, height, bands * depth, streamed=streamed)
    trailing = trailing_bytes(path, kind)
    return Probed(MediaClass.IMAGE, kind, size, width, height, memory=memory, trailing=trailing)


def _png_depth(path: Path) -> int:
    """Bytes per sample of a PNG (16-bit PNGs decode to two), from its header."""
    with path.open("rb") as handle:
        header = handle.read(25)
    return 2 if len(header) == 25 and header[24] == 16 else 1


def image_memory(kind: str, width: int, height: int, sample_bytes: int, *, streamed: bool) -> int:
    """Bytes libvips holds to validate and derive an image: a JPEG decoded at the smallest
    scale that still covers the preview, streamed; a non-interlaced PNG streamed a strip of
    rows at a time; everything else (interlaced PNG, GIF, WebP) decoded whole."""
    if kind == "jpeg":
        shrink = next((s for s in SHRINKS if max(width, height) // s >= PREVIEW_TARGET), 1)
        width, height = -(-width // shrink), -(-height // shrink)
    rows = min(height, STREAMED_LINES) if streamed else height
    return DECODER_BASE + width * rows * sample_bytes


def stream_memory(
    *, rate: int, channels: int, width: int = 0, height: int = 0, video: bool = False
) -> int:
    """Bytes FFmpeg holds to validate and derive audio (a couple of seconds of float samples in
    flight: the waveform is computed as they stream) or video (its reference and threads'
    frames, the poster in RGB, the preview's encoder)."""
    audio = int(rate * max(1, channels) * 4 * AUDIO_SECONDS_HELD)
    if not video:
        return DECODER_BASE + audio
    frame = width * height * 3 // 2  # YUV 4:2:0
    return DECODER_BASE + VIDEO_BASE + audio + frame * FRAMES_HELD + width * height * 3


def estimate_memory(path: Path, limits: dict[MediaClass, Limits] | None = None) -> int:
    """The peak bytes decoding `path` (to validate it and to derive from it) is estimated to
    take, from its headers only; Refused as `inspect` is."""
    return inspect(path, limits).memory


def _decode_image(path: Path, found: Probed) -> None:
    # JPEG at 1/8 scale: libjpeg still reads every coefficient, so a cut file still fails.
    options: dict[str, object] = {"shrink": 8} if found.format == "jpeg" else {}
    try:
        image = pyvips.Image.new_from_file(
            str(path), access="sequential", fail_on="truncated", **options
        )
        image.avg()  # pulls every row through the decoder, holding a strip at a time
    except pyvips.Error as error:
        raise decoder_refusal(
            error, "the image does not decode to its end", found.format
        ) from error


def decoder_refusal(error: pyvips.Error, message: str, kind: str = "") -> Refused:
    """A libvips error as a refusal: out of memory (the child's limit) is too costly; a codec
    libheif was built without (HEVC in the libvips wheel) makes `kind` a format not taken."""
    said = str(error).lower()
    if "memory" in said:
        return Refused(TOO_COSTLY, "decoding the image needs more memory than allowed")
    if any(words in said for words in NO_CODEC):
        return Refused(
            UNSUPPORTED,
            f"{kind.upper() or 'these'} images are not taken: this server's image decoder "
            "lacks their codec",
        )
    return Refused(CORRUPT, message)


def decoder_failed(error: Exception) -> Refused | None:
    """What any other exception raised while decoding a contributor's bytes is: a refusal
    (`NotImplementedError`: a variant of a format the decoder lacks, `media.unsupported`;
    anything else: `media.corrupt`), or None when the host failed (a full disk, a file limit:
    `HOST_ERRNOS`), which is no fault of the file's."""
    if isinstance(error, OSError) and error.errno in HOST_ERRNOS:
        return None
    if isinstance(error, NotImplementedError):
        return Refused(UNSUPPORTED, "the decoder does not implement this variant of its format")
    return Refused(CORRUPT, "the decoder failed on the file")


def heif_brand(head: bytes) -> bytes | None:
    """The HEIF or AVIF major brand of a file's first bytes (its `ftyp` box), or None."""
    brand = head[8:12]
    return brand if head[4:8] == b"ftyp" and brand in HEIF_BRANDS else None


def _head(path: Path) -> bytes:
    with path.open("rb") as handle:
        return handle.read(16)


def _inspect_heif(path: Path, size: int, limits: Limits, brand: bytes) -> Probed:
    """A HEIF or AVIF image from its header, as libvips reads it."""
    if brand in HEIF_SEQUENCES:
        raise Refused(UNSUPPORTED, "HEIF and AVIF image sequences are not taken: send one image")
    try:
        header = pyvips.Image.new_from_file(str(path))  # the header only
        coding = header.get("heif-compression") if "heif-compression" in header.get_fields() else ""
        width, height, bands = header.width, header.height, header.bands
        depth = 2 if header.format == "ushort" else 1
    except pyvips.Error as error:
        raise Refused(CORRUPT, "the HEIF image's header does not read") from error
    kind = HEIF_CODINGS.get(coding)
    if kind is None:
        raise Refused(UNSUPPORTED, "HEIF images of this coding are not taken")
    _check_pixels(width, height, limits, "image")
    if size > limits.max_bytes:
        raise Refused(TOO_LARGE, f"{size} bytes, more than {limits.max_bytes}")
    memory = image_memory(kind, width, height, bands * depth, streamed=False)
    return Probed(MediaClass.IMAGE, kind, size, width, height, memory=memory)


def _inspect_stream(path: Path, size: int, limits: dict[MediaClass, Limits]) -> Probed:
    try:
        container = av.open(str(path), "r", options=OPEN_OPTIONS)
    except (av.error.FFmpegError, OSError, UnicodeDecodeError) as error:
        # EINVAL: FFmpeg knew the format, and it is not one of OPEN_OPTIONS' demuxers.
        foreign = isinstance(error, av.error.ArgumentError)
        if not foreign and _looks_like_media(path):  # a signature, and nothing to read: broken
            raise Refused(CORRUPT, "the file starts as media, but does not open") from error
        raise Refused(
            UNSUPPORTED, "neither an image nor audio or video this pipeline takes"
        ) from error
    with container:
        kind = CONTAINERS.get(container.format.name)
        video = next(iter(container.streams.video), None)
        audio = next(iter(container.streams.audio), None)
        if kind is None or (video is None and audio is None):
            raise Refused(UNSUPPORTED, "neither an image nor audio or video this pipeline takes")
        media_class = MediaClass.VIDEO if video is not None else MediaClass.AUDIO
        class_limits = limits[media_class]
        if size > class_limits.max_bytes:
            raise Refused(TOO_LARGE, f"{size} bytes, more than {class_limits.max_bytes}")
        width = height = 0
        if video is not None:
            width, height = video.codec_context.width, video.codec_context.height
            _check_pixels(width, height, class_limits, "video frame")
        seconds = _seconds(container)
        if seconds > class_limits.max_seconds:
            raise Refused(
                TOO_LARGE, f"{seconds:.0f} s long, more than {class_limits.max_seconds:.0f}"
            )
        codecs = tuple(s.codec_context.name for s in (video, audio) if s is not None)
        rate = audio.codec_context.sample_rate if audio is not None else 0
        channels = audio.codec_context.channels if audio is not None else 0
    memory = stream_memory(
        rate=rate, channels=channels, width=width, height=height, video=video is not None
    )
    return Probed(media_class, kind, size, width, height, seconds, codecs, memory=memory)


def _check_pixels(width: int, height: int, limits: Limits, what: str) -> None:
    if width <= 0 or height <= 0:
        raise Refused(CORRUPT, f"the {what} has no size")
    if width * height > limits.max_pixels or max(width, height) > limits.max_side:
        raise Refused(TOO_LARGE, f"the {what} is {width}x{height}, more than allowed")


def _seconds(container: av.container.InputContainer) -> float:
    if container.duration is not None:
        return container.duration / av.time_base
    longest = 0.0
    for stream in container.streams:
        if stream.duration is not None and stream.time_base is not None:
            longest = max(longest, float(stream.duration * stream.time_base))
    return longest


def _decode_all(container: av.container.InputContainer, media_class: MediaClass) -> float:
    """Decode every frame of the class's main stream; return the seconds it covers (to the end
    of its last frame). Broken data raises Refused."""
    streams = (
        container.streams.video if media_class is MediaClass.VIDEO else container.streams.audio
    )
    stream = streams[0]
    if isinstance(stream, av.video.stream.VideoStream):
        stream.thread_type = "AUTO"
    covered = 0.0
    try:
        for packet in container.demux(stream):
            if packet.size and packet.is_corrupt:
                raise Refused(CORRUPT, f"the {media_class.value} stream is corrupt")
            for frame in packet.decode():
                if isinstance(frame, av.AudioFrame | av.VideoFrame):
                    covered = max(covered, _frame_end(frame, stream))
    except av.error.FFmpegError as error:
        raise Refused(CORRUPT, f"the {media_class.value} stream does not decode") from error
    return covered


def _frame_end(frame: av.AudioFrame | av.VideoFrame, stream: av.stream.Stream) -> float:
    """When `frame` ends, in seconds from the stream's start."""
    base = frame.time_base or stream.time_base
    start = float(frame.pts * base) if frame.pts is not None and base is not None else 0.0
    if isinstance(frame, av.AudioFrame):
        return start + frame.samples / (frame.sample_rate or 1)
    rate = stream.average_rate or stream.guessed_rate
    return start + (1 / float(rate) if rate else 0.0)


def _looks_like_media(path: Path) -> bool:
    """Whether the file starts with the signature of a format taken (content, not name)."""
    return sniff(path) is not None


def sniff(path: Path) -> MediaClass | None:
    """The class a file's first bytes announce (its format's signature), or None: where an
    upload waits for validation, read without decoding anything. `probe` has the last word: a
    file may announce one class and turn out another (an MP4 with sound only is audio)."""
    head = _head(path)
    if (
        heif_brand(head) is not None  # HEIF, AVIF: an image, though an MP4 holds it
        or head[:3] == b"\xff\xd8\xff"  # JPEG
        or head[:8] == b"\x89PNG\r\n\x1a\n"
        or head[:4] == b"GIF8"
        or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")
    ):
        return MediaClass.IMAGE
    if head[4:8] == b"ftyp":  # MP4 / MOV; the M4A brand is sound only
        return MediaClass.AUDIO if head[8:11] == b"M4A" else MediaClass.VIDEO
    if head[:4] == b"\x1aE\xdf\xa3":  # Matroska / WebM
        return MediaClass.VIDEO
    if (
        (head[:4] == b"RIFF" and head[8:12] == b"WAVE")
        or head[:3] == b"ID3"  # MP3 with tags
        or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0)  # MPEG audio frame
        or head[:4] in (b"OggS", b"fLaC")
    ):
        return MediaClass.AUDIO
    return None
