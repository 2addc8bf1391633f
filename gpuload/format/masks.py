"""Segmentation masks' bytes read losslessly as uint8 class ids: what a build checks and a jpeg dataset serves.

A mask is a PNG of one class id per pixel: 8-bit grey (mode ``L``), a palette image (mode ``P``: its
indices are the ids, the palette only shows them), bilevel (``1``: 0 and 1) or 16-bit grey whose ids
are at most 255. Nothing is converted through RGB: an RGB mask (colours standing for classes) is
refused, as is a lossy format.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image

from ..errors import DecodeError

__all__ = ["decode_mask"]

_SIXTEEN_BIT = {"I", "I;16", "I;16B", "I;16L", "I;16N"}
_DAMAGE = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error, zlib.error)
_SAVE_AS = "save it as an 8-bit PNG of class ids (mode L or P)"


def decode_mask(data: bytes, name: str) -> np.ndarray:
    """The class ids of a mask's PNG bytes: uint8 ``[H, W]`` (``name`` names it in errors).

    Raises:
        DecodeError: empty, not a PNG, damaged, RGB (or another mode with no class ids), or holding an id
            above 255 (the reason says what to do).

    Example:
        >>> buffer = io.BytesIO()
        >>> Image.fromarray(np.array([[0, 1], [2, 255]], np.uint8)).save(buffer, "PNG")
        >>> decode_mask(buffer.getvalue(), "m.png").tolist()
        [[0, 1], [2, 255]]
    """
    if not data:
        raise DecodeError(name, "empty (0 bytes)")
    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as error:
        raise DecodeError(name, f"of too many pixels ({error})") from None
    except Image.UnidentifiedImageError:
        raise DecodeError(name, f"not an image; {_SAVE_AS}") from None
    except _DAMAGE as error:
        raise DecodeError(name, f"damaged ({type(error).__name__}: {error})") from None
    with image:
        if image.format != "PNG":
            raise DecodeError(name, f"a {image.format}, not a PNG; {_SAVE_AS}")
        if image.mode not in ("L", "P", "1", *_SIXTEEN_BIT):
            raise DecodeError(
                name,
                f"in mode {image.mode} (colours, not class ids): convert it to one class id per pixel and {_SAVE_AS}",
            )
        try:
            image.load()
        except _DAMAGE as error:
            raise DecodeError(name, f"truncated or corrupt ({type(error).__name__}: {error})") from None
        ids = np.asarray(image)
    if image.mode in _SIXTEEN_BIT:
        largest = int(ids.max(initial=0))
        if largest > 255 or int(ids.min(initial=0)) < 0:
            raise DecodeError(name, f"16-bit and holds the class id {largest}; gpuload keeps ids 0 to 255")
    return np.array(ids, dtype=np.uint8)  # a writable copy: torch refuses read-only arrays
