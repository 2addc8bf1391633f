"""gpuload.transforms.mix: MixUp and CutMix against torchvision's v2 ``MixUp``/``CutMix`` and timm's ``Mixup``
for the same draws, the distributions of the draws, the switch, label smoothing, compilation, bad input."""

import numpy as np
import pytest
import torch
from test_augment import ks_statistic, photo_tensor
from torchvision.transforms import v2

from gpuload import MixUpCutMix, UsageError
from gpuload.transforms.draws import GAMMA_DRAWS, gamma

NUM_CLASSES = 5


def batch(size=(48, 64), count=6):
    photos = [photo_tensor(*size), photo_tensor(*size).flip(2), photo_tensor(*size).flip(1)]
    images = torch.stack((photos * count)[:count]).float() / 255
    return images, torch.arange(count) % NUM_CLASSES


class _Fixed:
    """A stand-in for torchvision's Beta distribution that samples one given weight."""

    def __init__(self, lam: float) -> None:
        self.lam = lam

    def sample(self, shape):
        return torch.tensor(self.lam)


class TestTorchvision:
    @pytest.mark.parametrize("seed", range(4))
    def test_mixup_is_torchvisions(self, seed):
        images, labels = batch()
        mix = MixUpCutMix(NUM_CLASSES, mixup_alpha=0.2, cutmix_alpha=0.0)
        generator = torch.Generator().manual_seed(seed)
        cutmix, lam, _ = mix.draw(48, 64, device=torch.device("cpu"), generator=torch.Generator().manual_seed(seed))
        out, targets = mix(images, labels, generator=generator)
        theirs = v2.MixUp(alpha=0.2, num_classes=NUM_CLASSES)
        theirs._dist = _Fixed(float(lam))
        their_images, their_targets = theirs(images, labels)
        assert not bool(cutmix)
        torch.testing.assert_close(out, their_images, atol=1e-6, rtol=0)
        torch.testing.assert_close(targets, their_targets, atol=1e-6, rtol=0)

    @pytest.mark.parametrize("seed", range(4))
    def test_cutmix_is_torchvisions(self, seed, monkeypatch):
        images, labels = batch((45, 71))
        mix = MixUpCutMix(NUM_CLASSES, mixup_alpha=0.0, cutmix_alpha=1.0)
        draws = torch.rand((1, mix.draws), generator=torch.Generator().manual_seed(seed))
        cpu = torch.device("cpu")
        cutmix, _, _ = mix.draw(45, 71, device=cpu, generator=torch.Generator().manual_seed(seed), uniform=draws)
        out, targets = mix(images, labels, generator=torch.Generator().manual_seed(seed), uniform=draws)
        # torchvision's CutMix given the same Beta draw (from the uniforms' Gammas) and centre
        gammas = gamma(torch.ones(4, dtype=torch.float64), draws[0, 4:].view(4, GAMMA_DRAWS))
        raw_lam = float(gammas[0] / (gammas[0] + gammas[1]))
        centres = iter([torch.tensor([int(draws[0, 3] * 71)]), torch.tensor([int(draws[0, 2] * 45)])])
        monkeypatch.setattr(torch, "randint", lambda *args, **kwargs: next(centres))
        theirs = v2.CutMix(alpha=1.0, num_classes=NUM_CLASSES)
        theirs._dist = _Fixed(raw_lam)
        their_images, their_targets = theirs(images, labels)
        monkeypatch.undo()
        assert bool(cutmix)
        assert torch.equal(out, their_images)
        torch.testing.assert_close(targets, their_targets, atol=1e-6, rtol=0)


class TestTimm:
    @pytest.mark.parametrize("use_cutmix", [False, True])
    def test_the_batch_and_smoothed_targets_are_timms(self, use_cutmix, monkeypatch):
        from timm.data.mixup import Mixup

        images, labels = batch((40, 52), count=6)
        mix = MixUpCutMix.timm(NUM_CLASSES)
        betas = torch.rand((1, 4 * GAMMA_DRAWS), generator=torch.Generator().manual_seed(7))
        draws = torch.cat([torch.tensor([[0.1, 0.2 if use_cutmix else 0.9, 0.37, 0.81]]), betas], dim=1)
        cutmix, lam, _ = mix.draw(40, 52, device=torch.device("cpu"), uniform=draws)
        out, targets = mix(images, labels, uniform=draws)
        gammas = gamma(torch.tensor([1.0, 1.0, 0.8, 0.8], dtype=torch.float64), betas.view(4, GAMMA_DRAWS))
        raw_lam = (
            float(gammas[0] / (gammas[0] + gammas[1])) if use_cutmix else float(gammas[2] / (gammas[2] + gammas[3]))
        )
        theirs = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=NUM_CLASSES)
        monkeypatch.setattr(theirs, "_params_per_batch", lambda: (raw_lam, use_cutmix))
        centres = iter([int(0.37 * 40), int(0.81 * 52)])
        monkeypatch.setattr(np.random, "randint", lambda *args, **kwargs: next(centres))
        their_images, their_targets = theirs(images.clone(), labels)
        assert bool(cutmix) == use_cutmix
        torch.testing.assert_close(out, their_images, atol=1e-6, rtol=0)
        torch.testing.assert_close(targets, their_targets, atol=1e-6, rtol=0)


class TestDraws:
    def test_lam_is_beta_and_the_switch_is_switch_prob(self):
        mix = MixUpCutMix(NUM_CLASSES, mixup_alpha=0.2, cutmix_alpha=0.0)
        generator = torch.Generator().manual_seed(0)
        lams = torch.stack([mix.draw(8, 8, device=torch.device("cpu"), generator=generator)[1] for _ in range(3000)])
        beta = torch.from_numpy(np.random.default_rng(0).beta(0.2, 0.2, 3000))
        assert ks_statistic(lams.float(), beta.float()) < 0.05
        both = MixUpCutMix(NUM_CLASSES, switch_prob=0.3, prob=0.8)
        draws = [both.draw(8, 8, device=torch.device("cpu"), generator=generator) for _ in range(3000)]
        cutmix = torch.stack([d[0] for d in draws]).float().mean()
        unmixed = torch.stack([d[1] == 1 for d in draws]).float().mean()
        assert abs(float(cutmix) - 0.8 * 0.3) < 0.03 and abs(float(unmixed) - 0.2) < 0.03

    def test_a_uint8_batch_stays_uint8_and_eval_gives_smoothed_one_hot(self):
        images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
        labels = torch.tensor([0, 1, 2, 3])
        mix = MixUpCutMix(NUM_CLASSES, label_smoothing=0.1)
        out, targets = mix(images, labels, generator=torch.Generator().manual_seed(0))
        assert out.dtype == torch.uint8 and torch.allclose(targets.sum(1), torch.ones(4))
        out, targets = mix.eval()(images, labels)
        assert torch.equal(out, images)
        expected = torch.full((4, NUM_CLASSES), 0.02)
        expected[torch.arange(4), labels] = 0.92
        torch.testing.assert_close(targets, expected)

    def test_compiles_whole_and_equals_eager(self):
        mix = MixUpCutMix.timm(NUM_CLASSES)
        images, labels = batch((24, 32), count=4)
        draws = torch.rand((1, mix.draws), generator=torch.Generator().manual_seed(3))
        torch.compiler.reset()
        compiled = torch.compile(mix, fullgraph=True)
        torch.manual_seed(3)
        first = compiled(images, labels, uniform=draws)
        torch.manual_seed(4)  # the uniforms decide every draw, the Betas' too: torch's generator does not matter
        second = mix(images, labels, uniform=draws)
        torch.testing.assert_close(first, second, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: MixUpCutMix(0), "num_classes must be an int of at least 1"),
        (lambda: MixUpCutMix(5, mixup_alpha=-1), "mixup_alpha must be a number of at least 0"),
        (lambda: MixUpCutMix(5, mixup_alpha=0, cutmix_alpha=0), "both 0"),
        (lambda: MixUpCutMix(5, pairing="shuffle"), "pairing must be one of roll, flip"),
        (lambda: MixUpCutMix(5, label_smoothing=2), "label_smoothing must be a probability"),
        (lambda: MixUpCutMix(5)(torch.zeros(2, 3, 4, 4), torch.zeros(2)), "labels must be class indices"),
        (lambda: MixUpCutMix(5)(torch.zeros(2, 3, 4, 4), torch.zeros(3, dtype=torch.int64)), r"integers \[2\]"),
        (lambda: MixUpCutMix(5)(torch.zeros(3, 4, 4), torch.zeros(3, dtype=torch.int64)), "batch of images"),
        (
            lambda: MixUpCutMix(5)(torch.zeros(2, 3, 4, 4), torch.tensor([1, 5])),
            r"^labels must be in \[0, 5\) for num_classes=5, got 5: pass num_classes=",
        ),
        (lambda: MixUpCutMix(5)(torch.zeros(2, 3, 4, 4), torch.tensor([-1, 0])), r"in \[0, 5\).*got -1"),
    ],
)
def test_bad_input(call, message):
    with pytest.raises(UsageError, match=message):
        call()


def test_a_one_dimensional_uniform_is_refused_naming_the_shape_it_takes():
    """``uniform=`` is ``[1, draws]`` (a recipe's first row): a flat vector was refused as "[104, 104]"."""
    mix = MixUpCutMix(num_classes=10)
    images, labels = torch.rand((4, 3, 8, 8)), torch.arange(4)
    with pytest.raises(
        UsageError, match=rf"uniform must be \[1, {mix.draws}\] \(a row per sample\), got \[{mix.draws}\]"
    ):
        mix(images, labels, uniform=torch.rand(mix.draws))
