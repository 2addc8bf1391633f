"""Per-sample augmentation of whole uint8 batches on the device: resized crop, flip, colour jitter, fused.

Every sample gets its own random crop box, flip and jitter factors, drawn on the batch's device with
no host synchronisation. On a GPU (and wherever the module is compiled or exported), the crop, the
antialiased resize and the flip of a whole batch are two batched matrix products with per-sample
interpolation matrices (``Wy [B, S, H]`` and ``Wx [B, S, W]``, whose rows hold each output pixel's
antialiased bilinear taps inside its sample's box; a flip reverses the rows of ``Wx``), meant for
tensor cores in half precision. On a CPU that resampler is several times slower than torch's own
antialiased resize, so an eager CPU batch is cropped and resized one sample at a time by
``torch.nn.functional.interpolate`` (its vectorised uint8 path, as torchvision's ``resized_crop``)
from the same draws. The jitter is elementwise, so ``torch.compile`` fuses it with the cast and a
following :class:`gpuload.Normalize` into the kernel that writes the output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ..errors import UsageError
from .draws import uniforms
from .masks import PARAMS, check_masks, crop_masks

__all__ = [
    "CROP_DRAWS",
    "RandomResizedCrop",
    "box_geometry",
    "centre_offset",
    "centre_window",
    "interpolation_weights",
    "resized_crop_boxes",
    "resized_crop_params",
    "resized_size",
]

_ATTEMPTS = 10  # torchvision's RandomResizedCrop.get_params tries 10 boxes, then falls back to a centre crop
CROP_DRAWS = _ATTEMPTS + 1  # pairs of uniform draws per box: (area, aspect) per attempt, then (top, left)
_BOX_DRAWS = 2 * CROP_DRAWS  # a box's uniforms in RandomResizedCrop's draws, before the flip's and the jitter's
_GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


def resized_crop_params(
    batch: int,
    height: int,
    width: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    *,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One random crop box per sample, distributed as torchvision's ``RandomResizedCrop.get_params``.

    All samples and attempts are drawn at once on ``device``, with no host synchronisation; see
    :func:`resized_crop_boxes`.

    Returns:
        float32 ``[batch, 4]``: ``top, left, height, width`` of each box, whole numbers.

    Example:
        >>> boxes = resized_crop_params(4, 480, 640, generator=torch.Generator().manual_seed(0))
        >>> boxes.shape, bool(((boxes[:, 0] + boxes[:, 2]) <= 480).all())
        (torch.Size([4, 4]), True)
    """
    return resized_crop_boxes(_rand((batch, CROP_DRAWS, 2), device, generator), height, width, scale, ratio)


def resized_crop_boxes(
    uniform: torch.Tensor,
    height: int | torch.Tensor,
    width: int | torch.Tensor,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> torch.Tensor:
    """torchvision's ``RandomResizedCrop.get_params`` for a batch, from uniform draws ``[B, 11, 2]`` in [0, 1).

    For each sample, up to 10 attempts take an area fraction uniformly from ``scale`` and a log
    aspect ratio uniformly from ``log(ratio)``; the first box that fits the image is placed with the
    last pair of draws, and when none fits the box is the largest centre crop within ``ratio``.
    ``height`` and ``width`` are the image's, or one per sample (``[B]``).

    Returns:
        float32 ``[B, 4]``: ``top, left, height, width`` of each box, whole numbers.
    """
    if isinstance(height, torch.Tensor):  # one size per sample: a column, against the attempts' rows
        height, width = height[:, None].to(uniform.dtype), width[:, None].to(uniform.dtype)
    area = height * width * (scale[0] + (scale[1] - scale[0]) * uniform[:, :_ATTEMPTS, 0])
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_low + (log_high - log_low) * uniform[:, :_ATTEMPTS, 1])
    box_width = torch.round(torch.sqrt(area * aspect))
    box_height = torch.round(torch.sqrt(area / aspect))
    fits = (box_width > 0) & (box_width <= width) & (box_height > 0) & (box_height <= height)
    first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first attempt that fits
    found = fits.any(dim=1, keepdim=True)
    fallback_height, fallback_width = _centre_crop_size(height, width, ratio)
    box_height = torch.where(found, box_height.gather(1, first), fallback_height)
    box_width = torch.where(found, box_width.gather(1, first), fallback_width)
    place = uniform[:, _ATTEMPTS:, :]
    top = torch.where(
        found, torch.floor(place[..., 0] * (height - box_height + 1)), torch.floor((height - box_height) / 2)
    )
    left = torch.where(
        found, torch.floor(place[..., 1] * (width - box_width + 1)), torch.floor((width - box_width) / 2)
    )
    return torch.cat([top, left, box_height, box_width], dim=1)


def _rand(shape: tuple, device: torch.device | str, generator: torch.Generator | None) -> torch.Tensor:
    """``torch.rand``, passing ``generator`` only when there is one: torch.compile with a dynamic batch
    size fails on an explicit ``generator=None`` (torch 2.14: "SymIntArrayRef expected to contain only
    concrete integers")."""
    if generator is None:
        return torch.rand(shape, device=device)
    return torch.rand(shape, device=device, generator=generator)


def _centre_crop_size(height, width, ratio: tuple[float, float]) -> tuple:
    """torchvision's fallback: the whole image, narrowed to the nearest aspect ratio in ``ratio``
    (ints, or tensors of one size per sample)."""
    low, high = min(ratio), max(ratio)
    if not isinstance(height, torch.Tensor):
        if width / height < low:
            return min(height, max(1, round(width / low))), width
        if width / height > high:
            return height, min(width, max(1, round(height * high)))
        return height, width
    aspect = width / height
    return (  # at least one pixel: a ratio range far from the image's would round a side to 0
        torch.where(aspect < low, torch.round(width / low), height).clamp(min=1).minimum(height),
        torch.where(aspect > high, torch.round(height * high), width).clamp(min=1).minimum(width),
    )


def box_geometry(boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """float64 ``[B, 8]``: for boxes ``top, left, height, width`` resized to ``size``, the arguments of
    :func:`interpolation_weights` along the rows then the columns (start, step, low, high), as
    :func:`gpuload.transforms.masks.crop_masks` takes them too.

    Example:
        >>> box_geometry(torch.tensor([[1.0, 2.0, 4.0, 6.0]]), (2, 3)).tolist()
        [[1.0, 2.0, 1.0, 5.0, 2.0, 2.0, 2.0, 8.0]]
    """
    top, left, box_height, box_width = boxes.double().unbind(1)
    rows = (top, box_height / size[0], top, top + box_height)
    columns = (left, box_width / size[1], left, left + box_width)
    return torch.stack([*rows, *columns], dim=1)


def interpolation_weights(
    start: torch.Tensor, step: torch.Tensor, low: torch.Tensor, high: torch.Tensor, out_size: int, in_size: int
) -> torch.Tensor:
    """Antialiased bilinear resampling as a matrix per sample: ``[B, out_size, in_size]``, rows summing to 1.

    Output pixel ``o`` of sample ``b`` is centred at ``start + (o + 0.5) * step`` in input pixels; its
    taps are the triangle filter widened by ``max(step, 1)`` (antialiasing when shrinking), limited to
    input pixels ``low <= x < high`` and normalised: the resampling of Pillow and of
    ``torch.nn.functional.interpolate(..., antialias=True)``. An output pixel centred outside
    ``[low, high)`` gets a row of zeros. All arguments but the sizes are ``[B]``.

    Example:
        >>> one = torch.ones(1)
        >>> interpolation_weights(0 * one, 2 * one, 0 * one, 4 * one, out_size=2, in_size=4)
        tensor([[[0.4286, 0.4286, 0.1429, 0.0000],
                 [0.0000, 0.1429, 0.4286, 0.4286]]])
    """
    centres = start[:, None] + (torch.arange(out_size, device=start.device, dtype=start.dtype) + 0.5) * step[:, None]
    pixels = torch.arange(in_size, device=start.device, dtype=start.dtype) + 0.5
    support = torch.clamp(step, min=1.0)[:, None, None]
    taps = torch.clamp(1 - (pixels[None, None, :] - centres[:, :, None]).abs() / support, min=0)
    inside = (pixels[None, :] > low[:, None]) & (pixels[None, :] < high[:, None])
    # An output pixel centred outside the input (eval with a side larger than the resized image)
    # gets a row of zeros: the black border torchvision's CenterCrop pads with.
    within = (centres >= low[:, None]) & (centres < high[:, None])
    taps = taps * inside[:, None, :] * within[:, :, None]
    return taps / taps.sum(dim=2, keepdim=True).clamp(min=torch.finfo(taps.dtype).tiny)


class RandomResizedCrop(nn.Module):
    """Per-sample random resized crop, horizontal flip and colour jitter of a uint8 batch, fused.

    In ``train()`` mode each sample gets its own box (torchvision's ``RandomResizedCrop``
    distribution), flip and jitter factors, drawn on the input's device from torch's generator for
    that device, like dropout: ``torch.manual_seed`` makes a run reproducible (seed each rank
    differently). In ``eval()`` mode it is deterministic: the shorter side resized to
    ``round(size / eval_ratio)`` (256 for 224) and the centre cut out, as torchvision's
    ``Resize(256)`` + ``CenterCrop(224)``; this mode exports to ONNX. Downscaling is antialiased,
    and the output matches ``torchvision.transforms.v2.functional.resized_crop(..., antialias=True)``
    for the same boxes.

    Put it first in the model, before :class:`gpuload.Normalize`, and compile the whole:
    ``torch.compile(nn.Sequential(augment, Normalize(mean, std), model))`` has no graph break, and
    with a float ``dtype`` the jitter, cast and normalisation fuse into one kernel.

    Segmentation: ``augment(images, masks=masks)`` returns the images and their masks (integer class
    ids ``[B, H, W]`` or ``[B, 1, H, W]``) cropped, resized and flipped with the same boxes and flips,
    by nearest neighbour (:func:`gpuload.transforms.masks.crop_masks`; 255 where an ``eval()`` crop
    is wider than its image); the jitter touches the images only.

    Args:
        size: output side, or ``(height, width)``.
        scale: range of the box's area, as a fraction of the image's.
        ratio: range of the box's aspect ratio (width / height).
        flip: mirror each sample left-right with probability 1/2.
        brightness, contrast, saturation: torchvision ``ColorJitter`` strengths, applied in this
            fixed order with factors drawn uniformly from ``[max(0, 1 - v), 1 + v]`` (0: off).
        crop: ``False`` skips the crop and the resize in both modes (flip and jitter only, output at
            the input's size), for batches already cropped at decode time.
        dtype: output dtype: ``torch.uint8`` (rounded) or a float dtype on the 0..255 scale. The
            arithmetic runs in float32 on a CPU and float16 on a GPU at least, whatever the dtype.
        memory_format: of the output: ``torch.channels_last`` (the default: the layout of gpuload's
            batches and of convolutions on tensor cores), ``torch.contiguous_format`` (NCHW) or
            ``torch.preserve_format`` (the input's, where it is one of those two).
        eval_ratio: in ``eval()``, ``size`` over the side the image is first resized to.

    Example:
        >>> augment = RandomResizedCrop(8, flip=True, brightness=0.4)
        >>> images = torch.randint(0, 256, (2, 3, 24, 32), dtype=torch.uint8)
        >>> augment(images).shape, augment(images).dtype, augment.eval()(images).shape
        (torch.Size([2, 3, 8, 8]), torch.uint8, torch.Size([2, 3, 8, 8]))
        >>> _, masks = augment.train()(images, masks=torch.zeros((2, 24, 32), dtype=torch.uint8))
        >>> masks.shape
        torch.Size([2, 8, 8])
    """

    draws = _BOX_DRAWS + 1 + 3  # uniforms per sample: the box, the flip, the three jitter factors

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        *,
        flip: bool = False,
        brightness: float = 0.0,
        contrast: float = 0.0,
        saturation: float = 0.0,
        crop: bool = True,
        dtype: torch.dtype = torch.uint8,
        memory_format: torch.memory_format = torch.channels_last,
        eval_ratio: float = 224 / 256,
    ) -> None:
        super().__init__()
        self.size = check_size(size)
        self.scale = check_range("scale", scale, low=0.0, high=1.0)
        self.ratio = check_range("ratio", ratio, low=0.0, high=math.inf)
        for name, value in (("brightness", brightness), ("contrast", contrast), ("saturation", saturation)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
                raise UsageError(f"{name} must be a finite number >= 0 (0 turns it off), got {value!r}")
        if not isinstance(flip, bool) or not isinstance(crop, bool):
            raise UsageError(f"flip and crop must be bools, got {flip!r} and {crop!r}")
        if memory_format not in (torch.channels_last, torch.contiguous_format, torch.preserve_format):
            raise UsageError(
                f"memory_format must be torch.channels_last, torch.contiguous_format or torch.preserve_format, "
                f"got {memory_format!r}"
            )
        if dtype != torch.uint8 and not dtype.is_floating_point:
            raise UsageError(f"dtype must be torch.uint8 or a float dtype, got {dtype}")
        check_eval_ratio("eval_ratio", eval_ratio, self.size)
        self.flip, self.crop, self.dtype, self.memory_format, self.eval_ratio = (
            flip,
            crop,
            dtype,
            memory_format,
            eval_ratio,
        )
        self.jitter = (float(brightness), float(contrast), float(saturation))

    def forward(
        self,
        images: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        masks: torch.Tensor | None = None,
        uniform: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Augment ``images`` (uint8 or float ``[B, C, H, W]`` on the 0..255 scale), and ``masks`` with
        them where given (then returns both).

        ``generator`` (a generator on the images' device) replaces torch's default one: the loader
        passes one seeded by the epoch and the batch, so its batches do not depend on thread timing.
        ``uniform``: ``[B, draws]`` uniforms in [0, 1) to use instead of drawing (``loader.uniforms``):
        the box's 22, the flip's 1, the jitter's 3, in that order, each read where it is used.
        """
        _check_images(images, needs_rgb=self.training and any(self.jitter))
        batch, _, height, width = images.shape
        if masks is not None:
            check_masks(masks, images)
        compute = _compute_dtype(images)
        given = None if uniform is None else uniforms(batch, self.draws, device=images.device, uniform=uniform)
        boxes = flips = None
        if self.crop and self.training and given is None:
            boxes = resized_crop_params(
                batch, height, width, self.scale, self.ratio, device=images.device, generator=generator
            )
        elif self.crop and self.training:
            boxes = resized_crop_boxes(
                given[:, :_BOX_DRAWS].reshape(batch, CROP_DRAWS, 2), height, width, self.scale, self.ratio
            )
        if self.training and self.flip:
            coin = None if given is None else given[:, _BOX_DRAWS]
            flips = self._coin(batch, images.device, generator) if coin is None else (coin < 0.5)[:, None, None]
        if self.crop and images.device.type == "cpu" and not _traced():
            pixels = self._crop_each(images, boxes, flips, compute)
        elif self.crop:
            weights_y, weights_x = self._weights(boxes, height, width, images.device, batch)
            if flips is not None:
                weights_x = torch.where(flips, weights_x.flip(1), weights_x)
            pixels = resample(images.to(compute), weights_y.to(compute), weights_x.to(compute))
        elif flips is not None:
            pixels = torch.where(flips[:, None], images.to(compute).flip(3), images.to(compute))
        else:
            pixels = images
        if self.training and any(self.jitter):
            jitter = None if given is None else given[:, _BOX_DRAWS + 1 :].T
            pixels = _jitter(pixels.to(compute), self._factors(batch, images.device, generator, compute, jitter))
        out = self._output(
            pixels, _layout(images) if self.memory_format == torch.preserve_format else self.memory_format
        )
        if masks is None:
            return out
        size = self.size if self.crop else (height, width)
        params = self._mask_params(boxes, flips, batch, height, width, images.device)
        cropped = crop_masks(masks.reshape(batch, height, width), params, size)
        return out, cropped.reshape(*masks.shape[:-2], *size)

    def _mask_params(
        self,
        boxes: torch.Tensor | None,
        flips: torch.Tensor | None,
        batch: int,
        height: int,
        width: int,
        device: torch.device,
    ) -> torch.Tensor:
        """The geometry of each sample's crop (see :data:`gpuload.transforms.masks.PARAMS`) for its mask."""
        params = torch.zeros((batch, PARAMS), dtype=torch.float64, device=device)
        out_height, out_width = self.size
        if boxes is not None:
            params[:, :8] = box_geometry(boxes, self.size)
        else:  # eval: torchvision's Resize, then CenterCrop; or no crop (the image itself)
            resized = resized_size(height, width, self.size, self.eval_ratio) if self.crop else (height, width)
            step_y, step_x = height / resized[0], width / resized[1]
            top = centre_offset(resized[0], out_height) * step_y if self.crop else 0
            left = centre_offset(resized[1], out_width) * step_x if self.crop else 0
            # Python numbers filled on the device: a CPU tensor copied in would synchronise with the host
            for column, value in enumerate((top, step_y, 0, height, left, step_x, 0, width)):
                params[:, column] = value
        if flips is not None:
            params[:, 8] = flips.flatten().double()
        return params

    def _output(self, pixels: torch.Tensor, layout: torch.memory_format) -> torch.Tensor:
        """``pixels`` (0..255) cast to the output dtype, rounded for uint8, written once in ``layout``."""
        if pixels.dtype == self.dtype and pixels.is_contiguous(memory_format=layout):
            return pixels
        if self.dtype == torch.uint8 and pixels.is_floating_point():
            pixels = pixels.round().clamp_(0, 255)
        out = torch.empty(pixels.shape, dtype=self.dtype, device=pixels.device, memory_format=layout)
        return out.copy_(pixels)  # the cast and the layout in one pass

    def _crop_each(
        self, images: torch.Tensor, boxes: torch.Tensor | None, flips: torch.Tensor | None, compute: torch.dtype
    ) -> torch.Tensor:
        """The crop, resize and flip of an eager CPU batch, a sample at a time with torch's antialiased
        resize (uint8 in, uint8 out, as torchvision's ``resized_crop``), from the same draws as the
        batched resampler. ``eval()`` (no ``boxes``): the whole batch resized at once, then its centre."""
        batch, _, height, width = images.shape
        pixels = images if images.dtype == torch.uint8 else images.to(compute)
        pixels = pixels.contiguous(memory_format=torch.channels_last)
        if boxes is None:
            return _centre(_resize(pixels, resized_size(height, width, self.size, self.eval_ratio)), self.size)
        boxes = boxes.tolist()
        flips = flips.flatten().tolist() if flips is not None else [False] * batch
        out = torch.empty((batch, pixels.shape[1], *self.size), dtype=pixels.dtype)
        out = out.contiguous(memory_format=torch.channels_last)

        for row, ((top, left, box_height, box_width), flip) in enumerate(zip(boxes, flips)):
            box = pixels[row : row + 1, :, int(top) : int(top + box_height), int(left) : int(left + box_width)]
            resized = _resize(box.contiguous(memory_format=torch.channels_last), self.size)[0]  # on torch's threads
            out[row] = resized.flip(-1) if flip else resized
        return out

    def _weights(
        self, boxes: torch.Tensor | None, height: int, width: int, device: torch.device, batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out_height, out_width = self.size
        if boxes is not None:
            top, left, box_height, box_width = boxes.unbind(1)
            return (
                interpolation_weights(top, box_height / out_height, top, top + box_height, out_height, height),
                interpolation_weights(left, box_width / out_width, left, left + box_width, out_width, width),
            )
        return self._eval_weights(height, width, device, batch)

    def _eval_weights(self, height: int, width: int, device: torch.device, batch: int) -> tuple[torch.Tensor, ...]:
        """Resize the shorter side to ``round(size / eval_ratio)`` (torchvision ``Resize``), then take the centre."""
        out_height, out_width = self.size
        resized = resized_size(height, width, self.size, self.eval_ratio)
        top, left = centre_offset(resized[0], out_height), centre_offset(resized[1], out_width)
        ones = torch.ones(batch, device=device)
        step_y, step_x = height / resized[0], width / resized[1]
        return (
            interpolation_weights(top * step_y * ones, step_y * ones, 0 * ones, height * ones, out_height, height),
            interpolation_weights(left * step_x * ones, step_x * ones, 0 * ones, width * ones, out_width, width),
        )

    @staticmethod
    def _coin(batch: int, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
        return (_rand((batch,), device, generator) < 0.5)[:, None, None]

    def _factors(
        self,
        batch: int,
        device: torch.device,
        generator: torch.Generator | None,
        dtype: torch.dtype,
        uniform: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[3, B]`` brightness, contrast and saturation factors, 1 where a jitter is off (from ``[3, B]``
        ``uniform`` where given)."""
        uniform = _rand((3, batch), device, generator) if uniform is None else uniform
        low = [max(0.0, 1 - value) for value in self.jitter]  # Python numbers: no host-to-device copy
        return torch.stack([lo + (1 + value - lo) * u for lo, value, u in zip(low, self.jitter, uniform)]).to(dtype)

    def extra_repr(self) -> str:
        jitter = ", ".join(f"{n}={v}" for n, v in zip(("brightness", "contrast", "saturation"), self.jitter) if v)
        return (
            f"size={self.size}, scale={self.scale}, ratio={tuple(round(r, 4) for r in self.ratio)}, flip={self.flip}"
            + (f", {jitter}" if jitter else "")
            + ("" if self.crop else ", crop=False")
            + f", dtype={self.dtype}"
        )


def resized_size(height: int, width: int, size: tuple[int, int], ratio: float) -> tuple[int, int]:
    """torchvision's ``Resize(round(min(size) / ratio))`` of an image: its shorter side to that length.

    Example:
        >>> resized_size(480, 640, (224, 224), 224 / 256)
        (256, 341)
    """
    short = round(min(size) / ratio)
    return (short, int(short * width / height)) if height <= width else (int(short * height / width), short)


def centre_offset(resized: int, out: int) -> int:
    """Where torchvision's ``CenterCrop`` starts in a side of ``resized`` pixels: negative when it pads."""
    return int(round((resized - out) / 2.0)) if out <= resized else -((out - resized) // 2)


def centre_window(side: int, out: int) -> tuple[int, int, int]:
    """torchvision's ``CenterCrop`` along one side: (start in the image, start in the output, length).

    Example:
        >>> centre_window(256, 224), centre_window(200, 224)
        ((16, 0, 224), (0, 12, 200))
    """
    offset = centre_offset(side, out)
    return max(0, offset), max(0, -offset), min(side, out)


def resample(pixels: torch.Tensor, weights_y: torch.Tensor, weights_x: torch.Tensor) -> torch.Tensor:
    """``Wy @ pixels @ Wx^T`` per sample and channel: ``[B, C, H, W]`` -> ``[B, C, S_y, S_x]``.

    Two batched matrix products over the samples, the channels folded into the rows, so no weight
    matrix is repeated per channel. Channels-last input is read as it lies: ``[B, S_y, H] @ [B, H,
    W*C]`` first, then the smaller intermediate is reordered once for ``[B, C*S_y, W] @ [B, W, S_x]``.
    Other input: ``[B, C*H, W] @ [B, W, S_x]``, then ``[B, S_y, H] @ [B, H, C*S_x]``. The result's
    strides differ between the two; the caller writes the output layout it wants.

    The products run in the dtype they are given, also inside a training loop's ``torch.autocast``
    (bfloat16, say, would turn the pixels' whole numbers above 256 and the products into other grey levels).
    """
    if torch.is_autocast_enabled(pixels.device.type):  # no context otherwise: export and tracing stay plain
        with torch.autocast(pixels.device.type, enabled=False):
            return _resample(pixels, weights_y, weights_x)
    return _resample(pixels, weights_y, weights_x)


def _resample(pixels: torch.Tensor, weights_y: torch.Tensor, weights_x: torch.Tensor) -> torch.Tensor:
    batch, channels, height, width = pixels.shape
    if channels > 1 and pixels.is_contiguous(memory_format=torch.channels_last):
        rows = torch.bmm(weights_y, pixels.permute(0, 2, 3, 1).reshape(batch, height, width * channels))
        columns = rows.view(batch, -1, width, channels).permute(0, 3, 1, 2).reshape(batch, -1, width)
        return torch.bmm(columns, weights_x.transpose(1, 2)).view(batch, channels, weights_y.shape[1], -1)
    rows = torch.bmm(pixels.reshape(batch, channels * height, -1), weights_x.transpose(1, 2))
    rows = rows.view(batch, channels, height, -1).permute(0, 2, 1, 3).reshape(batch, height, -1)
    out = torch.bmm(weights_y, rows)
    return out.view(batch, weights_y.shape[1], channels, -1).permute(0, 2, 1, 3)


def _jitter(pixels: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Brightness, contrast, saturation (torchvision's ``adjust_*`` on the 0..255 scale), per sample."""
    brightness, contrast, saturation = (factor[:, None, None, None] for factor in factors)
    pixels = (pixels * brightness).clamp(0, 255)
    mean = _gray(pixels).mean(dim=(-3, -2, -1), keepdim=True)
    pixels = (contrast * pixels + (1 - contrast) * mean).clamp(0, 255)
    return (saturation * pixels + (1 - saturation) * _gray(pixels)).clamp(0, 255)


def _gray(pixels: torch.Tensor) -> torch.Tensor:
    red, green, blue = pixels.unbind(1)
    return (_GRAY[0] * red + _GRAY[1] * green + _GRAY[2] * blue).unsqueeze(1)


def _compute_dtype(images: torch.Tensor) -> torch.dtype:
    """float16 on CUDA (tensor cores, exact for 0..255), float32 elsewhere; a float input of more
    precision keeps its dtype. bfloat16 (8 bits of mantissa: whole numbers only up to 256, and its
    products off by several grey levels) is never computed in."""
    least = torch.float16 if images.device.type == "cuda" else torch.float32
    if (
        images.is_floating_point()
        and images.dtype != torch.bfloat16
        and torch.finfo(images.dtype).bits >= least.itemsize * 8
    ):
        return images.dtype
    return least


def _traced() -> bool:
    """Whether the module runs under ``torch.compile``, ``torch.export`` (the ONNX exporter) or a
    TorchScript trace: the batched resampler has no data-dependent Python, the per-sample path has."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def _layout(images: torch.Tensor) -> torch.memory_format:
    """The memory format of a ``[B, C, H, W]`` batch: channels-last, or else contiguous."""
    channels_last = images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()
    return torch.channels_last if channels_last else torch.contiguous_format


def _resize(pixels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """torch's antialiased bilinear resize of ``[B, C, H, W]`` (channels-last: its fast uint8 path)."""
    if tuple(pixels.shape[-2:]) == tuple(size):
        return pixels
    return torch.nn.functional.interpolate(pixels, size=size, mode="bilinear", antialias=True)


def _centre(pixels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """torchvision's ``CenterCrop(size)`` of ``[B, C, H, W]``: zeros where the image is smaller."""
    (top, to_top, rows), (left, to_left, columns) = (
        centre_window(pixels.shape[-2], size[0]),
        centre_window(pixels.shape[-1], size[1]),
    )
    if (rows, columns) == tuple(size):
        return pixels[..., top : top + rows, left : left + columns]
    out = torch.zeros((*pixels.shape[:2], *size), dtype=pixels.dtype).contiguous(memory_format=torch.channels_last)
    out[..., to_top : to_top + rows, to_left : to_left + columns] = pixels[..., top : top + rows, left : left + columns]
    return out


def _check_images(images: torch.Tensor, *, needs_rgb: bool) -> None:
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        shape = list(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise UsageError(f"expected a batch of images [B, C, H, W], got {shape}")
    if images.dtype != torch.uint8 and not images.is_floating_point():
        raise UsageError(f"expected uint8 or float images on the 0..255 scale, got {images.dtype}")
    if images.shape[2] == 0 or images.shape[3] == 0:
        raise UsageError(f"expected images of at least 1x1 pixels, got {list(images.shape)}")
    if needs_rgb and images.shape[1] != 3:
        raise UsageError(f"colour jitter needs 3 channels (RGB), got {images.shape[1]}")


def check_size(size) -> tuple[int, int]:
    sides = (size, size) if isinstance(size, int) else tuple(size) if isinstance(size, Sequence) else ()
    if len(sides) != 2 or not all(isinstance(side, int) and not isinstance(side, bool) and side > 0 for side in sides):
        raise UsageError(f"size must be a positive int or (height, width) of positive ints, got {size!r}")
    return sides


def check_range(name: str, values, *, low: float, high: float) -> tuple[float, float]:
    if not isinstance(values, Sequence) or len(values) != 2 or not all(isinstance(v, (int, float)) for v in values):
        raise UsageError(f"{name} must be (min, max), got {values!r}")
    first, second = float(values[0]), float(values[1])
    if not (low < first <= second <= high and math.isfinite(second)):
        raise UsageError(f"{name} must be (min, max) with {low} < min <= max <= {high}, finite, got {values!r}")
    return first, second


def check_eval_ratio(name: str, ratio, size: tuple[int, int]) -> float:
    """A centre crop's share of the resized shorter side: in (0, 1], and not so small that the
    resized side (``min(size) / ratio``) passes 65,535 pixels."""
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0 < ratio <= 1:
        raise UsageError(f"{name} must be in (0, 1], got {ratio!r}")
    if min(size) / ratio > 65_535:
        raise UsageError(
            f"{name}={ratio!r} would resize the shorter side to {min(size) / ratio:,.0f} pixels before the "
            f"{min(size)}-pixel centre crop; give a ratio of at least {min(size) / 65_535:.6f}"
        )
    return float(ratio)
