"""RandomErasing on a batch: each sample its own rectangle, drawn as torchvision's ``RandomErasing`` draws it.

The draws of every sample (whether it is erased, ten attempts at an area and an aspect ratio, the
position) are made at once on the batch's device, and the first attempt that fits is chosen by a
comparison, so there is no host synchronisation and ``torch.compile(fullgraph=True)`` traces it whole.
The rectangle is filled as torchvision's fills it: with one value, a value per channel, or (``"random"``)
standard normal noise per pixel, which is meant for a batch already normalised (torchvision's reference
recipe erases after ``Normalize``, where 0 is the mean colour).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ..errors import UsageError
from .augment import _traced
from .checks import check_probability, is_number
from .draws import uniforms

__all__ = ["RandomErasing"]

_ATTEMPTS = 10  # torchvision's RandomErasing tries 10 rectangles, then leaves the image as it is


class RandomErasing(nn.Module):
    """torchvision's ``RandomErasing`` for each sample of a batch ``[B, C, H, W]`` (uint8 or float).

    With probability ``p`` a sample gets a rectangle of ``scale`` of its area (uniform) and an aspect ratio
    in ``ratio`` (log-uniform), filled with ``value``; a sample whose ten attempts do not fit is left as it is.

    Args:
        p: the probability that a sample is erased (torchvision's reference recipe: 0.1; timm's: 0.25).
        scale: the range of the rectangle's share of the image's area.
        ratio: the range of its aspect ratio (height / width).
        value: the fill: a number, one per channel, or ``"random"`` (standard normal noise per pixel, for a
            float batch: after :class:`gpuload.Normalize`).

    Example:
        >>> erase = RandomErasing(p=1.0, value=7)
        >>> out = erase(torch.zeros((4, 3, 32, 32), dtype=torch.uint8), generator=torch.Generator().manual_seed(0))
        >>> sorted(out.unique().tolist()), out.shape
        ([0, 7], torch.Size([4, 3, 32, 32]))
    """

    draws = 1 + 2 * _ATTEMPTS + 2  # whether; (area, ratio) per attempt; (top, left)

    def __init__(
        self,
        p: float = 0.5,
        scale: tuple[float, float] = (0.02, 0.33),
        ratio: tuple[float, float] = (0.3, 3.3),
        value: float | Sequence[float] | str = 0.0,
    ) -> None:
        super().__init__()
        p = check_probability("p", p)
        if not _pair(scale) or not 0 <= scale[0] <= scale[1] <= 1:
            raise UsageError(f"scale must be (low, high) with 0 <= low <= high <= 1, got {scale!r}")
        if not _pair(ratio) or not 0 < ratio[0] <= ratio[1]:
            raise UsageError(f"ratio must be (low, high) with 0 < low <= high, got {ratio!r}")
        if isinstance(value, str):
            if value != "random":
                raise UsageError(f"value must be a number, one per channel, or 'random', got {value!r}")
            fill = None
        elif is_number(value):
            fill = (float(value),)
        elif isinstance(value, Sequence) and value and all(is_number(v) for v in value):
            fill = tuple(float(v) for v in value)
        else:
            raise UsageError(f"value must be a number, one per channel, or 'random', got {value!r}")
        self.p, self.scale, self.ratio, self.value, self.fill = p, tuple(scale), tuple(ratio), value, fill

    def forward(
        self,
        images: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        uniform: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Erase a rectangle of each sample drawn to be erased (in ``train()`` mode; ``eval()`` returns the batch).

        Args:
            generator: draws from this generator (on the images' device) instead of torch's.
            uniform: ``[B, draws]`` uniforms to use instead of drawing (the noise of ``"random"`` still
                comes from ``generator``).
        """
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            got = list(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise UsageError(f"expected a batch of images [B, C, H, W], got {got}")
        batch, channels, height, width = images.shape
        if self.fill is not None and len(self.fill) not in (1, channels):
            raise UsageError(f"value must be one number or {channels} (one per channel), got {self.value!r}")
        if self.fill is None and not images.is_floating_point():
            raise UsageError(
                f"value='random' fills with normal noise, for a float batch (after gpuload.Normalize), got {images.dtype}"
            )
        if self.fill is not None and not images.is_floating_point():
            info = torch.iinfo(images.dtype)
            if any(value != int(value) or not info.min <= value <= info.max for value in self.fill):
                raise UsageError(
                    f"value={self.value!r} does not fit a {images.dtype} batch (integers {info.min} to {info.max}); "
                    "erase after gpuload.Normalize (a float batch), or give a value that fits"
                )
        if not self.training:
            return images
        draws = uniforms(batch, self.draws, device=images.device, generator=generator, uniform=uniform)
        boxes = self.boxes(draws, height, width)
        if images.device.type == "cpu" and not _traced():  # eager on a CPU: write the erased rectangles only
            return self._erase_each(images, boxes.tolist(), generator)
        top, left, rows, columns = boxes.unbind(1)
        ys = torch.arange(height, device=images.device).view(1, height, 1)
        xs = torch.arange(width, device=images.device).view(1, 1, width)
        inside = (ys >= top.view(-1, 1, 1)) & (ys < (top + rows).view(-1, 1, 1))
        inside = inside & (xs >= left.view(-1, 1, 1)) & (xs < (left + columns).view(-1, 1, 1))
        inside = inside.unsqueeze(1)
        if self.fill is None:
            if generator is None:
                noise = torch.randn(images.shape, device=images.device, dtype=images.dtype)
            else:
                noise = torch.randn(images.shape, device=images.device, dtype=images.dtype, generator=generator)
            return torch.where(inside, noise, images)
        fill = torch.tensor(self.fill, device=images.device).view(1, -1, 1, 1).to(images.dtype)
        return torch.where(inside, fill, images)

    def _erase_each(
        self, images: torch.Tensor, boxes: list[list[int]], generator: torch.Generator | None
    ) -> torch.Tensor:
        """The batch with each sample's rectangle filled, sample by sample (a copy where one is erased)."""
        erased = [(sample, box) for sample, box in enumerate(boxes) if box[2] > 0]
        if not erased:
            return images
        out = images.clone()
        for sample, (top, left, rows, columns) in erased:
            area = out[sample, :, top : top + rows, left : left + columns]
            if self.fill is None:
                area.copy_(torch.randn(area.shape, dtype=images.dtype, generator=generator))
            else:
                area.copy_(torch.tensor(self.fill, dtype=images.dtype).view(-1, 1, 1).expand_as(area))
        return out

    def boxes(self, draws: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Each sample's rectangle from its ``[B, draws]`` uniforms: int64 ``[B, 4]``, ``top, left, height,
        width``; ``0, 0, 0, 0`` for a sample left as it is (not drawn, or no attempt fitted)."""
        draws = draws.to(torch.float64)
        erased = draws[:, 0] < self.p  # torchvision: torch.rand(1) >= p leaves the image
        attempts = draws[:, 1 : 1 + 2 * _ATTEMPTS].view(-1, _ATTEMPTS, 2)
        area = height * width * (self.scale[0] + (self.scale[1] - self.scale[0]) * attempts[..., 0])
        low, high = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = torch.exp(low + (high - low) * attempts[..., 1])
        rows, columns = torch.round(torch.sqrt(area * aspect)), torch.round(torch.sqrt(area / aspect))
        fits = (rows < height) & (columns < width)
        first = fits.to(torch.int8).argmax(dim=1, keepdim=True)  # the first attempt that fits
        erased = erased & fits.any(dim=1)
        rows = torch.where(erased, rows.gather(1, first).squeeze(1), 0).to(torch.int64)
        columns = torch.where(erased, columns.gather(1, first).squeeze(1), 0).to(torch.int64)
        top = torch.floor(draws[:, -2] * (height - rows + 1)).to(torch.int64)
        left = torch.floor(draws[:, -1] * (width - columns + 1)).to(torch.int64)
        top = torch.minimum(top, height - rows)  # a uniform rounded up to 1.0 in float32 stays inside
        left = torch.minimum(left, width - columns)
        return torch.stack([torch.where(erased, top, 0), torch.where(erased, left, 0), rows, columns], dim=1)

    def extra_repr(self) -> str:
        return f"p={self.p}, scale={self.scale}, ratio={self.ratio}, value={self.value!r}"


def _pair(value: object) -> bool:
    return isinstance(value, Sequence) and len(value) == 2 and all(is_number(v) for v in value)
