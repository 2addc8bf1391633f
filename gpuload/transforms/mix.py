"""MixUp and CutMix of a batch with its labels, switching between them per batch, with label smoothing.

One draw per batch, as the recipes make it: whether the batch is mixed at all (``prob``), CutMix or MixUp
(``switch_prob``), the mixing weight ``lam`` from a Beta distribution (``torch._standard_gamma`` on the
batch's device: Beta(a, a) is G1 / (G1 + G2)) and CutMix's box centre. Everything stays on the device
(no ``.item()``, no Python branch on a drawn value), so ``torch.compile(fullgraph=True)`` traces it whole.

Each sample is mixed with a partner: the previous sample (``pairing="roll"``, torchvision's
``MixUp``/``CutMix``) or the sample at the mirrored position (``"flip"``, timm's ``Mixup``). The targets
are the mixed one-hot labels, smoothed as timm's ``mixup_target`` and torch's ``cross_entropy(...,
label_smoothing=...)`` smooth them: ``(1 - smoothing) * target + smoothing / num_classes``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import UsageError
from .augment import _traced
from .checks import check_int, check_probability, is_number
from .draws import GAMMA_DRAWS, gamma, uniforms

__all__ = ["MixUpCutMix"]

BOXES = ("torchvision", "timm")
PAIRINGS = ("roll", "flip")


class MixUpCutMix(nn.Module):
    """MixUp and CutMix of a batch ``[B, C, H, W]`` and its labels ``[B]``, returning the images and soft
    targets ``[B, num_classes]`` (float32) for ``cross_entropy``.

    Args:
        num_classes: the number of classes of the labels.
        mixup_alpha: MixUp's Beta parameter (0: no MixUp).
        cutmix_alpha: CutMix's Beta parameter (0: no CutMix).
        switch_prob: with both, the probability that a batch gets CutMix rather than MixUp.
        prob: the probability that a batch is mixed at all.
        label_smoothing: the smoothing of the targets.
        pairing: ``"roll"`` (torchvision: each sample with the one before) or ``"flip"`` (timm: with the
            sample at the mirrored position).
        box: CutMix's box from its side ratio ``sqrt(1 - lam)``: ``"torchvision"`` (``CutMix``: half the
            side truncated on each side of the centre) or ``"timm"`` (``rand_bbox``: ``int(side * ratio)``
            rows and columns, the odd one below and after the centre).

    The presets: :meth:`torchvision` (its reference recipe: MixUp 0.2 or CutMix 1.0, one of them per batch;
    its loss smooths the labels) and :meth:`timm` (``Mixup(mixup_alpha=0.8, cutmix_alpha=1.0,
    label_smoothing=0.1)``).

    A uint8 batch comes out uint8 (MixUp's blend rounded to whole grey levels: 0.5 at most from the blend
    of the same batch normalised first); a float batch comes out in its dtype.

    Example:
        >>> mix = MixUpCutMix(10, mixup_alpha=0.2, cutmix_alpha=1.0, label_smoothing=0.1)
        >>> images, labels = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
        >>> out, targets = mix(images, labels, generator=torch.Generator().manual_seed(0))
        >>> out.shape, targets.shape, torch.allclose(targets.sum(1), torch.ones(4))
        (torch.Size([4, 3, 8, 8]), torch.Size([4, 10]), True)
    """

    draws = 4 + 4 * GAMMA_DRAWS  # whether, which, CutMix's centre row and column; the four Gammas of the two Betas

    def __init__(
        self,
        num_classes: int,
        *,
        mixup_alpha: float = 0.2,
        cutmix_alpha: float = 1.0,
        switch_prob: float = 0.5,
        prob: float = 1.0,
        label_smoothing: float = 0.0,
        pairing: str = "roll",
        box: str = "torchvision",
    ) -> None:
        super().__init__()
        self.num_classes = check_int("num_classes", num_classes, low=1)
        for name, alpha in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
            if not is_number(alpha) or alpha < 0:
                raise UsageError(f"{name} must be a number of at least 0 (0: off), got {alpha!r}")
        if mixup_alpha == 0 and cutmix_alpha == 0:
            raise UsageError("mixup_alpha and cutmix_alpha are both 0: give one of them, or leave MixUpCutMix out")
        if pairing not in PAIRINGS:
            raise UsageError(f"pairing must be one of {', '.join(PAIRINGS)}, got {pairing!r}")
        self.mixup_alpha, self.cutmix_alpha = float(mixup_alpha), float(cutmix_alpha)
        self.switch_prob = check_probability("switch_prob", switch_prob)
        self.prob = check_probability("prob", prob)
        self.label_smoothing = check_probability("label_smoothing", label_smoothing)
        if box not in BOXES:
            raise UsageError(f"box must be one of {', '.join(BOXES)}, got {box!r}")
        self.pairing, self.box = pairing, box

    @classmethod
    def torchvision(cls, num_classes: int, *, label_smoothing: float = 0.0) -> MixUpCutMix:
        """torchvision's classification reference: ``RandomChoice([MixUp(alpha=0.2), CutMix(alpha=1.0)])``
        per batch (its loss smooths the labels by 0.1: pass ``label_smoothing=0.1`` here, or to the loss)."""
        return cls(num_classes, mixup_alpha=0.2, cutmix_alpha=1.0, label_smoothing=label_smoothing)

    @classmethod
    def timm(cls, num_classes: int, *, label_smoothing: float = 0.1) -> MixUpCutMix:
        """timm's ``Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, mode="batch",
        label_smoothing=0.1)`` (DeiT, ResNet strikes back)."""
        return cls(
            num_classes, mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=label_smoothing, pairing="flip", box="timm"
        )

    def forward(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        uniform: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The mixed batch and its targets (in ``eval()`` mode the batch as it is, with one-hot targets).

        Args:
            generator: draws from this generator (on the images' device) instead of torch's.
            uniform: ``[1, draws]`` uniforms to use instead of drawing (the Beta draws too: see
                :func:`gpuload.transforms.draws.gamma`); only its first row is read, one draw per batch.
        """
        batch, height, width = _check(images, labels, self.num_classes)
        targets = torch.zeros((batch, self.num_classes), device=images.device)  # one-hot, without one_hot's sync
        targets = targets.scatter(1, labels.to(torch.int64).view(-1, 1), 1.0)
        if self.training:
            cutmix, lam, box = self.draw(height, width, device=images.device, generator=generator, uniform=uniform)
            top, bottom, left, right = box.unbind()
            ys = torch.arange(height, device=images.device).view(1, 1, height, 1)
            xs = torch.arange(width, device=images.device).view(1, 1, 1, width)
            inside = (ys >= top) & (ys < bottom) & (xs >= left) & (xs < right)
            partner = images.roll(1, 0) if self.pairing == "roll" else images.flip(0)
            weight = lam.to(torch.float32)
            if images.device.type == "cpu" and not _traced():  # eager on a CPU: only the drawn one
                images = torch.where(inside, partner, images) if bool(cutmix) else _blend(images, partner, weight)
            else:
                images = torch.where(cutmix, torch.where(inside, partner, images), _blend(images, partner, weight))
            others = targets.roll(1, 0) if self.pairing == "roll" else targets.flip(0)
            targets = targets * weight + others * (1 - weight)
        smoothing = self.label_smoothing
        return images, targets * (1 - smoothing) + smoothing / self.num_classes

    def draw(
        self,
        height: int,
        width: int,
        *,
        device: torch.device,
        generator: torch.Generator | None = None,
        uniform: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One batch's draws: whether it gets CutMix (bool), the weight of each sample's own image
        (float64: CutMix's corrected by the box's area, 1 for a batch not mixed), and CutMix's box
        (int64 ``top, bottom, left, right``; empty for MixUp), all on ``device``, as torchvision's
        ``CutMix.make_params`` and timm's ``cutmix_bbox_and_lam`` compute them."""
        if uniform is None:
            whether, which, row, column = uniforms(1, 4, device=device, generator=generator)[0]
        else:
            rows = uniform.shape[0] if isinstance(uniform, torch.Tensor) and uniform.dim() == 2 else 1
            given = uniforms(rows, self.draws, device=device, uniform=uniform)[0]  # the first row only
            whether, which, row, column = given[:4]
        mixed = whether.to(torch.float64) < self.prob
        if self.mixup_alpha == 0 or self.cutmix_alpha == 0:
            cutmix = mixed & (self.cutmix_alpha > 0)
        else:
            cutmix = mixed & (which.to(torch.float64) < self.switch_prob)
        alphas = torch.tensor(
            [self.cutmix_alpha or 1.0] * 2 + [self.mixup_alpha or 1.0] * 2, dtype=torch.float64, device=device
        )
        if uniform is not None:
            gammas = gamma(alphas, given[4:].view(4, GAMMA_DRAWS))
        elif generator is None:
            gammas = torch._standard_gamma(alphas)
        else:
            gammas = torch._standard_gamma(alphas, generator=generator)
        cut_lam = gammas[0] / (gammas[0] + gammas[1]).clamp(min=1e-300)
        mix_lam = gammas[2] / (gammas[2] + gammas[3]).clamp(min=1e-300)
        ratio = torch.sqrt(1 - cut_lam)
        if self.box == "torchvision":  # CutMix.make_params: half the side each way, truncated
            above = below = torch.trunc(0.5 * ratio * height)
            before = after = torch.trunc(0.5 * ratio * width)
        else:  # timm's rand_bbox: a side of int(H * ratio), its odd row and column below and after the centre
            cut_height, cut_width = torch.trunc(ratio * height), torch.trunc(ratio * width)
            above, below = torch.floor(cut_height / 2), torch.floor((cut_height + 1) / 2)
            before, after = torch.floor(cut_width / 2), torch.floor((cut_width + 1) / 2)
        centre_y = torch.floor(row.to(torch.float64) * height).clamp(max=height - 1)
        centre_x = torch.floor(column.to(torch.float64) * width).clamp(max=width - 1)
        top, bottom = (centre_y - above).clamp(min=0), (centre_y + below).clamp(max=height)
        left, right = (centre_x - before).clamp(min=0), (centre_x + after).clamp(max=width)
        box = torch.stack([top, bottom, left, right]).to(torch.int64)
        box = torch.where(cutmix, box, torch.zeros_like(box))
        corrected = 1 - (bottom - top) * (right - left) / (height * width)
        lam = torch.where(cutmix, corrected, torch.where(mixed, mix_lam, 1.0))
        return cutmix, lam, box

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, mixup_alpha={self.mixup_alpha}, cutmix_alpha={self.cutmix_alpha}, "
            f"switch_prob={self.switch_prob}, prob={self.prob}, label_smoothing={self.label_smoothing}, "
            f"pairing={self.pairing!r}, box={self.box!r}"
        )


def _blend(images: torch.Tensor, partner: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """MixUp's ``weight * images + (1 - weight) * partner``, in the images' dtype (uint8: rounded)."""
    blend = torch.lerp(partner.to(torch.float32), images.to(torch.float32), weight)
    return blend.to(images.dtype) if images.is_floating_point() else blend.round().to(images.dtype)


def _check(images: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[int, int, int]:
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        got = list(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise UsageError(f"expected a batch of images [B, C, H, W], got {got}")
    if not isinstance(labels, torch.Tensor) or labels.shape != images.shape[:1] or labels.is_floating_point():
        got = f"{labels.dtype} {list(labels.shape)}" if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise UsageError(f"labels must be class indices, integers [{images.shape[0]}], got {got}")
    if labels.device.type == "cpu" and labels.numel() and not _traced():  # free here; on a GPU it would sync
        low, high = (int(value) for value in torch.aminmax(labels.to(torch.int64)))
        if low < 0 or high >= num_classes:
            raise UsageError(
                f"labels must be in [0, {num_classes}) for num_classes={num_classes}, got {low if low < 0 else high}: "
                "pass num_classes=len(dataset.classes)"
            )
    return images.shape[0], images.shape[2], images.shape[3]
