"""``gpuload.Normalize``: uint8 images to normalised floats as the model's first layer."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["Normalize", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Normalize(nn.Module):
    """``(x / 255 - mean) / std`` for uint8 (or 0..255 float) ``[B, C, H, W]`` images (or one ``[C, H, W]``), in one pass.

    The scale ``1 / (255 std)`` and shift ``-mean / std`` are folded into two buffers, so the
    forward is a single ``addcmul`` that reads the uint8 input and writes the output once
    (on CUDA, one elementwise kernel that casts as it reads). The output dtype is the module's:
    ``.half()`` makes it emit float16. Put it first in the model, so the cast runs on the GPU
    and is part of an exported ONNX graph: ``nn.Sequential(Normalize(mean, std), model)``.

    Args:
        mean: per-channel mean, on the 0..1 scale.
        std: per-channel standard deviation, on the 0..1 scale.
        memory_format: ``torch.channels_last`` to emit channels-last output (what convolution
            kernels with tensor cores prefer); the default keeps the input's layout.

    Example:
        >>> normalize = Normalize(IMAGENET_MEAN, IMAGENET_STD)
        >>> out = normalize(torch.full((1, 3, 2, 2), 255, dtype=torch.uint8))
        >>> out.dtype, round(out[0, 0, 0, 0].item(), 4)
        (torch.float32, 2.2489)
    """

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        *,
        memory_format: torch.memory_format = torch.preserve_format,
    ) -> None:
        super().__init__()
        mean_t = torch.as_tensor(mean, dtype=torch.float64)
        std_t = torch.as_tensor(std, dtype=torch.float64)
        if mean_t.ndim != 1 or mean_t.shape != std_t.shape:
            raise ValueError(
                f"mean and std must be 1-D and the same length, got {list(mean_t.shape)} and {list(std_t.shape)}"
            )
        if not bool((std_t > 0).all()):
            raise ValueError(f"std must be positive, got {std_t.tolist()}")
        if memory_format not in (torch.preserve_format, torch.contiguous_format, torch.channels_last):
            raise ValueError(
                f"memory_format must be preserve_format, contiguous_format or channels_last, got {memory_format}"
            )
        self.memory_format = memory_format
        self.mean, self.std = mean_t.tolist(), std_t.tolist()
        shape = (1, -1, 1, 1)
        self.register_buffer("scale", (1 / (255 * std_t)).float().view(shape))
        self.register_buffer("shift", (-mean_t / std_t).float().view(shape))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        images = self._in_layout(images)
        if images.is_floating_point() and images.dtype != self.scale.dtype:
            images = images.to(self.scale.dtype)  # uint8 needs no cast: addcmul promotes it as it reads
        if images.dim() == 3:  # one image
            return torch.addcmul(self.shift[0], images, self.scale[0])
        return torch.addcmul(self.shift, images, self.scale)

    def _in_layout(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` in the output's memory format, on the uint8 (1 byte a value); one ``[3, H, W]``
        image stays 3-D, as torchvision's ``Normalize`` takes it, but has no channels-last layout.
        Any other shape is refused: broadcasting would quietly turn ``[H, W]`` or ``[B, 1, H, W]`` into
        three channels."""
        channels = len(self.mean)
        if images.dim() not in (3, 4) or images.shape[-3] != channels:
            raise ValueError(
                f"Normalize with {channels} channels takes a batch [N, {channels}, H, W] or one image "
                f"[{channels}, H, W], got shape {tuple(images.shape)}; a channels-last batch is [N, {channels}, H, W] "
                "with channels-last strides (x.permute(0, 3, 1, 2) of [N, H, W, C])"
            )
        if self.memory_format is torch.preserve_format:
            return images
        if images.dim() != 4 and self.memory_format is torch.channels_last:
            raise ValueError(
                f"Normalize(memory_format={self.memory_format}) takes a batch [N, 3, H, W], got shape "
                f"{tuple(images.shape)}; pass images[None] for one image, or memory_format=torch.preserve_format"
            )
        return images.contiguous(memory_format=self.memory_format)

    def extra_repr(self) -> str:
        return f"mean={self.mean}, std={self.std}"
