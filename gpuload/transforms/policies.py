"""TrivialAugmentWide, RandAugment and AutoAugment on a batch, each sample its own ops and magnitudes.

Each policy draws, per sample, what torchvision's (or timm's) draws per image: the op, the magnitude bin,
the sign, whether a sub-policy's op applies; then :func:`gpuload.transforms.functional.apply_ops` applies
every sample's op of a layer in one batched pass. The choice of ops and magnitudes is torchvision's
(``TrivialAugmentWide``, ``RandAugment``, ``AutoAugment(AutoAugmentPolicy.IMAGENET)``) or timm's
(``rand_augment_transform("rand-m9-mstd0.5-inc1")``), tested against theirs by their distributions; the
pixels of each op are torchvision's (``tests/test_functional.py``). No op table lives on a device (they are
made on the batch's device, or chosen by comparisons), so a policy needs no ``.to(device)``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch
from torch import nn

from ..errors import UsageError
from .checks import check_int, is_number
from .draws import index, uniforms
from .functional import (
    AUTOCONTRAST,
    BRIGHTNESS,
    COLOR,
    CONTRAST,
    EQUALIZE,
    IDENTITY,
    INTERPOLATIONS,
    INVERT,
    OPS,
    POSTERIZE,
    ROTATE,
    SHARPNESS,
    SHEAR_X,
    SHEAR_Y,
    SOLARIZE,
    SOLARIZE_ADD,
    TRANSLATE_X,
    TRANSLATE_Y,
    apply_ops,
)

__all__ = ["AutoAugment", "RandAugment", "TrivialAugmentWide"]

# torchvision's op space of TrivialAugmentWide and RandAugment, in its order: codes 0 to 13 of OPS.
_TORCHVISION_OPS = OPS[: EQUALIZE + 1]
_SIGNED = (SHEAR_X, SHEAR_Y, TRANSLATE_X, TRANSLATE_Y, ROTATE, BRIGHTNESS, COLOR, CONTRAST, SHARPNESS)

# torchvision's AutoAugmentPolicy.IMAGENET: 25 sub-policies of two (op, probability, magnitude bin of 10).
_IMAGENET_POLICY = (
    (("posterize", 0.4, 8), ("rotate", 0.6, 9)),
    (("solarize", 0.6, 5), ("autocontrast", 0.6, 0)),
    (("equalize", 0.8, 0), ("equalize", 0.6, 0)),
    (("posterize", 0.6, 7), ("posterize", 0.6, 6)),
    (("equalize", 0.4, 0), ("solarize", 0.2, 4)),
    (("equalize", 0.4, 0), ("rotate", 0.8, 8)),
    (("solarize", 0.6, 3), ("equalize", 0.6, 0)),
    (("posterize", 0.8, 5), ("equalize", 1.0, 0)),
    (("rotate", 0.2, 3), ("solarize", 0.6, 8)),
    (("equalize", 0.6, 0), ("posterize", 0.4, 6)),
    (("rotate", 0.8, 8), ("color", 0.4, 0)),
    (("rotate", 0.4, 9), ("equalize", 0.6, 0)),
    (("equalize", 0.0, 0), ("equalize", 0.8, 0)),
    (("invert", 0.6, 0), ("equalize", 1.0, 0)),
    (("color", 0.6, 4), ("contrast", 1.0, 8)),
    (("rotate", 0.8, 8), ("color", 1.0, 2)),
    (("color", 0.8, 8), ("solarize", 0.8, 7)),
    (("sharpness", 0.4, 7), ("invert", 0.6, 0)),
    (("shear_x", 0.6, 5), ("equalize", 1.0, 0)),
    (("color", 0.4, 0), ("equalize", 0.6, 0)),
    (("equalize", 0.4, 0), ("solarize", 0.2, 4)),
    (("solarize", 0.6, 5), ("autocontrast", 0.6, 0)),
    (("invert", 0.6, 0), ("equalize", 1.0, 0)),
    (("color", 0.6, 4), ("contrast", 1.0, 8)),
    (("equalize", 0.8, 0), ("equalize", 0.6, 0)),
)

# timm's RandAugment op sets (timm.data.auto_augment: _RAND_TRANSFORMS, _RAND_INCREASING_TRANSFORMS).
_TIMM_OPS = (
    "AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color", "Contrast",
    "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel",
)  # fmt: skip
_TIMM_INCREASING_OPS = (
    "AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing", "SolarizeAdd",
    "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing", "ShearX", "ShearY",
    "TranslateXRel", "TranslateYRel",
)  # fmt: skip
_TIMM_LEVELS = 10.0  # timm's _LEVEL_DENOM: magnitude 10 is an op's strongest
_TIMM_FILL = (124, 116, 104)  # what timm's create_transform gives its policies for ImageNet's mean
_Layer = tuple[torch.Tensor, torch.Tensor]  # each sample's op code and value


class _Policy(nn.Module):
    """What the three policies share: the checks, the draws, the layers of ops applied in turn. Subclasses
    say how many uniforms a sample takes (``draws``) and turn them into layers (:meth:`layers`)."""

    draws: int

    def __init__(self, *, interpolation: str, fill: float | Sequence[float] | None) -> None:
        super().__init__()
        if interpolation not in INTERPOLATIONS:
            raise UsageError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {interpolation!r}")
        if fill is not None:
            fills = [fill] if isinstance(fill, (int, float)) else list(fill) if isinstance(fill, Sequence) else None
            if (
                not fills
                or len(fills) not in (1, 3)
                or not all(is_number(value) and 0 <= value <= 255 for value in fills)
            ):
                raise UsageError(f"fill must be None, a number or 3 numbers (one per channel) in 0..255, got {fill!r}")
            fill = tuple(float(value) for value in fills)
        self.interpolation, self.fill = interpolation, fill

    def forward(
        self,
        images: torch.Tensor,
        *,
        masks: torch.Tensor | None = None,
        mask_fill: int = 0,
        generator: torch.Generator | None = None,
        uniform: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Augment uint8 ``images`` ``[B, 3, H, W]`` (in ``train()`` mode; ``eval()`` returns them as they are).

        Args:
            masks: segmentation masks ``[B, H, W]`` or ``[B, 1, H, W]``, moved by the geometric ops as the
                images are (nearest pixel); returned beside the images.
            mask_fill: the class id a geometric op brings into a mask (0, or an ignore index such as 255).
            generator: draws from this generator (on the images' device) instead of torch's.
            uniform: ``[B, draws]`` uniforms to use instead of drawing (what ``gpuload.DataLoader`` passes).
        """
        if not self.training:
            return images if masks is None else (images, masks)
        batch, _, height, width = images.shape
        draws = uniforms(batch, self.draws, device=images.device, generator=generator, uniform=uniform)
        pixels = images.to(torch.float32) if images.dtype == torch.uint8 else images
        for ops, values in self.layers(draws.to(torch.float64), height, width):
            out = apply_ops(
                pixels, ops, values, interpolation=self.interpolation, fill=self.fill, masks=masks, mask_fill=mask_fill
            )
            pixels, masks = out if masks is not None else (out, None)
        pixels = pixels.to(images.dtype)
        return pixels if masks is None else (pixels, masks)

    def layers(self, draws: torch.Tensor, height: int, width: int) -> list[_Layer]:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"interpolation={self.interpolation!r}, fill={self.fill}"


class TrivialAugmentWide(_Policy):
    """torchvision's ``TrivialAugmentWide`` for each sample of a batch: one op of 14, at one of
    ``num_magnitude_bins`` magnitudes drawn uniformly, negated half the time where the op has a sign.

    Args:
        num_magnitude_bins: the magnitudes of each op, evenly spaced from none to its strongest.
        interpolation: of the geometric ops, ``"nearest"`` (torchvision's default) or ``"bilinear"``.
        fill: the colour brought in by the geometric ops (``None``: black, torchvision's default).

    Example:
        >>> augment = TrivialAugmentWide()
        >>> images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
        >>> augment(images, generator=torch.Generator().manual_seed(0)).shape
        torch.Size([4, 3, 32, 32])
    """

    draws = 3  # op, bin, sign

    def __init__(
        self,
        num_magnitude_bins: int = 31,
        *,
        interpolation: str = "nearest",
        fill: float | Sequence[float] | None = None,
    ) -> None:
        super().__init__(interpolation=interpolation, fill=fill)
        self.num_magnitude_bins = check_int("num_magnitude_bins", num_magnitude_bins, low=2)

    def layers(self, draws: torch.Tensor, height: int, width: int) -> list[_Layer]:
        table = _torchvision_table(self.num_magnitude_bins, height, width, draws.device, wide=True)
        ops = index(draws[:, 0], len(_TORCHVISION_OPS))
        magnitudes = table[ops, index(draws[:, 1], self.num_magnitude_bins)]
        return [(ops, _torchvision_values(ops, magnitudes, draws[:, 2]))]

    def extra_repr(self) -> str:
        return f"num_magnitude_bins={self.num_magnitude_bins}, {super().extra_repr()}"


class RandAugment(_Policy):
    """RandAugment for each sample of a batch: ``num_ops`` ops in turn, each drawn uniformly.

    ``RandAugment(num_ops, magnitude, num_magnitude_bins)`` is torchvision's: 14 ops (one the identity) at
    bin ``magnitude`` of ``num_magnitude_bins``, negated half the time where the op has a sign.
    :meth:`RandAugment.timm` is timm's ``rand_augment_transform`` from its configuration string
    (``"rand-m9-mstd0.5-inc1"``: magnitude 9 of 10, Gaussian magnitude noise of deviation 0.5, the
    increasing op set), with timm's op sets, probabilities and magnitude scales; the pixels of each op
    are torchvision's (timm's are Pillow's).

    Args:
        num_ops: ops applied in turn to each sample.
        magnitude: the magnitude bin of every op.
        num_magnitude_bins: the magnitudes of each op, evenly spaced from none to its strongest.
        interpolation: of the geometric ops, ``"nearest"`` (torchvision's default) or ``"bilinear"``.
        fill: the colour brought in by the geometric ops (``None``: black, torchvision's default).

    Example:
        >>> augment = RandAugment.timm("rand-m9-mstd0.5-inc1")
        >>> augment
        RandAugment(timm='rand-m9-mstd0.5-inc1', interpolation='bilinear', fill=(124.0, 116.0, 104.0))
        >>> augment(torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)).dtype
        torch.uint8
    """

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: int = 9,
        num_magnitude_bins: int = 31,
        *,
        interpolation: str = "nearest",
        fill: float | Sequence[float] | None = None,
    ) -> None:
        super().__init__(interpolation=interpolation, fill=fill)
        self.num_ops = check_int("num_ops", num_ops, low=0)
        self.num_magnitude_bins = check_int("num_magnitude_bins", num_magnitude_bins, low=2)
        self.magnitude = check_int("magnitude", magnitude, low=0)
        if magnitude >= num_magnitude_bins:
            raise UsageError(f"magnitude must be a bin in [0, {num_magnitude_bins}), got {magnitude}")
        self.config: _TimmConfig | None = None
        self.draws = 2 * self.num_ops  # per op: which, sign

    @classmethod
    def timm(
        cls,
        config: str = "rand-m9-mstd0.5-inc1",
        *,
        interpolation: str = "bilinear",
        fill: float | Sequence[float] | None = _TIMM_FILL,
    ) -> RandAugment:
        """timm's ``rand_augment_transform(config)``, per sample.

        ``config``: ``rand`` then dash-separated sections: ``m`` magnitude (0 to 10, default 10), ``n`` ops
        per sample (default 2), ``p`` probability of each op (default 0.5), ``mstd`` deviation of a Gaussian
        noise on the magnitude (above 100: uniform from 0 to ``m``), ``mmax`` the magnitude's upper clip
        (default 10), ``inc1`` the increasing op set. The magnitude is drawn per op and per sample, as timm
        draws it per op and per image. ``interpolation`` and ``fill`` default to what timm's training
        transform gives its ops for ImageNet (it picks bilinear or bicubic at random; here bilinear).

        Raises:
            UsageError: a section timm does not know, or weighted op choice (``t``), which is not supported.
        """
        parsed = _TimmConfig.parse(config)
        policy = cls(parsed.num_ops, interpolation=interpolation, fill=fill)
        policy.config = parsed
        policy.draws = 5 * parsed.num_ops  # per op: which, whether, two for its noise, sign
        return policy

    def layers(self, draws: torch.Tensor, height: int, width: int) -> list[_Layer]:
        if self.config is not None:
            return [self.config.layer(draws[:, 5 * op : 5 * op + 5], height, width) for op in range(self.num_ops)]
        table = _torchvision_table(self.num_magnitude_bins, height, width, draws.device, wide=False)
        layers = []
        for op in range(self.num_ops):
            ops = index(draws[:, 2 * op], len(_TORCHVISION_OPS))
            layers.append((ops, _torchvision_values(ops, table[ops, self.magnitude], draws[:, 2 * op + 1])))
        return layers

    def extra_repr(self) -> str:
        if self.config is not None:
            return f"timm={self.config.text!r}, {super().extra_repr()}"
        return (
            f"num_ops={self.num_ops}, magnitude={self.magnitude}, num_magnitude_bins={self.num_magnitude_bins}, "
            f"{super().extra_repr()}"
        )


class AutoAugment(_Policy):
    """torchvision's ``AutoAugment(AutoAugmentPolicy.IMAGENET)`` for each sample of a batch: one of its 25
    sub-policies drawn uniformly, whose two ops each apply with their probability, at their magnitude bin
    of 10, negated half the time where the op has a sign.

    Args:
        policy: ``"imagenet"`` (the policy of the AutoAugment paper that torchvision ships).
        interpolation: of the geometric ops, ``"nearest"`` (torchvision's default) or ``"bilinear"``.
        fill: the colour brought in by the geometric ops (``None``: black, torchvision's default).

    Example:
        >>> AutoAugment()(torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)).shape
        torch.Size([2, 3, 16, 16])
    """

    draws = 5  # sub-policy; per op: whether, sign

    def __init__(
        self,
        policy: str = "imagenet",
        *,
        interpolation: str = "nearest",
        fill: float | Sequence[float] | None = None,
    ) -> None:
        super().__init__(interpolation=interpolation, fill=fill)
        if policy != "imagenet":
            raise UsageError(f"policy must be 'imagenet' (torchvision's AutoAugmentPolicy.IMAGENET), got {policy!r}")
        self.policy = policy

    def layers(self, draws: torch.Tensor, height: int, width: int) -> list[_Layer]:
        table = _torchvision_table(10, height, width, draws.device, wide=False)
        chosen = index(draws[:, 0], len(_IMAGENET_POLICY))
        layers = []
        for step in range(2):
            entries = [policy[step] for policy in _IMAGENET_POLICY]
            ops = _lookup(chosen, [OPS.index(name) for name, _, _ in entries]).to(torch.int64)
            applies = draws[:, 1 + 2 * step] < _lookup(chosen, [probability for _, probability, _ in entries])
            bins = _lookup(chosen, [magnitude for _, _, magnitude in entries]).to(torch.int64)
            ops = torch.where(applies, ops, IDENTITY)
            layers.append((ops, _torchvision_values(ops, table[ops, bins], draws[:, 2 + 2 * step])))
        return layers

    def extra_repr(self) -> str:
        return f"policy={self.policy!r}, {super().extra_repr()}"


def _torchvision_table(bins: int, height: int, width: int, device: torch.device, *, wide: bool) -> torch.Tensor:
    """float64 ``[len(OPS), bins]``: each op's magnitudes as torchvision's ``_AUGMENTATION_SPACE`` gives them
    (float32 ``linspace``; zeros for ops without one), made on ``device``: TrivialAugmentWide's (``wide``) or
    RandAugment's and AutoAugment's."""

    def spaced(start: float, end: float) -> torch.Tensor:
        return torch.linspace(start, end, bins, device=device)

    strongest_bits = 6 if wide else 4
    rows = {
        SHEAR_X: spaced(0.0, 0.99 if wide else 0.3),
        SHEAR_Y: spaced(0.0, 0.99 if wide else 0.3),
        TRANSLATE_X: spaced(0.0, 32.0 if wide else 150.0 / 331.0 * width),
        TRANSLATE_Y: spaced(0.0, 32.0 if wide else 150.0 / 331.0 * height),
        ROTATE: spaced(0.0, 135.0 if wide else 30.0),
        POSTERIZE: (8 - (torch.arange(bins, device=device) / ((bins - 1) / strongest_bits))).round().int(),
        SOLARIZE: spaced(1.0, 0.0),
    }
    for code in (BRIGHTNESS, COLOR, CONTRAST, SHARPNESS):
        rows[code] = spaced(0.0, 0.99 if wide else 0.9)
    zeros = torch.zeros(bins, device=device)
    return torch.stack([rows.get(code, zeros).to(torch.float64) for code in range(len(OPS))])


def _torchvision_values(ops: torch.Tensor, magnitudes: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """Each sample's value for :func:`apply_ops` from its torchvision magnitude, as torchvision's
    ``_apply_image_or_video_transform`` turns one into its functional's argument: negated where the op has
    a sign and ``sign < 0.5``; a translation truncated to whole pixels, an enhancement ``1 + m``, a
    solarize threshold ``255 m``."""
    signed = torch.zeros_like(ops, dtype=torch.bool)
    for code in _SIGNED:
        signed = signed | (ops == code)
    magnitudes = torch.where(signed & (sign < 0.5), -magnitudes, magnitudes)
    translate = (ops == TRANSLATE_X) | (ops == TRANSLATE_Y)
    enhance = (ops >= BRIGHTNESS) & (ops <= SHARPNESS)
    values = torch.where(translate, torch.trunc(magnitudes), magnitudes)
    values = torch.where(enhance, 1.0 + magnitudes, values)
    return torch.where(ops == SOLARIZE, 255.0 * magnitudes, values)


def _lookup(chosen: torch.Tensor, table: Sequence[float]) -> torch.Tensor:
    """``table[chosen]`` (float64) without a tensor of the table, so that nothing is copied to the device."""
    out = torch.zeros_like(chosen, dtype=torch.float64)
    for position, value in enumerate(table):
        if value:
            out = torch.where(chosen == position, float(value), out)
    return out


class _TimmConfig:
    """timm's RandAugment configuration (``rand_augment_transform``'s string), and its draws per op."""

    def __init__(
        self, text: str, magnitude: float, num_ops: int, probability: float, std: float, top: float, increasing: bool
    ):
        self.text, self.magnitude, self.num_ops, self.probability = text, magnitude, num_ops, probability
        self.std, self.top, self.names = std, top, _TIMM_INCREASING_OPS if increasing else _TIMM_OPS

    @classmethod
    def parse(cls, text: str) -> _TimmConfig:
        if not isinstance(text, str) or text.split("-")[0] != "rand":
            raise UsageError(
                f"a timm RandAugment configuration starts with 'rand', as 'rand-m9-mstd0.5-inc1', got {text!r}"
            )
        options = {"m": _TIMM_LEVELS, "n": 2, "p": 0.5, "mstd": 0.0, "mmax": _TIMM_LEVELS, "inc": 0}
        for section in text.split("-")[1:]:
            if section.startswith("t"):
                raise UsageError(f"timm's weighted op choice ({section!r} in {text!r}) is not supported")
            found = re.fullmatch(r"([a-z]+)(\d.*)", section)
            if found is None or found[1] not in options:
                raise UsageError(f"{text!r}: unknown section {section!r}; timm knows m, n, p, mstd, mmax and inc")
            try:
                options[found[1]] = float(found[2])
            except ValueError:
                raise UsageError(f"{text!r}: {section!r} is not a number after {found[1]!r}") from None
        std = math.inf if options["mstd"] > 100 else options["mstd"]  # timm: uniform from 0 to m
        return cls(
            text,
            options["m"],
            check_int("n", int(options["n"]), low=0),
            options["p"],
            std,
            options["mmax"],
            bool(options["inc"]),
        )

    def layer(self, draws: torch.Tensor, height: int, width: int) -> _Layer:
        """One op per sample from 5 uniforms: which op, whether it applies (``p``), its magnitude's noise (two:
        Box-Muller), and its sign (timm negates when ``random() > 0.5``)."""
        which, whether, noise_a, noise_b, sign = draws.unbind(1)
        level = torch.full_like(which, self.magnitude)
        if self.std == math.inf:
            level = noise_a * self.magnitude
        elif self.std > 0:
            gauss = torch.sqrt(-2 * torch.log1p(-noise_a)) * torch.cos(2 * math.pi * noise_b)
            level = self.magnitude + self.std * gauss
        level = level.clamp(0, self.top) / _TIMM_LEVELS
        negate = torch.where(sign > 0.5, -1.0, 1.0)
        chosen = index(which, len(self.names))
        ops = torch.full_like(chosen, IDENTITY)
        values = torch.zeros_like(level)
        for position, name in enumerate(self.names):
            code, value = _timm_op(name, level, negate, height, width)
            ops = torch.where(chosen == position, code, ops)
            values = torch.where(chosen == position, value, values)
        return torch.where(whether < self.probability, ops, IDENTITY), values


def _timm_op(name: str, level: torch.Tensor, negate: torch.Tensor, height: int, width: int) -> tuple[int, torch.Tensor]:
    """timm's op ``name`` at ``level`` (its magnitude / 10) as a code of :data:`OPS` and each sample's value
    (timm's ``LEVEL_TO_ARG``; a translation to the left in Pillow's terms is one to the right in torchvision's)."""
    zero = torch.zeros_like(level)
    bits = torch.trunc(level * 4)
    solarize = torch.clamp(torch.trunc(level * 256), max=256)
    enhance = level * 1.8 + 0.1
    increasing = torch.clamp(1.0 + negate * level * 0.9, min=0.1)
    ops = {
        "AutoContrast": (AUTOCONTRAST, zero),
        "Equalize": (EQUALIZE, zero),
        "Invert": (INVERT, zero),
        "Rotate": (ROTATE, negate * level * 30),
        "Posterize": (POSTERIZE, bits),
        "PosterizeIncreasing": (POSTERIZE, 4 - bits),
        "Solarize": (SOLARIZE, solarize),
        "SolarizeIncreasing": (SOLARIZE, 256 - solarize),
        "SolarizeAdd": (SOLARIZE_ADD, torch.clamp(torch.trunc(level * 110), max=128)),
        "ShearX": (SHEAR_X, negate * level * 0.3),
        "ShearY": (SHEAR_Y, negate * level * 0.3),
        "TranslateXRel": (TRANSLATE_X, -negate * level * 0.45 * width),
        "TranslateYRel": (TRANSLATE_Y, -negate * level * 0.45 * height),
    }
    for plain, code in (("Color", COLOR), ("Contrast", CONTRAST), ("Brightness", BRIGHTNESS), ("Sharpness", SHARPNESS)):
        ops[plain] = (code, enhance)
        ops[plain + "Increasing"] = (code, increasing)
    return ops[name]
