"""A training recipe in one object: the crop where it is cheapest, then the per-sample ops, ``Normalize``,
RandomErasing and MixUp/CutMix, so that no image is cropped twice and evaluation is torchvision's.

:class:`Recipe` owns where the crop happens. With ``crop="loader"`` it gives the loader its decode-time
crop (:meth:`Recipe.loader`, :meth:`Recipe.decode`: ``RandomResizedCropDecode`` for training,
``CenterCropDecode``, torchvision's ``Resize(256)`` + ``CenterCrop(224)``, for evaluation) and itself
takes only batches of the crop's size; with ``crop="device"`` the loader gets no crop and the recipe crops
on the device (:class:`gpuload.RandomResizedCrop`, whose ``eval()`` is the same evaluation transform), and
refuses batches already at the crop's size. Either way a second crop (the 1.14x zoom of a centre crop of
an image already cropped) is an error, not a silent loss of accuracy.

Segmentation: ``recipe(images, labels, masks=masks)`` moves the masks through the geometric steps with
their images (the crop and flip, on the device or in the loader's threads; the policy's geometric ops),
by nearest neighbour, with class 255 (``ignore_index``) where a step brings in area; erasing touches the
images only, and MixUp/CutMix, which blend images, are refused with masks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..errors import UsageError
from ..format.fields import MASK_FILL
from ..loading.crop import CenterCropDecode, RandomResizedCropDecode
from .augment import RandomResizedCrop, check_size
from .draws import uniforms
from .erasing import RandomErasing
from .masks import check_masks
from .mix import MixUpCutMix
from .normalize import IMAGENET_MEAN, IMAGENET_STD, Normalize
from .policies import RandAugment, TrivialAugmentWide, _Policy

__all__ = ["Recipe"]

CROPS = ("loader", "device")


class Recipe(nn.Module):
    """The augmentation of a training recipe, from the loader's batches to the model's input.

    In ``train()`` mode: the random resized crop and flip (in the loader's threads or on the device, as
    ``crop`` says), the per-sample ``augment`` policy on uint8, :class:`gpuload.Normalize`, the per-sample
    ``erasing`` (on the normalised batch, where 0 is the mean colour, as torchvision's reference erases),
    then ``mix`` with the labels. In ``eval()`` mode: torchvision's evaluation transform (resize the
    shorter side to ``size / eval_ratio``, centre crop ``size``) and ``Normalize``, nothing random.

    Args:
        size: the crop's side.
        crop: ``"loader"`` (decode-time crop in the loader's threads: build the loader with
            :meth:`loader`) or ``"device"`` (on the batch's device: the loader serves whole images).
        scale: the range of the crop's area (torchvision's ``RandomResizedCrop``).
        flip: mirror half the samples left-right.
        augment: a per-sample policy (:class:`gpuload.TrivialAugmentWide`, :class:`gpuload.RandAugment`,
            :class:`gpuload.AutoAugment`) or ``None``.
        erasing: a :class:`gpuload.RandomErasing` or ``None``.
        mix: a :class:`gpuload.MixUpCutMix` or ``None`` (then the labels pass as they are).
        mean: ``Normalize``'s mean (0..1 scale).
        std: ``Normalize``'s standard deviation.
        eval_ratio: the crop's share of the resized shorter side at evaluation (224 / 256).

    Example:
        >>> recipe = Recipe.torchvision(num_classes=10, size=32)
        >>> recipe.decode(train=True), recipe.decode(train=False)
        (RandomResizedCropDecode(size=(32, 32), scale=(0.08, 1.0), ratio=(0.75, 1.3333333333333333), flip=True, fast=True, gpu=False), CenterCropDecode(size=(32, 32), ratio=0.8750, fast=False, gpu=False))
        >>> images, labels = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8), torch.tensor([0, 1, 2, 3])
        >>> images, targets = recipe(images, labels, generator=torch.Generator().manual_seed(0))
        >>> images.dtype, targets.shape
        (torch.float32, torch.Size([4, 10]))
    """

    def __init__(
        self,
        size: int = 224,
        *,
        crop: str = "loader",
        scale: Sequence[float] = (0.08, 1.0),
        flip: bool = True,
        augment: nn.Module | None = None,
        erasing: RandomErasing | None = None,
        mix: MixUpCutMix | None = None,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        eval_ratio: float = 224 / 256,
    ) -> None:
        super().__init__()
        if crop not in CROPS:
            raise UsageError(f"crop must be 'loader' (in the loader's threads) or 'device', got {crop!r}")
        if not isinstance(flip, bool):
            raise UsageError(f"flip must be a bool, got {flip!r}")
        for name, value, kind in (("erasing", erasing, RandomErasing), ("mix", mix, MixUpCutMix)):
            if value is not None and not isinstance(value, kind):
                raise UsageError(f"{name} must be a gpuload.{kind.__name__} or None, got {type(value).__name__}")
        if augment is not None and not isinstance(augment, nn.Module):
            raise UsageError(f"augment must be an nn.Module taking (images, generator=) or None, got {augment!r}")
        self.size, self.crop, self.flip, self.scale = check_size(size), crop, flip, tuple(scale)
        self.eval_ratio = float(eval_ratio)
        # The crop of either place, so that its arguments are checked the same way whichever is used.
        cropper = RandomResizedCrop(size, scale, flip=flip, eval_ratio=eval_ratio)
        self.cropper = cropper if crop == "device" else None
        self.augment, self.erasing, self.mix = augment, erasing, mix
        self.normalize = Normalize(mean, std)

    @classmethod
    def torchvision(
        cls, num_classes: int, *, size: int = 224, crop: str = "loader", label_smoothing: float = 0.1
    ) -> Recipe:
        """torchvision's classification reference recipe (ResNet-50 "new recipe"): RandomResizedCrop,
        horizontal flip, ``TrivialAugmentWide`` (bilinear), ``RandomErasing(p=0.1)``, MixUp 0.2 or CutMix 1.0
        per batch, label smoothing 0.1 (in the targets here; the reference gives it to its loss)."""
        return cls(
            size,
            crop=crop,
            augment=TrivialAugmentWide(interpolation="bilinear"),
            erasing=RandomErasing(p=0.1),
            mix=MixUpCutMix.torchvision(num_classes, label_smoothing=label_smoothing),
        )

    @classmethod
    def timm(
        cls, num_classes: int, *, size: int = 224, crop: str = "loader", config: str = "rand-m9-mstd0.5-inc1"
    ) -> Recipe:
        """timm's DeiT / "ResNet strikes back" training transform: RandomResizedCrop, flip,
        ``RandAugment`` from ``config``, RandomErasing (p=0.25, per-pixel normal noise: timm's ``mode="pixel"``),
        Mixup 0.8 / CutMix 1.0 per batch with label smoothing 0.1."""
        return cls(
            size,
            crop=crop,
            augment=RandAugment.timm(config),
            erasing=RandomErasing(p=0.25, scale=(0.02, 1 / 3), ratio=(0.3, 1 / 0.3), value="random"),  # timm's
            mix=MixUpCutMix.timm(num_classes),
        )

    def decode(self, *, train: bool) -> RandomResizedCropDecode | CenterCropDecode | None:
        """The loader's ``decode=`` for this recipe: its crop for training and torchvision's evaluation crop
        with ``crop="loader"``; ``None`` with ``crop="device"`` (the loader serves whole images)."""
        if self.crop == "device":
            return None
        if train:
            return RandomResizedCropDecode(self.size, self.scale, flip=self.flip)
        return CenterCropDecode(self.size, ratio=self.eval_ratio)

    def loader(self, dataset, *, train: bool = True, **options):
        """A :class:`gpuload.DataLoader` of ``dataset`` with this recipe's ``decode=`` (``options``: the
        loader's other arguments; ``decode=`` and ``transform=`` are the recipe's to decide)."""
        from ..loading.loader import DataLoader

        taken = sorted({"decode", "transform"} & set(options))
        if taken:
            raise UsageError(
                f"Recipe.loader decides {' and '.join(taken)}=: build the loader with gpuload.DataLoader "
                "yourself to choose them, and apply the recipe to its batches"
            )
        inner = getattr(dataset, "dataset", dataset)  # a Subset's
        classes = getattr(inner, "classes", None)
        if self.mix is not None and classes is not None and len(classes) > self.mix.num_classes:
            raise UsageError(
                f"the dataset has {len(classes)} classes, and the recipe's targets {self.mix.num_classes}: pass "
                f"num_classes={len(classes)} (labels past {self.mix.num_classes - 1} would fail at the first batch)"
            )
        return DataLoader(dataset, decode=self.decode(train=train), **options)

    def forward(
        self,
        images: torch.Tensor,
        labels: torch.Tensor | None = None,
        *,
        masks: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        uniform: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The model's input from a loader's uint8 batch ``[B, 3, H, W]``, and the targets from ``labels``
        when given (the soft targets of ``mix`` in training; the labels as they are otherwise), and the
        ``masks`` (``[B, H, W]`` class ids, the batch's ``"mask"``) moved with the images when given, last:
        ``(images, targets, masks)`` or ``(images, masks)``.

        ``generator`` (on the images' device) replaces torch's for every draw; the loader passes one seeded
        by (seed, epoch, rank, the batch's position) when the recipe is its ``transform=``. ``uniform``
        (``[B, recipe.draws]`` uniforms in [0, 1), ``loader.uniforms(recipe.draws)`` in a training loop)
        decides every draw instead, each sample's from its own row (the mix's from the first row): a
        resumed run repeats them."""
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            got = list(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise UsageError(f"expected a batch of images [B, 3, H, W], got {got}")
        if labels is None and self.training and self.mix is not None:
            raise UsageError(
                f"this recipe mixes images and their labels (mix={type(self.mix).__name__}), and got no labels (as a "
                "loader's transform= it gets the images only): call it on the loader's batches, images, targets = "
                "recipe(images, labels); or recipe.eval() for evaluation"
            )
        if masks is not None:
            self._check_masks(images, masks)
        parts = self._split(images, uniform) if uniform is not None and self.training else {}
        cropped = tuple(images.shape[-2:]) == self.size
        if self.cropper is None and not cropped:
            raise UsageError(
                f"this recipe crops in the loader (crop='loader'), so it takes {list(self.size)} batches, got "
                f"{list(images.shape[-2:])}: build the loader with recipe.loader(dataset, ...), or use "
                "Recipe(crop='device') to crop on the device"
            )
        if self.cropper is not None:
            if cropped:
                raise UsageError(
                    f"this recipe crops on the device (crop='device'), and the batch is already {list(self.size)}: "
                    "it was cropped before (a loader with decode=?), and cropping again zooms in; or the dataset "
                    "is stored at the crop size. Use Recipe(crop='loader') with recipe.loader(dataset, ...) (its "
                    "crop reads the stored image: right for both), or a loader without decode="
                )
            moved = self.cropper(images, generator=generator, masks=masks, uniform=parts.get("crop"))
            images, masks = moved if masks is not None else (moved, None)
        if self.training and self.augment is not None:
            moved = self.augment(
                images,
                generator=generator,
                **({} if masks is None else {"masks": masks, "mask_fill": MASK_FILL}),
                **({"uniform": parts["augment"]} if "augment" in parts else {}),
            )
            images, masks = moved if masks is not None else (moved, None)
        images = self.normalize(images)
        if self.training and self.erasing is not None:
            images = self.erasing(images, generator=generator, uniform=parts.get("erasing"))
        if labels is not None and self.training and self.mix is not None:
            images, labels = self.mix(images, labels, generator=generator, uniform=parts.get("mix"))
        out = (images, *([] if labels is None else [labels]), *([] if masks is None else [masks]))
        return out if len(out) > 1 else images

    @property
    def draws(self) -> int:
        """The uniforms a sample takes in ``train()`` mode (``uniform=``'s columns): the device crop's, the
        policy's, the erasing's and the mix's, in that order.

        Example:
            >>> Recipe.torchvision(num_classes=10).draws  # TrivialAugmentWide 3, RandomErasing 23, MixUp/CutMix 104
            130
        """
        return sum(count for _, count in self._draws())

    def _draws(self) -> list[tuple[str, int]]:
        """Each random step's name and uniforms per sample, in the order the steps run."""
        steps = [("crop", self.cropper), ("augment", self.augment), ("erasing", self.erasing), ("mix", self.mix)]
        out = []
        for name, step in steps:
            if step is None:
                continue
            if not isinstance(getattr(step, "draws", None), int):
                raise UsageError(
                    f"augment={type(step).__name__} does not say how many uniforms it takes (a draws attribute and a "
                    "uniform= argument): use a gpuload policy, or leave uniform= out"
                )
            out.append((name, step.draws))
        return out

    def _split(self, images: torch.Tensor, uniform: torch.Tensor) -> dict[str, torch.Tensor]:
        """``uniform``'s columns for each random step (the mix: the first row's)."""
        steps = self._draws()
        given = uniforms(images.shape[0], sum(count for _, count in steps), device=images.device, uniform=uniform)
        parts, start = {}, 0
        for name, count in steps:
            parts[name] = given[:, start : start + count]
            start += count
        if "mix" in parts:
            parts["mix"] = parts["mix"][:1]
        return parts

    def _check_masks(self, images: torch.Tensor, masks: torch.Tensor) -> None:
        """Refuse masks this recipe cannot move with their images (one line saying what to change)."""
        if self.training and self.mix is not None:
            raise UsageError(
                f"this recipe mixes images (mix={type(self.mix).__name__}), and a mask's class ids cannot be mixed: "
                "for segmentation build the recipe with mix=None"
            )
        if self.training and self.augment is not None and not isinstance(self.augment, _Policy):
            raise UsageError(
                f"augment={type(self.augment).__name__} does not move masks with the images: use "
                "gpuload.TrivialAugmentWide, RandAugment or AutoAugment, or augment=None"
            )
        check_masks(masks, images)

    def extra_repr(self) -> str:
        return f"size={self.size}, crop={self.crop!r}, flip={self.flip}"
