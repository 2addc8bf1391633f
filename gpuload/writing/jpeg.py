"""The JPEG store: which sources are kept as they are, and how the others are re-encoded.

Every stored image must decode upright, fast, with libjpeg-turbo's DCT-domain scaling: a baseline
JPEG in RGB (YCbCr) or grayscale with no EXIF rotation is stored byte for byte (after a strict
decode that finds damage, as for raw builds), and so is the first picture of a multi-picture JPEG
(MPO: a stereo pair, an Ultra HDR photo and its gain map) that is one. Anything else, a
progressive JPEG (2-3x slower to decode, and it cannot skip rows), an arithmetic-coded one (no row
skipping either), an EXIF-rotated one, a CMYK or 12-bit one, one whose sampling libjpeg-turbo cannot read, a PNG, or an
image larger than ``max_side``, is decoded upright (by
Pillow where libjpeg-turbo cannot) and re-encoded at ``quality``: baseline 4:2:0 with a restart
marker at every MCU row, as ``gpuload compress`` writes them (see :func:`row_window`).
Pillow does not report corrupt data inside a JPEG, so damage in one that only Pillow reads goes
unnoticed (as in a raw build).
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Iterator
from itertools import islice

import numpy as np
import xxhash
from PIL import Image

from ..errors import DecodeError
from .decode import (
    JPEG_COLORSPACES,
    decode_image,
    decode_jpeg_strict,
    exif_orientation,
    open_image,
    read_bytes,
    upright_size,
)

__all__ = [
    "REENCODE_REASONS",
    "StoredJpeg",
    "arithmetic_coded",
    "frame_size",
    "primary_image",
    "row_window",
    "scale_is_exact",
    "store_jpeg",
    "without_extraneous_bytes",
]

REENCODE_REASONS = (
    "not_jpeg",
    "progressive",
    "arithmetic_coded",
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


def store_jpeg(
    path: str | os.PathLike, *, max_side: int | None = None, quality: int = 90, data: bytes | None = None
) -> StoredJpeg:
    """What the JPEG store keeps for ``path`` (``data``: its bytes, when read already).

    Raises:
        DecodeError: the file is damaged or not an image (what a raw build would skip).

    Example:
        >>> import matplotlib.cbook
        >>> stored = store_jpeg(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False), max_side=300)
        >>> stored.shape, stored.reencoded
        ((300, 256), 'larger_than_max_side')
    """
    data = read_bytes(path) if data is None else data
    with open_image(data, path) as image:
        if image.format == "MPO":
            data = primary_image(data)  # what any JPEG decoder shows: the pictures after it are not stored
        orientation = exif_orientation(image, path)
        height, width = upright_size(image, path)
        reason = _reencode_reason(image, data, orientation, (height, width), max_side)
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
    # Baseline 4:2:0 with a restart marker at every MCU row, as ``gpuload compress`` writes them:
    # training crops then decode only their box's rows (:func:`row_window`).
    Image.fromarray(np.ascontiguousarray(pixels)).save(
        encoded := io.BytesIO(), "JPEG", quality=quality, subsampling="4:2:0", restart_marker_rows=1
    )
    return StoredJpeg(encoded.getvalue(), (height, width), reason)


JPEG_MAX_SIDE = 65_500  # libjpeg-turbo's largest width or height


def _reencode_reason(image, data: bytes, orientation: int, shape: tuple[int, int], max_side: int | None) -> str | None:
    if image.format not in ("JPEG", "MPO"):
        return "not_jpeg"
    if image.info.get("progressive") or image.info.get("progression"):
        return "progressive"
    if _frame_marker(data) not in _SEQUENTIAL:
        return "arithmetic_coded"  # (Pillow reads no lossless or hierarchical frame)
    if orientation != 1:
        return "exif_rotated"
    if image.mode not in JPEG_COLORSPACES:
        return "not_rgb_or_gray"
    if max_side is not None and max(shape) > max_side:
        return "larger_than_max_side"
    return None


_SEQUENTIAL = {0xC0, 0xC1}  # baseline and extended sequential Huffman frames
_FRAMES = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # every start of frame (not DHT, JPG, DAC)
_ARITHMETIC = {0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}  # arithmetic-coded frames
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # markers with no length field
_SOS = 0xDA  # start of scan
_EOI = 0xD9  # end of image
_MARKER = re.compile(rb"\xff[^\x00\xff]")  # 0xFF and a marker: not a stuffed zero (0xFF00), not a fill byte
_DRI = 0xDD  # define restart interval
_RESTART = re.compile(rb"\xff[\xd0-\xd7]")  # RST0 to RST7, in entropy-coded data


def frame_size(data: bytes) -> tuple[int, int] | None:
    """The ``(height, width)`` a JPEG's frame header gives (height 0: set later by a DNL marker),
    or ``None`` where it has none (not a JPEG, a cut header).

    Example:
        >>> import matplotlib.cbook
        >>> frame_size(open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False), "rb").read())
        (600, 512)
    """
    frame = next((position for position, marker in _markers(data) if marker in _FRAMES), None)
    return None if frame is None or frame + 9 > len(data) else _size_at(data, frame)


def arithmetic_coded(data: bytes) -> bool:
    """Whether a JPEG's frame is arithmetic-coded: libjpeg-turbo and Pillow decode it; ffmpeg does
    not, and no crop can skip its rows.

    Example:
        >>> import matplotlib.cbook
        >>> arithmetic_coded(open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False), "rb").read())
        False
    """
    return _frame_marker(data) in _ARITHMETIC


def primary_image(data: bytes) -> bytes:
    """The bytes of a JPEG's first picture, from its start to its end-of-image marker: of a
    multi-picture JPEG (MPO), its primary picture without the ones stored after it. ``data`` as it
    is where no end is found (a cut file, which a strict decode reports).

    Example:
        >>> import matplotlib.cbook
        >>> data = open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False), "rb").read()
        >>> primary_image(data + b"another picture") == data
        True
    """
    end = next((position + 2 for position, marker in _markers(data, scans=True) if marker == _EOI), None)
    return data if end is None else data[:end]


def without_extraneous_bytes(data: bytes) -> bytes:
    """A JPEG's header segments end to end, then the rest from its first scan on: without the stray
    bytes before a marker that libjpeg skips (warning "Corrupt JPEG data: N extraneous bytes before
    marker"), which TurboJPEG refuses in a header even when it decodes leniently. ``data`` as it is
    where no scan is found."""
    segments = []
    for position, marker in _markers(data):
        if marker == _SOS:
            return b"".join([data[:2], *segments, data[position:]])
        segments.append(data[position : position + 2 + int.from_bytes(data[position + 2 : position + 4], "big")])
    return data


def _frame_marker(data: bytes) -> int | None:
    """The start-of-frame marker of a JPEG (0xC0 baseline ... 0xCF), ``None`` where it has none."""
    return next((marker for _, marker in _markers(data) if marker in _FRAMES), None)


def row_window(data: bytes, first: int, last: int, *, context: bool = True) -> tuple[bytes, int, int] | None:
    """A copy of a JPEG that holds only its rows ``first`` to ``last`` (end excluded), widened to
    whole MCU rows, so that libjpeg-turbo decodes only those; returns the copy, the image row its
    first row is, and the rows it declares. ``None`` where that saves nothing or does not apply.

    A sequential JPEG whose first scan holds every component stores its MCU rows top to bottom.
    Below the window: the copy's frame declares fewer rows, and the decoder stops there (it reports
    the data after them as extraneous bytes: decode the copy with ``strict=False``). Above the
    window: only where restart markers begin MCU rows, at most two per row (``gpuload compress``
    writes one per MCU row; Pillow's ``restart_marker_rows``): the copy's scan starts at the restart
    marker before the window's first row, and stops at the one after its last, with the markers
    between renumbered.
    ``context`` adds one MCU row on each side, which libjpeg's smooth ("fancy") chroma upsampling
    reads: with it, the rows wanted decode to the pixels of the whole image at any DCT scale;
    without it, only with ``fastupsample``. Progressive and multi-scan files are left whole.

    Raises:
        ValueError: not ``0 <= first < last`` with ``first`` inside the image.

    Example:
        >>> import matplotlib.cbook, simplejpeg
        >>> data = open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False), "rb").read()
        >>> copy, top, rows = row_window(data, 40, 100)
        >>> top, rows, simplejpeg.decode_jpeg(copy, strict=False).shape
        (0, 128, (128, 512, 3))
    """
    header = _frame_and_scan(data)
    if header is None:
        return None
    frame, interval, scan = header
    height, width = _size_at(data, frame)
    components = data[frame + 9]
    sampling = data[frame + 11 : frame + 10 + 3 * components : 3]
    if height == 0 or width == 0 or components == 0 or len(sampling) != components:
        return None  # a height defined after the scan (DNL), or a cut header
    if not all(factor & 0x0F and factor >> 4 for factor in sampling):
        return None  # a sampling factor of 0: no JPEG decoder reads it
    if not 0 <= first < min(last, height):
        raise ValueError(
            f"rows must satisfy 0 <= first < last and first < {height} (the image's height), got {first} and {last}"
        )
    # An MCU: one 8x8 block of a single-component scan, else every component's blocks of one area.
    mcu_height = 8 if components == 1 else 8 * max(factor & 0x0F for factor in sampling)
    mcu_width = 8 if components == 1 else 8 * max(factor >> 4 for factor in sampling)
    per_row, mcu_rows = -(-width // mcu_width), -(-height // mcu_height)
    bottom = min(mcu_rows, -(-last // mcu_height) + context)
    # From the nearest MCU row above that a restart marker starts, where there are at most two
    # restart intervals per MCU row (more would cost more to find and renumber than the rows save).
    if interval and 2 * interval >= per_row:
        step = interval // math.gcd(interval, per_row)
        top = max(0, first // mcu_height - context) // step * step
        pieces = _restart_window(data, scan, interval, per_row, (top, bottom, mcu_rows)) if top else None
        if pieces is not None:
            declared = min(height, bottom * mcu_height) - top * mcu_height
            copy = b"".join([data[: frame + 5], declared.to_bytes(2, "big"), data[frame + 7 : scan], *pieces])
            return copy, top * mcu_height, declared
    if bottom >= mcu_rows:
        return None  # nothing to save
    declared = bottom * mcu_height
    return data[: frame + 5] + declared.to_bytes(2, "big") + data[frame + 7 :], 0, declared


def scale_is_exact(denominator: int, height: int, width: int) -> bool:
    """Whether a decode asked for at least ``ceil(side / denominator)`` pixels per side (simplejpeg's
    ``min_height``, ``min_width``) runs at exactly 1/``denominator`` (1, 2, 4 or 8). TurboJPEG
    decodes at the largest of its M/8 scales that fits that size, and for an image a few pixels
    across the next larger scale can give the same size.

    Example:
        >>> scale_is_exact(2, 480, 640), scale_is_exact(2, 3, 3), scale_is_exact(2, 3, 640)
        (True, False, True)
    """
    larger = 8 // denominator + 1  # in eighths
    return denominator == 1 or any(-(-side * larger // 8) > -(-side // denominator) for side in (height, width))


def _size_at(data: bytes, frame: int) -> tuple[int, int]:
    """The ``(height, width)`` of the frame header at ``frame`` (whole: checked by the caller)."""
    return int.from_bytes(data[frame + 5 : frame + 7], "big"), int.from_bytes(data[frame + 7 : frame + 9], "big")


def _markers(data: bytes, *, scans: bool = False) -> Iterator[tuple[int, int]]:
    """``(position, marker)`` of each marker segment from the start of a JPEG to its first scan
    (``scans``: on through its scans, to its end-of-image marker included); stops early where the
    data is not a JPEG or its headers are cut. As libjpeg does, bytes before a marker that are not
    one are skipped (libjpeg warns "Corrupt JPEG data: N extraneous bytes before marker", and its
    strict decode refuses the file), and so is a scan's entropy-coded data."""
    if data[:2] != b"\xff\xd8":
        return
    position = 2
    while (found := _MARKER.search(data, position)) is not None:
        position, marker = found.start(), data[found.start() + 1]
        if marker in _STANDALONE:
            position += 2
            continue
        if marker != _EOI and position + 4 > len(data):
            return
        yield position, marker
        if marker == _EOI or (marker == _SOS and not scans):
            return
        position += 2 + int.from_bytes(data[position + 2 : position + 4], "big")


def _frame_and_scan(data: bytes) -> tuple[int, int, int] | None:
    """Where a sequential JPEG's frame header is, its restart interval (0: none), and where its
    first scan's data starts; ``None`` unless that scan holds every component (one scan)."""
    frame, interval = None, 0
    for position, marker in _markers(data):
        if marker in _FRAMES:
            if marker not in _SEQUENTIAL or frame is not None:
                return None  # a progressive, lossless or arithmetic-coded frame, or a second frame
            frame = position
        elif marker == _DRI:
            interval = int.from_bytes(data[position + 4 : position + 6], "big")
        elif marker == _SOS:
            if (
                frame is None
                or len(data) < frame + 10
                or data[position + 4 : position + 5] != data[frame + 9 : frame + 10]
            ):
                return None  # a cut header, or other scans follow this one
            return frame, interval, position + 2 + int.from_bytes(data[position + 2 : position + 4], "big")
    return None


def _restart_window(
    data: bytes, scan: int, interval: int, per_row: int, rows: tuple[int, int, int]
) -> list[bytes] | None:
    """The pieces of a scan that holds only the restart intervals of MCU rows ``top`` to ``bottom``
    (the first starts at a restart marker), the markers between them renumbered from RST0, and an
    end of image; ``None`` where the markers are not where the restart interval puts them."""
    top, bottom, mcu_rows = rows
    total = -(-mcu_rows * per_row // interval)  # the scan's restart intervals
    first, end = top * per_row // interval, -(-bottom * per_row // interval)  # the ones kept
    markers = [found.start() for found in islice(_RESTART.finditer(data, scan), end)]
    if len(markers) < min(end, total - 1) or any(
        data[markers[i] + 1] != 0xD0 + i % 8 for i in range(first - 1, end - 1)
    ):
        return None  # fewer markers than the interval says, or out of sequence: decode it whole
    if end < total:  # the window stops at a restart marker
        stop = markers[end - 1]
    else:  # it reaches the end of the scan (markers found after that would be in data after it)
        stop = data.find(b"\xff\xd9", markers[total - 2])
        stop = len(data) if stop < 0 else stop
    pieces, start = [], markers[first - 1] + 2
    for number, marker in enumerate(markers[first : end - 1]):  # RSTn counts from RST0 in the copy
        pieces += (data[start:marker], bytes((0xFF, 0xD0 + number % 8)))
        start = marker + 2
    pieces += (data[start:stop], b"\xff\xd9")
    return pieces
