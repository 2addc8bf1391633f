"""gpuload.loading.per_image: any torchvision v2 transform per image in the loader's threads, each image
seeded by (seed, epoch, index), and the bad hooks."""

import pytest
import torch
from torchvision.transforms import v2

from gpuload import CenterCropDecode, DataLoader, ImageData, MemmapImageDataset, RandomResizedCropDecode, UsageError
from gpuload.loading.order import epoch_order
from gpuload.loading.per_image import image_seed


def batches(loader: DataLoader, epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    loader.set_epoch(epoch)
    pairs = [(images.clone(), labels) for images, labels in loader]
    return torch.cat([images for images, _ in pairs]), torch.cat([labels for _, labels in pairs])


class TestTorchvisionPerImage:
    def test_each_image_is_the_transform_of_its_crop_with_its_own_seed(self, built_dataset):
        """``v2.RandAugment`` per image in two threads: each image equals the transform of the same crop
        with torch's generator seeded by (seed, epoch, index), whatever the threads' timing."""
        ds = MemmapImageDataset(built_dataset)
        transform = v2.RandAugment(num_ops=2, magnitude=9)
        options = {"batch_size": 4, "shuffle": True, "seed": 5, "device": "cpu", "threads": 2}
        plain = DataLoader(ds, decode=RandomResizedCropDecode(32), **options)
        hooked = DataLoader(ds, decode=RandomResizedCropDecode(32), per_image=transform, **options)
        crops, labels = batches(plain, epoch=1)
        out, same = batches(hooked, epoch=1)
        assert torch.equal(labels, same)
        indices = epoch_order(len(ds), epoch=1, seed=5, shuffle=True)
        changed = 0
        for crop, image, index in zip(crops, out, indices.tolist()):
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(image_seed(5, 1, index))
                expected = transform(crop)
            assert torch.equal(image, expected)
            changed += not torch.equal(image, crop)
        assert changed > len(out) // 2
        assert torch.equal(out, batches(hooked, epoch=1)[0])  # again: the same draws
        assert not torch.equal(out, batches(hooked, epoch=2)[0])

    def test_a_hook_with_a_generator_gets_one_seeded_per_image(self, built_dataset):
        ds = MemmapImageDataset(built_dataset)
        seen = []

        def noise(image, generator):
            seen.append(torch.randint(0, 1000, (1,), generator=generator).item())
            return image

        loader = DataLoader(ds, batch_size=5, decode=CenterCropDecode(16), per_image=noise, seed=2, device="cpu")
        batches(loader)
        expected = [
            torch.randint(0, 1000, (1,), generator=torch.Generator().manual_seed(image_seed(2, 0, index))).item()
            for index in range(len(ds))
        ]
        assert sorted(seen) == sorted(expected)

    def test_the_users_global_generator_is_left_as_it_was(self, built_dataset):
        ds = MemmapImageDataset(built_dataset)
        torch.manual_seed(11)
        before = torch.rand(3)
        torch.manual_seed(11)
        loader = DataLoader(ds, batch_size=5, decode=CenterCropDecode(16), per_image=v2.RandomErasing(1.0), seed=0)
        batches(loader)
        assert torch.equal(torch.rand(3), before)


@pytest.mark.parametrize(
    ("hook", "error", "message"),
    [
        (
            lambda image: image[:, :8],
            UsageError,
            r"per_image must return the image as it came, torch.uint8 \[3, 16, 16\]",
        ),
        (lambda image: image.float(), UsageError, "got torch.float32"),
        (lambda image: None, UsageError, "got <class 'NoneType'>"),
    ],
)
def test_a_hook_that_changes_the_image_is_refused(built_dataset, hook, error, message):
    loader = DataLoader(MemmapImageDataset(built_dataset), batch_size=4, decode=CenterCropDecode(16), per_image=hook)
    with pytest.raises(error, match=message):
        batches(loader)


def test_per_image_must_be_callable(built_dataset):
    with pytest.raises(TypeError, match="per_image must be callable"):
        DataLoader(MemmapImageDataset(built_dataset), batch_size=4, per_image="flip")


@pytest.mark.parametrize("hook", [lambda image: image.transpose(-1, -2), lambda image: image.mT])
def test_a_hook_that_returns_a_view_of_the_image_is_applied(built_dataset, hook):
    """A view of the image (a transpose of a square crop: the same first byte, other strides) is the hook's
    result too, not the image left as it was."""
    ds = MemmapImageDataset(built_dataset)
    options = {"batch_size": 4, "decode": CenterCropDecode(16), "device": "cpu"}
    crops, _ = batches(DataLoader(ds, **options))
    out, _ = batches(DataLoader(ds, per_image=hook, **options))
    assert not torch.equal(out, crops)
    assert torch.equal(out, crops.transpose(-1, -2))


def test_a_hook_that_returns_a_view_of_the_image_in_another_order_is_applied():
    """A transposed view of a square image has its shape, dtype and first byte: it is still copied in, not dropped."""
    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).reshape(2, 3, 4, 4)
    data = ImageData(images=images, labels=torch.zeros(2, dtype=torch.int64), batch_size=[2])
    served, _ = batches(DataLoader(data, batch_size=2, device="cpu", per_image=lambda image: image.transpose(-1, -2)))
    assert torch.equal(served, images.transpose(-1, -2))


def test_a_hook_that_changes_the_dtype_is_told_to_return_uint8(built_dataset):
    loader = DataLoader(
        MemmapImageDataset(built_dataset), batch_size=4, decode=CenterCropDecode(16), per_image=lambda i: i.float()
    )
    with pytest.raises(UsageError, match=r"got torch.float32 \[3, 16, 16\]: return uint8 pixels"):
        batches(loader)
