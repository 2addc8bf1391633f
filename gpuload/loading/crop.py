"""Crops at decode time, for jpeg datasets: each image decoded only as large as its crop needs.

``gpuload.DataLoader(jpeg_dataset, decode=RandomResizedCropDecode(224))`` decodes every sample of a
batch in the loader's threads: libjpeg-turbo (simplejpeg, which releases the GIL) decodes at the
smallest DCT scale (1/8, 1/4, 1/2 or 1) at which the sample's crop box is still at least as large
as the output, the box is cut out and resized (torch's antialiased bilinear uint8 resize), flipped
when drawn so, and written into the batch's pinned buffer: fixed-size uint8 ``[B, 3, S, S]``
batches that go to the device exactly as raw batches do.

The random boxes and flips are a pure function of (seed, epoch, sample index), by a counter-based
hash (splitmix64): an epoch is the same whatever the thread scheduling, and a resumed epoch
replays it exactly. Their distribution is torchvision's ``RandomResizedCrop`` (the same code as
:class:`gpuload.RandomResizedCrop`, :func:`gpuload.transforms.augment.resized_crop_boxes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ..errors import UsageError
from ..store.dataset import MemmapImageDataset, decode_stored
from ..transforms.augment import CROP_DRAWS, _check_range, _check_size, resized_crop_boxes

__all__ = ["CenterCropDecode", "RandomResizedCropDecode", "counter_uniforms", "decode_crops"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class RandomResizedCropDecode:
    """Decode each image of a jpeg dataset already cropped: a random resized crop (torchvision's
    distribution), optionally mirrored, for training.

    Args:
        size: output side, or ``(height, width)``.
        scale: range of the box's area, as a fraction of the image's.
        ratio: range of the box's aspect ratio (width / height).
        flip: mirror each sample left-right with probability 1/2.
        fast: libjpeg-turbo's fast integer DCT and fast upsampling: faster, with pixels that differ
            slightly from the accurate decode (measured in ``experiments/jpeg_store.py``).

    Example:
        >>> decode = RandomResizedCropDecode(224)
        >>> boxes, flips = decode.boxes(torch.tensor([[480, 640], [300, 200]]), torch.tensor([0, 1]), seed=0, epoch=0)
        >>> boxes.shape, flips.shape
        (torch.Size([2, 4]), torch.Size([2]))
    """

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        *,
        flip: bool = True,
        fast: bool = True,
    ) -> None:
        self.size = _check_size(size)
        self.scale = _check_range("scale", scale, low=0.0, high=1.0)
        self.ratio = _check_range("ratio", ratio, low=0.0, high=math.inf)
        if not isinstance(flip, bool) or not isinstance(fast, bool):
            raise UsageError(f"flip and fast must be bools, got {flip!r} and {fast!r}")
        self.flip, self.fast = flip, fast
        self.dct_scaling = True

    def boxes(
        self, shapes: torch.Tensor, indices: torch.Tensor, *, seed: int, epoch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The crop box (``top, left, height, width``) and flip of each sample, from its image's
        ``(height, width)`` and its index: the same for the same (seed, epoch, index)."""
        uniform = counter_uniforms(seed, epoch, indices, 2 * CROP_DRAWS + 1)
        draws = uniform[:, : 2 * CROP_DRAWS].reshape(len(indices), CROP_DRAWS, 2)
        boxes = resized_crop_boxes(draws, shapes[:, 0], shapes[:, 1], self.scale, self.ratio)
        flips = uniform[:, -1] < 0.5 if self.flip else torch.zeros(len(indices), dtype=torch.bool)
        return boxes, flips

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio}, flip={self.flip}, fast={self.fast})"


class CenterCropDecode:
    """Decode each image of a jpeg dataset already cropped for evaluation: the shorter side resized
    to ``round(size / ratio)`` (256 for 224) and the centre cut out, as torchvision's ``Resize(256)``
    + ``CenterCrop(224)``; decoded exactly (accurate DCT, full scale).

    Example:
        >>> boxes, flips = CenterCropDecode(224).boxes(torch.tensor([[480, 640]]), torch.tensor([0]), seed=0, epoch=0)
        >>> boxes.tolist(), flips.tolist()
        ([[30.0, 110.0, 420.0, 420.0]], [False])
    """

    def __init__(self, size: int | Sequence[int], *, ratio: float = 224 / 256) -> None:
        self.size = _check_size(size)
        if not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise UsageError(f"ratio must be in (0, 1], got {ratio!r}")
        self.ratio, self.fast, self.dct_scaling = float(ratio), False, False

    def boxes(
        self, shapes: torch.Tensor, indices: torch.Tensor, *, seed: int, epoch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The centre box of each image in its own pixels: what the resize + centre crop keeps."""
        height, width = shapes[:, 0].double(), shapes[:, 1].double()
        scale = round(min(self.size) / self.ratio) / torch.minimum(height, width)  # the Resize's scale
        box_height, box_width = torch.round(self.size[0] / scale), torch.round(self.size[1] / scale)
        box_height, box_width = torch.minimum(box_height, height), torch.minimum(box_width, width)
        top, left = torch.floor((height - box_height) / 2), torch.floor((width - box_width) / 2)
        return torch.stack([top, left, box_height, box_width], dim=1).float(), torch.zeros(
            len(indices), dtype=torch.bool
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, ratio={self.ratio:.4f})"


def decode_crops(
    dataset: MemmapImageDataset,
    indices: torch.Tensor,
    out: torch.Tensor,
    decode: RandomResizedCropDecode | CenterCropDecode,
    *,
    seed: int,
    epoch: int,
) -> None:
    """Decode the images ``indices`` of a jpeg dataset, each cropped as ``decode`` says, into ``out``
    (uint8 ``[len(indices), 3, S, S]``).

    Raises:
        DatasetError: an image's bytes fail their checksum or do not decode (named, with its source).
    """
    shapes = dataset.data.shapes[indices]
    boxes, flips = decode.boxes(shapes, indices, seed=seed, epoch=epoch)
    for row, (index, shape, box, flip) in enumerate(
        zip(indices.tolist(), shapes.tolist(), boxes.tolist(), flips.tolist())
    ):
        out[row].copy_(_decode_crop(dataset, index, shape, box, flip, decode))


def _decode_crop(
    dataset: MemmapImageDataset,
    index: int,
    shape: list[int],
    box: list[float],
    flip: bool,
    decode: RandomResizedCropDecode | CenterCropDecode,
) -> torch.Tensor:
    """One image: decoded at the smallest DCT scale that keeps its box at least the output's size,
    the box cut out, resized and maybe mirrored; ``[3, S, S]``."""
    (height, width), (top, left, box_height, box_width) = shape, box
    out_height, out_width = decode.size
    denominator = 1
    if decode.dct_scaling:
        denominator = next((d for d in (8, 4, 2) if box_height >= d * out_height and box_width >= d * out_width), 1)
    pixels = decode_stored(
        dataset.read_jpeg(index),
        dataset,
        index,
        fastdct=decode.fast,
        fastupsample=decode.fast,
        min_height=-(-height // denominator),
        min_width=-(-width // denominator),
    )
    scale_y, scale_x = pixels.shape[0] / height, pixels.shape[1] / width
    y0, x0 = int(top * scale_y), int(left * scale_x)
    y1 = max(y0 + 1, min(pixels.shape[0], round((top + box_height) * scale_y)))
    x1 = max(x0 + 1, min(pixels.shape[1], round((left + box_width) * scale_x)))
    crop = torch.from_numpy(pixels)[y0:y1, x0:x1].permute(2, 0, 1)[None]
    resized = torch.nn.functional.interpolate(crop, size=decode.size, mode="bilinear", antialias=True)[0]
    return resized.flip(-1) if flip else resized


def counter_uniforms(seed: int, epoch: int, indices: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` uniform floats in [0, 1) per index, a pure function of (seed, epoch, index).

    A counter-based generator: splitmix64 of a key made from the seed and the epoch, mixed with
    each (index, draw) counter; no state, so any sample can be drawn in any order or thread.

    Example:
        >>> first = counter_uniforms(7, 0, torch.tensor([3, 5]), 4)
        >>> bool(torch.equal(first[1], counter_uniforms(7, 0, torch.tensor([5]), 4)[0])), first.shape
        (True, torch.Size([2, 4]))
    """
    with np.errstate(over="ignore"):
        key = _splitmix64(_splitmix64(np.uint64(seed % 2**64)) ^ np.uint64(epoch % 2**64))
        counters = np.asarray(indices, dtype=np.uint64)[:, None] * np.uint64(count) + np.arange(count, dtype=np.uint64)
        bits = _splitmix64(key ^ _splitmix64(counters))
    return torch.from_numpy((bits >> np.uint64(11)).astype(np.float64) * 2.0**-53)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
