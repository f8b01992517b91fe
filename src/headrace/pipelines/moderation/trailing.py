"""Where an image's own data ends, from its structure, so bytes appended past it (an HTML page,
a ZIP: a polyglot that a browser or an unzip tool reads as something else) are found.

Each walker follows its format's framing without decoding pixels: JPEG markers and the
entropy-coded data up to EOI, PNG chunks up to IEND, the GIF block stream up to its trailer,
WebP's RIFF length. A file that does not frame as its format says is left to the decoder to
refuse; here it counts as having no trailing data.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

TRAILING_DATA = "media.trailing_data"
# Encoders pad with a few zero or newline bytes; those are not a payload.
_PADDING = b"\x00\r\n \t"


def trailing_bytes(path: Path, image_format: str) -> int:
    """How many bytes of `path` lie past the end of its image (`image_format` as `probe`
    names it), not counting padding; 0 for formats without a walker."""
    walker = _WALKERS.get(image_format)
    if walker is None:
        return 0
    data = path.read_bytes()
    end = walker(data)
    if end is None or end >= len(data):
        return 0
    return len(data[end:].rstrip(_PADDING))


def _jpeg_end(data: bytes) -> int | None:
    at = 2  # past SOI
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xD9:  # EOI
            return at + 2
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # no length
            at += 2
            continue
        (length,) = struct.unpack_from(">H", data, at + 2)
        at += 2 + length
        if marker == 0xDA:  # SOS: entropy-coded data runs to the next real marker
            at = _entropy_end(data, at)
    return None


def _entropy_end(data: bytes, at: int) -> int:
    while True:
        at = data.find(b"\xff", at)
        if at < 0 or at + 1 >= len(data):
            return len(data)
        following = data[at + 1]
        if following == 0x00 or 0xD0 <= following <= 0xD7 or following == 0xFF:
            at += 1  # stuffed byte, restart marker or fill: still entropy-coded data
            continue
        return at


def _png_end(data: bytes) -> int | None:
    at = 8
    while at + 12 <= len(data):
        length: int = struct.unpack_from(">I", data, at)[0]
        kind = data[at + 4 : at + 8]
        at += 12 + length
        if kind == b"IEND":
            return at
    return None


def _gif_end(data: bytes) -> int | None:
    if len(data) < 13:
        return None
    at = 13 + _table_size(data[10])
    while at < len(data):
        block = data[at]
        if block == 0x3B:  # trailer
            return at + 1
        if block == 0x21:  # extension: label, then sub-blocks
            at = _skip_sub_blocks(data, at + 2)
        elif block == 0x2C:  # image: descriptor, local table, LZW size, sub-blocks
            if at + 10 > len(data):
                return None
            at = _skip_sub_blocks(data, at + 10 + _table_size(data[at + 9]) + 1)
        else:
            return None
    return None


def _table_size(flags: int) -> int:
    return 3 * (2 ** ((flags & 0x07) + 1)) if flags & 0x80 else 0


def _skip_sub_blocks(data: bytes, at: int) -> int:
    while at < len(data) and data[at] != 0:
        at += data[at] + 1
    return at + 1


def _webp_end(data: bytes) -> int | None:
    if len(data) < 12:
        return None
    length: int = struct.unpack_from("<I", data, 4)[0]
    return 8 + length + (length & 1)  # RIFF pads odd sizes to even


_WALKERS: dict[str, Callable[[bytes], int | None]] = {
    "jpeg": _jpeg_end,
    "png": _png_end,
    "gif": _gif_end,
    "webp": _webp_end,
}
