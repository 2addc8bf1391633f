"""gpuload.transforms.erasing: RandomErasing's rectangles against torchvision's, its pixels against
torchvision's ``erase``, its fills, compilation and the bad arguments."""

import pytest
import torch
from test_augment import ks_statistic, photo_tensor
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from gpuload import IMAGENET_MEAN, IMAGENET_STD, Normalize, RandomErasing, UsageError
from gpuload.transforms import erasing

HEIGHT, WIDTH = 48, 64


def torchvision_boxes(erase: v2.RandomErasing, count: int) -> torch.Tensor:
    """torchvision's rectangle for ``count`` images (``0, 0, 0, 0`` where it leaves one as it is)."""
    torch.manual_seed(0)
    image = torch.zeros((3, HEIGHT, WIDTH), dtype=torch.uint8)
    boxes = []
    for _ in range(count):
        if torch.rand(1) >= erase.p:  # what _RandomApplyTransform.forward draws first
            boxes.append((0, 0, 0, 0))
            continue
        params = erase.make_params([image])
        fitted = params["v"] is not None
        boxes.append((params["i"], params["j"], params["h"], params["w"]) if fitted else (0, 0, 0, 0))
    return torch.tensor(boxes)


class TestDistribution:
    @pytest.mark.parametrize(
        "options", [{"p": 0.5}, {"p": 1.0, "scale": (0.3, 0.9), "ratio": (0.5, 4.0)}, {"p": 0.25}], ids=str
    )
    def test_rectangles_are_torchvisions(self, options):
        ours = RandomErasing(**options)
        draws = torch.rand((16_000, ours.draws), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        mine, theirs = ours.boxes(draws, HEIGHT, WIDTH), torchvision_boxes(v2.RandomErasing(**options), 4_000)
        erased, their_erased = mine[:, 2] > 0, theirs[:, 2] > 0
        assert abs(float(erased.float().mean()) - float(their_erased.float().mean())) < 0.03
        for column, name in enumerate(["top", "left", "height", "width"]):
            gap = ks_statistic(mine[erased, column].float(), theirs[their_erased, column].float())
            assert gap < 0.05, name
        assert ((mine[:, 0] + mine[:, 2] <= HEIGHT) & (mine[:, 1] + mine[:, 3] <= WIDTH)).all()
        assert ((mine[erased, 2] < HEIGHT) & (mine[erased, 3] < WIDTH)).all()


class TestPixels:
    @pytest.mark.parametrize("size", [(96, 128), (75, 131)])
    @pytest.mark.parametrize("value", [0, (124, 116, 104)])
    @pytest.mark.parametrize("branchless", [False, True], ids=["each", "branchless"])
    def test_each_sample_is_torchvisions_erase_of_its_rectangle(self, size, value, branchless, monkeypatch):
        """Eager on a CPU each rectangle is written apart; on a GPU and compiled, one masked pass (forced here)."""
        monkeypatch.setattr(erasing, "_traced", lambda: branchless)
        images = torch.stack([photo_tensor(*size), photo_tensor(*size).flip(2)] * 8)
        erase = RandomErasing(p=0.7, value=value)
        draws = torch.rand((len(images), erase.draws), generator=torch.Generator().manual_seed(1))
        out = erase(images, uniform=draws)
        fill = torch.tensor(value if isinstance(value, tuple) else (value,), dtype=torch.float32)[:, None, None]
        for image, sample, (top, left, rows, columns) in zip(images, out, erase.boxes(draws, *size).tolist()):
            expected = F.erase(image, top, left, rows, columns, fill) if rows else image
            assert torch.equal(sample, expected)

    def test_random_fills_a_normalised_batch_with_normal_noise(self):
        images = Normalize(IMAGENET_MEAN, IMAGENET_STD)(photo_tensor(64, 64)[None].repeat(32, 1, 1, 1)).float()
        erase = RandomErasing(p=1.0, scale=(0.3, 0.3), ratio=(1.0, 1.0), value="random")
        out = erase(images, generator=torch.Generator().manual_seed(0))
        changed = out != images
        assert changed.any(dim=(1, 2, 3)).all()  # every sample: a 35x35 square of 64x64
        noise = out[changed]
        assert abs(float(noise.mean())) < 0.05 and abs(float(noise.std()) - 1) < 0.05

    def test_eval_and_the_generator(self):
        images = torch.randint(0, 256, (8, 3, 20, 20), dtype=torch.uint8)
        erase = RandomErasing(p=1.0)
        first = erase(images, generator=torch.Generator().manual_seed(4))
        assert torch.equal(first, erase(images, generator=torch.Generator().manual_seed(4)))
        assert not torch.equal(first, images) and torch.equal(erase.eval()(images), images)

    def test_compiles_whole_and_equals_eager(self):
        erase = RandomErasing(p=0.8, value=(1, 2, 3))
        images = torch.randint(0, 256, (6, 3, 24, 32), dtype=torch.uint8)
        draws = torch.rand((6, erase.draws), generator=torch.Generator().manual_seed(0))
        torch.compiler.reset()
        compiled = torch.compile(erase, fullgraph=True)
        assert torch.equal(compiled(images, uniform=draws), erase(images, uniform=draws))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: RandomErasing(p=1.5), r"p must be a probability in \[0, 1\]"),
        (lambda: RandomErasing(scale=(0.5, 0.1)), "scale must be"),
        (lambda: RandomErasing(ratio=(0, 1)), "ratio must be"),
        (lambda: RandomErasing(value="noise"), "'random'"),
        (lambda: RandomErasing(value=(1, 2))(torch.zeros(2, 3, 8, 8)), "one number or 3"),
        (lambda: RandomErasing(value="random")(torch.zeros(2, 3, 8, 8, dtype=torch.uint8)), "for a float batch"),
        (lambda: RandomErasing()(torch.zeros(3, 8, 8)), r"batch of images \[B, C, H, W\]"),
        (
            lambda: RandomErasing(value=300)(torch.zeros(2, 3, 8, 8, dtype=torch.uint8)),
            r"^value=300 does not fit a torch.uint8 batch \(integers 0 to 255\)",
        ),
        (lambda: RandomErasing(value=(0, 1.5, 0))(torch.zeros(2, 3, 8, 8, dtype=torch.uint8)), "does not fit"),
    ],
)
def test_bad_arguments(call, message):
    with pytest.raises(UsageError, match=message):
        call()
