import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.data
from conftest import SIZE, photo

from gpuload import Collate, DatasetError, MemmapImageDataset, UsageError, build_memmap


def test_stock_loader_with_collate_gets_the_gathered_batches(built_dataset):
    dataset = MemmapImageDataset(built_dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, collate_fn=Collate("cpu"))
    batches = list(loader)
    assert [len(images) for images, _ in batches] == [8, 8, 4]
    images, labels = batches[0]
    assert type(images) is torch.Tensor and images.dtype == torch.uint8 and labels.dtype == torch.int64
    assert torch.equal(torch.cat([b[0] for b in batches]), dataset.data.images)
    assert torch.equal(torch.cat([b[1] for b in batches]), dataset.data.labels)


def test_gathered_batch_is_not_restacked(built_dataset):
    dataset = MemmapImageDataset(built_dataset)
    gathered = dataset.__getitems__([3, 1])
    images, _ = Collate("cpu")(gathered)
    assert images.data_ptr() == gathered.data.images.data_ptr()


@pytest.fixture(scope="module")
def mixed_sizes(photo_folder, tmp_path_factory) -> Path:
    """A jpeg dataset of 48x64 photos and one 30x90 photo."""
    src = Path(shutil.copytree(photo_folder, tmp_path_factory.mktemp("mixed") / "photos"))
    photo((30, 90)).save(src / "face" / "wide.jpg", quality=90)
    return build_memmap(src, src.with_name("mixed.jpeg"), format="jpeg", progress=False)


class TestJpegDatasets:
    """A jpeg dataset keeps each image at its own size: Collate, which stacks, refuses the first batch
    of one with several sizes (even where that batch's images share one) and names the loader that
    crops them; one whose images share one size is stacked."""

    @pytest.mark.parametrize("subset", [False, True])
    def test_several_sizes_are_refused_with_the_fix_named(self, mixed_sizes, subset):
        dataset = MemmapImageDataset(mixed_sizes)
        if subset:
            dataset = torch.utils.data.Subset(dataset, range(len(dataset)))
        loader = torch.utils.data.DataLoader(dataset, batch_size=len(dataset), collate_fn=Collate("cpu"))
        with pytest.raises(UsageError) as caught:
            next(iter(loader))
        message = str(caught.value)
        assert message.startswith("gpuload.Collate stacks images of one size, and the jpeg dataset ")
        assert "gpuload.DataLoader(dataset, decode=gpuload.RandomResizedCropDecode(224))" in message
        assert "CenterCropDecode(224)" in message and "\n" not in message

    def test_a_batch_of_one_size_from_a_dataset_of_several_is_refused_too(self, mixed_sizes):
        dataset = MemmapImageDataset(mixed_sizes)
        with pytest.raises(UsageError, match="holds images of several sizes"):
            Collate("cpu")(dataset.__getitems__([0]))

    @pytest.mark.parametrize("damaged", [0, 7])
    def test_a_damaged_size_record_is_called_damage_not_several_sizes(self, jpeg_dataset, tmp_path, damaged):
        """shapes.memmap records several sizes where the images have one: the gpuload loader and verify
        call that damage, and so does this path, even where the first batch does not hold that image."""
        copy = Path(shutil.copytree(jpeg_dataset, tmp_path / "copy"))
        shapes = copy / "shapes.memmap"
        shapes.chmod(0o644)
        values = np.fromfile(shapes, np.int32).reshape(-1, 2)
        values[damaged, 0] += 1
        values.tofile(shapes)
        loader = torch.utils.data.DataLoader(MemmapImageDataset(copy), batch_size=4, collate_fn=Collate("cpu"))
        with pytest.raises(DatasetError) as caught:
            next(iter(loader))
        assert str(caught.value) == (
            f"{copy}: image {damaged} ({MemmapImageDataset(copy).table.path(damaged)}) decodes to "
            f"{SIZE[1]}x{SIZE[0]} where its recorded size is {SIZE[1]}x{SIZE[0] + 1}: shapes.memmap is damaged; "
            "run gpuload verify, then rebuild the dataset"
        )

    def test_one_size_is_stacked(self, jpeg_dataset):
        dataset = MemmapImageDataset(jpeg_dataset)
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=Collate("cpu"))
        images, labels = next(iter(loader))
        assert images.shape == (4, 3, *SIZE) and torch.equal(images[1], dataset[1][0])
        assert labels.tolist() == [dataset[i][1] for i in range(4)]


def test_plain_samples_are_stacked():
    samples = [(torch.full((3, 2, 2), value, dtype=torch.uint8), value) for value in (4, 9)]
    images, labels = Collate("cpu")(samples)
    assert images[:, 0, 0, 0].tolist() == [4, 9] and labels.tolist() == [4, 9]


def test_cuda_in_a_worker_process_is_refused(monkeypatch):
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    with pytest.raises(RuntimeError, match="num_workers=0"):
        Collate("cuda")([(torch.zeros(3, 2, 2, dtype=torch.uint8), 0)])


@pytest.mark.cuda
def test_cuda_batches_are_pinned_non_blocking_channels_last_copies(built_dataset, host_copies):
    dataset = MemmapImageDataset(built_dataset)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0)).tolist()
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=order, collate_fn=Collate("cuda"))
    for number, (images, labels) in enumerate(loader):
        indices = order[number * 8 : (number + 1) * 8]
        assert images.is_cuda and labels.is_cuda and images.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(images.cpu(), dataset.data.images[indices])
        assert labels.tolist() == [dataset.targets[index] for index in indices]
    assert host_copies and all(pinned and non_blocking for pinned, non_blocking in host_copies)


def test_a_gathered_channels_last_batch_is_handed_over_without_a_copy(built_dataset):
    """The dataset gathers in the file's order; Collate on the CPU passes that batch on as it is."""
    dataset = MemmapImageDataset(built_dataset)
    gathered = dataset.__getitems__([3, 0, 5])
    images, labels = Collate("cpu")(gathered)
    assert images.data_ptr() == gathered.data.images.data_ptr() and images.stride() == gathered.data.images.stride()
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert labels.tolist() == [dataset.targets[index] for index in (3, 0, 5)]


class TestFields:
    """A dataset with fields: Collate gives the dict that gpuload.DataLoader gives (the fields' tensors on the
    device with the images, text a list of ``str``), as ``FieldSamples`` promises."""

    def test_the_stock_loader_with_collate_gives_the_loaders_dict(self, fields_dataset):
        dataset = MemmapImageDataset(fields_dataset)
        stock = next(iter(torch.utils.data.DataLoader(dataset, batch_size=5, collate_fn=Collate("cpu"))))
        ours = next(iter(gpuload_loader(dataset, batch_size=5)))
        assert sorted(stock) == sorted(ours)
        for name, value in ours.items():
            if isinstance(value, torch.Tensor):
                assert stock[name].dtype == value.dtype and torch.equal(stock[name], value), name
            else:
                assert stock[name] == value, name

    def test_a_jpeg_dataset_of_one_size_is_stacked_with_its_fields(self, table_folder, tmp_path):
        dataset = MemmapImageDataset(build_memmap(table_folder, tmp_path / "jpeg", format="jpeg", progress=False))
        batch = Collate("cpu")(dataset.__getitems__([3, 0]))
        assert batch["image"].shape == (2, *dataset[0]["image"].shape) and batch["label"].dtype == torch.int64
        assert torch.equal(batch["image"][0], dataset[3]["image"]) and batch["label"].tolist() == [
            dataset[3]["label"],
            dataset[0]["label"],
        ]
        assert batch["caption"] == [dataset[3]["caption"], dataset[0]["caption"]]
        assert torch.equal(batch["boxes"], torch.stack([dataset[3]["boxes"], dataset[0]["boxes"]]))


def gpuload_loader(dataset, **options):
    from gpuload import DataLoader

    return DataLoader(dataset, device="cpu", **options)
