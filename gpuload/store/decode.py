"""Decode one image file into RGB uint8 pixels at a target size, with Pillow.

Pillow (which torchvision already depends on) reads every format a photo folder
holds, applies the EXIF orientation, and converts CMYK, palette, grayscale,
16-bit and alpha images. For JPEGs at least four times the target size it decodes
at a reduced scale (``Image.draft``), which is several times faster.
"""

from __future__ import annotations

import math
import os
from typing import Literal

import nanoarrow
import numpy as np
import torch
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

__all__ = [
    "RESIZE_MODES",
    "DecodeError",
    "check_target",
    "copy_chw",
    "decode_image",
    "exif_orientation",
    "load_rgb",
    "read_size",
]

Resize = Literal["crop", "pad", "stretch"]
RESIZE_MODES: tuple[str, ...] = ("crop", "pad", "stretch")

_ORIENTATION = ExifTags.Base.Orientation
_SIDEWAYS = {5, 6, 7, 8}  # EXIF orientations that swap width and height
_SIXTEEN_BIT = {"I", "I;16", "I;16B", "I;16L", "I;16N"}


class DecodeError(ValueError):
    """A file that cannot be turned into an RGB image.

    Attributes:
        path: the file.
        reason: what is wrong with it, in a few words.
    """

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason

    def __reduce__(self):
        return type(self), (self.path, self.reason)


def check_target(size: tuple[int, int] | None, resize: str) -> tuple[int, int] | None:
    """Check a target ``(height, width)`` and resize mode; returns the size as a tuple of ints.

    Raises:
        ValueError: a size that is not two positive integers, a target with more pixels
            than ``PIL.Image.MAX_IMAGE_PIXELS``, or an unknown resize mode.

    Example:
        >>> check_target([480, 640], "crop")
        (480, 640)
    """
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {', '.join(RESIZE_MODES)}, got {resize!r}")
    if size is None:
        return None
    if len(size) != 2 or not all(isinstance(side, (int, np.integer)) and side > 0 for side in size):
        raise ValueError(f"size must be two positive integers (height, width), got {size!r}")
    height, width = int(size[0]), int(size[1])
    limit = Image.MAX_IMAGE_PIXELS
    if limit and height * width > limit:
        raise ValueError(
            f"size {height}x{width} has {height * width:,} pixels per image, more than "
            f"PIL.Image.MAX_IMAGE_PIXELS = {limit:,}; choose a smaller size"
        )
    return height, width


def read_size(path: str | os.PathLike) -> tuple[int, int]:
    """The ``(height, width)`` of an image as displayed (EXIF orientation applied), from its header.

    Raises:
        DecodeError: the file is empty, not an image, or has too many pixels.
    """
    with _open(path) as image:
        width, height = image.size
        if exif_orientation(image) in _SIDEWAYS:
            width, height = height, width
    return height, width


def load_rgb(path: str | os.PathLike, size: tuple[int, int] | None = None, resize: Resize = "crop") -> Image.Image:
    """Decode ``path`` into a loaded RGB Pillow image, resized to ``size`` = ``(height, width)``.

    ``resize`` says how an image of another aspect ratio fits the target: ``"crop"``
    scales it to cover the target and cuts the centre, ``"pad"`` scales it to fit
    inside and fills the borders with black, ``"stretch"`` scales each side on its own.
    Resampling is Pillow's antialiased bilinear. Alpha is dropped and 16-bit
    pixels keep their 8 most significant bits. With ``size=None`` the image keeps its size.
    A JPEG at least 4 times larger than needed is decoded at a reduced scale
    (``Image.draft``), still at least twice the target size, which is several times faster.

    Raises:
        DecodeError: the file is empty, truncated, corrupt, not an image, has too many
            pixels, or has a pixel format with no RGB conversion.
        ValueError: a bad ``size`` or ``resize``.
    """
    size = check_target(size, resize)
    with _open(path) as image:
        orientation = exif_orientation(image)
        if size is not None and image.format == "JPEG":
            image.draft(None, _draft_request(image.size, size, resize, orientation in _SIDEWAYS))
        try:
            image.load()
            if orientation != 1:
                image = ImageOps.exif_transpose(image)
            rgb = _to_rgb(image, path)
            return rgb if size is None else _fit(rgb, size, resize)
        except DecodeError:
            raise
        except Exception as error:  # Pillow raises many types for damaged files
            raise DecodeError(path, f"truncated or corrupt ({type(error).__name__}: {error})") from None


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


def _open(path: str | os.PathLike) -> Image.Image:
    try:
        if os.path.getsize(path) == 0:
            raise DecodeError(path, "empty file (0 bytes)")
        image = Image.open(path)
    except DecodeError:
        raise
    except Image.DecompressionBombError as error:
        raise DecodeError(path, f"too many pixels, a possible decompression bomb ({error})") from None
    except UnidentifiedImageError:
        raise DecodeError(path, "not an image (Pillow cannot identify the format)") from None
    except Exception as error:
        raise DecodeError(path, f"cannot open ({type(error).__name__}: {error})") from None
    limit = Image.MAX_IMAGE_PIXELS
    if limit and image.width * image.height > limit:
        image.close()
        raise DecodeError(
            path,
            f"{image.width}x{image.height} = {image.width * image.height:,} pixels, more than "
            f"PIL.Image.MAX_IMAGE_PIXELS = {limit:,} (a possible decompression bomb; raise that limit for trusted files)",
        )
    return image


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation of an opened image, 1 (upright, as stored) to 8; 1 when absent or unreadable."""
    try:
        orientation = image.getexif().get(_ORIENTATION, 1)
    except Exception:  # unreadable EXIF: show the pixels as stored
        return 1
    return orientation if orientation in range(1, 9) else 1


def _draft_request(image_size: tuple[int, int], size: tuple[int, int], resize: str, sideways: bool) -> tuple[int, int]:
    """The stored (width, height) to ask ``Image.draft`` for: twice what the target needs, so
    that the final antialiased resize still does the smoothing (Pillow's ``thumbnail`` does the same)."""
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
        box_width, box_height = width / scale, height / scale
        left, top = (image_width - box_width) / 2, (image_height - box_height) / 2
        return image.resize((width, height), bilinear, box=(left, top, left + box_width, top + box_height))
    scale = min(width / image_width, height / image_height)
    inner = (max(1, round(image_width * scale)), max(1, round(image_height * scale)))
    canvas = Image.new("RGB", (width, height))
    canvas.paste(image.resize(inner, bilinear), ((width - inner[0]) // 2, (height - inner[1]) // 2))
    return canvas
