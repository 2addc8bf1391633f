"""gpuload.transforms.policies: the choice of ops and magnitudes against torchvision's and timm's, the pixels
of a policy's samples against torchvision's ops, masks, compilation and the bad arguments."""

import math
import random
from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency
from test_augment import ks_statistic, photo_tensor
from test_functional import torchvision_op
from torchvision.transforms import v2

from gpuload import AutoAugment, RandAugment, TrivialAugmentWide, UsageError
from gpuload.transforms.functional import OPS

HEIGHT, WIDTH = 60, 80  # the image size the draws are made for (translations scale with it)
_TORCHVISION_NAMES = {
    "Identity": "identity", "ShearX": "shear_x", "ShearY": "shear_y", "TranslateX": "translate_x",
    "TranslateY": "translate_y", "Rotate": "rotate", "Brightness": "brightness", "Color": "color",
    "Contrast": "contrast", "Sharpness": "sharpness", "Posterize": "posterize", "Solarize": "solarize",
    "AutoContrast": "autocontrast", "Equalize": "equalize", "Invert": "invert",
}  # fmt: skip


def torchvision_value(name: str, magnitude: float) -> float:
    """What torchvision's ``_apply_image_or_video_transform`` passes its functional op (our value)."""
    if name in ("translate_x", "translate_y", "posterize"):
        return float(int(magnitude))
    if name in ("brightness", "color", "contrast", "sharpness"):
        return 1.0 + magnitude
    if name == "solarize":
        return 255.0 * magnitude
    if name in ("shear_x", "shear_y", "rotate"):
        return magnitude
    return 0.0


def torchvision_draws(policy: v2.Transform, count: int) -> list[tuple[str, float]]:
    """The (op, value) of every op torchvision's ``policy`` applies to ``count`` images (its pixels skipped)."""
    applied = []

    def record(image, transform_id, magnitude, interpolation, fill):
        name = _TORCHVISION_NAMES[transform_id]
        applied.append((name, round(torchvision_value(name, magnitude), 3)))
        return image

    policy._apply_image_or_video_transform = record
    image = torch.zeros((3, HEIGHT, WIDTH), dtype=torch.uint8)
    torch.manual_seed(0)
    for _ in range(count):
        policy(image)
    return applied


def our_draws(policy, count: int) -> list[tuple[str, float]]:
    """The (op, value) of every op ``policy`` applies to ``count`` samples (identity where none applies)."""
    draws = torch.rand((count, policy.draws), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    applied = []
    for ops, values in policy.layers(draws, HEIGHT, WIDTH):
        applied += [(OPS[op], round(value, 3)) for op, value in zip(ops.tolist(), values.tolist())]
    return applied


def same_distribution(ours: list, theirs: list, *, skipped: tuple[int, int] = (0, 0)) -> float:
    """The p-value of a chi-squared test that two samples of categories come from one distribution
    (``skipped``: ops not applied, ours and theirs, as a category of their own)."""
    mine, their = Counter(ours), Counter(theirs)
    categories = sorted(set(mine) | set(their))
    table = [[mine[c] for c in categories] + [skipped[0]], [their[c] for c in categories] + [skipped[1]]]
    table = [row[:-1] for row in table] if skipped == (0, 0) else table
    return float(chi2_contingency(np.array(table)).pvalue)


class TestTorchvisionDistributions:
    """Each policy draws torchvision's ops and magnitudes: the same support, the same frequencies."""

    @pytest.mark.parametrize(
        ("ours", "theirs", "count"),
        [
            (TrivialAugmentWide(), v2.TrivialAugmentWide(), 20_000),
            (TrivialAugmentWide(num_magnitude_bins=5), v2.TrivialAugmentWide(num_magnitude_bins=5), 8_000),
            (RandAugment(), v2.RandAugment(), 8_000),
            (RandAugment(3, 5, 11), v2.RandAugment(3, 5, 11), 5_000),
        ],
        ids=["trivial", "trivial-5-bins", "rand", "rand-3-5-11"],
    )
    def test_ops_and_magnitudes(self, ours, theirs, count):
        mine, their = our_draws(ours, count * 4), torchvision_draws(theirs, count)
        assert set(mine) == set(their)  # every (op, value) pair torchvision draws, and no other
        assert same_distribution(mine, their) > 1e-3
        assert same_distribution([name for name, _ in mine], [name for name, _ in their]) > 1e-3

    def test_autoaugment_imagenet(self):
        count = 10_000
        mine = [pair for pair in our_draws(AutoAugment(), count * 4) if pair[0] != "identity"]
        their = torchvision_draws(v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET), count)
        assert set(mine) == set(their)
        skipped = (2 * count * 4 - len(mine), 2 * count - len(their))  # ops whose probability said no
        assert same_distribution(mine, their, skipped=skipped) > 1e-3


def timm_draws(config: str, count: int) -> list[tuple[str, float]]:
    """The (op, value) of every op timm's ``rand_augment_transform(config)`` applies to ``count`` images of
    ``HEIGHT x WIDTH`` (its pixels skipped), in our ops' terms."""
    from PIL import Image
    from timm.data.auto_augment import rand_augment_transform

    transform = rand_augment_transform(config, {"img_mean": (124, 116, 104)})
    applied = []
    ours = {"ShearX": "shear_x", "ShearY": "shear_y", "Rotate": "rotate", "SolarizeAdd": "solarize_add"}
    ours |= {"TranslateXRel": "translate_x", "TranslateYRel": "translate_y"}
    ours |= {"AutoContrast": "autocontrast", "Equalize": "equalize", "Invert": "invert"}
    for name in ("Posterize", "Solarize", "Color", "Contrast", "Brightness", "Sharpness"):
        ours[name] = ours[name + "Increasing"] = name.lower()

    def recorder(name):
        def record(image, *args, **kwargs):
            value = float(args[0]) if args else 0.0
            if name == "TranslateXRel":  # Pillow's shift to the left by a share of the width
                value = -value * WIDTH
            elif name == "TranslateYRel":
                value = -value * HEIGHT
            applied.append((ours[name], value))
            return image

        return record

    for op in transform.ops:
        op.aug_fn = recorder(op.name)
    random.seed(0)
    np.random.seed(0)
    image = Image.new("RGB", (WIDTH, HEIGHT))
    for _ in range(count):
        transform(image)
    return applied


class TestTimmDistributions:
    """``RandAugment.timm(config)`` draws timm's ops and magnitudes (``mstd``: magnitude noise; ``inc1``:
    the increasing op set)."""

    @pytest.mark.parametrize("config", ["rand-m9-mstd0.5-inc1", "rand-m7-n3-p0.8", "rand-m9-mstd101"])
    def test_ops_and_magnitudes(self, config):
        count = 6_000
        policy = RandAugment.timm(config)
        draws = torch.rand((count * 4, policy.draws), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        mine = []
        for ops, values in policy.layers(draws, HEIGHT, WIDTH):
            mine += [(OPS[op], value) for op, value in zip(ops.tolist(), values.tolist()) if OPS[op] != "identity"]
        their = timm_draws(config, count)
        names = sorted({name for name, _ in mine} | {name for name, _ in their})
        layers = policy.num_ops
        skipped = (layers * count * 4 - len(mine), layers * count - len(their))
        assert same_distribution([n for n, _ in mine], [n for n, _ in their], skipped=skipped) > 1e-3
        for name in names:  # each op's magnitudes (noisy under mstd): the same distribution
            first = torch.tensor([v for n, v in mine if n == name])
            second = torch.tensor([v for n, v in their if n == name])
            bound = 1.95 * math.sqrt((len(first) + len(second)) / (len(first) * len(second)))  # 0.1 % level
            assert ks_statistic(first, second) < bound, name

    def test_a_fixed_magnitude_gives_timms_values(self):
        policy = RandAugment.timm("rand-m9-inc1")
        draws = torch.rand((4000, policy.draws), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        mine = {
            (OPS[op], round(value, 2))
            for ops, values in policy.layers(draws, HEIGHT, WIDTH)
            for op, value in zip(ops.tolist(), values.tolist())
            if OPS[op] != "identity"
        }
        assert mine == {(name, round(value, 2)) for name, value in timm_draws("rand-m9-inc1", 2000)}


class TestPixels:
    @pytest.mark.parametrize("size", [(96, 128), (131, 77)])
    @pytest.mark.parametrize("policy", [TrivialAugmentWide(fill=(124, 116, 104)), RandAugment(), AutoAugment()])
    def test_each_sample_is_torchvisions_ops_in_turn(self, policy, size):
        """A policy's output is, sample by sample, torchvision's functional ops of its draws in turn."""
        images = torch.stack([photo_tensor(*size), photo_tensor(*size).flip(2)] * 6)
        draws = torch.rand((len(images), policy.draws), generator=torch.Generator().manual_seed(3))
        out = policy(images, uniform=draws)
        expected = images.clone()
        for ops, values in policy.layers(draws.to(torch.float64), *size):
            for sample, (op, value) in enumerate(zip(ops.tolist(), values.tolist())):
                if OPS[op] != "identity":
                    expected[sample] = torchvision_op(expected[sample], OPS[op], value, fill=policy.fill)
        assert torch.equal(out, expected)

    def test_eval_mode_and_the_generator(self):
        images = torch.randint(0, 256, (4, 3, 24, 24), dtype=torch.uint8)
        policy = TrivialAugmentWide()
        first = policy(images, generator=torch.Generator().manual_seed(5))
        assert torch.equal(first, policy(images, generator=torch.Generator().manual_seed(5)))
        assert torch.equal(policy.eval()(images), images)

    def test_masks_follow_the_geometric_ops(self):
        images = photo_tensor(48, 64)[None].repeat(16, 1, 1, 1)
        masks = (photo_tensor(48, 64)[0] // 64).to(torch.int64)[None].repeat(16, 1, 1)
        policy = TrivialAugmentWide()
        draws = torch.rand((16, policy.draws), generator=torch.Generator().manual_seed(2))
        out, moved = policy(images, masks=masks, uniform=draws)
        assert torch.equal(out, policy(images, uniform=draws)) and moved.shape == masks.shape
        ((ops, values),) = policy.layers(draws.to(torch.float64), 48, 64)
        for sample, (op, value) in enumerate(zip(ops.tolist(), values.tolist())):
            from torchvision import tv_tensors

            if OPS[op] in ("shear_x", "shear_y", "translate_x", "translate_y", "rotate"):
                expected = torchvision_op(tv_tensors.Mask(masks[sample][None]), OPS[op], value)[0]
            else:
                expected = masks[sample]
            assert torch.equal(moved[sample], expected.as_subclass(torch.Tensor)), OPS[op]


def test_compiled_policies_in_turn_make_one_graph_close_to_eager():
    """The three policies, one after another, compile whole (``fullgraph=True``: no graph break, so no
    host synchronisation) and give the eager pixels but for a few rounding steps."""
    policies = (RandAugment.timm("rand-m9-mstd0.5-inc1"), AutoAugment(), TrivialAugmentWide())

    def augment(images: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        start = 0
        for policy in policies:
            images = policy(images, uniform=draws[:, start : start + policy.draws])
            start += policy.draws
        return images

    images = torch.stack([photo_tensor(40, 56), photo_tensor(40, 56).flip(1)] * 4)
    draws = torch.rand((8, sum(p.draws for p in policies)), generator=torch.Generator().manual_seed(0))
    torch.compiler.reset()
    compiled = torch.compile(augment, fullgraph=True)(images, draws)
    eager = augment(images, draws)
    gap = (compiled.int() - eager.int()).abs()
    assert compiled.dtype == torch.uint8 and float((gap > 1).float().mean()) < 0.01


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: TrivialAugmentWide(num_magnitude_bins=1), "num_magnitude_bins must be an int of at least 2"),
        (lambda: RandAugment(magnitude=31), r"magnitude must be a bin in \[0, 31\)"),
        (lambda: RandAugment(num_ops=-1), "num_ops must be an int of at least 0"),
        (lambda: AutoAugment("cifar10"), "policy must be 'imagenet'"),
        (lambda: TrivialAugmentWide(interpolation="bicubic"), "interpolation must be one of"),
        (lambda: TrivialAugmentWide(fill=(1, 2)), "fill must be None, a number or 3 numbers"),
        (lambda: TrivialAugmentWide(fill=300), "fill must be None"),
        (lambda: RandAugment.timm("rand-m9-tweights"), "weighted op choice"),
        (lambda: RandAugment.timm("augmix-m5"), "starts with 'rand'"),
        (lambda: RandAugment.timm("rand-q3"), "unknown section 'q3'"),
        (lambda: RandAugment.timm("rand-m9x"), "is not a number"),
        (lambda: TrivialAugmentWide()(torch.zeros(2, 3, 8, 8), uniform=torch.zeros(2, 2)), "hold 3 draws"),
        (lambda: TrivialAugmentWide()(torch.zeros(2, 3, 8, 8), uniform=torch.zeros(3, 3)), r"uniform must be \[2, 3\]"),
    ],
)
def test_bad_arguments(make, message):
    with pytest.raises(UsageError, match=message):
        make()
