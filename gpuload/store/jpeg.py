"""The JPEG store: which sources are kept as they are, and how the others are re-encoded.

Every stored image must decode upright, fast, with libjpeg-turbo's DCT-domain scaling: a baseline
JPEG in RGB (YCbCr) or grayscale with no EXIF rotation is stored byte for byte (after a strict
decode that finds damage, as for raw builds). Anything else, a progressive JPEG (2-3x slower to
decode, and it cannot skip rows), an EXIF-rotated one, a CMYK or 12-bit one, one whose sampling
libjpeg-turbo cannot read, a PNG, or an image larger than ``max_side``, is decoded upright (by
Pillow where libjpeg-turbo cannot) and re-encoded at ``quality``.
Pillow does not report corrupt data inside a JPEG, so damage in one that only Pillow reads goes
unnoticed (as in a raw build).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import simplejpeg
import xxhash

from ..errors import DecodeError
from .decode import (
    JPEG_COLORSPACES,
    SIDEWAYS,
    decode_image,
    decode_jpeg_strict,
    exif_orientation,
    open_image,
    read_bytes,
)

__all__ = ["REENCODE_REASONS", "StoredJpeg", "first_rows", "frame_size", "store_jpeg"]

REENCODE_REASONS = (
    "not_jpeg",
    "progressive",
    "exif_rotated",
    "not_rgb_or_gray",
    "larger_than_max_side",
    "not_read_by_libjpeg_turbo",
)


class StoredJpeg:
    """The bytes to store for one source, their checksum, the image's ``(height, width)``, and why
    it was re-encoded (``None``: stored as it was).

    A small buffer of Python's own ``bytes``; the writer appends it to the data file.
    """

    __slots__ = ("data", "checksum", "shape", "reencoded")

    def __init__(self, data: bytes, shape: tuple[int, int], reencoded: str | None) -> None:
        self.data, self.shape, self.reencoded = data, shape, reencoded
        self.checksum = xxhash.xxh3_64_intdigest(data)


def store_jpeg(path: str | os.PathLike, *, max_side: int | None = None, quality: int = 90) -> StoredJpeg:
    """What the JPEG store keeps for ``path``.

    Raises:
        DecodeError: the file is damaged or not an image (what a raw build would skip).

    Example:
        >>> import matplotlib.cbook
        >>> stored = store_jpeg(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False), max_side=300)
        >>> stored.shape, stored.reencoded
        ((300, 256), 'larger_than_max_side')
    """
    data = read_bytes(path)
    with open_image(data, path) as image:
        orientation = exif_orientation(image)
        height, width = image.height, image.width
        if orientation in SIDEWAYS:
            height, width = width, height
        reason = _reencode_reason(image, orientation, (height, width), max_side)
        if reason is None:
            # A strict decode: damage is found here, as in a raw build. A JPEG that libjpeg-turbo
            # cannot read at all (a sampling it does not know) is left to Pillow and re-encoded.
            if decode_jpeg_strict(data, path, JPEG_COLORSPACES[image.mode]) is not None:
                return StoredJpeg(data, (height, width), None)
            reason = "not_read_by_libjpeg_turbo"
    if max_side is not None and max(height, width) > max_side:
        scale = max_side / max(height, width)
        height, width = max(1, round(height * scale)), max(1, round(width * scale))
    if max(height, width) > JPEG_MAX_SIDE:
        raise DecodeError(
            path,
            f"{width}x{height} is larger than a JPEG can be ({JPEG_MAX_SIDE:,} px per side): "
            f"build with --max-side {JPEG_MAX_SIDE} or less, or with --format raw",
        )
    pixels = decode_image(path, (height, width), "stretch", data=data).permute(1, 2, 0).numpy()  # one read
    encoded = simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=quality, colorsubsampling="420")
    return StoredJpeg(encoded, (height, width), reason)


JPEG_MAX_SIDE = 65_500  # libjpeg-turbo's largest width or height


def _reencode_reason(image, orientation: int, shape: tuple[int, int], max_side: int | None) -> str | None:
    if image.format != "JPEG":
        return "not_jpeg"
    if image.info.get("progressive") or image.info.get("progression"):
        return "progressive"
    if orientation != 1:
        return "exif_rotated"
    if image.mode not in JPEG_COLORSPACES:
        return "not_rgb_or_gray"
    if max_side is not None and max(shape) > max_side:
        return "larger_than_max_side"
    return None


_SEQUENTIAL = {0xC0, 0xC1}  # baseline and extended sequential Huffman frames
_FRAMES = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # every start of frame (not DHT, JPG, DAC)
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # markers with no length field
_SOS = 0xDA  # start of scan


def frame_size(data: bytes) -> tuple[int, int] | None:
    """The ``(height, width)`` a JPEG's frame header gives (height 0: set later by a DNL marker),
    or ``None`` where it has none (not a JPEG, a cut header).

    Example:
        >>> import matplotlib.cbook
        >>> frame_size(open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False), "rb").read())
        (600, 512)
    """
    for position, marker in _markers(data):
        if marker in _FRAMES:
            if position + 9 > len(data):
                return None
            return int.from_bytes(data[position + 5 : position + 7], "big"), int.from_bytes(
                data[position + 7 : position + 9], "big"
            )
    return None


def first_rows(data: bytes, rows: int) -> tuple[bytes, int] | None:
    """A copy of a JPEG whose frame declares only its first rows, so that libjpeg-turbo stops
    decoding below them; returns the copy and the rows it declares, or ``None`` where that would
    save nothing or does not apply.

    A sequential JPEG whose first scan holds every component has one scan, which stores the rows
    top to bottom: a decoder told the image is shorter decodes only those rows (entropy decoding
    included) and skips the rest of the data (which libjpeg reports as extraneous bytes: decode the
    copy with ``strict=False``). The copy declares one MCU row more than ``rows``, so that
    upsampling the chroma of the last row wanted sees the same neighbours as in the whole image:
    the first ``rows`` rows decode to the same pixels, at any DCT scale. Progressive and
    multi-scan files are left whole (``None``).

    Example:
        >>> import matplotlib.cbook
        >>> data = open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False), "rb").read()
        >>> copy, declared = first_rows(data, 100)
        >>> declared, simplejpeg.decode_jpeg(copy, strict=False).shape
        (128, (128, 512, 3))
    """
    frame = None
    for position, marker in _markers(data):
        if marker in _FRAMES:
            if marker not in _SEQUENTIAL:
                return None  # a progressive, lossless or arithmetic-coded frame
            frame = position
        elif marker == _SOS:  # the first scan: it must hold every component of a sequential frame
            if frame is None or data[position + 4 : position + 5] != data[frame + 9 : frame + 10]:
                return None
            return _declare_rows(data, frame, rows)
    return None


def _markers(data: bytes) -> Iterator[tuple[int, int]]:
    """``(position, marker)`` of each marker segment from the start of a JPEG to its first scan;
    stops early where the data is not a JPEG or its headers are cut."""
    if data[:2] != b"\xff\xd8":
        return
    position = 2
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            return
        marker = data[position + 1]
        if marker == 0xFF:  # a fill byte before a marker
            position += 1
            continue
        if marker in _STANDALONE:
            position += 2
            continue
        yield position, marker
        if marker == _SOS:
            return
        position += 2 + int.from_bytes(data[position + 2 : position + 4], "big")


def _declare_rows(data: bytes, frame: int, rows: int) -> tuple[bytes, int] | None:
    """``data`` with the height of the frame header at ``frame`` cut to ``rows`` plus one MCU row."""
    height = int.from_bytes(data[frame + 5 : frame + 7], "big")
    components = data[frame + 9] if frame + 9 < len(data) else 0
    sampling = data[frame + 11 : frame + 10 + 3 * components : 3]
    if height == 0 or components == 0 or len(sampling) != components:
        return None  # a height defined after the scan (DNL), or a cut header
    mcu = 8 * max(factor & 0x0F for factor in sampling)
    declared = (-(-rows // mcu) + 1) * mcu
    if rows < 1 or declared >= height:
        return None
    return data[: frame + 5] + declared.to_bytes(2, "big") + data[frame + 7 :], declared
