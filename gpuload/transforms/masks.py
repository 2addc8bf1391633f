"""Segmentation masks resampled by nearest neighbour along the geometry of their images' crops.

An image's crop (a random resized crop, an evaluation resize and centre cut, a flip) resamples each
output pixel at a centre in the input, ``start + (o + 0.5) * step`` along each side (the convention of
:func:`gpuload.transforms.augment.interpolation_weights`); its mask takes the class id of the pixel
under that centre, and :data:`~gpuload.format.fields.MASK_FILL` where the centre falls outside
``[low, high)`` (an evaluation crop wider than its image). Class ids are never blended.
"""

from __future__ import annotations

import torch

from ..errors import UsageError
from ..format.fields import MASK_FILL

__all__ = ["PARAMS", "check_masks", "crop_masks"]

# Per sample, the geometry of a crop: start, step, low, high along the rows, the same along the
# columns, and whether it is mirrored left-right (1 or 0).
PARAMS = 9


def check_masks(masks: object, images: torch.Tensor) -> None:
    """Refuse, in one line, masks that are not ``[B, H, W]`` or ``[B, 1, H, W]`` beside ``images`` ``[B, C, H, W]``.

    Example:
        >>> check_masks(torch.zeros(2, 1, 4, 5), torch.zeros(2, 3, 4, 5))  # fine: nothing said
    """
    batch, height, width = images.shape[0], images.shape[-2], images.shape[-1]
    if (
        not isinstance(masks, torch.Tensor)
        or masks.dim() not in (3, 4)
        or masks.shape[0] != batch
        or masks.shape[-2:] != (height, width)
        or (masks.dim() == 4 and masks.shape[1] != 1)
    ):
        got = list(masks.shape) if isinstance(masks, torch.Tensor) else type(masks).__name__
        raise UsageError(f"masks must be [B, H, W] or [B, 1, H, W] beside images {list(images.shape)}, got {got}")


def crop_masks(
    masks: torch.Tensor, params: torch.Tensor, size: tuple[int, int], *, fill: int = MASK_FILL
) -> torch.Tensor:
    """Masks ``[B, H, W]`` (integer class ids) resampled by nearest neighbour to ``[B, *size]`` along
    ``params`` (``[B, 9]``, see :data:`PARAMS`).

    Example:
        >>> masks = torch.arange(16, dtype=torch.uint8).reshape(1, 4, 4)
        >>> whole_flipped = torch.tensor([[0.0, 2.0, 0.0, 4.0, 0.0, 2.0, 0.0, 4.0, 1.0]])
        >>> crop_masks(masks, whole_flipped, (2, 2)).tolist()
        [[[7, 5], [15, 13]]]
    """
    batch, height, width = masks.shape
    params = params.to(device=masks.device, dtype=torch.float64)
    rows, rows_in = _nearest(params[:, 0:4], size[0], height)
    columns, columns_in = _nearest(params[:, 4:8], size[1], width)
    mirrored = params[:, 8:9] > 0.5
    columns, columns_in = (torch.where(mirrored, flipped.flip(1), flipped) for flipped in (columns, columns_in))
    picked = masks[torch.arange(batch, device=masks.device)[:, None, None], rows[:, :, None], columns[:, None, :]]
    inside = rows_in[:, :, None] & columns_in[:, None, :]
    return torch.where(inside, picked, torch.full_like(picked, fill))


def _nearest(side: torch.Tensor, out_size: int, in_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The input pixel under each output pixel's centre along one side (``side``: ``[B, 4]`` start, step,
    low, high), clamped into the input, and whether the centre lies in ``[low, high)``."""
    start, step, low, high = side.unbind(1)
    centres = start[:, None] + (torch.arange(out_size, device=side.device, dtype=side.dtype) + 0.5) * step[:, None]
    inside = (centres >= low[:, None]) & (centres < high[:, None])
    return centres.floor().clamp(0, in_size - 1).long(), inside
