import json
import tracemalloc
from pathlib import Path

import pytest
import torch
from conftest import BAD_FILES, ODD_KINDS, SIZE, write_bad_file, write_odd_image
from tensordict import TensorDict
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

import gpuload.store.build
from gpuload import DecodeError, ImageData, MemmapImageDataset, build_memmap, make_sample_folder


def imagefolder_tensors(root: Path, transform) -> tuple[torch.Tensor, torch.Tensor]:
    reference = ImageFolder(str(root), transform=transform)
    images, labels = zip(*(reference[i] for i in range(len(reference))))
    return torch.stack(images), torch.tensor(labels)


def leftovers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if ".tmp-" in path.name or ".old-" in path.name)


class TestAgainstImageFolder:
    def test_same_classes_order_labels_and_pixels(self, photo_folder, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        images, labels = imagefolder_tensors(photo_folder, v2.PILToTensor())
        assert dataset.classes == ImageFolder(str(photo_folder)).classes
        assert torch.equal(dataset.data.labels, labels)
        assert torch.equal(dataset.data.images, images)

    def test_crop_resize_is_close_to_torchvision_resize_then_centre_crop(self, photo_folder, tmp_path):
        out = build_memmap(photo_folder, tmp_path / "small.memmap", size=(24, 24), resize="crop", progress=False)
        images, _ = imagefolder_tensors(photo_folder, v2.Compose([v2.PILToTensor(), v2.Resize(24), v2.CenterCrop(24)]))
        stored = MemmapImageDataset(out).data.images
        assert stored.shape == images.shape
        assert (stored.float() - images.float()).abs().max() <= 1  # rounding only


class TestOutput:
    def test_default_out_is_beside_src(self, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        assert len(dataset) == 20
        assert dataset.image_shape == (3, *SIZE)

    def test_plain_tensordict_loads_it(self, built_dataset):
        data = TensorDict.load_memmap(built_dataset)
        assert isinstance(data, ImageData)
        assert data.images.shape == (20, 3, *SIZE) and data.images.dtype == torch.uint8
        assert data.labels.shape == (20,) and data.labels.dtype == torch.int64

    def test_manifest_records_what_was_built(self, photo_folder, built_dataset):
        manifest = json.loads((built_dataset / "manifest.json").read_text())
        assert manifest["source"] == str(photo_folder)
        assert manifest["image_shape"] == [3, *SIZE]
        assert manifest["resize"] == "crop"
        assert manifest["samples"][0] == ["background/0000.jpg", 0]
        assert len(manifest["checksums"]) == 20 and all(len(c) == 16 for c in manifest["checksums"])
        assert manifest["skipped"] == []
        assert {"gpuload", "torch", "tensordict", "pillow", "python"} <= set(manifest["versions"])

    def test_data_files_are_read_only(self, built_dataset):
        for name in ("images.memmap", "labels.memmap"):
            assert (built_dataset / "_tensordict" / name).stat().st_mode & 0o222 == 0

    def test_images_of_several_sizes_need_a_size(self, photo_copy):
        write_odd_image(photo_copy / "face" / "other.jpg", "exif_rotated")  # displays as 48x64 ...
        make_sample_folder(photo_copy / "wide", images_per_class=1, size=(30, 90), classes=1)
        with pytest.raises(
            ValueError, match=r"2 different sizes \(most common: 48x64 \(21 images\), 30x90 \(1 images\)\); pass size"
        ):
            build_memmap(photo_copy, progress=False)
        assert not (photo_copy.parent / "photos.memmap").exists()

    def test_odd_images_are_converted_not_skipped(self, photo_copy):
        for kind, name in ODD_KINDS.items():
            write_odd_image(photo_copy / "face" / name, kind)
        dataset = MemmapImageDataset(build_memmap(photo_copy, progress=False))
        assert len(dataset) == 20 + len(ODD_KINDS) and dataset.skipped == []


class TestBadInputs:
    @pytest.fixture
    def with_bad_files(self, photo_copy):
        for name in BAD_FILES:
            write_bad_file(photo_copy / "collar", name)
        return photo_copy

    def test_bad_files_are_skipped_and_listed(self, with_bad_files):
        dataset = MemmapImageDataset(build_memmap(with_bad_files, size=SIZE, progress=False))
        assert len(dataset) == 20
        reasons = {entry["path"]: entry["reason"] for entry in dataset.skipped}
        assert sorted(reasons) == sorted(f"collar/{name}" for name in BAD_FILES)
        for name, reason in BAD_FILES.items():
            assert reason in reasons[f"collar/{name}"]
        assert all("collar/" + name not in [path for path, _ in dataset.manifest.samples] for name in BAD_FILES)

    def test_bad_files_are_skipped_when_probing_the_size_too(self, with_bad_files):
        dataset = MemmapImageDataset(build_memmap(with_bad_files, progress=False))
        assert len(dataset) == 20 and len(dataset.skipped) == len(BAD_FILES)

    def test_strict_fails_and_leaves_nothing(self, with_bad_files):
        with pytest.raises(DecodeError, match="collar/"):
            build_memmap(with_bad_files, size=SIZE, strict=True, progress=False)
        assert not (with_bad_files.parent / "photos.memmap").exists()
        assert leftovers(with_bad_files.parent) == []

    def test_no_decodable_image(self, tmp_path):
        for name in ("empty.jpg", "notes.jpg"):
            write_bad_file(tmp_path / "src" / "a", name)
        with pytest.raises(ValueError, match="no image in .* could be decoded; first problem: empty file"):
            build_memmap(tmp_path / "src", size=SIZE, progress=False)
        assert not (tmp_path / "src.memmap").exists()

    def test_empty_source(self, tmp_path):
        (tmp_path / "src").mkdir()
        with pytest.raises(FileNotFoundError, match="holds no image"):
            build_memmap(tmp_path / "src", progress=False)

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"size": (0, 5)}, "size must be two positive integers"),
            ({"size": (100_000, 100_000)}, "more than PIL.Image.MAX_IMAGE_PIXELS"),
            ({"resize": "zoom"}, "resize must be one of"),
            ({"workers": 0}, "workers must be a positive integer"),
        ],
    )
    def test_bad_arguments_fail_before_any_work(self, photo_folder, tmp_path, kwargs, message):
        with pytest.raises(ValueError, match=message):
            build_memmap(photo_folder, tmp_path / "out.memmap", progress=False, **kwargs)
        assert not (tmp_path / "out.memmap").exists()

    def test_out_inside_src_is_refused(self, photo_folder):
        with pytest.raises(ValueError, match="must not be inside src"):
            build_memmap(photo_folder, photo_folder / "x.memmap", progress=False)

    def test_not_enough_disk_space_fails_before_decoding(self, photo_folder, tmp_path, monkeypatch):
        monkeypatch.setattr(gpuload.store.build.shutil, "disk_usage", lambda path: _Usage())
        with pytest.raises(OSError, match="the dataset needs 0.00 GB .* but .* has 0.00 GB free"):
            build_memmap(photo_folder, tmp_path / "out.memmap", progress=False)
        assert not (tmp_path / "out.memmap").exists()


class _Usage:
    total = used = free = 100


class TestCrashSafety:
    def test_existing_out_is_not_touched(self, photo_folder, tmp_path):
        out = tmp_path / "out.memmap"
        out.mkdir()
        (out / "mine.txt").write_text("unchanged")
        with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
            build_memmap(photo_folder, out, progress=False)
        assert (out / "mine.txt").read_text() == "unchanged"

    def test_overwrite_replaces(self, photo_folder, tmp_path):
        out = tmp_path / "out.memmap"
        out.mkdir()
        (out / "mine.txt").write_text("old")
        build_memmap(photo_folder, out, overwrite=True, progress=False)
        assert not (out / "mine.txt").exists() and len(MemmapImageDataset(out)) == 20
        assert leftovers(tmp_path) == []

    @pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
    def test_interrupted_build_leaves_nothing(self, photo_folder, tmp_path, monkeypatch, error):
        calls = []
        real = gpuload.store.build._decode_into

        def failing(*args):
            calls.append(1)
            if len(calls) == 7:
                raise error("stop")
            return real(*args)

        monkeypatch.setattr(gpuload.store.build, "_decode_into", failing)
        with pytest.raises(error):
            build_memmap(photo_folder, tmp_path / "out.memmap", progress=False)
        assert not (tmp_path / "out.memmap").exists()
        assert leftovers(tmp_path) == []

    def test_stale_temporary_folder_of_a_dead_build_is_removed(self, photo_folder, tmp_path):
        stale = tmp_path / ".out.memmap.tmp-999999999"
        (stale / "_tensordict").mkdir(parents=True)
        build_memmap(photo_folder, tmp_path / "out.memmap", progress=False)
        assert not stale.exists()


def test_memory_does_not_grow_with_the_dataset(tmp_path):
    src = make_sample_folder(tmp_path / "many", images_per_class=20, size=(96, 128))
    dataset_bytes = 100 * 3 * 96 * 128
    tracemalloc.start()
    try:
        build_memmap(src, workers=2, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < dataset_bytes / 4  # a few images in flight, never the dataset
