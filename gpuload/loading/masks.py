"""Masks cropped in the loader's threads with their images' boxes and flips, by nearest neighbour.

A loader with ``decode=`` crops each image in its threads; each mask field of the dataset is cropped
with the same box and flip, drawn again from the same (seed, epoch, index) (the draws are a pure
function of them), into a buffer of the ring ``[B, *decode.size]``. Where a jpeg image is decoded
at a reduced DCT scale, its box moves onto that scale's pixel grid, and so does its mask's.
"""

from __future__ import annotations

import torch

from ..transforms.augment import box_geometry
from ..transforms.masks import crop_masks
from .crop import CenterCropDecode, RandomResizedCropDecode, resample_params

__all__ = ["MaskCrop"]


class MaskCrop:
    """The crop of one epoch's masks.

    Args:
        decode: the loader's ``decode``.
        seed, epoch: the loader's seed and the epoch, which draw the boxes and flips.
        scaled: the images are jpeg decoded on the host, each at the DCT scale of its box.

    Example:
        >>> crop = MaskCrop(RandomResizedCropDecode(4), seed=0, epoch=0, scaled=False)
        >>> masks = [torch.zeros((12, 16), dtype=torch.uint8)] * 2
        >>> out = torch.empty((2, 4, 4), dtype=torch.uint8)
        >>> crop(masks, torch.tensor([5, 9]), out)
        >>> out.shape
        torch.Size([2, 4, 4])
    """

    def __init__(
        self, decode: RandomResizedCropDecode | CenterCropDecode, *, seed: int, epoch: int, scaled: bool
    ) -> None:
        self.decode, self.seed, self.epoch = decode, seed, epoch
        self.scaled = scaled and isinstance(decode, RandomResizedCropDecode)

    def __call__(self, masks: list[torch.Tensor] | torch.Tensor, indices: torch.Tensor, out: torch.Tensor) -> None:
        """Crop ``masks`` (each ``[H, W]``, its image's size; a raw dataset's ``[B, H, W]``) of the images
        ``indices`` into ``out`` (``[B, *decode.size]``)."""
        size = tuple(out.shape[1:])
        if isinstance(masks, torch.Tensor):  # a raw dataset's: one size, cropped in one call
            shapes = torch.tensor([tuple(masks.shape[1:])], dtype=torch.int64).expand(len(indices), 2)
            params = resample_params(self.decode, shapes, indices, self.seed, self.epoch).double()
            out.copy_(crop_masks(masks, params[:, :9], size))
            return
        shapes = torch.tensor([tuple(mask.shape) for mask in masks], dtype=torch.int64).reshape(-1, 2)
        params = resample_params(self.decode, shapes, indices, self.seed, self.epoch).double()
        if self.scaled:
            for row, shape in enumerate(shapes.tolist()):
                top, _, _, bottom, left, _, _, right = params[row, :8].tolist()
                d, (y0, y1), (x0, x1) = self.decode.scaled_box(shape, [top, left, bottom - top, right - left])
                box = torch.tensor([[y0 * d, x0 * d, (y1 - y0) * d, (x1 - x0) * d]], dtype=torch.float64)
                params[row, :8] = box_geometry(box, self.decode.size)[0]
        for row, mask in enumerate(masks):
            out[row] = crop_masks(mask[None], params[row : row + 1, :9], size)[0]
