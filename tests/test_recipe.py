"""gpuload.transforms.recipe: the README's training example crops each image once, evaluation is
torchvision's, a second crop is an error wherever it could happen, and the recipe compiles whole."""

import itertools
import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torchvision.transforms import v2

import gpuload
from gpuload import (
    CenterCropDecode,
    DataLoader,
    MemmapImageDataset,
    MixUpCutMix,
    RandomResizedCrop,
    RandomResizedCropDecode,
    Recipe,
    TrivialAugmentWide,
    UsageError,
)

README = Path(__file__).parents[1] / "README.md"


@pytest.fixture
def crops(monkeypatch) -> dict[str, int]:
    """How many images each crop of the path cut: the loader's decode-time crops (per image) and the
    device's ``RandomResizedCrop`` (per sample of a batch, training or evaluation)."""
    counts = {"loader": 0, "device": 0}
    for kind in (RandomResizedCropDecode, CenterCropDecode):
        original = kind.crop

        def crop(self, *args, _original=original, **kwargs):
            counts["loader"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(kind, "crop", crop)
    forward = RandomResizedCrop.forward

    def device_forward(self, images, *args, **kwargs):
        counts["device"] += len(images) if self.crop else 0
        return forward(self, images, *args, **kwargs)

    monkeypatch.setattr(RandomResizedCrop, "forward", device_forward)
    return counts


def readme_block(heading: str) -> str:
    """The first python block after ``heading`` in the README."""
    text = README.read_text()
    found = re.search(re.escape(heading) + r".*?```python\n(.*?)```", text, re.S)
    assert found, heading
    return found[1]


class TestReadmeExample:
    def test_the_training_example_crops_each_image_once_and_evaluates_as_torchvision(
        self, built_dataset, crops, monkeypatch
    ):
        """The README's training example, run as written on a small dataset (one epoch, a small model,
        no compilation): each training image is cropped once, in the loader's threads, and each
        evaluation image once, by torchvision's resize and centre crop."""
        code = readme_block("### Training with it")
        code = code.replace('"photos-q3.memmap"', repr(str(built_dataset))).replace("range(90)", "range(1)")
        code = code.replace("batch_size=256", "batch_size=4")
        code = "\n".join(line for line in code.splitlines() if "torch.save" not in line)  # a sketch of a checkpoint
        monkeypatch.setattr(torch, "compile", lambda module, **options: module)
        small = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 5))
        namespace = {"__name__": "readme"}
        exec(
            compile(code.replace("resnet50(num_classes=len(ds.classes))", "small"), "README.md", "exec"),
            namespace | {"small": small},
        )
        assert crops == {"loader": 20 + 20, "device": 0}  # 20 images: one epoch of training, one of evaluation

    def test_the_eval_path_is_torchvisions_eval_transform_exactly(self, built_dataset):
        ds = MemmapImageDataset(built_dataset)
        recipe = Recipe.torchvision(num_classes=5, size=32).eval()
        loader = recipe.loader(ds, train=False, batch_size=5, device="cpu")
        reference = v2.Compose(
            [v2.Resize(37, antialias=True), v2.CenterCrop(32), v2.ToDtype(torch.float32, scale=True)]
            + [v2.Normalize(gpuload.IMAGENET_MEAN, gpuload.IMAGENET_STD)]
        )
        start = 0
        for images, labels in loader:
            out, same = recipe(images, labels)
            assert torch.equal(same, labels)
            for offset, sample in enumerate(out):
                expected = reference(ds[start + offset][0].contiguous())
                torch.testing.assert_close(sample, expected, atol=1e-5, rtol=0)
            start += len(images)
        assert start == len(ds)

    def test_on_the_device_the_loader_serves_whole_images_and_the_recipe_crops_once(self, built_dataset, crops):
        ds = MemmapImageDataset(built_dataset)
        recipe = Recipe.torchvision(num_classes=5, size=32, crop="device")
        loader = recipe.loader(ds, batch_size=5, device="cpu")
        assert recipe.decode(train=True) is None and recipe.decode(train=False) is None
        for images, labels in loader:
            out, targets = recipe(images, labels)
            assert out.shape == (5, 3, 32, 32) and targets.shape == (5, 5)
        recipe.eval()
        for images, _ in recipe.loader(ds, train=False, batch_size=10, device="cpu"):
            assert recipe(images).shape == (10, 3, 32, 32)
        assert crops == {"loader": 0, "device": 20 + 20}


class TestNoSecondCrop:
    def test_the_loader_refuses_a_decode_crop_with_a_cropping_transform(self, built_dataset):
        ds = MemmapImageDataset(built_dataset)
        for transform in (
            RandomResizedCrop(32, flip=True),
            nn.Sequential(RandomResizedCrop(32), gpuload.Normalize(gpuload.IMAGENET_MEAN, gpuload.IMAGENET_STD)),
            torch.compile(RandomResizedCrop(32)),
            Recipe(32, crop="device"),
        ):
            for decode in (RandomResizedCropDecode(32), CenterCropDecode(32)):
                with pytest.raises(UsageError, match="crops each image in the loader, and the transform crops it"):
                    DataLoader(ds, batch_size=4, decode=decode, transform=transform, device="cpu")
        # flip and jitter without the crop are fine after a decode-time crop
        DataLoader(ds, batch_size=4, decode=RandomResizedCropDecode(32), transform=RandomResizedCrop(32, crop=False))

    def test_a_recipe_refuses_a_batch_cropped_before_or_not_cropped(self):
        cropped = torch.zeros((2, 3, 32, 32), dtype=torch.uint8)
        whole = torch.zeros((2, 3, 48, 64), dtype=torch.uint8)
        for mode in ("train", "eval"):
            device, loader = Recipe(32, crop="device"), Recipe(32, crop="loader")
            getattr(device, mode)()
            getattr(loader, mode)()
            with pytest.raises(
                UsageError,
                match="already \\[32, 32\\]: it was cropped before .*or the dataset is stored at the crop size",
            ):
                device(cropped)
            with pytest.raises(UsageError, match="crops in the loader .*takes \\[32, 32\\] batches, got \\[48, 64\\]"):
                loader(whole)

    def test_recipe_loader_keeps_decode_and_transform_to_itself(self, built_dataset):
        ds = MemmapImageDataset(built_dataset)
        with pytest.raises(UsageError, match="Recipe.loader decides decode="):
            Recipe(32).loader(ds, batch_size=4, decode=CenterCropDecode(32))

    def test_recipe_loader_refuses_a_dataset_of_more_classes_than_its_targets(self, built_dataset):
        """The dataset's 5 classes in targets of 3: said when the loader is made, not as an index error (or a
        CUDA device-side assert) at the first batch."""
        ds = MemmapImageDataset(built_dataset)
        with pytest.raises(
            UsageError, match=r"^the dataset has 5 classes, and the recipe's targets 3: pass num_classes=5"
        ):
            Recipe.torchvision(num_classes=3, size=32).loader(ds, batch_size=4)


class TestRecipe:
    def test_draws_come_from_the_generator_and_the_recipe_as_the_loaders_transform(self, built_dataset):
        """As a loader's ``transform=`` the recipe gets the loader's seeded generator: two runs of an epoch
        give the same batches."""
        ds = MemmapImageDataset(built_dataset)
        recipe = Recipe(32, crop="device", augment=TrivialAugmentWide())

        def epoch():
            loader = DataLoader(ds, batch_size=5, transform=recipe, seed=3, device="cpu")
            return torch.cat([images for images, _ in loader])

        first = epoch()
        assert first.shape == (20, 3, 32, 32) and first.dtype == torch.float32 and torch.equal(first, epoch())

    def test_a_recipe_that_mixes_refuses_a_batch_without_labels_in_training(self, built_dataset):
        """As a loader's transform= it gets the images only: MixUp/CutMix and the soft targets would be
        skipped without a word. In eval() it takes images alone, as the README's evaluation does."""
        recipe = Recipe.torchvision(num_classes=5, size=32, crop="device")
        loader = DataLoader(MemmapImageDataset(built_dataset), batch_size=4, transform=recipe, device="cpu")
        with pytest.raises(UsageError, match=r"^this recipe mixes images and their labels \(mix=MixUpCutMix"):
            next(iter(loader))
        recipe.eval()
        assert recipe(torch.zeros((2, 3, 40, 40), dtype=torch.uint8)).shape == (2, 3, 32, 32)

    def test_the_order_is_crop_policy_normalize_erasing_mix(self, monkeypatch):
        calls = []
        recipe = Recipe.timm(num_classes=5, size=16, crop="device")
        for module in (recipe.cropper, recipe.augment, recipe.normalize, recipe.erasing, recipe.mix):
            original = type(module).forward

            def spy(self, images, *args, _original=original, **kwargs):
                calls.append((type(self).__name__, images.dtype))
                return _original(self, images, *args, **kwargs)

            monkeypatch.setattr(type(module), "forward", spy)
        images, labels = torch.randint(0, 256, (4, 3, 24, 24), dtype=torch.uint8), torch.arange(4)
        out, targets = recipe(images, labels, generator=torch.Generator().manual_seed(0))
        assert calls == [
            ("RandomResizedCrop", torch.uint8),
            ("RandAugment", torch.uint8),
            ("Normalize", torch.uint8),
            ("RandomErasing", torch.float32),
            ("MixUpCutMix", torch.float32),
        ]
        assert out.shape == (4, 3, 16, 16) and torch.allclose(targets.sum(1), torch.ones(4))

    def test_the_reference_recipe_compiles_to_one_graph(self):
        recipe = Recipe.torchvision(num_classes=5, size=24)
        images, labels = torch.randint(0, 256, (4, 3, 24, 24), dtype=torch.uint8), torch.arange(4)
        torch.compiler.reset()
        out, targets = torch.compile(recipe, fullgraph=True)(images, labels)
        assert out.shape == (4, 3, 24, 24) and targets.shape == (4, 5) and torch.isfinite(out).all()

    @pytest.mark.parametrize("crop", ["loader", "device"])
    def test_given_uniforms_decide_every_draw_whatever_torchs_generator(self, crop):
        """With ``uniform=`` the crop, the policy, the erasing and the mix (its Betas too) come from the
        uniforms alone; compiled whole, the same batch. (timm's recipe erases with per-pixel noise, whose
        values come from the generator: only its rectangles come from the uniforms.)"""
        recipe = Recipe.torchvision(num_classes=5, size=16, crop=crop)
        side = 16 if crop == "loader" else 24
        images, labels = torch.randint(0, 256, (6, 3, side, side), dtype=torch.uint8), torch.arange(6) % 5
        uniform = torch.rand((6, recipe.draws), generator=torch.Generator().manual_seed(0))
        torch.manual_seed(1)
        first = recipe(images, labels, uniform=uniform)
        torch.manual_seed(2)
        assert all(torch.equal(a, b) for a, b in zip(first, recipe(images, labels, uniform=uniform)))
        other = recipe(
            images, labels, uniform=torch.rand((6, recipe.draws), generator=torch.Generator().manual_seed(9))
        )
        assert not torch.equal(first[0], other[0])
        torch.compiler.reset()
        compiled = torch.compile(recipe, fullgraph=True)(images, labels, uniform=uniform)
        torch.testing.assert_close(compiled[1], first[1])
        assert compiled[0].shape == first[0].shape

    def test_each_sample_takes_its_own_row(self):
        """Without a mix (which pairs samples), a sample's output depends on its row of uniforms only:
        reversing the batch and its uniforms reverses the output."""
        recipe = Recipe(16, crop="device", augment=TrivialAugmentWide(), erasing=gpuload.RandomErasing(p=0.5))
        images = torch.randint(0, 256, (5, 3, 24, 24), dtype=torch.uint8)
        uniform = torch.rand((5, recipe.draws), generator=torch.Generator().manual_seed(4))
        out = recipe(images, uniform=uniform)
        torch.testing.assert_close(recipe(images.flip(0), uniform=uniform.flip(0)), out.flip(0))

    def test_a_resumed_run_repeats_the_recipes_draws_with_the_loaders_uniforms(self, built_dataset):
        """The README's loop: ``recipe(images, labels, uniform=loader.uniforms(recipe.draws))``; a run
        stopped after two batches and resumed from its state gives the batches the whole run gave."""
        ds = MemmapImageDataset(built_dataset)
        recipe = Recipe.torchvision(num_classes=len(ds.classes), size=24)

        def run(loader, batches=None):
            return [
                recipe(images, labels, uniform=loader.uniforms(recipe.draws))
                for images, labels in itertools.islice(loader, batches)
            ]

        loader = recipe.loader(ds, batch_size=4, shuffle=True, seed=5, device="cpu")
        whole = run(loader)
        loader = recipe.loader(ds, batch_size=4, shuffle=True, seed=5, device="cpu")
        loader.set_epoch(0)
        run(loader, batches=2)
        saved = loader.state_dict()
        resumed = recipe.loader(ds, batch_size=4, shuffle=True, seed=8, device="cpu")
        resumed.load_state_dict(saved)
        rest = run(resumed)
        assert len(rest) == len(whole) - 2
        for (images, targets), (expected_images, expected_targets) in zip(rest, whole[2:]):
            assert torch.equal(images, expected_images) and torch.equal(targets, expected_targets)

    def test_uniform_that_is_not_a_tensor_is_refused_in_one_line(self):
        """A list of rows reached ``uniform.device`` first: an AttributeError, not the shape the recipe takes."""
        recipe = Recipe(16, crop="device", mix=None)
        with pytest.raises(UsageError, match=rf"uniform must be a tensor of \[2, {recipe.draws}\] uniforms"):
            recipe(torch.zeros((2, 3, 24, 24), dtype=torch.uint8), uniform=[[0.5] * recipe.draws] * 2)

    def test_uniform_with_an_augment_that_takes_none_says_so(self):
        recipe = Recipe(16, augment=nn.Identity())
        with pytest.raises(UsageError, match="augment=Identity does not say how many uniforms it takes"):
            recipe(torch.zeros((2, 3, 16, 16), dtype=torch.uint8), uniform=torch.rand(2, 40))

    @pytest.mark.parametrize(
        ("make", "message"),
        [
            (lambda: Recipe(crop="gpu"), "crop must be 'loader'"),
            (lambda: Recipe(erasing=0.1), "erasing must be a gpuload.RandomErasing"),
            (lambda: Recipe(mix=MixUpCutMix), "mix must be a gpuload.MixUpCutMix"),
            (lambda: Recipe(augment="trivial"), "augment must be an nn.Module"),
            (lambda: Recipe(flip=1), "flip must be a bool"),
        ],
    )
    def test_bad_arguments(self, make, message):
        with pytest.raises(UsageError, match=message):
            make()


def test_the_readme_augmentation_example_runs():
    namespace = {"__name__": "readme"}
    exec(compile(readme_block("### Augmentation recipes"), "README.md", "exec"), namespace)
    assert namespace["floats"].shape == (8, 3, 64, 64) and namespace["targets"].shape == (8, 4)
