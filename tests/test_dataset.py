import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash
from conftest import SIZE, resident_kib
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

import gpuload
from gpuload import (
    DatasetError,
    GatheredSamples,
    ImageData,
    MemmapImageDataset,
    build_memmap,
    decode_image,
    verify_memmap,
)
from gpuload.format.dataset import JpegSamples, storage_order
from gpuload.format.table import file_digest

PINNED = Path(__file__).parent / "data" / "tiny.memmap"
PINNED_V2 = Path(__file__).parent / "data" / "v2"
PINNED_V3 = Path(__file__).parent / "data" / "v3"


@pytest.fixture
def fresh_dataset(photo_folder, tmp_path) -> Path:
    return build_memmap(photo_folder, tmp_path / "photos.memmap", progress=False)


class TestLikeImageFolder:
    def test_items_classes_samples_targets(self, photo_folder, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        reference = ImageFolder(str(photo_folder), transform=v2.PILToTensor())
        assert len(dataset) == len(reference) == 20
        assert dataset.classes == reference.classes
        assert dataset.class_to_idx == reference.class_to_idx
        assert dataset.samples == reference.samples
        assert dataset.targets == reference.targets
        for index in (0, 7, -1):
            image, label = dataset[index]
            expected_image, expected_label = reference[index % len(reference)]
            assert torch.equal(image, expected_image) and label == expected_label
            assert isinstance(label, int)

    def test_index_out_of_range(self, built_dataset):
        with pytest.raises(IndexError, match="index 20 is out of range for a dataset of 20 images"):
            MemmapImageDataset(built_dataset)[20]

    def test_an_index_that_is_not_an_integer_is_refused_and_integer_likes_are_taken(self, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        for bad in (1.5, "3", None):
            with pytest.raises(TypeError, match="a dataset index must be an integer"):
                dataset[bad]
        expected = dataset[3][0]
        for index in (np.int64(3), torch.tensor(3)):
            assert torch.equal(dataset[index][0], expected)

    @pytest.mark.parametrize("workers", [0, 2])
    def test_stock_dataloader_with_default_collate(self, photo_folder, built_dataset, workers):
        dataset = MemmapImageDataset(built_dataset)
        reference = ImageFolder(str(photo_folder), transform=v2.PILToTensor())
        ours = list(DataLoader(dataset, batch_size=8, num_workers=workers))
        theirs = list(DataLoader(reference, batch_size=8))
        assert len(ours) == len(theirs) == 3
        for (images, labels), (expected_images, expected_labels) in zip(ours, theirs):
            assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)

    def test_getitems_gathers_a_batch_in_one_copy(self, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        gathered = dataset.__getitems__([3, 1, 3])
        assert isinstance(gathered, GatheredSamples) and isinstance(gathered.data, ImageData)
        assert len(gathered) == 3
        assert torch.equal(gathered.data.images, dataset.data.images[[3, 1, 3]])
        image, label = gathered[1]
        assert torch.equal(image, dataset[1][0]) and label == dataset[1][1]

    def test_getitems_of_a_jpeg_dataset_decodes_each_image_at_its_own_size(self, jpeg_dataset):
        dataset = MemmapImageDataset(jpeg_dataset)
        samples = dataset.__getitems__([3, 1])
        assert isinstance(samples, JpegSamples) and isinstance(samples, list) and samples.path == dataset.path
        assert [label for _, label in samples] == [dataset[3][1], dataset[1][1]]
        assert all(torch.equal(image, dataset[index][0]) for (image, _), index in zip(samples, (3, 1)))


class TestChannelsLast:
    """Raw images are stored [N, H, W, 3] and shown [N, 3, H, W] with channels-last strides: views, no copies."""

    def test_images_are_a_channels_last_view_of_the_file(self, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        images = dataset.data.images
        assert images.shape == (20, 3, *SIZE) and images.is_contiguous(memory_format=torch.channels_last)
        stored = (built_dataset / "images.memmap").read_bytes()[: 3 * SIZE[0] * SIZE[1]]
        assert torch.equal(images[0].permute(1, 2, 0).flatten(), torch.frombuffer(bytearray(stored), dtype=torch.uint8))
        image, _ = dataset[3]
        assert image.shape == (3, *SIZE) and image.stride() == (1, 3 * SIZE[1], 3)

    def test_a_gathered_batch_stays_channels_last(self, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        images = dataset.__getitems__([4, 0, 4]).data.images
        assert images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()
        assert torch.equal(images, dataset.data.images[[4, 0, 4]])

    def test_storage_order_of_other_layouts(self):
        planar = torch.zeros(2, 3, 4, 5, dtype=torch.uint8)
        view, channels_last = storage_order(planar)
        assert view is not None and view.stride() == planar.stride() and not channels_last
        stored = torch.zeros(2, 4, 5, 3, dtype=torch.uint8)
        view, channels_last = storage_order(stored.permute(0, 3, 1, 2))
        assert channels_last and view.data_ptr() == stored.data_ptr() and view.stride() == stored.stride()


class TestReadOnly:
    def test_writes_never_reach_the_files(self, fresh_dataset):
        images_file = fresh_dataset / "images.memmap"
        before = images_file.read_bytes()
        dataset = MemmapImageDataset(fresh_dataset)
        dataset.data.images[0].fill_(7)
        dataset.data.labels[:] = 3
        assert images_file.read_bytes() == before
        reopened = MemmapImageDataset(fresh_dataset).data.images[0]
        stored = torch.frombuffer(bytearray(before[: 3 * 48 * 64]), dtype=torch.uint8).view(48, 64, 3)
        assert torch.equal(reopened, stored.permute(2, 0, 1))

    def test_items_are_copies(self, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        image, _ = dataset[0]
        image.zero_()
        assert dataset[0][0].sum() > 0

    def test_fields_cannot_be_replaced_and_items_not_assigned(self, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        with pytest.raises(RuntimeError, match="locked"):
            dataset.data.images = torch.zeros_like(dataset.data.images)
        with pytest.raises(TypeError):
            dataset[0] = dataset[1]


class TestPickle:
    def test_sends_paths_not_pixels(self, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        payload = pickle.dumps(dataset)
        assert len(payload) < dataset.data.images.numel() / 10
        copy = pickle.loads(payload)
        assert torch.equal(copy.data.images, dataset.data.images)
        assert copy.samples == dataset.samples and copy.classes == dataset.classes

    def test_a_copy_made_after_a_rebuild_refuses_the_new_version(self, photo_folder, tmp_path):
        """A spawned DataLoader worker unpickles the dataset: rebuilt in between (--overwrite), it would
        serve other images under the same indices next to the parent's."""
        built = build_memmap(photo_folder, tmp_path / "ds", size=(24, 32), progress=False)
        payload = pickle.dumps(MemmapImageDataset(built))
        build_memmap(photo_folder, built, size=(12, 16), overwrite=True, progress=False)
        with pytest.raises(DatasetError, match=r"ds is not the version that was opened when it was pickled"):
            pickle.loads(payload)

    def test_ranks_that_opened_another_version_than_rank_0s_refuse_it(self, built_dataset, monkeypatch):
        """Under torch.distributed the loader sends rank 0's seed, and the version rank 0 opened with it."""
        import torch.distributed as dist

        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
        monkeypatch.setattr(dist, "get_rank", lambda: 1)
        monkeypatch.setattr(dist, "get_world_size", lambda: 2)
        monkeypatch.setattr(dist, "broadcast_object_list", lambda sent, src: sent.__setitem__(1, "another version"))
        dataset = MemmapImageDataset(built_dataset)
        with pytest.raises(DatasetError, match=r"is not the version that was opened by rank 0"):
            gpuload.DataLoader(dataset, batch_size=4, shuffle=True)
        monkeypatch.setattr(dist, "broadcast_object_list", lambda sent, src: None)  # rank 0's own: the same
        gpuload.DataLoader(dataset, batch_size=4, shuffle=True)


class TestLargerThanMemory:
    def test_a_sparse_dataset_far_larger_than_ram_opens_and_reads(self, built_dataset, tmp_path):
        """64 GiB of holes (no disk used): a private mapping charged against RAM + swap could not open it."""
        count, shape = 74_565, (3, 480, 640)  # 64 GiB of uint8 pixels
        folder = tmp_path / "huge.memmap"
        folder.mkdir()
        manifest = json.loads((built_dataset / "manifest.json").read_text())
        meta = json.dumps({"images": {"shape": [count, 480, 640, 3]}})  # what tensordict records
        (folder / "meta.json").write_text(meta)
        sizes = {"images.memmap": count * 3 * 480 * 640, "labels.memmap": count * 8, "checksums.memmap": count * 8}
        for name, size in sizes.items():
            with open(folder / name, "wb") as file:
                file.truncate(size)
        (folder / "paths.memmap").write_bytes(b"face/0000.jpg" * count)
        (folder / "path_offsets.memmap").write_bytes((np.arange(count + 1, dtype=np.int64) * 13).tobytes())
        table = ("labels.memmap", "checksums.memmap", "paths.memmap", "path_offsets.memmap")
        manifest.update(
            count=count,
            image_shape=list(shape),
            files={name: (folder / name).stat().st_size for name in (*table, "images.memmap", "meta.json")},
            table={name: file_digest(folder / name) for name in table},
        )
        (folder / "manifest.json").write_text(json.dumps(manifest))
        assert (folder / "images.memmap").stat().st_size > 2 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        dataset = MemmapImageDataset(folder)
        assert len(dataset) == count
        for index in (0, 12_345, count - 1):
            image, label = dataset[index]
            assert image.shape == shape and int(image.sum()) == 0 and label == 0
        batch = dataset.data[torch.tensor([5, 70_000, 33])]
        assert batch.images.shape == (3, *shape)


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
@pytest.mark.parametrize("storage", ["raw", "jpeg"])
def test_opening_leaves_no_page_of_the_index_in_this_process(photo_folder, tmp_path, storage):
    """The open's checks read every label (and every offset and size) of the index: 40 MB of a process's
    resident memory at ImageNet's count, per rank and worker, were they left mapped in."""
    dataset = MemmapImageDataset(build_memmap(photo_folder, tmp_path / "ds", format=storage, progress=False))
    resident = resident_kib(dataset.path)
    index = ["labels.memmap"] + (["offsets.memmap", "shapes.memmap"] if storage == "jpeg" else [])
    assert all(name in resident for name in index)  # mapped...
    assert sum(resident[name] for name in index) == 0, resident  # ...and nothing of them in memory
    assert dataset[len(dataset) - 1][1] == dataset.targets[-1]  # read again from the files when used


def test_resident_kib_counts_no_anonymous_mapping_as_the_file_before_it(tmp_path):
    """An anonymous mapping's header has no path: its pages are not the previous file's (the helper once
    counted them so, and the two tests above failed on a process whose heap lay after a mapped index)."""
    smaps = tmp_path / "smaps"
    smaps.write_text(
        f"7f00-7f10 r--s 00000000 08:01 42 {tmp_path}/ds/offsets.memmap\n"
        "Size: 4 kB\nRss: 0 kB\n"
        "7f10-7f80 rw-p 00000000 00:00 0 \n"
        "Size: 6048 kB\nRss: 6048 kB\n"
        f"7f80-7f90 r--s 00000000 08:01 43 {tmp_path}/ds/labels.memmap\n"
        "Size: 4 kB\nRss: 4 kB\n"
    )
    assert resident_kib(tmp_path / "ds", smaps) == {"offsets.memmap": 0, "labels.memmap": 4}


class TestDamagedFolders:
    def damage(self, dataset_path: Path, tmp_path: Path) -> Path:
        copy = Path(shutil.copytree(dataset_path, tmp_path / "copy.memmap"))
        for file in copy.iterdir():
            file.chmod(0o644)
        return copy

    def test_truncated_images_file(self, built_dataset, tmp_path):
        copy = self.damage(built_dataset, tmp_path)
        images = copy / "images.memmap"
        images.write_bytes(images.read_bytes()[:-100])
        with pytest.raises(DatasetError, match="images.memmap has 184,220 bytes, the manifest says 184,320"):
            MemmapImageDataset(copy)

    def test_missing_labels(self, built_dataset, tmp_path):
        copy = self.damage(built_dataset, tmp_path)
        (copy / "labels.memmap").unlink()
        with pytest.raises(DatasetError, match="labels.memmap is missing"):
            MemmapImageDataset(copy)

    @pytest.mark.parametrize("storage", ["raw", "jpeg", "raw version 3", "jpeg version 3"])
    def test_a_damaged_label_is_refused_at_open_not_served(self, built_dataset, jpeg_dataset, tmp_path, storage):
        built = {"raw": built_dataset, "jpeg": jpeg_dataset}.get(storage) or PINNED_V3 / f"{storage.split()[0]}.memmap"
        copy = self.damage(built, tmp_path)
        labels = copy / "labels.memmap"
        labels.chmod(0o644)
        data = bytearray(labels.read_bytes())
        data[8 * 3] ^= 0x01  # image 3: class 0 becomes 1
        labels.write_bytes(bytes(data))
        message = (  # version 3 compares the labels with the manifest's, version 4 with the build's digest of the file
            r"1 labels in labels.memmap differ from the manifest \(first at index 3"
            if "version 3" in storage
            else r"is damaged: labels.memmap differs from what was built; run gpuload verify"
        )
        with pytest.raises(DatasetError, match=message):
            MemmapImageDataset(copy)

    def test_missing_manifest(self, tmp_path):
        with pytest.raises(DatasetError, match="is not a gpuload dataset: it has no manifest.json"):
            MemmapImageDataset(tmp_path)

    def test_a_dataset_whose_manifest_is_gone_is_called_damaged_not_foreign(self, tmp_path):
        """The same words as ``gpuload verify``: its arrays say it is a dataset."""
        (tmp_path / "labels.memmap").write_bytes(b"\0" * 8)
        with pytest.raises(DatasetError) as caught:
            MemmapImageDataset(tmp_path)
        assert str(caught.value) == (
            f"{tmp_path}: manifest.json is missing but files a build writes are there (the manifest was deleted, "
            "or the build never finished); if it is a gpuload dataset, delete it and build it again (--overwrite "
            "replaces only whole datasets)"
        )

    def test_unfinished_build(self, tmp_path):
        (tmp_path / ".out.memmap.tmp-12").mkdir()
        with pytest.raises(DatasetError, match="an unfinished build"):
            MemmapImageDataset(tmp_path / ".out.memmap.tmp-12")

    def test_tensordict_metadata_is_not_needed_by_gpuload(self, built_dataset, tmp_path):
        copy = self.damage(built_dataset, tmp_path)
        (copy / "meta.json").write_text("{")  # same size class of damage: only plain tensordict reads it
        with pytest.raises(DatasetError, match="meta.json has 1 bytes, the manifest says"):
            MemmapImageDataset(copy)

    def test_manifest_that_disagrees_with_the_arrays(self, built_dataset, tmp_path):
        copy = self.damage(built_dataset, tmp_path)
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest["image_shape"] = [3, 64, 49]
        (copy / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(
            DatasetError, match=r"images.memmap has 184,320 bytes, the manifest says 188,160 \(20 x \[64, 49, 3\]"
        ):
            MemmapImageDataset(copy)

    @pytest.mark.parametrize(
        "edit",
        [
            {"layout": "channels_first"},
            {"image_shape": [3, SIZE[1], SIZE[0]]},
            {"format_version": 2, "layout": None},  # version 3's manifest made version 2's: channel-first
        ],
    )
    def test_a_manifest_edited_to_another_layout_or_shape_is_refused(self, built_dataset, tmp_path, edit):
        """The same bytes read in another order are scrambled pixels: refused at open, and by verify."""
        copy = self.damage(PINNED_V3 / "raw.memmap" if "format_version" in edit else built_dataset, tmp_path)
        manifest = json.loads((copy / "manifest.json").read_text())
        for name, value in edit.items():
            if value is None:
                del manifest[name]
            else:
                manifest[name] = value
        (copy / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(DatasetError, match="meta.json recorded .* when it was built: the manifest was edited"):
            MemmapImageDataset(copy)
        problems = verify_memmap(copy, progress=False)
        assert len(problems) == 1 and "the manifest was edited" in problems[0]

    def test_not_a_folder(self, tmp_path):
        (tmp_path / "file").touch()
        with pytest.raises(DatasetError, match="is not a folder"):
            MemmapImageDataset(tmp_path / "file")

    def test_a_missing_path_is_said_to_be_missing(self, tmp_path):
        """As ``gpuload verify`` says it."""
        with pytest.raises(DatasetError, match="nope does not exist; pass the folder that build-memmap wrote"):
            MemmapImageDataset(tmp_path / "nope")


class TestPinnedFormat:
    """``tests/data/tiny.memmap`` was built by gpuload 0.1.0; this release must read it unchanged."""

    def test_manifest(self):
        manifest = json.loads((PINNED / "manifest.json").read_text())
        assert manifest == {
            "source": "/tmp/gpuload-pinned/tiny",
            "classes": ["collar", "face"],
            "samples": [["collar/0000.jpg", 0], ["collar/0001.jpg", 0], ["face/0000.jpg", 1], ["face/0001.jpg", 1]],
            "checksums": manifest["checksums"],
            "image_shape": [3, 6, 8],
            "resize": "crop",
            "skipped": [],
            "versions": manifest["versions"],
            "created": manifest["created"],
            "format": "gpuload.memmap",
            "format_version": 1,
            "checksum": "xxh3_64",
        }
        assert manifest["versions"]["gpuload"] == "0.1.0"

    def test_pixels_match_the_recorded_checksums(self):
        dataset = MemmapImageDataset(PINNED)
        assert dataset.data.images.shape == (4, 3, 6, 8)
        assert dataset.data.labels.tolist() == [0, 0, 1, 1]
        sums = [f"{xxhash.xxh3_64_intdigest(dataset.data.images[i].numpy()):016x}" for i in range(4)]
        assert sums == dataset.manifest.checksums


class TestPinnedVersion3:
    """``tests/data/v3`` holds a raw and a jpeg dataset built from ``tests/data/v2/sources`` by the release
    that kept every image's path and checksum in ``manifest.json`` (format version 3, raw images
    channels-last): they open, read, load and verify as they did."""

    @pytest.fixture
    def moved(self, tmp_path) -> Path:
        """The datasets with their manifests pointing at the committed sources (``source`` is not digested)."""
        for name in ("raw.memmap", "jpeg.memmap"):
            shutil.copytree(PINNED_V3 / name, tmp_path / name)
            manifest = json.loads((tmp_path / name / "manifest.json").read_text())
            manifest["source"] = str(PINNED_V2 / "sources")
            (tmp_path / name / "manifest.json").chmod(0o644)
            (tmp_path / name / "manifest.json").write_text(json.dumps(manifest, separators=(",", ":")))
        return tmp_path

    def test_manifests_are_version_3_with_the_samples_in_them(self):
        for name in ("raw.memmap", "jpeg.memmap"):
            manifest = json.loads((PINNED_V3 / name / "manifest.json").read_text())
            assert manifest["format_version"] == 3 and len(manifest["samples"]) == len(manifest["checksums"]) == 4

    def test_raw_pixels_are_the_sources_decoded_channels_last(self, moved):
        dataset = MemmapImageDataset(moved / "raw.memmap")
        assert dataset.manifest.layout == "channels_last"
        assert dataset.data.images.is_contiguous(memory_format=torch.channels_last)
        assert dataset.data.images.shape == (4, 3, 6, 8) and list(dataset.targets) == [0, 0, 1, 1]
        for index, (path, label) in enumerate(dataset.samples):
            assert torch.equal(dataset[index][0], decode_image(path, (6, 8), "crop"))
            assert label == dataset.targets[index] and path.startswith(str(PINNED_V2 / "sources"))

    def test_jpeg_images_decode_as_their_sources(self, moved):
        dataset = MemmapImageDataset(moved / "jpeg.memmap")
        for index, (path, _) in enumerate(dataset.samples):
            assert torch.equal(dataset[index][0], decode_image(path))

    def test_both_verify_with_their_sources(self, moved):
        for name in ("raw.memmap", "jpeg.memmap"):
            assert verify_memmap(moved / name, sources="all", progress=False) == []

    def test_both_load_through_the_loader(self):
        raw = MemmapImageDataset(PINNED_V3 / "raw.memmap")
        batches = list(gpuload.DataLoader(raw, batch_size=4, device="cpu"))
        assert torch.equal(batches[0][0], raw.data.images)
        decode = gpuload.CenterCropDecode((12, 16), ratio=1.0)
        jpeg = gpuload.DataLoader(
            MemmapImageDataset(PINNED_V3 / "jpeg.memmap"), batch_size=2, device="cpu", decode=decode
        )
        assert [images.shape for images, _ in jpeg] == [(2, 3, 12, 16), (2, 3, 12, 16)]


class TestPinnedVersion2:
    """``tests/data/v2`` holds a raw and a jpeg dataset built by the release before raw images were
    stored channels-last (format version 2), and their four sources: they open, read and verify
    exactly as they did."""

    @pytest.fixture
    def moved(self, tmp_path) -> Path:
        """The datasets with their manifests pointing at the committed sources (``source`` is not digested)."""
        for name in ("raw.memmap", "jpeg.memmap"):
            shutil.copytree(PINNED_V2 / name, tmp_path / name)
            manifest = json.loads((tmp_path / name / "manifest.json").read_text())
            manifest["source"] = str(PINNED_V2 / "sources")
            (tmp_path / name / "manifest.json").write_text(json.dumps(manifest, separators=(",", ":")))
        return tmp_path

    def test_manifests_are_version_2_without_a_layout(self):
        for name in ("raw.memmap", "jpeg.memmap"):
            manifest = json.loads((PINNED_V2 / name / "manifest.json").read_text())
            assert manifest["format_version"] == 2 and "layout" not in manifest

    def test_raw_pixels_are_the_sources_decoded_channel_first_as_stored(self):
        dataset = MemmapImageDataset(PINNED_V2 / "raw.memmap")
        assert dataset.manifest.layout == "channels_first" and dataset.data.images.is_contiguous()
        assert dataset.data.images.shape == (4, 3, 6, 8) and dataset.data.labels.tolist() == [0, 0, 1, 1]
        for index, (source, _) in enumerate(dataset.manifest.samples):
            expected = decode_image(PINNED_V2 / "sources" / source, (6, 8), "crop")
            assert torch.equal(dataset[index][0], expected)
        sums = [f"{xxhash.xxh3_64_intdigest(dataset.data.images[i].numpy()):016x}" for i in range(4)]
        assert sums == dataset.manifest.checksums
        assert torch.equal(dataset.__getitems__([2, 1]).data.images, dataset.data.images[[2, 1]])

    def test_jpeg_images_decode_as_their_sources(self):
        dataset = MemmapImageDataset(PINNED_V2 / "jpeg.memmap")
        assert dataset.manifest.layout is None
        for index, (source, _) in enumerate(dataset.manifest.samples):
            assert torch.equal(dataset[index][0], decode_image(PINNED_V2 / "sources" / source))

    def test_both_verify_with_their_sources(self, moved):
        for name in ("raw.memmap", "jpeg.memmap"):
            assert verify_memmap(moved / name, sources="all", progress=False) == []

    def test_both_load_through_the_loader(self):
        raw = list(gpuload.DataLoader(MemmapImageDataset(PINNED_V2 / "raw.memmap"), batch_size=4, device="cpu"))
        assert torch.equal(raw[0][0], MemmapImageDataset(PINNED_V2 / "raw.memmap").data.images)
        decode = gpuload.CenterCropDecode((12, 16), ratio=1.0)
        jpeg = gpuload.DataLoader(
            MemmapImageDataset(PINNED_V2 / "jpeg.memmap"), batch_size=2, device="cpu", decode=decode
        )
        assert [images.shape for images, _ in jpeg] == [(2, 3, 12, 16), (2, 3, 12, 16)]


def test_repr_writes_the_size_width_x_height(built_dataset):
    assert f"size={SIZE[1]}x{SIZE[0]}, classes=5)" in repr(MemmapImageDataset(built_dataset))
