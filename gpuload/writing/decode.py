"""Decode one image file into RGB uint8 pixels at a target size.

JPEGs in RGB or grayscale, nearly every photo, are decoded by libjpeg-turbo through simplejpeg in
strict mode: a file that libjpeg reports as truncated or as holding corrupt data is damaged, and is
reported so, never passed on with grey or green blocks where the data was missing (Pillow and
ffmpeg decode such files without a word). When the target is at least twice smaller, the JPEG is
decoded at a reduced scale in the DCT domain (1/2, 1/4, 1/8), still at least twice the target, which
is several times faster. Pillow decodes everything else (PNG, CMYK JPEGs, 16-bit, palette, alpha),
and reads the EXIF orientation of every image. The pixels stay a numpy array from the decoder on:
turned upright by strided views, resized by ``torch.nn.functional.interpolate`` (bilinear,
antialiased, uint8: the pixels of Pillow's resize, several times faster) and copied once into
their destination.

Only what comes out of the decoders on the file's bytes is reported as damage
(:class:`gpuload.DecodeError`); any other exception is a bug or an environment failure and propagates.
"""

from __future__ import annotations

import errno
import io
import math
import os
import stat
import struct
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import BinaryIO, Literal

import numpy as np
import simplejpeg
import torch
from PIL import ExifTags, Image

from ..errors import DecodeError, UsageError
from ..format.fields import MASK_FILL
from ..format.manifest import RESIZE_MODES
from ..text import image_size

__all__ = [
    "JPEG_COLORSPACES",
    "RESIZE_MODES",
    "DecodeError",
    "check_image",
    "check_target",
    "decode_image",
    "decode_into",
    "decode_jpeg_strict",
    "exif_orientation",
    "fit_mask",
    "pixel_limit",
    "read_size",
    "upright_pixels",
    "upright_size",
]

Resize = Literal["crop", "pad", "stretch"]

_ORIENTATION = ExifTags.Base.Orientation
SIDEWAYS = {5, 6, 7, 8}  # EXIF orientations that swap width and height
# (flip rows, flip columns) after swapping the axes of sideways orientations (5 to 8): what shows
# each EXIF orientation upright, as ImageOps.exif_transpose does
_FLIPS = {
    1: (False, False),
    2: (False, True),
    3: (True, True),
    4: (True, False),
    5: (False, False),
    6: (False, True),
    7: (True, True),
    8: (True, False),
}
# Pillow modes of the JPEGs libjpeg-turbo decodes, and its colorspace for each.
JPEG_COLORSPACES = {"RGB": "RGB", "L": "GRAY"}
_SIXTEEN_BIT = {"I", "I;16", "I;16B", "I;16L", "I;16N"}
_COVER_LIMIT = 4  # crop mode resizes the whole image when it covers at most 4 times the target's pixels
# Errors reading a file that are about the file: gone, a folder, unreadable, a damaged disk block.
_FILE_ERRNOS = {errno.ENOENT, errno.EISDIR, errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.EIO, errno.ELOOP}
# What Pillow raises on the bytes of a damaged or foreign file while identifying or decoding it.
_PILLOW_DAMAGE = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error, zlib.error)


def check_target(size: tuple[int, int] | None, resize: str) -> tuple[int, int] | None:
    """Check a target ``(height, width)`` and resize mode; returns the size as a tuple of ints.

    Raises:
        UsageError: a size that is not two positive integers, a target with more pixels
            than ``PIL.Image.MAX_IMAGE_PIXELS``, or an unknown resize mode.

    Example:
        >>> check_target([480, 640], "crop")
        (480, 640)
    """
    if resize not in RESIZE_MODES:
        raise UsageError(f"resize must be one of {', '.join(RESIZE_MODES)}, got {resize!r}")
    if size is None:
        return None
    if len(size) != 2 or not all(isinstance(side, (int, np.integer)) and side > 0 for side in size):
        raise UsageError(f"size must be two positive integers (height, width), got {size!r}")
    height, width = int(size[0]), int(size[1])
    limit = Image.MAX_IMAGE_PIXELS
    if limit and height * width > limit:
        raise UsageError(
            f"size {image_size(height, width)} has {height * width:,} pixels per image, more than "
            f"PIL.Image.MAX_IMAGE_PIXELS = {limit:,}; choose a smaller size, or raise the limit: --max-pixels N "
            "on the command line, PIL.Image.MAX_IMAGE_PIXELS = N in Python"
        )
    return height, width


def read_size(path: str | os.PathLike, data: bytes | None = None) -> tuple[int, int]:
    """The ``(height, width)`` of an image as displayed (EXIF orientation applied), from its header
    (a PNG's pixels too: Pillow loads them to find an EXIF chunk after them). ``data``: its bytes, where
    they are not a file's (``path`` then only names it).

    Raises:
        DecodeError: the file is empty, unreadable, not a regular file, not an image, or has too many pixels.
    """
    if data is not None:
        if not data:
            raise DecodeError(path, "empty (0 bytes)")
        with open_image(data, path) as image:
            return upright_size(image, path)
    with _reading(path), _open_file(path) as file:  # Pillow reads only the header of an opened file
        if os.fstat(file.fileno()).st_size == 0:
            raise DecodeError(path, "empty file (0 bytes)")
        with open_image(file, path) as image:
            return upright_size(image, path)


def upright_size(image: Image.Image, path: str | os.PathLike) -> tuple[int, int]:
    """The ``(height, width)`` of an opened image (``path`` names it) as displayed, from its header
    (a PNG's pixels too, see :func:`exif_orientation`; the orientation still to apply swaps the
    sides of a sideways one).

    Raises:
        DecodeError: a PNG whose pixels Pillow had to load to find its EXIF is damaged.
    """
    if exif_orientation(image, path) in SIDEWAYS:
        return image.width, image.height
    return image.height, image.width


def decode_image(
    path: str | os.PathLike, size: tuple[int, int] | None = None, resize: Resize = "crop", *, data: bytes | None = None
) -> torch.Tensor:
    """Decode ``path`` into a uint8 tensor ``[3, height, width]``: RGB, upright, fitted to ``size`` = ``(height, width)``.
    ``data``: the file's bytes, when the caller has already read them (``path`` then only names it).

    ``resize`` says how an image of another aspect ratio fits the target: ``"crop"``
    scales it to cover the target and cuts the centre, ``"pad"`` scales it to fit
    inside and fills the borders with black, ``"stretch"`` scales each side on its own.
    Resampling is antialiased bilinear. Alpha is dropped and 16-bit pixels keep their 8 most
    significant bits. With ``size=None`` the image keeps its size.

    Raises:
        DecodeError: the file is empty, unreadable, truncated, holds corrupt data, is not an
            image, has too many pixels, or has a pixel format with no RGB conversion.
        UsageError: a bad ``size`` or ``resize``.

    Example:
        >>> import matplotlib.cbook
        >>> decode_image(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False), (240, 320)).shape
        torch.Size([3, 240, 320])
    """
    return _decode(path, check_target(size, resize), resize, data).contiguous()


def decode_into(path: str | os.PathLike, out: np.ndarray, resize: Resize = "crop", data: bytes | None = None) -> None:
    """Decode ``path`` as :func:`decode_image` does, fitted to ``out``'s size, into ``out``: uint8
    ``[height, width, 3]`` (channels-last, as decoders write pixels and raw datasets store them).
    ``data``: its bytes, when read already (or not a file's: ``path`` then only names it).

    An upright RGB JPEG already at that size (a dataset of photos of one size, built at that size:
    the common case) is decoded by libjpeg-turbo straight into ``out``: no transposition and no copy.
    Anything else is copied into it once.

    Raises:
        DecodeError: see :func:`decode_image`.
    """
    pixels = _decode(path, tuple(out.shape[:2]), resize, data, out=out)
    if pixels is not None:
        np.copyto(out, pixels.permute(1, 2, 0).numpy())


def check_image(path: str | os.PathLike, data: bytes | None = None) -> tuple[int, tuple[int, int]]:
    """Decode ``path`` once, as :func:`decode_image` would, to find damage; returns the orientation
    of its stored pixels (its EXIF or TIFF tag, 1 to 8: what a decoder that ignores the tag, such as
    ffmpeg, must apply) and its ``(height, width)`` upright. ``data``: its bytes, when read already.

    Raises:
        DecodeError: what :func:`decode_image` raises for the file.
    """
    data = read_bytes(path) if data is None else data
    with open_image(data, path) as image:
        stored, size = _tagged_orientation(image, path), upright_size(image, path)
        decode_pixels(image, data, path, None)
    return stored, size


def upright_pixels(path: str | os.PathLike, data: bytes | None = None) -> np.ndarray:
    """The pixels of :func:`decode_image` at their own size, as contiguous uint8 ``[H, W, 3]``
    (copied only where the orientation moves them). ``data``: the bytes, when read already.

    Raises:
        DecodeError: see :func:`decode_image`.
    """
    return np.ascontiguousarray(_decode(path, None, "crop", data).permute(1, 2, 0).numpy())


def _decode(
    path: str | os.PathLike,
    size: tuple[int, int] | None,
    resize: str,
    data: bytes | None = None,
    out: np.ndarray | None = None,
) -> torch.Tensor | None:
    """The upright RGB pixels of ``path`` (read here unless ``data`` holds them), fitted to ``size``:
    ``[3, H, W]``, often a strided view (channels-last where the decoder's order survives). With
    ``out`` (uint8 ``[*size, 3]``), an upright RGB JPEG of that size is decoded straight into it,
    and ``None`` is returned."""
    data = read_bytes(path) if data is None else data
    with open_image(data, path) as image:
        orientation = exif_orientation(image, path)
        if out is not None and orientation == 1 and (image.height, image.width) == size and image.mode == "RGB":
            if image.format == "JPEG" and decode_jpeg_strict(data, path, "RGB", buffer=out) is not None:
                return None
        request = None if size is None else _draft_request(image.size, size, resize, orientation in SIDEWAYS)
        pixels = decode_pixels(image, data, path, request)
    chw = _upright(pixels, orientation).permute(2, 0, 1)
    return chw if size is None else _fit(chw, size, resize)


def exif_orientation(image: Image.Image, path: str | os.PathLike) -> int:
    """The orientation still to apply to the pixels of an opened image (``path`` names it) as
    Pillow loads them, 1 (upright) to 8: its EXIF orientation, but 1 for a TIFF, which Pillow turns
    upright itself when it loads it (and whose size it already gives upright); 1 when absent or
    unreadable.

    Raises:
        DecodeError: a PNG whose pixels Pillow had to load to find its EXIF is damaged.
    """
    return 1 if image.format == "TIFF" else _tagged_orientation(image, path)


def _tagged_orientation(image: Image.Image, path: str | os.PathLike) -> int:
    """The orientation an image's EXIF or TIFF tag gives its stored pixels, 1 to 8; 1 when absent or unreadable."""
    if image.format == "PNG" and "exif" not in image.info:
        # Pillow loads a PNG's pixels to look for an EXIF chunk after them. Damage found there is
        # the file's, not its EXIF's: a failed load leaves half a picture that a second load keeps.
        _load(image, path)
    try:
        orientation = image.getexif().get(_ORIENTATION, 1)
    except _PILLOW_DAMAGE:  # unreadable EXIF: show the pixels as stored
        return 1
    return orientation if orientation in range(1, 9) else 1


@contextmanager
def _reading(path: str | os.PathLike) -> Iterator[None]:
    """Errors reading ``path`` that are about the file become a :class:`DecodeError`; the machine's
    (EMFILE, ENOMEM, ESTALE...) propagate."""
    try:
        yield
    except OSError as error:
        if error.errno not in _FILE_ERRNOS:
            raise
        raise DecodeError(path, f"cannot read ({type(error).__name__}: {error.strerror or error})") from None


def read_bytes(path: str | os.PathLike) -> bytes:
    with _reading(path), _open_file(path) as file:
        data = file.read()
    if not data:
        raise DecodeError(path, "empty file (0 bytes)")
    return data


def _open_file(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened to read, unless its status says it is a named pipe, a socket or a device: those
    are never opened (a pipe would block the open until a writer comes, a device would be read:
    /dev/zero forever). Opened non-blocking, so that a pipe put there since then cannot block either."""
    kind = _NOT_FILES.get(stat.S_IFMT(os.stat(path).st_mode))
    if kind is not None:
        raise DecodeError(path, f"not a regular file ({kind}): not opened; images must be regular files")
    return open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK))


_NOT_FILES = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def open_image(source: bytes | BinaryIO, path: str | os.PathLike) -> Image.Image:
    """Pillow's lazy ``Image.open`` of a file's bytes (or an open file), with the decompression-bomb guard.

    Raises:
        DecodeError: not an image, a damaged header, or too many pixels.
    """
    try:
        image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
    except Image.DecompressionBombError as error:
        raise DecodeError(path, f"too many pixels, a possible decompression bomb ({error}); {_RAISE_LIMIT}") from None
    except Image.UnidentifiedImageError:
        raise DecodeError(path, "not an image (Pillow cannot identify the format)") from None
    except _PILLOW_DAMAGE as error:
        raise DecodeError(path, f"damaged header ({type(error).__name__}: {error})") from None
    limit = Image.MAX_IMAGE_PIXELS
    if limit and image.width * image.height > limit:
        image.close()
        raise DecodeError(
            path,
            f"{image.width}x{image.height} = {image.width * image.height:,} pixels, more than "
            f"PIL.Image.MAX_IMAGE_PIXELS = {limit:,} (a possible decompression bomb); {_RAISE_LIMIT}",
        )
    return image


_RAISE_LIMIT = (
    "for trusted files, raise the limit: --max-pixels N on the command line, PIL.Image.MAX_IMAGE_PIXELS = N in Python"
)


@contextmanager
def pixel_limit(limit: int | None) -> Iterator[None]:
    """Decode with ``PIL.Image.MAX_IMAGE_PIXELS`` set to ``limit`` (``None``: no limit) inside, the
    decompression-bomb guard of :func:`open_image` (Pillow's setting, for the whole process: every
    thread decodes with it meanwhile); the limit before is put back after.

    Example:
        >>> with pixel_limit(10):
        ...     Image.MAX_IMAGE_PIXELS
        10
    """
    before = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = limit
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = before


def decode_pixels(
    image: Image.Image, data: bytes, path: str | os.PathLike, request: tuple[int, int] | None
) -> np.ndarray:
    """RGB uint8 ``[H, W, 3]`` pixels of an opened image, in stored orientation; JPEGs checked strictly.

    ``request``: the smallest stored ``(width, height)`` wanted; a JPEG may then decode at a reduced scale.
    """
    if image.format in ("JPEG", "MPO"):  # an MPO's first picture is a JPEG, what libjpeg-turbo decodes of it
        colorspace = JPEG_COLORSPACES.get(image.mode)
        pixels = decode_jpeg_strict(data, path, colorspace or "CMYK", request)
        if colorspace == "RGB" and pixels is not None:
            return pixels
        if colorspace == "GRAY" and pixels is not None:
            return np.repeat(pixels, 3, axis=2)
        if request is not None:  # CMYK and the rare JPEGs libjpeg-turbo cannot read: Pillow, at reduced scale
            image.draft(None, request)
    _load(image, path)
    return np.array(_to_rgb(image, path))  # a writable copy: torch refuses read-only arrays


def _load(image: Image.Image, path: str | os.PathLike) -> None:
    """Pillow's decode of an opened image's pixels; damage becomes a :class:`DecodeError`."""
    try:
        image.load()
    except _PILLOW_DAMAGE as error:
        raise DecodeError(path, f"truncated or corrupt ({type(error).__name__}: {error})") from None


def _upright(pixels: np.ndarray, orientation: int) -> torch.Tensor:
    """``[H, W, 3]`` pixels shown upright for an EXIF orientation (as ``ImageOps.exif_transpose``)."""
    upright = torch.from_numpy(pixels)
    if orientation in SIDEWAYS:  # stored sideways: swap the axes first
        upright = upright.transpose(0, 1)
    flips = [axis for axis, flip in enumerate(_FLIPS[orientation]) if flip]
    return upright.flip(flips) if flips else upright


def decode_jpeg_strict(
    data: bytes,
    path: str | os.PathLike,
    colorspace: str,
    request: tuple[int, int] | None = None,
    *,
    buffer: np.ndarray | None = None,
) -> np.ndarray | None:
    """libjpeg-turbo's strict decode of a JPEG, or ``None`` where it cannot read the file at all.
    ``buffer``: decode into it (large enough; the result views it).

    libjpeg reports a truncated file or corrupt data as a warning and fills the gap with grey;
    strict mode turns those warnings into errors, and a file that only a lenient decode reads is
    damaged. A file that even the lenient decode refuses (a format libjpeg-turbo does not
    support) is left to Pillow, which decides. The lenient decode skips stray bytes before a
    header's markers, as libjpeg does (TurboJPEG refuses them in a header even when lenient).
    """
    width, height = request or (0, 0)
    try:
        return simplejpeg.decode_jpeg(
            data, colorspace=colorspace, min_width=width, min_height=height, strict=True, buffer=buffer
        )
    except ValueError as strict:
        from .jpeg import without_extraneous_bytes  # here: jpeg.py imports this module

        try:
            simplejpeg.decode_jpeg(without_extraneous_bytes(data), colorspace=colorspace, strict=False)
        except ValueError:
            return None
        raise DecodeError(path, f"truncated or corrupt JPEG (libjpeg: {strict})") from None


def _draft_request(image_size: tuple[int, int], size: tuple[int, int], resize: str, sideways: bool) -> tuple[int, int]:
    """The smallest stored (width, height) to decode: twice what the target needs, so that the
    final antialiased resize still does the smoothing (Pillow's ``thumbnail`` does the same)."""
    height, width = size
    if sideways:
        height, width = width, height
    stored_width, stored_height = image_size
    if resize == "stretch":
        return 2 * width, 2 * height
    fit = max if resize == "crop" else min
    scale = 2 * fit(width / stored_width, height / stored_height)
    return math.ceil(stored_width * scale), math.ceil(stored_height * scale)


def _to_rgb(image: Image.Image, path: str | os.PathLike) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode in _SIXTEEN_BIT:
        pixels = np.asarray(image).astype(np.int32)
        eight_bit = (np.clip(pixels, 0, 65535) >> 8).astype(np.uint8)
        return Image.fromarray(eight_bit).convert("RGB")
    try:
        return image.convert("RGB")
    except ValueError:
        raise DecodeError(path, f"no conversion from pixel mode {image.mode} to RGB") from None


def _fit(
    chw: torch.Tensor,
    size: tuple[int, int],
    resize: str,
    *,
    resample: Callable[[torch.Tensor, tuple[int, int]], torch.Tensor] | None = None,
    fill: int = 0,
) -> torch.Tensor:
    """``[C, H, W]`` pixels fitted to ``size``: cropped (cover, cut the centre), padded with ``fill`` or
    stretched, each resize by ``resample`` (:func:`resize_image`, antialiased bilinear, when left out)."""
    resample = resample or resize_image
    height, width = chw.shape[1:]
    target_height, target_width = size
    if (height, width) == size:
        return chw
    if resize == "stretch":
        return resample(chw, size)
    if resize == "crop":
        scale = max(target_height / height, target_width / width)
        covering = (max(target_height, round(height * scale)), max(target_width, round(width * scale)))
        if covering[0] * covering[1] <= _COVER_LIMIT * target_height * target_width:
            # as torchvision's Resize + CenterCrop, the pixels around the centre box weigh on its edges;
            # an odd margin puts the extra pixel after the box (torchvision rounds half to even: a
            # pixel's shift at most; kept, as every dataset built so far was built this way)
            top, left = (covering[0] - target_height) // 2, (covering[1] - target_width) // 2
            return resample(chw, covering)[:, top : top + target_height, left : left + target_width]
        # a far longer image (a 1x20000 strip): cut the centre box out first, so only it is resized
        box = (min(height, max(1, round(target_height / scale))), min(width, max(1, round(target_width / scale))))
        top, left = (height - box[0]) // 2, (width - box[1]) // 2
        return resample(chw[:, top : top + box[0], left : left + box[1]], size)
    scale = min(target_height / height, target_width / width)
    inner = (min(target_height, max(1, round(height * scale))), min(target_width, max(1, round(width * scale))))
    top, left = (target_height - inner[0]) // 2, (target_width - inner[1]) // 2
    canvas = torch.full((*size, chw.shape[0]), fill, dtype=torch.uint8).permute(2, 0, 1)  # channels-last
    canvas[:, top : top + inner[0], left : left + inner[1]] = resample(chw, inner)
    return canvas


def fit_mask(ids: np.ndarray, out: np.ndarray, resize: Resize) -> None:
    """A mask's class ids (uint8 ``[H, W]``) fitted into ``out`` (``[h, w]``) as :func:`decode_into` fits
    its image with ``resize``, by nearest neighbour (torch's ``nearest-exact``: the pixel under each output
    pixel's centre), the border of a padded one :data:`~gpuload.format.fields.MASK_FILL`.

    Example:
        >>> out = np.empty((4, 4), np.uint8)
        >>> fit_mask(np.ones((4, 8), np.uint8), out, "pad")
        >>> out[:, 0].tolist()
        [255, 1, 1, 255]
    """
    nearest = partial(torch.nn.functional.interpolate, mode="nearest-exact")
    fitted = _fit(
        torch.from_numpy(ids)[None],
        tuple(out.shape),
        resize,
        resample=lambda m, size: nearest(m[None], size)[0],
        fill=MASK_FILL,
    )
    np.copyto(out, fitted[0].numpy())


def resize_image(chw: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Antialiased bilinear resize of uint8 ``[3, H, W]``, or ``[1, 3, H, W]`` whose memory format
    (contiguous or channels-last) the result keeps, to ``[3, *size]`` (torch's uint8 path: Pillow's
    pixels)."""
    if tuple(chw.shape[-2:]) == tuple(size):
        return chw if chw.dim() == 3 else chw[0]
    batch = chw if chw.dim() == 4 else chw[None]
    return torch.nn.functional.interpolate(batch, size=size, mode="bilinear", antialias=True)[0]
