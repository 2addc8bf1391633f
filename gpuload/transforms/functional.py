"""The operations of AutoAugment, RandAugment and TrivialAugment, batched: each sample its own op and magnitude.

:func:`apply_ops` takes a uint8 batch ``[B, C, H, W]`` and, per sample, an op (an index into :data:`OPS`)
and a value (its magnitude in the op's own unit), and returns the batch with each sample's op applied, in
one pass of each kind whatever the mix of ops: one ``grid_sample`` for the geometric ops (each sample's
own affine matrix, the identity for the others), one elementwise chain for the colour ops (each sample's
own factor, bits or threshold, neutral for the others), and one table lookup for ``equalize``. There is no
Python branching on the data and no host synchronisation: ``torch.compile(fullgraph=True)`` traces it
whole, on any device.

The pixels are torchvision's: each op computes what ``torchvision.transforms.v2.functional`` computes on a
uint8 image, in float32 with the same formulas, truncations and roundings (``tests/test_functional.py``
states the bound per op against it, on real photos). The values:

============== ===================================================================== ================
op             value                                                                 torchvision
============== ===================================================================== ================
identity       ignored                                                               -
shear_x        shear factor ``m``: the input pixel of ``(x, y)`` is ``(x + m y, y)``  ``affine(shear=[degrees(atan(m)), 0], center=[0, 0])``
shear_y        shear factor ``m``: the input pixel of ``(x, y)`` is ``(x, y + m x)``  ``affine(shear=[0, degrees(atan(m))], center=[0, 0])``
translate_x    pixels to the right (torchvision's policies give whole numbers)          ``affine(translate=[t, 0])``
translate_y    pixels down                                                            ``affine(translate=[0, t])``
rotate         degrees, counter-clockwise, about the centre                           ``rotate(angle)``
brightness     factor (1: unchanged)                                                  ``adjust_brightness``
color          factor (saturation)                                                    ``adjust_saturation``
contrast       factor                                                                 ``adjust_contrast``
sharpness      factor                                                                 ``adjust_sharpness``
posterize      bits kept, 0 to 8                                                      ``posterize``
solarize       threshold: pixels at or above it inverted (256: none)                  ``solarize``
autocontrast   ignored                                                                ``autocontrast``
equalize       ignored                                                                ``equalize``
invert         ignored                                                                ``invert``
solarize_add   added to pixels below 128 (timm's ``SolarizeAdd``)                     -
============== ===================================================================== ================
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..errors import UsageError
from .augment import _traced
from .masks import check_masks

__all__ = ["OPS", "affine", "affine_matrices", "apply_op", "apply_ops", "op_codes"]

OPS = (
    "identity",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
    "rotate",
    "brightness",
    "color",
    "contrast",
    "sharpness",
    "posterize",
    "solarize",
    "autocontrast",
    "equalize",
    "invert",
    "solarize_add",
)
(
    IDENTITY,
    SHEAR_X,
    SHEAR_Y,
    TRANSLATE_X,
    TRANSLATE_Y,
    ROTATE,
    BRIGHTNESS,
    COLOR,
    CONTRAST,
    SHARPNESS,
    POSTERIZE,
    SOLARIZE,
    AUTOCONTRAST,
    EQUALIZE,
    INVERT,
    SOLARIZE_ADD,
) = range(len(OPS))
_GEOMETRIC = (SHEAR_X, SHEAR_Y, TRANSLATE_X, TRANSLATE_Y, ROTATE)
INTERPOLATIONS = ("nearest", "bilinear")
_GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights
_SHARPEN = ((1.0, 1.0, 1.0), (1.0, 5.0, 1.0), (1.0, 1.0, 1.0))  # torchvision's adjust_sharpness kernel, / 13


def op_codes(names: Sequence[str]) -> list[int]:
    """The codes of ``names`` in :data:`OPS`.

    Example:
        >>> op_codes(["rotate", "equalize"])
        [5, 13]
    """
    unknown = [name for name in names if name not in OPS]
    if unknown:
        raise UsageError(f"unknown op {unknown[0]!r}; the ops are {', '.join(OPS)}")
    return [OPS.index(name) for name in names]


def apply_op(images: torch.Tensor, name: str, value: float | torch.Tensor = 0.0, **options) -> torch.Tensor:
    """One op of :data:`OPS` on every sample of a uint8 batch, with one value or one per sample
    (``[B]``); ``options`` as :func:`apply_ops`.

    Example:
        >>> images = torch.tensor([[[[10, 200]]]], dtype=torch.uint8).expand(2, 3, 1, 2)
        >>> apply_op(images, "solarize", torch.tensor([128.0, 256.0]))[:, 0, 0].tolist()
        [[10, 55], [10, 200]]
    """
    (code,) = op_codes([name])
    batch = images.shape[0]
    values = torch.as_tensor(value, dtype=torch.float64, device=images.device).expand(batch)
    return apply_ops(images, torch.full((batch,), code, device=images.device), values, **options)


def apply_ops(
    images: torch.Tensor,
    ops: torch.Tensor,
    values: torch.Tensor,
    *,
    interpolation: str = "nearest",
    fill: float | Sequence[float] | None = None,
    masks: torch.Tensor | None = None,
    mask_fill: int = 0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Each sample's op of :data:`OPS` (``ops``: int ``[B]``) with its value (``values``: float ``[B]``).

    Args:
        images: uint8 ``[B, 3, H, W]`` (any memory layout; the output keeps it), or float holding whole
            numbers 0..255 (the output is then float too).
        interpolation: of the geometric ops, ``"nearest"`` (torchvision's policies' default) or ``"bilinear"``.
        fill: the colour of the area a geometric op brings in, one value or one per channel (0..255);
            ``None`` (torchvision's default) is black, and a bilinear edge fades to it as torchvision's does.
        masks: segmentation masks ``[B, H, W]`` or ``[B, 1, H, W]`` (integer class ids), moved with the same
            geometry by their nearest pixel; the colour ops leave them as they are.
        mask_fill: the class id of the area a geometric op brings into a mask (0, or an ignore index such as 255).

    Returns:
        The batch, and the masks when given.

    Example:
        >>> images = torch.randint(0, 256, (3, 3, 8, 8), dtype=torch.uint8)
        >>> out = apply_ops(images, torch.tensor(op_codes(["identity", "rotate", "equalize"])), torch.tensor([0.0, 90.0, 0.0]))
        >>> torch.equal(out[0], images[0]), torch.equal(out[1], images[1].rot90(1, (1, 2)))
        (True, True)
    """
    _check_batch(images, ops, values)
    if interpolation not in INTERPOLATIONS:
        raise UsageError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {interpolation!r}")
    batch, channels, height, width = images.shape
    layout = torch.channels_last if _is_channels_last(images) else torch.contiguous_format
    values = values.to(torch.float64)  # as torchvision's magnitudes, Python floats
    geometry = {"interpolation": interpolation, "fill": fill, "mask_fill": mask_fill}
    if images.device.type == "cpu" and not _traced():
        # Eager on a CPU: the samples of each op apart, with that op's arithmetic only (a fraction of the
        # branchless pass's, which a GPU or a compiled graph runs: no host synchronisation there).
        pixels = images.to(torch.float32, copy=True)  # written in place, sample by sample
        moved = None if masks is None else masks.clone()
        for code in ops.unique().tolist():
            if code == IDENTITY:
                continue
            rows = (ops == code).nonzero().squeeze(1)
            part, part_masks = _apply(
                pixels[rows], ops[rows], values[rows], {code}, masks=None if masks is None else masks[rows], **geometry
            )
            pixels[rows] = part
            if moved is not None:
                moved[rows] = part_masks
        masks = moved
    else:
        pixels, masks = _apply(images.to(torch.float32), ops, values, set(range(len(OPS))), masks=masks, **geometry)
    out = pixels if images.is_floating_point() else pixels.to(torch.uint8)
    out = out.contiguous(memory_format=layout)
    return out if masks is None else (out, masks)


def affine_matrices(
    *,
    angle: torch.Tensor,
    translate: tuple[torch.Tensor, torch.Tensor],
    shear: tuple[torch.Tensor, torch.Tensor],
    centre: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """torchvision's inverse affine matrix (``_get_inverse_affine_matrix``, scale 1) of each sample: float32
    ``[B, 2, 3]`` mapping an output pixel to the input pixel it shows, in pixels from the image's centre.

    ``angle`` and ``shear`` in degrees, ``translate`` in pixels, ``centre`` in pixels from the image's centre
    (torchvision's ``center`` minus half the size), each ``[B]``; computed in float64 as torchvision's are.

    Example:
        >>> zero = torch.zeros(1)
        >>> affine_matrices(angle=zero, translate=(zero + 1, zero), shear=(zero, zero), centre=(zero, zero)).tolist()
        [[[1.0, 0.0, -1.0], [-0.0, 1.0, 0.0]]]
    """
    angle, tx, ty, sx, sy, cx, cy = (
        value.to(torch.float64) for value in (angle, *translate, *shear, *centre)
    )  # fmt: skip
    rotation, shear_x, shear_y = torch.deg2rad(angle), torch.deg2rad(sx), torch.deg2rad(sy)
    a = torch.cos(rotation - shear_y) / torch.cos(shear_y)
    b = -(a * torch.tan(shear_x) + torch.sin(rotation))
    c = torch.sin(rotation - shear_y) / torch.cos(shear_y)
    d = torch.cos(rotation) - c * torch.tan(shear_x)
    m0, m1, m3, m4 = d, -b, -c, a
    m2 = cx - m0 * (cx + tx) - m1 * (cy + ty)
    m5 = cy - m3 * (cx + tx) - m4 * (cy + ty)
    return torch.stack([m0, m1, m2, m3, m4, m5], dim=1).view(-1, 2, 3).to(torch.float32)


def affine(
    pixels: torch.Tensor,
    matrices: torch.Tensor,
    *,
    interpolation: str = "nearest",
    fill: float | Sequence[float] | None = None,
    masks: torch.Tensor | None = None,
    mask_fill: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each sample of float ``pixels`` ``[B, C, H, W]`` resampled through its matrix of :func:`affine_matrices`
    (torchvision's ``_affine_grid`` and ``_apply_grid_transform``: ``grid_sample`` without aligned corners,
    ``fill`` where the output maps outside the input, rounded); ``masks`` through the same matrices by
    their nearest pixel, ``mask_fill`` outside. Returns the pixels (float, whole numbers) and the masks.

    Example:
        >>> pixels = torch.arange(4.0).view(1, 1, 2, 2)
        >>> zero = torch.zeros(1)
        >>> shift = affine_matrices(angle=zero, translate=(zero + 1, zero), shear=(zero, zero), centre=(zero, zero))
        >>> affine(pixels, shift, fill=9.0)[0].tolist()
        [[[[9.0, 0.0], [9.0, 2.0]]]]
    """
    batch, channels, height, width = pixels.shape
    grid = _grid(matrices, height, width)
    fills = None if fill is None else torch.as_tensor(fill, dtype=pixels.dtype, device=pixels.device).flatten()
    if fills is not None and fills.numel() not in (1, channels):
        raise UsageError(f"fill must be one value or {channels} (one per channel), got {fill!r}")
    pixels = _sample(pixels, grid, interpolation, None if fills is None else fills.view(1, -1, 1, 1)).round()
    if masks is None:
        return pixels, None
    check_masks(masks, pixels)
    flat = masks.reshape(batch, 1, height, width)
    moved = _sample(
        flat.to(torch.float32), grid, "nearest", torch.full((1, 1, 1, 1), float(mask_fill), device=pixels.device)
    )
    return pixels, moved.round().to(masks.dtype).view(masks.shape)


def _grid(matrices: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """torchvision's ``_affine_grid``, one matrix per sample: ``[B, H, W, 2]`` for ``grid_sample``."""
    device = matrices.device
    xs = torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width, device=device)
    ys = torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height, device=device)
    base = torch.stack(
        [xs.expand(height, width), ys[:, None].expand(height, width), torch.ones(height, width, device=device)], dim=-1
    ).view(1, height * width, 3)
    scale = torch.tensor([0.5 * width, 0.5 * height], dtype=matrices.dtype, device=device)
    rescaled = matrices.transpose(1, 2) / scale
    return base.expand(matrices.shape[0], -1, -1).bmm(rescaled).view(-1, height, width, 2)


def _sample(pixels: torch.Tensor, grid: torch.Tensor, mode: str, fill: torch.Tensor | None) -> torch.Tensor:
    """``grid_sample`` with a channel of ones beside the pixels, telling where the output maps inside, for
    ``fill`` (``None``: zeros outside, no channel of ones, as torchvision without a fill)."""
    if fill is None:
        return F.grid_sample(pixels, grid, mode=mode, padding_mode="zeros", align_corners=False)
    ones = torch.ones_like(pixels[:, :1])
    sampled = F.grid_sample(
        torch.cat([pixels, ones], dim=1), grid, mode=mode, padding_mode="zeros", align_corners=False
    )
    pixels, inside = sampled[:, :-1], sampled[:, -1:]
    fill = fill.to(pixels.dtype)
    if mode == "nearest":
        return torch.where(inside < 0.5, fill, pixels)
    return (pixels - fill) * inside + fill


def _apply(
    pixels: torch.Tensor,
    ops: torch.Tensor,
    values: torch.Tensor,
    present: set[int],
    *,
    interpolation: str,
    fill: float | Sequence[float] | None,
    masks: torch.Tensor | None,
    mask_fill: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each sample's op on float ``pixels``, with the arithmetic of the ops in ``present`` only (the
    codes that may occur in ``ops``): the geometry through one ``grid_sample``, then the colour ops."""
    if present & set(_GEOMETRIC):
        matrices = _op_matrices(ops, values, pixels.shape[-2], pixels.shape[-1])
        pixels, masks = affine(
            pixels, matrices, interpolation=interpolation, fill=fill, masks=masks, mask_fill=mask_fill
        )
    return _colour(pixels, ops, values, present), masks


def _op_matrices(ops: torch.Tensor, values: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The inverse matrix of each sample's op: its geometry, or the identity for a colour op."""
    zero = torch.zeros_like(values)
    shear = torch.rad2deg(torch.atan(values))
    # A shear is about the top-left corner (torchvision's center=[0, 0]); the rest about the centre.
    corner = (ops == SHEAR_X) | (ops == SHEAR_Y)
    return affine_matrices(
        angle=torch.where(ops == ROTATE, -torch.remainder(values, 360), zero),  # torchvision's matrix of -(angle % 360)
        translate=(torch.where(ops == TRANSLATE_X, values, zero), torch.where(ops == TRANSLATE_Y, values, zero)),
        shear=(torch.where(ops == SHEAR_X, shear, zero), torch.where(ops == SHEAR_Y, shear, zero)),
        centre=(torch.where(corner, zero - width * 0.5, zero), torch.where(corner, zero - height * 0.5, zero)),
    )


def _colour(pixels: torch.Tensor, ops: torch.Tensor, values: torch.Tensor, present: set[int]) -> torch.Tensor:
    """The colour ops, each neutral where a sample has another: whole numbers 0..255 in, and out; the
    stages of ops not in ``present`` are left out.

    The statistics (the mean grey of ``contrast``, the extremes of ``autocontrast``, the histogram of
    ``equalize``) are taken from the input, as each sample has one op."""
    one = torch.ones_like(values)
    column = _per_sample
    # Blends (torchvision's _blend: x * f + d * (1 - f) with f and 1 - f from a float64 value, one rounding
    # as addcmul rounds, clamped, truncated to uint8) with their degenerate image d: black (brightness),
    # the mean grey (contrast), the grey (color), the blur (sharpness, which torchvision computes as
    # x + (1 - f) * (d - x), and only inside the border).
    if present & {BRIGHTNESS, COLOR, CONTRAST, SHARPNESS}:
        factor = torch.where((ops >= BRIGHTNESS) & (ops <= SHARPNESS), values, one)
        keep, rest = column(factor.to(torch.float32)), column((1 - factor).to(torch.float32))
        degenerate = pixels.new_zeros(())
        if present & {COLOR, CONTRAST}:
            gray = _gray(pixels).floor()
            mean = gray.mean(dim=(-3, -2, -1), keepdim=True)
            degenerate = torch.where(column(ops == CONTRAST), mean, torch.where(column(ops == COLOR), gray, 0.0))
        blended = torch.addcmul(pixels * keep, degenerate, rest)
        if SHARPNESS in present:
            sharpened = torch.addcmul(pixels, _blur(pixels) - pixels, rest)
            blended = torch.where(column(ops == SHARPNESS), sharpened, blended)
        pixels = blended.clamp(0, 255).trunc()
    if POSTERIZE in present:  # keep the top `bits` bits
        step = column(torch.where(ops == POSTERIZE, torch.exp2(8 - values), one).to(torch.float32))
        pixels = torch.floor(pixels / step) * step
    if present & {SOLARIZE, INVERT}:  # invert the pixels at or above the threshold
        threshold = torch.where(ops == SOLARIZE, values, torch.where(ops == INVERT, 0.0, 256.0))
        pixels = torch.where(pixels >= column(threshold.to(torch.float32)), 255 - pixels, pixels)
    if SOLARIZE_ADD in present:  # add to the pixels below 128 (timm's SolarizeAdd)
        added = column(torch.where(ops == SOLARIZE_ADD, values, 0.0).to(torch.float32))
        pixels = torch.where(pixels < 128, (pixels + added).clamp(max=255), pixels)
    if AUTOCONTRAST in present:  # each channel's range stretched to 0..255
        low, high = pixels.amin(dim=(-2, -1), keepdim=True), pixels.amax(dim=(-2, -1), keepdim=True)
        flat = (high == low) | ~column(ops == AUTOCONTRAST)
        scale = torch.where(flat, 1.0, (high - low) * (1.0 / 255))
        pixels = ((pixels - torch.where(flat, 0.0, low)) / scale).clamp(0, 255).trunc()
    if EQUALIZE in present:
        pixels = torch.where(column(ops == EQUALIZE), _equalize(pixels), pixels)
    return pixels


def _per_sample(values: torch.Tensor) -> torch.Tensor:
    return values.view(-1, 1, 1, 1)


def _gray(pixels: torch.Tensor) -> torch.Tensor:
    red, green, blue = pixels.unbind(1)
    return (red * _GRAY[0] + green * _GRAY[1] + blue * _GRAY[2]).unsqueeze(1)


def _blur(pixels: torch.Tensor) -> torch.Tensor:
    """torchvision's ``adjust_sharpness`` degenerate image: the 3x3 smoothing, rounded, inside a border
    of the pixels themselves (all of them for an image 2 pixels or less across)."""
    channels, height, width = pixels.shape[1:]
    if height <= 2 or width <= 2:
        return pixels
    kernel = torch.tensor(_SHARPEN, dtype=pixels.dtype, device=pixels.device) / 13
    blurred = F.conv2d(pixels, kernel.expand(channels, 1, 3, 3), groups=channels).round()
    border = torch.ones((1, 1, height - 2, width - 2), dtype=torch.bool, device=pixels.device)
    inside = F.pad(border, (1, 1, 1, 1))
    return torch.where(inside, F.pad(blurred, (1, 1, 1, 1)), pixels)


def _equalize(pixels: torch.Tensor) -> torch.Tensor:
    """torchvision's ``equalize_image`` (PIL's lookup table), batched: each channel of each sample its own."""
    batch, channels, height, width = pixels.shape
    flat = pixels.reshape(batch, channels, height * width).to(torch.int64)
    histogram = torch.zeros((batch, channels, 256), dtype=torch.int32, device=pixels.device)
    histogram.scatter_add_(2, flat, torch.ones_like(flat, dtype=torch.int32))
    cumulative = histogram.cumsum(dim=2)
    last = cumulative.argmax(dim=2, keepdim=True)  # the last value present: its count is left out
    step = torch.div(height * width - histogram.gather(2, last), 255, rounding_mode="floor")
    table = torch.div(cumulative[..., :-1] + step // 2, step.clamp(min=1), rounding_mode="floor").clamp(0, 255)
    table = torch.cat([torch.zeros_like(table[..., :1]), table], dim=2).to(pixels.dtype)
    equalized = table.gather(2, flat).view(pixels.shape)
    return torch.where((step != 0).view(batch, channels, 1, 1), equalized, pixels)


def _is_channels_last(images: torch.Tensor) -> bool:
    return images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()


def _check_batch(images: torch.Tensor, ops: torch.Tensor, values: torch.Tensor) -> None:
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[1] != 3:
        shape = list(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise UsageError(f"expected a batch of RGB images [B, 3, H, W], got {shape}")
    if images.dtype != torch.uint8 and not images.is_floating_point():
        raise UsageError(f"expected uint8 images (or floats holding 0..255), got {images.dtype}")
    if images.shape[2] == 0 or images.shape[3] == 0:
        raise UsageError(f"expected images of at least 1x1 pixels, got {list(images.shape)}")
    for name, tensor in (("ops", ops), ("values", values)):
        if not isinstance(tensor, torch.Tensor) or tensor.shape != images.shape[:1]:
            got = list(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise UsageError(f"{name} must be one per sample, [{images.shape[0]}], got {got}")
