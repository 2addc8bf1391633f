import shutil
from pathlib import Path

import pytest
import torch
import torch.utils.data
from conftest import photo

from gpuload import Collate, MemmapImageDataset, UsageError, build_memmap


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


class TestJpegDatasetsAreRefused:
    """A jpeg dataset keeps each image at its own size: Collate, which stacks, refuses its first batch
    (even where its images happen to share one size) and names the loader that crops them."""

    @pytest.mark.parametrize("which", ["mixed_sizes", "jpeg_dataset"])
    @pytest.mark.parametrize("subset", [False, True])
    def test_with_the_fix_named(self, request, which, subset):
        dataset = MemmapImageDataset(request.getfixturevalue(which))
        if subset:
            dataset = torch.utils.data.Subset(dataset, range(len(dataset)))
        loader = torch.utils.data.DataLoader(dataset, batch_size=len(dataset), collate_fn=Collate("cpu"))
        with pytest.raises(UsageError) as caught:
            next(iter(loader))
        message = str(caught.value)
        assert message.startswith("gpuload.Collate stacks images of one size, and the jpeg dataset ")
        assert "gpuload.DataLoader(dataset, decode=gpuload.RandomResizedCropDecode(224))" in message
        assert "CenterCropDecode(224)" in message and "\n" not in message


def test_plain_samples_are_stacked():
    samples = [(torch.full((3, 2, 2), value, dtype=torch.uint8), value) for value in (4, 9)]
    images, labels = Collate("cpu")(samples)
    assert images[:, 0, 0, 0].tolist() == [4, 9] and labels.tolist() == [4, 9]


def test_cuda_in_a_worker_process_is_refused(monkeypatch):
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    with pytest.raises(RuntimeError, match="num_workers=0"):
        Collate("cuda")([(torch.zeros(3, 2, 2, dtype=torch.uint8), 0)])


@pytest.mark.cuda
def test_cuda_batches_are_pinned_copies(built_dataset):
    dataset = MemmapImageDataset(built_dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True, collate_fn=Collate("cuda"))
    for images, labels in loader:
        assert images.is_cuda and labels.is_cuda
        assert torch.equal(images.cpu(), dataset.data.images[labels.cpu()])
