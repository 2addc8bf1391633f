"""gpuload.DataLoader over a torch.utils.data.ConcatDataset of gpuload datasets (gpuload/loading/concat.py)."""

import contextlib
import math
import re
import shutil
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import FAST_RETRY, SIZE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import ConcatDataset, Subset

from gpuload import (
    CenterCropDecode,
    DataLoader,
    DatasetError,
    ImageData,
    MemmapImageDataset,
    RandomResizedCropDecode,
    UsageError,
    build_memmap,
    make_sample_folder,
)
from gpuload.loading import loader as loader_module
from gpuload.loading.concat import ConcatImages
from gpuload.loading.crop import crop_raw
from gpuload.loading.order import epoch_order
from gpuload.remote.push import push_memmap
from gpuload.remote.store import open_store


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory) -> Path:
    """Other real photos than ``photo_folder``'s: its first 3 classes (sorted, as ImageFolder labels them) x 2."""
    folder = make_sample_folder(tmp_path_factory.mktemp("small") / "photos", images_per_class=2, seed=1, size=SIZE)
    for extra in sorted(folder.iterdir())[3:]:
        shutil.rmtree(extra)
    return folder


@pytest.fixture(scope="module")
def small_raw(small_folder, tmp_path_factory) -> Path:
    return build_memmap(small_folder, tmp_path_factory.mktemp("small") / "small.memmap", progress=False)


@pytest.fixture(scope="module")
def small_jpeg(small_folder, tmp_path_factory) -> Path:
    return build_memmap(small_folder, tmp_path_factory.mktemp("small") / "small.jpeg", format="jpeg", progress=False)


def stacked(dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """Every ``(image, label)`` of a dataset of raw images, read one by one as torch's DataLoader reads them."""
    pairs = [dataset[index] for index in range(len(dataset))]
    return torch.stack([image for image, _ in pairs]), torch.tensor([label for _, label in pairs])


def served(loader) -> tuple[torch.Tensor, torch.Tensor]:
    batches = [(images.clone(), labels.clone()) for images, labels in loader]
    return torch.cat([images for images, _ in batches]), torch.cat([labels for _, labels in batches])


def numbered(*lengths: int) -> list[ImageData]:
    """ImageData parts whose labels number their images across the parts, and whose pixels spell the label."""
    parts, first = [], 0
    for length in lengths:
        labels = torch.arange(first, first + length)
        images = (labels.view(-1, 1, 1, 1) + torch.zeros(1, 3, 2, 2, dtype=torch.int64)) % 251
        parts.append(ImageData(images=images.to(torch.uint8), labels=labels, batch_size=[length]))
        first += length
    return parts


@contextlib.contextmanager
def as_rank(rank: int, world_size: int):
    with mock.patch.object(loader_module, "distributed_rank", return_value=(rank, world_size)):
        yield


class TestBatches:
    def test_raw_parts_of_different_lengths_are_served_as_torchs_concat_dataset_indexes_them(
        self, built_dataset, small_raw
    ):
        both = ConcatDataset([MemmapImageDataset(built_dataset), MemmapImageDataset(small_raw)])
        loader = DataLoader(both, batch_size=7, device="cpu")
        images, labels = served(loader)
        expected_images, expected_labels = stacked(both)
        assert len(both) == 26 and len(loader) == 4
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)

    def test_a_shuffled_batch_mixes_the_parts_and_every_image_comes_once(self, built_dataset, small_raw):
        both = ConcatDataset([MemmapImageDataset(built_dataset), MemmapImageDataset(small_raw)])
        loader = DataLoader(both, batch_size=13, shuffle=True, seed=4, device="cpu", threads=2)
        expected_images, expected_labels = stacked(both)
        orders = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            images, labels = served(loader)
            order = epoch_order(26, epoch=epoch, seed=4, shuffle=True)
            assert torch.equal(images, expected_images[order]) and torch.equal(labels, expected_labels[order])
            assert sorted(order.tolist()) == list(range(26))
            assert 0 < int((order[:13] >= 20).sum()) < 13  # the first batch holds images of both parts
            orders.append(order.tolist())
        assert orders[0] != orders[1] != orders[2]

    @pytest.mark.parametrize("batch_size", [3, 20])
    def test_a_channels_last_and_a_channel_first_part_make_channels_last_batches(self, built_dataset, batch_size):
        """A raw dataset (channels-last) and an NCHW ImageData of its images, batches of one part and of both."""
        dataset = MemmapImageDataset(built_dataset)
        first = ImageData(images=dataset.data.images.contiguous(), labels=dataset.data.labels + 5, batch_size=[20])
        both = ConcatDataset([first, dataset])
        loader = DataLoader(both, batch_size=batch_size, shuffle=batch_size == 3, seed=1, device="cpu")
        images, labels = served(loader)
        order = epoch_order(40, epoch=0, seed=1, shuffle=batch_size == 3)
        expected_images = torch.cat([first.images, dataset.data.images])
        expected_labels = torch.cat([first.labels, dataset.data.labels])
        assert torch.equal(images, expected_images[order]) and torch.equal(labels, expected_labels[order])
        assert images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()

    @pytest.mark.parametrize("kinds", [("jpeg", "jpeg"), ("raw", "jpeg")])
    def test_jpeg_parts_are_decoded_by_their_own_reader(
        self, kinds, built_dataset, jpeg_dataset, small_raw, small_jpeg
    ):
        """Each part cropped as a loader of that part alone crops it (CenterCropDecode: no random draws)."""
        big = MemmapImageDataset(jpeg_dataset if kinds[0] == "jpeg" else built_dataset)
        small = MemmapImageDataset(small_jpeg if kinds[1] == "jpeg" else small_raw)
        decode = CenterCropDecode(16)
        alone = [served(DataLoader(part, batch_size=5, device="cpu", decode=decode)) for part in (big, small)]
        order = epoch_order(26, epoch=0, seed=3, shuffle=True)
        loader = DataLoader(
            ConcatDataset([big, small]), batch_size=5, shuffle=True, seed=3, device="cpu", decode=decode
        )
        images, labels = served(loader)
        assert torch.equal(images, torch.cat([alone[0][0], alone[1][0]])[order])
        assert torch.equal(labels, torch.cat([alone[0][1], alone[1][1]])[order])

    def test_random_crops_are_drawn_for_the_concatenations_indices(self, built_dataset):
        """A dataset given twice: its second copy gets other boxes, those of indices 20 to 39."""
        dataset = MemmapImageDataset(built_dataset)
        decode = RandomResizedCropDecode(16)
        loader = DataLoader(ConcatDataset([dataset, dataset]), batch_size=8, seed=2, device="cpu", decode=decode)
        images, labels = served(loader)
        alone, _ = served(DataLoader(dataset, batch_size=8, seed=2, device="cpu", decode=decode))
        second = torch.empty((20, 3, 16, 16), dtype=torch.uint8)
        crop_raw(dataset.data.images, torch.arange(20), second, decode, seed=2, epoch=0, keys=torch.arange(20, 40))
        assert torch.equal(images[:20], alone) and torch.equal(images[20:], second)
        assert not torch.equal(images[20:], alone)
        assert torch.equal(labels, dataset.data.labels.repeat(2))

    def test_subsets_and_nested_concats_are_flattened(self, built_dataset, small_raw):
        big, small = MemmapImageDataset(built_dataset), MemmapImageDataset(small_raw)
        nested = ConcatDataset(
            [Subset(small, [5, 0, -1]), ConcatDataset([big, Subset(ConcatDataset([small, big]), [7, 2])])]
        )
        images, labels = served(DataLoader(nested, batch_size=4, device="cpu"))
        expected_images, expected_labels = stacked(nested)
        assert len(images) == 3 + 20 + 2
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)

    def test_a_subset_of_a_concatenation_serves_its_indices_and_a_sampler_picks_in_it(self, built_dataset, small_raw):
        both = ConcatDataset([MemmapImageDataset(built_dataset), MemmapImageDataset(small_raw)])
        expected_images, _ = stacked(both)
        images, _ = served(DataLoader(Subset(both, [25, 3, 21]), batch_size=2, device="cpu"))
        assert torch.equal(images, expected_images[[25, 3, 21]])
        images, _ = served(DataLoader(both, sampler=[24, 0, 22], batch_size=2, device="cpu"))
        assert torch.equal(images, expected_images[[24, 0, 22]])

    def test_fields_of_every_part_are_gathered_into_one_batch(self, fields_dataset):
        dataset = MemmapImageDataset(fields_dataset)
        both = ConcatDataset([dataset, Subset(dataset, [3, 1])])
        loader = DataLoader(both, batch_size=22, shuffle=True, seed=1, device="cpu")
        (batch,) = list(loader)
        order = epoch_order(22, epoch=0, seed=1, shuffle=True).tolist()
        samples = [both[index] for index in order]
        assert list(batch) == list(samples[0])
        for name in batch:
            if isinstance(batch[name], list):
                assert batch[name] == [sample[name] for sample in samples]
            else:
                assert torch.equal(batch[name], torch.stack([torch.as_tensor(sample[name]) for sample in samples]))

    def test_classes_that_one_part_lacks_are_the_same_label_space(self, built_dataset, small_raw):
        """``small_raw`` has the first 3 of ``built_dataset``'s 5 classes: every label means one class."""
        big, small = MemmapImageDataset(built_dataset), MemmapImageDataset(small_raw)
        assert small.classes == big.classes[:3]
        assert len(DataLoader(ConcatDataset([small, big]), batch_size=4, device="cpu")) == 7

    def test_the_block_aware_order_numbers_each_parts_blocks_after_the_previous(self):
        """Images of 3 MiB: a 4 MiB block holds the start of two of them."""
        large = ImageData(
            images=torch.zeros(3, 3, 1024, 1024, dtype=torch.uint8), labels=torch.arange(3), batch_size=[3]
        )
        concat = ConcatDataset([large, Subset(large, [2, 0]), large])
        blocks = [0, 0, 1, 3, 2, 4, 4, 5]
        assert ConcatImages(concat, None).image_blocks().tolist() == blocks
        loader = DataLoader(concat, batch_size=3, shuffle=True, seed=5, device="cpu", block_shuffle=2)
        _, labels = served(loader)
        order = epoch_order(8, epoch=0, seed=5, shuffle=True, blocks=torch.tensor(blocks), window=2)
        assert labels.tolist() == torch.tensor([0, 1, 2, 2, 0, 0, 1, 2])[order].tolist()
        assert order.tolist() != epoch_order(8, epoch=0, seed=5, shuffle=True).tolist()  # not the exact shuffle


class TestOrder:
    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        lengths=st.lists(st.integers(0, 9), min_size=1, max_size=4).filter(sum),
        world_size=st.integers(1, 4),
        batch_size=st.integers(1, 5),
        shuffle=st.booleans(),
        drop_last=st.booleans(),
    )
    def test_each_rank_gets_its_shard_of_the_concatenation(self, lengths, world_size, batch_size, shuffle, drop_last):
        parts, length = numbered(*lengths), sum(lengths)
        served_all = []
        for rank in range(world_size):
            with as_rank(rank, world_size):
                loader = DataLoader(ConcatDataset(parts), batch_size, shuffle, seed=7, drop_last=drop_last, device="cpu", threads=1)  # fmt: skip
                batches = [(images.clone(), labels.clone()) for images, labels in loader]
                assert len(batches) == len(loader)
            expected = epoch_order(length, epoch=0, seed=7, shuffle=shuffle, rank=rank, world_size=world_size)
            if drop_last:
                expected = expected[: len(expected) // batch_size * batch_size]
            labels = torch.cat([labels for _, labels in batches]) if batches else torch.empty(0, dtype=torch.int64)
            assert labels.tolist() == expected.tolist()
            assert all(torch.equal(images, (labels.view(-1, 1, 1, 1) % 251).to(torch.uint8).expand_as(images)) for images, labels in batches)  # fmt: skip
            served_all += labels.tolist()
        if not drop_last:
            assert set(served_all) == set(range(length))

    @pytest.mark.parametrize("decode", [None, RandomResizedCropDecode(16)], ids=["whole", "crops"])
    @pytest.mark.parametrize("stop", [1, 3])
    def test_a_resumed_epoch_is_the_uninterrupted_one(self, decode, stop, built_dataset, small_raw, small_jpeg):
        second = small_raw if decode is None else small_jpeg  # a raw and a jpeg part, cropped
        parts = [MemmapImageDataset(built_dataset), Subset(MemmapImageDataset(second), [4, 1, 2, 5])]
        options = {"batch_size": 4, "shuffle": True, "seed": 8, "device": "cpu", "decode": decode}
        loader = DataLoader(ConcatDataset(parts), **options)
        loader.set_epoch(1)
        whole = served(loader)
        interrupted = DataLoader(ConcatDataset(parts), **options)
        interrupted.set_epoch(1)
        iterator = iter(interrupted)
        before = [(images.clone(), labels.clone()) for _, (images, labels) in zip(range(stop), iterator)]
        state = interrupted.state_dict()
        del iterator
        assert state["dataset_length"] == 24 and state["global_position"] == 4 * stop
        resumed = DataLoader(ConcatDataset(parts), **{**options, "seed": 0})
        resumed.load_state_dict(state)
        resumed.set_epoch(1)
        rest = served(resumed)
        assert torch.equal(torch.cat([images for images, _ in before] + [rest[0]]), whole[0])
        assert torch.equal(torch.cat([labels for _, labels in before] + [rest[1]]), whole[1])


class TestRefused:
    def test_a_jpeg_part_without_a_crop(self, built_dataset, jpeg_dataset):
        both = ConcatDataset([MemmapImageDataset(built_dataset), MemmapImageDataset(jpeg_dataset)])
        with pytest.raises(UsageError, match=r"^part 1 of the ConcatDataset is a jpeg dataset, .* pass decode="):
            DataLoader(both, device="cpu")

    def test_raw_parts_of_other_sizes_without_a_crop_and_taken_with_one(self, built_dataset):
        other = numbered(4)[0]
        both = ConcatDataset([MemmapImageDataset(built_dataset), other])
        with pytest.raises(
            UsageError, match=r"^the parts of a ConcatDataset stack into one batch: part 0 holds images \[3, 48, 64\], "
            r"part 1 \[3, 2, 2\]: pass a decode= crop"
        ):  # fmt: skip
            DataLoader(both, device="cpu")
        images, _ = served(DataLoader(both, batch_size=8, device="cpu", decode=CenterCropDecode(2)))
        assert images.shape == (24, 3, 2, 2) and torch.equal(images[20:], other.images)

    def test_parts_with_other_fields(self, built_dataset, fields_dataset):
        both = ConcatDataset([MemmapImageDataset(fields_dataset), MemmapImageDataset(built_dataset)])
        with pytest.raises(
            UsageError, match=r"^the parts of a ConcatDataset serve one kind of batch: part 0 has the fields boxes "
            r"\(number int64 \[4\]\), .*part 1 none: build them with the same fields"
        ):  # fmt: skip
            DataLoader(both, device="cpu")

    def test_parts_whose_labels_mean_other_classes(self, small_folder, built_dataset, tmp_path):
        renamed = Path(shutil.copytree(small_folder, tmp_path / "photos"))
        (renamed / sorted(path.name for path in renamed.iterdir())[2]).rename(renamed / "zebra")
        other = MemmapImageDataset(build_memmap(renamed, tmp_path / "other.memmap", progress=False))
        both = ConcatDataset([MemmapImageDataset(built_dataset), other])
        with pytest.raises(
            UsageError, match=r"^label 2 is class '\w+' in part 0 of the ConcatDataset and 'zebra' in part 1: their "
            "labels would mix two label spaces"
        ):  # fmt: skip
            DataLoader(both, device="cpu")

    def test_a_gpu_decode(self, jpeg_dataset):
        both = ConcatDataset([MemmapImageDataset(jpeg_dataset)] * 2)
        with pytest.raises(UsageError, match=r"^gpu=True decodes one dataset's JPEGs on the GPU, got a ConcatDataset: pass gpu=False"):  # fmt: skip
            DataLoader(both, device="cpu", decode=CenterCropDecode(16, gpu=True))

    def test_a_part_that_is_no_gpuload_dataset(self):
        both = ConcatDataset([numbered(2)[0], torch.utils.data.TensorDataset(torch.zeros(2))])
        with pytest.raises(
            TypeError, match=r"^DataLoader reads a ConcatDataset of .* got a part of TensorDataset: build"
        ):
            DataLoader(both, device="cpu")

    def test_a_position_outside_a_subset_in_it(self):
        both = ConcatDataset([numbered(2)[0], Subset(numbered(3)[0], [0, 3])])
        with pytest.raises(UsageError, match=r"^a Subset in the ConcatDataset gave position 3 in a Subset of 3 images"):
            DataLoader(both, device="cpu")

    def test_an_image_data_part_of_another_dtype(self):
        bad = ImageData(images=torch.zeros(2, 3, 2, 2), labels=torch.zeros(2, dtype=torch.int64), batch_size=[2])
        with pytest.raises(UsageError, match=r"^DataLoader serves uint8 images"):
            DataLoader(ConcatDataset([numbered(2)[0], bad]), device="cpu")

    def test_a_shuffled_subset_of_it_and_what_the_message_says_to_pass_instead(self):
        both, indices = ConcatDataset(numbered(2, 3)), [0, 4, 3]
        with pytest.raises(UsageError, match=r"^gpuload.DataLoader shuffles a whole dataset, got a Subset.*SubsetRandomSampler"):  # fmt: skip
            DataLoader(Subset(both, indices), shuffle=True, device="cpu")
        loader = DataLoader(both, sampler=torch.utils.data.SubsetRandomSampler(indices), batch_size=2, device="cpu")
        assert sorted(served(loader)[1].tolist()) == sorted(indices)


def test_parts_at_a_url_are_read_through_their_caches_each_with_a_read_ahead(s3, built_dataset, small_jpeg, tmp_path):
    """A raw and a (Subset of a) jpeg dataset pushed to S3: the exact shuffle serves what the local parts
    serve; the default, block-aware order runs over both parts' blocks, each part read ahead."""
    with contextlib.ExitStack() as stack:
        remote = []
        for local in (built_dataset, small_jpeg):
            url = s3.url(local.name)
            push_memmap(local, url, store=open_store(url, retry=FAST_RETRY), progress=False)
            cache = tmp_path / f"cache-{local.name}"
            remote.append(stack.enter_context(MemmapImageDataset(url, cache=cache, cache_size="50MB", block_size=8192)))
        local = [MemmapImageDataset(built_dataset), MemmapImageDataset(small_jpeg)]
        options = {"batch_size": 5, "shuffle": True, "seed": 3, "device": "cpu", "decode": CenterCropDecode(16)}

        def concat(parts):
            return ConcatDataset([parts[0], Subset(parts[1], [5, 0, 2])])

        exact = served(DataLoader(concat(remote), **options, block_shuffle=0))
        expected = served(DataLoader(concat(local), **options))
        assert torch.equal(exact[0], expected[0]) and torch.equal(exact[1], expected[1])
        loader = DataLoader(concat(remote), **options)
        assert loader.block_shuffle == 32
        iterator = iter(loader)
        assert len(iterator._pipeline.prefetcher.prefetchers) == 2
        images, labels = served(iterator)
        blocks = loader._image_blocks()
        assert int(blocks[20:].min()) > int(blocks[:20].max())  # the second part's blocks after the first's
        order = epoch_order(23, epoch=0, seed=3, shuffle=True, blocks=blocks, window=32)
        unshuffled = torch.argsort(epoch_order(23, epoch=0, seed=3, shuffle=True))
        assert torch.equal(images, expected[0][unshuffled][order]) and torch.equal(
            labels, expected[1][unshuffled][order]
        )


def test_a_rank_that_opened_another_version_of_a_part_refuses_rank_0s_seed(built_dataset, small_raw, monkeypatch):
    """Under torch.distributed the seed goes out with the version of every part that rank 0 opened."""
    parts = [MemmapImageDataset(built_dataset), MemmapImageDataset(small_raw)]

    def rank_0_opened_another_second_part(sent, src):
        sent[1][1] = "0123456789abcdef"

    monkeypatch.setattr(loader_module.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(loader_module.dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(loader_module.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(loader_module.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(loader_module.dist, "broadcast_object_list", rank_0_opened_another_second_part)
    with pytest.raises(
        DatasetError, match=rf"^{re.escape(str(parts[1].path))} is not the version that was opened by rank 0"
    ):
        DataLoader(ConcatDataset(parts), shuffle=True, device="cpu")


def test_len_state_and_repr_count_the_whole_concatenation():
    loader = DataLoader(ConcatDataset(numbered(5, 0, 4)), batch_size=4, drop_last=True, device="cpu")
    assert len(loader) == 2 and loader.state_dict()["dataset_length"] == 9 and "images=9" in repr(loader)
    assert math.prod(next(iter(loader))[0].shape) == 4 * 3 * 2 * 2
