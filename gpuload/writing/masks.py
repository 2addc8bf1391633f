"""A build's segmentation masks, each checked in its image's job: decoded losslessly, the image's size.

A mask pairs with its image as the image is shown (upright: its EXIF orientation applied). One that
cannot be read, or whose size differs from its image's, makes the job fail with a
:class:`gpuload.DecodeError` naming the image, both sizes and what to do: the build skips that image
and lists it, as one it cannot decode (``strict`` stops there).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import DecodeError
from ..format.masks import decode_mask
from ..text import image_size

__all__ = ["Masks", "checked_masks"]

# A sample's masks as the job gets them: (field name, the mask's bytes, why it could not be read or None).
Masks = list[tuple[str, bytes, str | None]]


def checked_masks(path: str | os.PathLike, size: tuple[int, int], masks: Masks) -> list[np.ndarray]:
    """The class ids (uint8 ``[H, W]``) of the masks of the image at ``path``, whose ``(height, width)`` is ``size``.

    Raises:
        DecodeError: a mask is unreadable, not an 8-bit PNG of class ids, or of another size (named by the image).

    Example:
        >>> checked_masks("a.jpg", (2, 3), [("mask", b"", "its mask a.png ('mask') cannot be read (No such file)")])
        Traceback (most recent call last):
          ...
        gpuload.errors.DecodeError: a.jpg: its mask a.png ('mask') cannot be read (No such file)
    """
    found = []
    for name, data, unreadable in masks:
        if unreadable is not None:
            raise DecodeError(path, unreadable)
        try:
            ids = decode_mask(data, name)
        except DecodeError as error:
            raise DecodeError(path, f"its mask {name!r} is {error.reason}") from None
        if ids.shape != tuple(size):
            raise DecodeError(
                path,
                f"its mask {name!r} is {image_size(*ids.shape)} where the image is {image_size(*size)} (width x "
                "height); give each image a mask of its own size",
            )
        found.append(ids)
    return found
