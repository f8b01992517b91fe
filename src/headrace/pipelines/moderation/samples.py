"""Sample media made on the spot, so the demo and the tests need nothing from outside: photos
(JPEG with a GPS position in its EXIF, PNG, WebP, AVIF), audio (WAV, MP3), short videos (MP4,
H.264 and AAC), and the files a moderation pipeline must refuse: a truncated JPEG, a PNG that
decompresses to 400 million pixels, a file whose name says one type and whose content is
another, a HEIC whose HEVC the bundled decoder cannot read, a texture format its decoder does
not implement, and the EICAR test file antivirus scanners detect by agreement.
"""

from __future__ import annotations

import io
import math
import struct
import wave
import zlib
from array import array
from fractions import Fraction
from pathlib import Path

import av
import pyvips
from PIL import Image

# The EICAR anti-malware test file: harmless, and detected as a virus by every scanner. Kept in
# two halves so this source file is not itself reported.
EICAR = b"X5O!P%@AP[4\\PZX54(P^)7CC)7}$" + b"EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*"
# EXIF tag numbers: the GPS directory, latitude reference and latitude.
GPS_IFD = 0x8825
GPS_LATITUDE_REF = 1
GPS_LATITUDE = 2
LOOKS = 16  # distinct pictures a sample video cycles through


def photo(width: int = 640, height: int = 480, *, shade: int = 0) -> Image.Image:
    """A gradient with a few bands: something a preview visibly shrinks."""
    image = Image.new("RGB", (width, height))
    pixels = [
        ((x * 255) // max(1, width - 1), (y * 255) // max(1, height - 1), (shade + x + y) % 256)
        for y in range(0, height, max(1, height // 64))
        for x in range(0, width, max(1, width // 64))
    ]
    small = Image.new("RGB", (len(range(0, width, max(1, width // 64))), len(pixels) // 64 or 1))
    small.putdata(pixels[: small.width * small.height])
    image.paste(small.resize((width, height)))
    return image


def jpeg(width: int = 640, height: int = 480, *, gps: bool = True, shade: int = 0) -> bytes:
    """A JPEG photo; with `gps`, its EXIF says where it was taken (as phones write it)."""
    image = photo(width, height, shade=shade)
    exif = Image.Exif()
    exif[0x010F] = "headrace samples"  # Make
    if gps:
        exif.get_ifd(GPS_IFD).update(
            {GPS_LATITUDE_REF: "N", GPS_LATITUDE: (48.0, 51.0, 24.0), 3: "E", 4: (2.0, 21.0, 7.0)}
        )
    out = io.BytesIO()
    image.save(out, "JPEG", quality=85, exif=exif)
    return out.getvalue()


def png(width: int = 320, height: int = 240) -> bytes:
    out = io.BytesIO()
    photo(width, height, shade=60).save(out, "PNG")
    return out.getvalue()


def webp(width: int = 320, height: int = 240) -> bytes:
    out = io.BytesIO()
    photo(width, height, shade=120).save(out, "WEBP", quality=80)
    return out.getvalue()


def avif(width: int = 320, height: int = 240) -> bytes:
    """An AVIF photo (AV1 in HEIF), as recent phones and browsers write them."""
    pixels = photo(width, height, shade=30).tobytes()
    image = pyvips.Image.new_from_memory(pixels, width, height, 3, "uchar")
    data: bytes = image.heifsave_buffer(compression="av1", Q=60)
    return data


def heic(width: int = 4032, height: int = 3024) -> bytes:
    """A HEIC (HEVC in HEIF, what phones shoot) as its header describes it: one HEVC-coded
    image of `width` x `height`, whose coded bytes are no picture. Its header reads as a real
    one's does; a decoder without HEVC (libvips' wheel) says so on decoding, as for a real one."""
    data = b"\x00" * 64
    ftyp = _box(b"ftyp", b"heic" + struct.pack(">I", 0) + b"mif1heic")
    offset = len(ftyp) + len(_heic_meta(width, height, 0, len(data))) + 8  # past mdat's header
    return ftyp + _heic_meta(width, height, offset, len(data)) + _box(b"mdat", data)


def _heic_meta(width: int, height: int, offset: int, length: int) -> bytes:
    """A `meta` box naming one primary `hvc1` item at `offset` (ISO/IEC 23008-12)."""
    handler = _full_box(b"hdlr", 0, b"\0" * 4 + b"pict" + b"\0" * 13)
    primary = _full_box(b"pitm", 0, struct.pack(">H", 1))
    location = _full_box(
        b"iloc", 0, b"\x44\x00" + struct.pack(">HHHHII", 1, 1, 0, 1, offset, length)
    )
    entry = _full_box(b"infe", 2, struct.pack(">HH", 1, 0) + b"hvc1\0")
    items = _full_box(b"iinf", 0, struct.pack(">H", 1) + entry)
    decoder = _box(b"hvcC", b"\x01" + b"\0" * 20 + b"\x03\x00")  # no parameter sets
    extent = _full_box(b"ispe", 0, struct.pack(">II", width, height))
    associations = _full_box(b"ipma", 0, struct.pack(">IHB", 1, 1, 2) + b"\x81\x02")
    properties = _box(b"iprp", _box(b"ipco", decoder + extent) + associations)
    return _full_box(b"meta", 0, handler + primary + location + items + properties)


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I4s", 8 + len(payload), kind) + payload


def _full_box(kind: bytes, version: int, payload: bytes) -> bytes:
    return _box(kind, struct.pack(">I", version << 24) + payload)


def wav(seconds: float = 1.0, *, rate: int = 16_000, pitch: float = 440.0) -> bytes:
    """A sine tone, 16-bit mono."""
    frames = int(seconds * rate)
    samples = b"".join(
        struct.pack("<h", int(12_000 * math.sin(2 * math.pi * pitch * i / rate)))
        for i in range(frames)
    )
    out = io.BytesIO()
    with wave.open(out, "wb") as sound:
        sound.setnchannels(1)
        sound.setsampwidth(2)
        sound.setframerate(rate)
        sound.writeframes(samples)
    return out.getvalue()


def voice_note(seconds: float = 2.0, *, rate: int = 16_000) -> bytes:
    """Something like a voice note, 16-bit mono: bursts of tone of changing loudness (a word
    every half second, a quarter of a second long), silence between them and in the last
    quarter."""
    frames = int(seconds * rate)
    samples = []
    for i in range(frames):
        at = i / rate
        word = int(at / 0.5)
        speaking = at % 0.5 < 0.25 and at < seconds * 0.75
        loudness = (4_000, 16_000, 9_000)[word % 3] if speaking else 0
        samples.append(struct.pack("<h", int(loudness * math.sin(2 * math.pi * 220 * at))))
    out = io.BytesIO()
    with wave.open(out, "wb") as sound:
        sound.setnchannels(1)
        sound.setsampwidth(2)
        sound.setframerate(rate)
        sound.writeframes(b"".join(samples))
    return out.getvalue()


def mp3(seconds: float = 1.0, *, rate: int = 44_100) -> bytes:
    return _audio("mp3", "libmp3lame", seconds, rate)


def mp4(seconds: float = 1.0, width: int = 320, height: int = 240, *, fps: int = 12) -> bytes:
    """A short H.264 video with an AAC sound track, in an MP4 container."""
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.options = {"preset": "ultrafast"}
        audio = container.add_stream("aac", rate=22_050)
        frames = max(1, int(seconds * fps))
        looks = [photo(width, height, shade=n * 8) for n in range(min(frames, LOOKS))]
        for n in range(frames):
            frame = av.VideoFrame.from_image(looks[n % len(looks)])  # type: ignore[no-untyped-call]
            frame.pts = n
            for packet in video.encode(frame):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
        _write_tone(container, audio, seconds, 22_050)
    return out.getvalue()


def truncated_jpeg() -> bytes:
    """A JPEG cut off halfway, as an interrupted upload leaves it."""
    whole = jpeg(gps=False)
    return whole[: len(whole) // 2]


def png_bomb(side: int = 20_000) -> bytes:
    """A valid PNG of side x side black pixels (400 million by default): a few hundred
    kilobytes that would take gigabytes to decode. Written row by row, never held whole."""
    compressor = zlib.compressobj(1)
    row = b"\x00" * (side + 1)  # filter byte, then one byte per grey pixel
    chunks = [compressor.compress(row) for _ in range(side)]
    data = b"".join(chunks) + compressor.flush()
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", data)
        + _chunk(b"IEND", b"")
    )


def eicar() -> bytes:
    return EICAR


def unimplemented_dds() -> bytes:
    """A DirectDraw Surface header (a game texture, 4x4) whose pixel format's FourCC no decoder
    knows: Pillow identifies it as DDS and raises NotImplementedError on opening it."""
    header = struct.pack("<4sIIIIIII44s", b"DDS ", 124, 0x1007, 4, 4, 0, 0, 0, bytes(44))
    pixel_format = struct.pack("<II4sIIIII", 32, 0x4, b"ZZZZ", 0, 0, 0, 0, 0)  # DDPF_FOURCC
    return header + pixel_format + struct.pack("<IIIII", 0x1000, 0, 0, 0, 0)


def write_all(directory: Path) -> dict[str, Path]:
    """Every sample, written into `directory` under a name that says what it is (the one whose
    extension lies is named so)."""
    directory.mkdir(parents=True, exist_ok=True)
    samples = {
        "photo.jpg": jpeg(),
        "graphic.png": png(),
        "sticker.webp": webp(),
        "voice.wav": wav(),
        "song.mp3": mp3(),
        "clip.mp4": mp4(),
        "truncated.jpg": truncated_jpeg(),
        "bomb.png": png_bomb(),
        "lying-extension.jpg": wav(0.5),
        "eicar.txt": eicar(),
    }
    written = {}
    for name, data in samples.items():
        path = directory / name
        path.write_bytes(data)
        written[name] = path
    return written


def _audio(container_format: str, codec: str, seconds: float, rate: int) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate)
        assert isinstance(stream, av.audio.stream.AudioStream)
        _write_tone(container, stream, seconds, rate)
    return out.getvalue()


def _write_tone(
    container: av.container.OutputContainer,
    stream: av.audio.stream.AudioStream,
    seconds: float,
    rate: int,
) -> None:
    """A 330 Hz tone, mono, as planar floats (what the AAC and MP3 encoders take)."""
    size = stream.codec_context.frame_size or 1024
    total = int(seconds * rate)
    pts = 0
    while pts < total:
        n = min(size, total - pts)
        tone = array(
            "f", (0.3 * math.sin(2 * math.pi * 330.0 * i / rate) for i in range(pts, pts + n))
        )
        frame = av.AudioFrame(format="fltp", layout="mono", samples=n)
        frame.planes[0].update(tone.tobytes())
        frame.sample_rate = rate
        frame.pts = pts
        frame.time_base = Fraction(1, rate)
        for packet in stream.encode(frame):
            container.mux(packet)
        pts += n
    for packet in stream.encode():
        container.mux(packet)


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def rgba_png(width: int, height: int) -> bytes:
    """A PNG with an alpha channel, written row by row (never held whole): a large one is a
    few hundred kilobytes that decode to width x height x 4 bytes."""
    compressor = zlib.compressobj(6)
    ramp = bytes((x * 255) // max(1, width - 1) for x in range(width))
    chunks = []
    for y in range(height):
        row = bytearray(1 + width * 4)  # filter byte 0, then RGBA
        row[1::4], row[3::4] = ramp, ramp[::-1]
        row[2::4] = bytes([(y * 255) // max(1, height - 1)]) * width
        row[4::4] = bytes([(y // 50) * 37 % 256]) * width
        chunks.append(compressor.compress(bytes(row)))
    data = b"".join(chunks) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", data)
        + _chunk(b"IEND", b"")
    )


def polyglot(image: bytes, payload: bytes = b"") -> bytes:
    """An image with something else appended (an HTML page by default): a file that an image
    decoder takes whole and a browser or an unzip tool reads as the payload."""
    return image + (payload or b"<!doctype html><script>alert(document.cookie)</script>\n")
