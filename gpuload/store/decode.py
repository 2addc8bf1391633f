"""Decode one image file into RGB uint8 pixels at a target size.

JPEGs in RGB or grayscale, nearly every photo, are decoded by libjpeg-turbo through simplejpeg in
strict mode: a file that libjpeg reports as truncated or as holding corrupt data is damaged, and is
reported so, never passed on with grey or green blocks where the data was missing (Pillow and
ffmpeg decode such files without a word). When the target is at least twice smaller, the JPEG is
decoded at a reduced scale in the DCT domain (1/2, 1/4, 1/8), still at least twice the target, which
is several times faster. Pillow decodes everything else (PNG, CMYK JPEGs, 16-bit, palette, alpha),
and reads the EXIF orientation of every image.

Only what comes out of the decoders on the file's bytes is reported as damage
(:class:`gpuload.DecodeError`); any other exception is a bug or an environment failure and propagates.
"""

from __future__ import annotations

import io
import math
import os
import struct
import zlib
from typing import Literal

import nanoarrow
import numpy as np
import simplejpeg
import torch
from PIL import ExifTags, Image

from ..errors import DecodeError, UsageError
from .manifest import RESIZE_MODES

__all__ = [
    "RESIZE_MODES",
    "DecodeError",
    "check_image",
    "check_target",
    "copy_chw",
    "decode_image",
    "exif_orientation",
    "load_rgb",
    "read_size",
]

Resize = Literal["crop", "pad", "stretch"]

_ORIENTATION = ExifTags.Base.Orientation
_SIDEWAYS = {5, 6, 7, 8}  # EXIF orientations that swap width and height
_UPRIGHT = {  # the transposition that shows each EXIF orientation upright (as ImageOps.exif_transpose)
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SIXTEEN_BIT = {"I", "I;16", "I;16B", "I;16L", "I;16N"}
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
            f"size {height}x{width} has {height * width:,} pixels per image, more than "
            f"PIL.Image.MAX_IMAGE_PIXELS = {limit:,}; choose a smaller size"
        )
    return height, width


def read_size(path: str | os.PathLike) -> tuple[int, int]:
    """The ``(height, width)`` of an image as displayed (EXIF orientation applied), from its header.

    Raises:
        DecodeError: the file is empty, unreadable, not an image, or has too many pixels.
    """
    with _open(_read(path), path) as image:
        width, height = image.size
        if exif_orientation(image) in _SIDEWAYS:
            width, height = height, width
    return height, width


def load_rgb(path: str | os.PathLike, size: tuple[int, int] | None = None, resize: Resize = "crop") -> Image.Image:
    """Decode ``path`` into a loaded RGB Pillow image, upright, resized to ``size`` = ``(height, width)``.

    ``resize`` says how an image of another aspect ratio fits the target: ``"crop"``
    scales it to cover the target and cuts the centre, ``"pad"`` scales it to fit
    inside and fills the borders with black, ``"stretch"`` scales each side on its own.
    Resampling is Pillow's antialiased bilinear. Alpha is dropped and 16-bit
    pixels keep their 8 most significant bits. With ``size=None`` the image keeps its size.

    Raises:
        DecodeError: the file is empty, unreadable, truncated, holds corrupt data, is not an
            image, has too many pixels, or has a pixel format with no RGB conversion.
        UsageError: a bad ``size`` or ``resize``.
    """
    size = check_target(size, resize)
    data = _read(path)
    with _open(data, path) as image:
        orientation = exif_orientation(image)
        request = None if size is None else _draft_request(image.size, size, resize, orientation in _SIDEWAYS)
        image = _decode(image, data, path, request)
        if orientation in _UPRIGHT:
            image = image.transpose(_UPRIGHT[orientation])
        rgb = _to_rgb(image, path)
        return rgb if size is None else _fit(rgb, size, resize)


def check_image(path: str | os.PathLike) -> int:
    """Decode ``path`` once, as :func:`load_rgb` would, to find damage; returns its EXIF orientation (1 to 8).

    Raises:
        DecodeError: what :func:`load_rgb` raises for the file.
    """
    data = _read(path)
    with _open(data, path) as image:
        orientation = exif_orientation(image)
        _decode(image, data, path, None)
    return orientation


def copy_chw(image: Image.Image, out: np.ndarray) -> None:
    """Copy the pixels of an RGB image into ``out``, a uint8 array of shape ``[3, height, width]``.

    The pixels are read in place through Pillow's Arrow export when the image is one
    block of memory (a copy otherwise), so the only copy is the one into ``out``.

    Example:
        >>> image = Image.new("RGB", (4, 2), (10, 20, 30))
        >>> out = np.empty((3, 2, 4), np.uint8)
        >>> copy_chw(image, out)
        >>> out[:, 0, 0].tolist()
        [10, 20, 30]
    """
    if image.mode != "RGB":
        raise ValueError(f"copy_chw needs an RGB image, got mode {image.mode}")
    if out.shape != (3, image.height, image.width) or out.dtype != np.uint8:
        raise ValueError(f"out must be uint8 of shape (3, {image.height}, {image.width}), got {out.dtype} {out.shape}")
    try:
        rgbx = nanoarrow.c_array(image).view().child(0).buffer(1)  # Pillow stores RGB as RGBX
        pixels = np.frombuffer(rgbx, np.uint8).reshape(image.height, image.width, 4)
    except ValueError:  # "rows are not contiguous": a large image spread over several blocks
        pixels = np.asarray(image)
    np.copyto(out, pixels[:, :, :3].transpose(2, 0, 1))


def decode_image(path: str | os.PathLike, size: tuple[int, int] | None = None, resize: Resize = "crop") -> torch.Tensor:
    """Decode ``path`` into a uint8 tensor ``[3, height, width]``; see :func:`load_rgb`.

    Example:
        >>> import matplotlib.cbook
        >>> decode_image(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False), (240, 320)).shape
        torch.Size([3, 240, 320])
    """
    image = load_rgb(path, size, resize)
    out = torch.empty((3, image.height, image.width), dtype=torch.uint8)
    copy_chw(image, out.numpy())
    return out


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation of an opened image, 1 (upright, as stored) to 8; 1 when absent or unreadable."""
    try:
        orientation = image.getexif().get(_ORIENTATION, 1)
    except _PILLOW_DAMAGE:  # unreadable EXIF: show the pixels as stored
        return 1
    return orientation if orientation in range(1, 9) else 1


def _read(path: str | os.PathLike) -> bytes:
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:  # gone, unreadable, a folder named like an image, a disk error
        raise DecodeError(path, f"cannot read ({type(error).__name__}: {error.strerror or error})") from None
    if not data:
        raise DecodeError(path, "empty file (0 bytes)")
    return data


def _open(data: bytes, path: str | os.PathLike) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as error:
        raise DecodeError(path, f"too many pixels, a possible decompression bomb ({error})") from None
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
            f"PIL.Image.MAX_IMAGE_PIXELS = {limit:,} (a possible decompression bomb; raise that limit for trusted files)",
        )
    return image


def _decode(image: Image.Image, data: bytes, path: str | os.PathLike, request: tuple[int, int] | None) -> Image.Image:
    """The loaded pixels of an opened image, in stored orientation; JPEGs checked strictly by libjpeg-turbo."""
    if image.format == "JPEG":
        colorspace = {"RGB": "RGB", "L": "GRAY"}.get(image.mode)
        pixels = _decode_jpeg(data, path, colorspace or "CMYK", request)
        if colorspace is not None and pixels is not None:
            return Image.fromarray(pixels[:, :, 0] if colorspace == "GRAY" else pixels)
        if request is not None:  # CMYK and the rare JPEGs libjpeg-turbo cannot read: Pillow, at reduced scale
            image.draft(None, request)
    try:
        image.load()
    except _PILLOW_DAMAGE as error:
        raise DecodeError(path, f"truncated or corrupt ({type(error).__name__}: {error})") from None
    return image


def _decode_jpeg(
    data: bytes, path: str | os.PathLike, colorspace: str, request: tuple[int, int] | None
) -> np.ndarray | None:
    """libjpeg-turbo's strict decode of a JPEG, or ``None`` where it cannot read the file at all.

    libjpeg reports a truncated file or corrupt data as a warning and fills the gap with grey;
    strict mode turns those warnings into errors, and a file that only a lenient decode reads is
    damaged. A file that even the lenient decode refuses (a format libjpeg-turbo does not
    support) is left to Pillow, which decides.
    """
    width, height = request or (0, 0)
    try:
        return simplejpeg.decode_jpeg(data, colorspace=colorspace, min_width=width, min_height=height, strict=True)
    except ValueError as strict:
        try:
            simplejpeg.decode_jpeg(data, colorspace=colorspace, strict=False)
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


def _fit(image: Image.Image, size: tuple[int, int], resize: str) -> Image.Image:
    height, width = size
    if image.size == (width, height):
        return image
    bilinear = Image.Resampling.BILINEAR
    if resize == "stretch":
        return image.resize((width, height), bilinear)
    image_width, image_height = image.size
    if resize == "crop":
        scale = max(width / image_width, height / image_height)
        return image.resize((width, height), bilinear, box=_centred_box(image.size, (width / scale, height / scale)))
    scale = min(width / image_width, height / image_height)
    inner = (min(width, max(1, round(image_width * scale))), min(height, max(1, round(image_height * scale))))
    canvas = Image.new("RGB", (width, height))
    canvas.paste(image.resize(inner, bilinear), ((width - inner[0]) // 2, (height - inner[1]) // 2))
    return canvas


def _centred_box(image_size: tuple[int, int], box_size: tuple[float, float]) -> tuple[float, float, float, float]:
    """``(left, top, right, bottom)`` of a box of ``box_size`` centred in the image, kept inside it:
    ``box_size`` comes from a float division and may exceed the image by a rounding error."""
    (image_width, image_height), (box_width, box_height) = image_size, box_size
    left = max(0.0, (image_width - box_width) / 2)
    top = max(0.0, (image_height - box_height) / 2)
    return left, top, min(float(image_width), left + box_width), min(float(image_height), top + box_height)
