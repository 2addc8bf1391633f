import collections
import errno
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from conftest import BAD_FILES, NOT_FILES, ODD_KINDS, SIZE, photo, shard_of, write_bad_file, write_odd_image
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

import gpuload.sources.samples
import gpuload.writing.build
import gpuload.writing.decode
import gpuload.writing.files
import gpuload.writing.writer
from gpuload import (
    BusyError,
    DecodeError,
    ImageData,
    MemmapImageDataset,
    SourceError,
    UsageError,
    build_memmap,
    make_sample_folder,
    verify_memmap,
)
from gpuload.format.table import SampleTable, file_digest
from gpuload.sources.samples import SampleScan

PINNED = Path(__file__).parent / "data" / "tiny.memmap"


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

    def test_plain_tensordict_opens_it_in_a_process_without_gpuload(self, built_dataset):
        code = textwrap.dedent(f"""
            import sys, torch
            from tensordict import TensorDict
            data = TensorDict.load_memmap({str(built_dataset)!r})
            assert "gpuload" not in sys.modules, "gpuload was imported"
            print(type(data).__name__, data["images"].dtype, list(data["images"].shape), data["labels"].dtype)
        """)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        # the file's layout: channels-last [N, H, W, 3] (gpuload shows it as [N, 3, H, W])
        assert result.stdout.split() == ["TensorDict", "torch.uint8", "[20,", "48,", "64,", "3]", "torch.int64"]

    def test_gpuload_still_hands_out_its_tensorclass(self, built_dataset):
        data = MemmapImageDataset(built_dataset).data
        assert isinstance(data, ImageData)
        assert data.images.shape == (20, 3, *SIZE) and data.images.dtype == torch.uint8
        assert data.labels.shape == (20,) and data.labels.dtype == torch.int64

    def test_manifest_records_what_was_built(self, photo_folder, built_dataset):
        manifest = json.loads((built_dataset / "manifest.json").read_text())
        assert manifest["source"] == str(photo_folder)
        assert manifest["image_shape"] == [3, *SIZE]
        assert manifest["format_version"] == 4 and manifest["layout"] == "channels_last"
        assert manifest["resize"] == "crop" and manifest["count"] == 20 and manifest["order"] == {}
        assert "samples" not in manifest and "checksums" not in manifest  # in the table files: nothing per image here
        table = SampleTable.open(built_dataset, 20)
        assert table.path(0) == "background/0000.jpg" and int(table.labels[0]) == 0
        assert manifest["table"] == {name: file_digest(built_dataset / name) for name in manifest["table"]}
        assert sorted(manifest["table"]) == ["checksums.memmap", "labels.memmap", "path_offsets.memmap", "paths.memmap"]
        assert manifest["skipped"] == []
        assert manifest["max_image_pixels"] == Image.MAX_IMAGE_PIXELS  # what verify decodes the sources with
        assert {"gpuload", "torch", "tensordict", "pillow", "python"} <= set(manifest["versions"])

    def test_images_are_stored_channels_last_as_decoded(self, photo_folder, built_dataset):
        first = (built_dataset / "images.memmap").read_bytes()[: 3 * SIZE[0] * SIZE[1]]
        source = MemmapImageDataset(built_dataset).samples[0][0]
        expected = gpuload.writing.decode.decode_image(source).permute(1, 2, 0).contiguous().numpy().tobytes()
        assert first == expected

    def test_files_are_read_only(self, built_dataset):
        for name in ("images.memmap", "labels.memmap", "meta.json", "manifest.json"):
            assert (built_dataset / name).stat().st_mode & 0o222 == 0

    def test_images_of_several_sizes_need_a_size(self, photo_copy):
        write_odd_image(photo_copy / "face" / "other.jpg", "exif_rotated")  # displays as 48x64 ...
        make_sample_folder(photo_copy / "wide", images_per_class=1, size=(30, 90), classes=1)
        with pytest.raises(
            ValueError,
            match=r"2 different sizes, width x height \(most common: 64x48 \(21 images\), 90x30 \(1 image\)\); pass size",
        ):
            build_memmap(photo_copy, progress=False)
        assert not (photo_copy.parent / "photos.memmap").exists()

    def test_images_smaller_than_the_target_in_one_side_are_kept(self, photo_copy):
        for width, height in ((382, 201), (319, 505), (641, 479)):
            photo((height, width)).save(photo_copy / "face" / f"odd-{width}x{height}.jpg", quality=90)
        dataset = MemmapImageDataset(build_memmap(photo_copy, size=(480, 640), progress=False))
        assert dataset.skipped == [] and len(dataset) == 23

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
        assert all(
            str(with_bad_files / "collar" / name) not in [path for path, _ in dataset.samples] for name in BAD_FILES
        )

    def test_bad_files_are_skipped_when_probing_the_size_too(self, with_bad_files):
        dataset = MemmapImageDataset(build_memmap(with_bad_files, progress=False))
        assert len(dataset) == 20 and len(dataset.skipped) == len(BAD_FILES)

    @pytest.mark.parametrize("options", [{}, {"size": SIZE}, {"format": "jpeg"}])  # {}: sizes probed first
    def test_what_is_not_a_regular_file_is_skipped_and_listed_never_opened(self, photo_copy, make_not_a_file, options):
        for kind in NOT_FILES:
            make_not_a_file(photo_copy / "collar" / f"{kind}.jpg", kind)
        dataset = MemmapImageDataset(build_memmap(photo_copy, progress=False, **options))
        assert len(dataset) == 20
        assert {entry["path"]: entry["reason"] for entry in dataset.skipped} == {
            f"collar/{kind}.jpg": f"not a regular file ({name}): not opened; images must be regular files"
            for kind, name in NOT_FILES.items()
        }

    def test_a_broken_link_is_skipped_and_listed_by_a_jpeg_build_too(self, photo_copy):
        (photo_copy / "collar" / "gone.jpg").symlink_to(photo_copy / "nowhere.jpg")
        dataset = MemmapImageDataset(build_memmap(photo_copy, format="jpeg", progress=False))
        assert len(dataset) == 20 and [entry["path"] for entry in dataset.skipped] == ["collar/gone.jpg"]
        assert dataset.skipped[0]["reason"].startswith("cannot read (FileNotFoundError")

    @pytest.mark.parametrize("given", [False, True])  # the classes of the folders, or a list (--classes-from)
    def test_a_class_whose_files_are_all_skipped_is_named_in_a_warning_and_the_manifest(self, photo_copy, given):
        shutil.rmtree(photo_copy / "collar")
        for name in ("notes.jpg", "truncated.jpg"):
            write_bad_file(photo_copy / "collar", name)
        classes = ["background", "collar", "face", "sleeve_left", "sleeve_right", "hat"] if given else None
        with pytest.warns(UserWarning) as caught:
            out = build_memmap(photo_copy, classes=classes, progress=False)
        assert [str(warning.message) for warning in caught][-1] == (
            f"1 class has no image left in {out}, all of its files skipped: collar; their labels are kept"
        )
        dataset = MemmapImageDataset(out)
        assert len(dataset) == 16 and dataset.manifest.empty_classes == (["collar", "hat"] if given else ["collar"])

    def test_strict_fails_and_leaves_nothing(self, with_bad_files):
        with pytest.raises(DecodeError, match="collar/"):
            build_memmap(with_bad_files, size=SIZE, strict=True, progress=False)
        assert not (with_bad_files.parent / "photos.memmap").exists()
        assert leftovers(with_bad_files.parent) == []

    def test_no_decodable_image(self, tmp_path):
        for name in ("empty.jpg", "notes.jpg"):
            write_bad_file(tmp_path / "src" / "a", name)
        with pytest.raises(DecodeError, match="src: no image could be decoded; first problem: empty file"):
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

    @pytest.mark.parametrize("resize", ["crop", "pad", "stretch"])
    def test_resize_with_jpeg_is_refused_even_the_default_mode(self, photo_folder, tmp_path, resize):
        with pytest.raises(UsageError, match=r"resize applies only to format='raw' \(--format raw\)") as caught:
            build_memmap(photo_folder, tmp_path / "out", format="jpeg", resize=resize, progress=False)
        assert "leave resize out" in str(caught.value) and "\n" not in str(caught.value)
        assert not (tmp_path / "out").exists()

    def test_resize_left_out_is_crop_for_raw_and_nothing_for_jpeg(self, photo_folder, tmp_path):
        raw = MemmapImageDataset(build_memmap(photo_folder, tmp_path / "raw", size=(24, 24), progress=False))
        jpeg = MemmapImageDataset(build_memmap(photo_folder, tmp_path / "jpeg", format="jpeg", progress=False))
        assert raw.manifest.resize == "crop" and jpeg.manifest.resize is None

    @pytest.mark.parametrize("error", [ZeroDivisionError, MemoryError, KeyboardInterrupt])
    def test_a_bug_while_decoding_stops_the_build_with_its_traceback(self, photo_folder, tmp_path, monkeypatch, error):
        def broken(*args):
            raise error("not the file's fault")

        monkeypatch.setattr(gpuload.writing.decode, "_fit", broken)
        with pytest.raises(error):
            build_memmap(photo_folder, tmp_path / "out.memmap", size=(10, 10), progress=False)
        assert os.listdir(tmp_path) == []

    @pytest.mark.parametrize(
        ("format", "advice"),
        [
            ("raw", "choose a smaller size (--size) or another out"),
            ("jpeg", "build with --max-side, or choose another out"),
        ],
    )
    def test_not_enough_disk_space_fails_before_decoding(self, photo_folder, tmp_path, monkeypatch, format, advice):
        monkeypatch.setattr(gpuload.writing.build.shutil, "disk_usage", lambda path: _Usage())
        with pytest.raises(OSError) as caught:
            build_memmap(photo_folder, tmp_path / "out.memmap", format=format, progress=False)
        assert caught.value.errno == errno.ENOSPC  # so the command line prints one line, not a traceback
        message = str(caught.value)
        assert re.search(r"the dataset needs [\d,]+ bytes \([\d.]+ [KM]B\) \(.*\) but .* has 100 bytes free", message)
        assert message.endswith(advice) and not (tmp_path / "out.memmap").exists()

    def test_a_full_disk_while_finishing_names_the_dataset_and_what_to_do(self, photo_folder, tmp_path, monkeypatch):
        monkeypatch.setattr(gpuload.writing.build.Manifest, "write", _disk_full)
        assert _full_disk_message(photo_folder, tmp_path / "out.memmap") == (
            f"[Errno 28] not enough disk space to finish {tmp_path / 'out.memmap'}: its images are written, and "
            "its labels, metadata and manifest did not fit; free space there or write to another disk"
        )
        assert os.listdir(tmp_path) == []  # nothing half-built left

    @pytest.mark.parametrize(("format", "name"), [("raw", "images.memmap"), ("jpeg", "data.memmap")])
    def test_a_full_disk_while_writing_images_names_the_dataset_not_its_temporary_folder(
        self, photo_folder, tmp_path, monkeypatch, format, name
    ):
        monkeypatch.setattr(gpuload.writing.writer.os, "pwrite", _disk_full)
        message = _full_disk_message(photo_folder, tmp_path / "out.memmap", format=format)
        assert message.startswith(f"[Errno 28] not enough disk space to write {tmp_path / 'out.memmap' / name}: ")
        assert ".tmp-" not in message and message.endswith("free space there or write to another disk")
        assert os.listdir(tmp_path) == []  # nothing half-built left

    @pytest.mark.parametrize("options", [{"size": (48, 64)}, {}], ids=["streamed", "scan first"])
    def test_a_full_disk_while_scanning_names_the_dataset(self, table_folder, tmp_path, monkeypatch, options):
        """A streamed build writes the scan's files among its images, so the disk may fill there: the
        message was the bare "[Errno 28] No space left on device", naming nothing."""
        monkeypatch.setattr(gpuload.sources.samples.TableWriter, "close", _disk_full)
        message = _full_disk_message(table_folder, tmp_path / "out.memmap", **options)
        assert message.startswith(f"[Errno 28] not enough disk space to build {tmp_path / 'out.memmap'}: ")
        assert message.endswith("free space there or write to another disk")
        assert os.listdir(tmp_path) == []  # nothing half-built left

    def test_no_room_for_the_build_folder_names_the_dataset(self, photo_folder, tmp_path, monkeypatch):
        real_mkdir = Path.mkdir

        def mkdir(self, *args, **kwargs):
            if ".tmp-" in self.name:
                raise OSError(errno.ENOSPC, "No space left on device", str(self))
            return real_mkdir(self, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", mkdir)
        assert _full_disk_message(photo_folder, tmp_path / "out.memmap") == (
            f"[Errno 28] not enough disk space to build {tmp_path / 'out.memmap'}: no room for a new folder "
            "beside it; free space there or write to another disk"
        )

    def test_no_free_inode_for_the_build_folder_is_not_called_a_lack_of_space(
        self, photo_folder, tmp_path, monkeypatch
    ):
        real_mkdir = Path.mkdir

        def mkdir(self, *args, **kwargs):
            if ".tmp-" in self.name:
                raise OSError(errno.ENOSPC, "No space left on device", str(self))
            return real_mkdir(self, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", mkdir)
        monkeypatch.setattr(gpuload.writing.files.os, "statvfs", lambda path: _Statvfs(12_800, free_inodes=0))
        assert _full_disk_message(photo_folder, tmp_path / "out.memmap") == (
            f"[Errno 28] no free inode left to build {tmp_path / 'out.memmap'}: no room for a new folder beside it "
            "(its disk has 52,428,800 bytes (52.4 MB) free, but all its 1,000 inodes are taken: each file or folder "
            "takes one, whatever its size); delete files there or write to another disk"
        )

    def test_a_jpeg_build_with_max_side_is_not_refused_for_the_size_of_its_sources(
        self, photo_folder, tmp_path, monkeypatch
    ):
        """Images scaled down to --max-side are re-encoded smaller than their sources: their bytes
        say nothing of what the build needs, so nothing is refused or reserved up front."""
        monkeypatch.setattr(gpuload.writing.build.shutil, "disk_usage", lambda path: _Usage(free=1000))
        reserved = []
        monkeypatch.setattr(
            gpuload.writing.writer.os, "posix_fallocate", lambda fd, offset, size: reserved.append(size)
        )
        out = build_memmap(photo_folder, tmp_path / "out.jpeg", format="jpeg", max_side=8, progress=False)
        assert MemmapImageDataset(out).data.shapes.max() == 8 and reserved == []

    def test_quality_with_raw_is_refused(self, photo_folder, tmp_path):
        with pytest.raises(UsageError, match=r"quality applies only to format='jpeg'"):
            build_memmap(photo_folder, tmp_path / "out", quality=80, progress=False)
        assert (
            MemmapImageDataset(
                build_memmap(photo_folder, tmp_path / "jpeg", format="jpeg", progress=False)
            ).manifest.jpeg["quality"]
            == 90
        )

    def test_stale_temporary_folders_are_removed_before_checking_free_space(self, photo_folder, tmp_path, monkeypatch):
        stale = tmp_path / ".out.memmap.tmp-1"  # left by a build killed on a nearly full disk
        stale.mkdir()
        (stale / "images.memmap").write_bytes(b"\0" * 1000)
        monkeypatch.setattr(
            gpuload.writing.build.shutil, "disk_usage", lambda path: _Usage(0 if stale.exists() else 10**9)
        )
        build_memmap(photo_folder, tmp_path / "out.memmap", progress=False)
        assert not stale.exists()


def _disk_full(*args, **kwargs):
    """A stand-in for a write that finds the disk full."""
    raise OSError(errno.ENOSPC, "No space left on device")


def _full_disk_message(src: Path, out: Path, **options) -> str:
    """What a build that runs out of disk space says; its errno must stay ENOSPC (one line on the
    command line, not a traceback)."""
    with pytest.raises(OSError) as caught:
        build_memmap(src, out, progress=False, **options)
    assert caught.value.errno == errno.ENOSPC
    return str(caught.value)


class _Statvfs:
    """What os.statvfs (also behind shutil.disk_usage) says of a disk of 4 KiB blocks."""

    def __init__(self, free_blocks: int, free_inodes: int) -> None:
        self.f_bavail, self.f_frsize, self.f_blocks, self.f_bfree = free_blocks, 4096, 10**6, free_blocks
        self.f_files, self.f_favail = 1000, free_inodes


class _Usage:
    def __init__(self, free: int = 100) -> None:
        self.total = self.used = 100
        self.free = free


class TestPathsAreCheckedResolved:
    """No output may be the source, lie inside it, or contain it, however the paths are spelled."""

    def test_out_inside_src_is_refused(self, photo_folder):
        with pytest.raises(UsageError, match="is inside src"):
            build_memmap(photo_folder, photo_folder / "x.memmap", progress=False)

    @pytest.mark.parametrize("spelling", ["parent", "dotdot", "symlink"])
    def test_out_containing_src_is_refused_with_overwrite_and_nothing_is_lost(self, photo_copy, spelling, monkeypatch):
        root = photo_copy.parent
        before = sorted(path.relative_to(root) for path in photo_copy.rglob("*"))
        monkeypatch.chdir(root)
        if spelling == "symlink":
            (root / "alias").symlink_to(root)
        out = {"parent": Path("."), "dotdot": Path("photos") / "..", "symlink": Path("alias")}[spelling]
        with pytest.raises(UsageError, match=r"contains src .*put out outside"):
            build_memmap(Path("photos"), out, overwrite=True, progress=False)
        assert sorted(path.relative_to(root) for path in photo_copy.rglob("*")) == before

    def test_src_reached_through_a_symlink_and_out_inside_its_target(self, photo_copy, tmp_path):
        (tmp_path / "link").symlink_to(photo_copy)
        with pytest.raises(UsageError, match="is inside src"):
            build_memmap(tmp_path / "link", photo_copy / "face" / "x.memmap", progress=False)


class TestOverwriteOnlyReplacesADataset:
    def test_existing_out_is_not_touched_without_overwrite(self, photo_folder, tmp_path):
        out = tmp_path / "out.memmap"
        out.mkdir()
        (out / "mine.txt").write_text("unchanged")
        with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
            build_memmap(photo_folder, out, progress=False)
        assert (out / "mine.txt").read_text() == "unchanged"

    def test_a_folder_that_is_not_a_dataset_is_refused(self, photo_folder, tmp_path):
        out = tmp_path / "out.memmap"
        out.mkdir()
        (out / "mine.txt").write_text("unchanged")
        with pytest.raises(UsageError, match=f"overwrite only replaces a gpuload dataset, and {out} is not one"):
            build_memmap(photo_folder, out, overwrite=True, progress=False)
        assert (out / "mine.txt").read_text() == "unchanged"

    def test_a_dataset_whose_manifest_is_gone_is_refused_with_one_piece_of_advice(self, photo_folder, tmp_path):
        out = build_memmap(photo_folder, tmp_path / "out.memmap", progress=False)
        (out / "manifest.json").unlink()
        kept = sorted(path.name for path in out.iterdir())
        with pytest.raises(UsageError) as caught:
            build_memmap(photo_folder, out, overwrite=True, progress=False)
        assert str(caught.value) == (
            f"overwrite only replaces a whole gpuload dataset, and {out} has no manifest.json (deleted, or its build "
            "never finished): move it away yourself or choose another out"
        )
        assert sorted(path.name for path in out.iterdir()) == kept

    def test_a_file_is_refused(self, photo_folder, tmp_path):
        out = tmp_path / "out.memmap"
        out.write_text("unchanged")
        with pytest.raises(UsageError, match="is not a folder"):
            build_memmap(photo_folder, out, overwrite=True, progress=False)
        assert out.read_text() == "unchanged"

    def test_a_dataset_holding_other_files_too_is_refused(self, photo_folder, built_dataset, tmp_path):
        out = Path(shutil.copytree(built_dataset, tmp_path / "out.memmap"))
        (out / "notes").mkdir()
        (out / "notes" / "mine.txt").write_text("unchanged")
        with pytest.raises(UsageError, match=r"also holds 'notes' \(2 entries gpuload did not write\)"):
            build_memmap(photo_folder, out, overwrite=True, progress=False)
        assert (out / "notes" / "mine.txt").read_text() == "unchanged"

    @pytest.mark.parametrize("old", ["current", "version_1"])
    def test_a_dataset_is_replaced(self, photo_folder, built_dataset, tmp_path, old):
        out = Path(shutil.copytree(built_dataset if old == "current" else PINNED, tmp_path / "out.memmap"))
        build_memmap(photo_folder, out, size=(24, 32), overwrite=True, progress=False)
        assert MemmapImageDataset(out).image_shape == (3, 24, 32)
        assert leftovers(tmp_path) == []


def test_an_old_dataset_that_cannot_be_removed_after_the_swap_is_a_warning(
    photo_folder, built_dataset, tmp_path, monkeypatch
):
    """The new dataset is in place (an NFS .nfsXXXX file of a reader still mapping the old one, an
    immutable file): the build succeeded, and says where the old copy is."""
    out = Path(shutil.copytree(built_dataset, tmp_path / "out.memmap"))
    real = shutil.rmtree

    def refused(path, *args, **kwargs):
        if ".out.memmap." in Path(path).name:
            raise PermissionError(1, "Operation not permitted", str(Path(path) / "labels.memmap"))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(gpuload.writing.build.shutil, "rmtree", refused)
    with pytest.warns(
        UserWarning, match=r"out.memmap holds the new dataset; the old one, moved to .*could not be removed"
    ):
        build_memmap(photo_folder, out, size=(24, 32), overwrite=True, progress=False)
    assert MemmapImageDataset(out).image_shape == (3, 24, 32)


def test_a_source_another_run_is_still_writing_is_refused(photo_folder, tmp_path):
    """compress SRC DST & build-memmap DST: the build would take the photos written so far."""
    from gpuload.writing.files import OutputLock

    with (
        OutputLock(photo_folder),
        pytest.raises(BusyError, match=f"another gpuload run is still writing {photo_folder}"),
    ):
        build_memmap(photo_folder, tmp_path / "early.memmap", progress=False)
    assert not (tmp_path / "early.memmap").exists()
    build_memmap(photo_folder, tmp_path / "later.memmap", progress=False)  # once it is done


class TestOutInsideADataset:
    @pytest.mark.parametrize("name", ["labels.memmap", "sub/new.memmap"])
    def test_is_refused_before_its_lock_file_lands_in_the_dataset(self, photo_folder, built_dataset, tmp_path, name):
        """A lock file left in a dataset would make its --overwrite refuse it as holding foreign files."""
        dataset = Path(shutil.copytree(built_dataset, tmp_path / "d.memmap"))
        before = sorted(path.relative_to(dataset).as_posix() for path in dataset.rglob("*"))
        with pytest.raises(UsageError, match=f"lies inside the gpuload dataset {dataset}; choose an out outside"):
            build_memmap(photo_folder, dataset / name, progress=False)
        assert sorted(path.relative_to(dataset).as_posix() for path in dataset.rglob("*")) == before
        build_memmap(photo_folder, dataset, size=(24, 32), overwrite=True, progress=False)  # still replaceable


class TestLock:
    def test_a_second_build_of_the_same_out_fails_at_once(self, photo_folder, tmp_path):
        out = tmp_path / "out.memmap"
        holder = subprocess.Popen(
            [sys.executable, "-c", LOCK_HOLDER, str(tmp_path / ".out.memmap.lock")], stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout.readline() == "locked\n"
            with pytest.raises(BusyError, match=f"another gpuload run is writing {out}"):
                build_memmap(photo_folder, out, progress=False)
        finally:
            holder.kill()
            holder.wait()
        assert not out.exists()
        build_memmap(photo_folder, out, progress=False)  # the kernel released the dead holder's lock

    def test_a_temporary_folder_is_stale_by_the_lock_not_by_a_pid(self, photo_folder, tmp_path):
        stale = tmp_path / ".out.memmap.tmp-1"  # PID 1 is alive: a PID test would keep it forever
        stale.mkdir()
        (stale / "images.memmap").write_bytes(b"\0")
        build_memmap(photo_folder, tmp_path / "out.memmap", progress=False)
        assert not stale.exists()

    def test_a_folder_named_like_a_build_but_holding_other_files_is_left_alone(self, photo_folder, tmp_path):
        foreign = tmp_path / ".out.memmap.tmp-0badf00d"
        foreign.mkdir()
        (foreign / "thesis.tex").write_text("unchanged")
        with pytest.warns(UserWarning, match="left .*tmp-0badf00d alone"):
            build_memmap(photo_folder, tmp_path / "out.memmap", progress=False)
        assert (foreign / "thesis.tex").read_text() == "unchanged"

    def test_the_temporary_folder_of_another_output_with_a_longer_name_is_not_touched(self, photo_folder, tmp_path):
        """.photos.memmap.old-v1.tmp-ab12cd34 is the build folder of photos.memmap.old-v1, under its own lock."""
        running = tmp_path / ".out.memmap.old-v1.tmp-ab12cd34"
        (running / "images.memmap").parent.mkdir()
        (running / "images.memmap").write_bytes(b"\0")
        build_memmap(photo_folder, tmp_path / "out.memmap", progress=False)
        assert (running / "images.memmap").exists()


LOCK_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
"""


class TestCrashSafety:
    @pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
    def test_interrupted_build_leaves_nothing(self, photo_folder, tmp_path, monkeypatch, error):
        calls = []
        real = gpuload.writing.build._decode_raw

        def failing(*args):
            calls.append(1)
            if len(calls) == 7:
                raise error("stop")
            return real(*args)

        monkeypatch.setattr(gpuload.writing.build, "_decode_raw", failing)
        with pytest.raises(error):
            build_memmap(photo_folder, tmp_path / "out.memmap", progress=False)
        assert not (tmp_path / "out.memmap").exists()
        assert leftovers(tmp_path) == []

    def test_everything_is_flushed_to_disk_before_the_rename(self, photo_folder, tmp_path, monkeypatch):
        events = record_fsyncs_and_renames(monkeypatch)
        out = build_memmap(photo_folder, tmp_path / "out.memmap", progress=False)
        rename = events.index("rename")
        synced_before = {Path(path).name for path in events[:rename] if path != "rename"}
        assert {"images.memmap", "labels.memmap", "meta.json", "manifest.json"} <= synced_before
        assert any(".out.memmap.tmp-" in Path(path).name for path in events[:rename])  # the folder itself
        assert str(out.parent) in events[rename:]  # then the parent, for the new name

    def test_without_sync_nothing_waits_for_the_disk(self, photo_folder, tmp_path, monkeypatch):
        events = record_fsyncs_and_renames(monkeypatch)
        build_memmap(photo_folder, tmp_path / "out.memmap", sync=False, progress=False)
        assert events == ["rename"]

    def test_an_interrupted_swap_puts_the_old_dataset_back(self, photo_folder, built_dataset, tmp_path, monkeypatch):
        """Where the filesystem cannot swap, two renames are needed; an error between them restores the old."""
        out = Path(shutil.copytree(built_dataset, tmp_path / "out.memmap"))
        monkeypatch.setattr(gpuload.writing.build, "rename_exchange", lambda a, b: False)

        def interrupted(source, target):
            raise KeyboardInterrupt

        monkeypatch.setattr(gpuload.writing.build, "rename_noreplace", interrupted)
        with pytest.raises(KeyboardInterrupt):
            build_memmap(photo_folder, out, size=(24, 32), overwrite=True, progress=False)
        assert MemmapImageDataset(out).image_shape == (3, *SIZE)
        assert leftovers(tmp_path) == []

    @pytest.mark.parametrize("moment", ["writing", "after_swap", "between_renames"])
    def test_after_kill_9_out_holds_a_whole_dataset_and_the_next_build_tidies_up(
        self, photo_folder, built_dataset, tmp_path, moment
    ):
        out = Path(shutil.copytree(built_dataset, tmp_path / "out.memmap"))
        code = KILLED_BUILD.format(src=str(photo_folder), out=str(out), moment=moment)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert result.returncode == -9, result.stderr[-2000:]
        assert leftovers(tmp_path)  # the kill left something behind
        if moment != "between_renames":  # an atomic swap: a whole dataset at out at every moment
            expected = (3, 24, 32) if moment == "after_swap" else (3, *SIZE)
            assert MemmapImageDataset(out).image_shape == expected and verify_memmap(out, progress=False) == []
        build_memmap(photo_folder, tmp_path / "other.memmap", progress=False)  # another out: not tidied
        assert leftovers(tmp_path)
        with (  # the next build of out tidies up, even when it then refuses
            pytest.warns(UserWarning, match="restored .*out.memmap from .out.memmap.old-")
            if moment == "between_renames"
            else warnings.catch_warnings(action="error"),
            pytest.raises(FileExistsError),
        ):
            build_memmap(photo_folder, out, progress=False)
        assert leftovers(tmp_path) == []
        assert verify_memmap(out, progress=False) == []


KILLED_BUILD = """
import os, signal
import gpuload.writing.build as build

def kill(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

moment = {moment!r}
if moment == "writing":
    calls = []
    real = build._decode_raw
    def decode(*args):
        calls.append(1)
        if len(calls) == 5:
            kill()
        return real(*args)
    build._decode_raw = decode
elif moment == "after_swap":
    build.shutil.rmtree = kill
else:
    build.rename_exchange = lambda a, b: False
    build.rename_noreplace = kill
build.build_memmap({src!r}, {out!r}, size=(24, 32), overwrite=True, progress=False)
"""


def record_fsyncs_and_renames(monkeypatch) -> list[str]:
    """Record, in order, the path of every fsync and a "rename" for every rename of the build."""
    events: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        events.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    for name in ("rename_exchange", "rename_noreplace"):
        real = getattr(gpuload.writing.build, name)
        monkeypatch.setattr(gpuload.writing.build, name, lambda a, b, real=real: events.append("rename") or real(a, b))
    return events


def test_memory_does_not_grow_with_the_dataset(tmp_path):
    """Measured in a process of its own, so that nothing else allocates in the traced window (no other
    test's threads, finalisers or garbage), after an untraced build that makes the one-time imports.
    The lower peak of two builds counts: the interpreter's own tables grow now and then, whatever
    code runs (the interned strings' table by 7.7 MB at once, here), and then have room for far more
    than one build adds, so that growth can fall into one window, never into two in a row."""
    src = make_sample_folder(tmp_path / "many", images_per_class=20, size=(192, 256))
    dataset_bytes = 100 * 3 * 192 * 256  # a quarter of it is far above the build's fixed objects (~0.9 MB)
    result = subprocess.run(
        [sys.executable, "-c", TRACED_BUILDS, str(src), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    peaks = [int(peak) for peak in result.stdout.split()]
    assert len(peaks) == 2 and min(peaks) < dataset_bytes / 4, peaks  # a few images in flight, never the dataset


TRACED_BUILDS = """
import gc, sys, tracemalloc
from gpuload import build_memmap

src, out = sys.argv[1:]
build_memmap(src, out + "-warm", workers=2, progress=False)
for attempt in range(2):
    gc.collect()
    tracemalloc.start()
    build_memmap(src, f"{out}-{attempt}", workers=2, progress=False)
    print(tracemalloc.get_traced_memory()[1])
    tracemalloc.stop()
"""


@pytest.mark.parametrize("format", ["raw", "jpeg"])
def test_each_source_costs_one_status_lookup(photo_folder, tmp_path, monkeypatch, format):
    """At ImageNet's count, a stat per file in the scan, the sources' bytes summed twice and a stat at
    each open made 44 s of metadata calls before the first image: now the open's own, and a sample."""
    looked_up: list[str] = []
    real = os.stat

    def stat(path, *args, **kwargs):
        if str(path).startswith(str(photo_folder) + os.sep) and str(path).endswith(".jpg"):
            looked_up.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    size = {"size": SIZE} if format == "raw" else {}
    build_memmap(photo_folder, tmp_path / "out", format=format, progress=False, **size)
    counts = collections.Counter(looked_up)
    assert len(counts) == 20 and max(counts.values()) <= (2 if format == "jpeg" else 1), (
        counts
    )  # jpeg: a sample's size too
    assert sum(counts.values()) <= 20 + (20 if format == "jpeg" else 0)


def test_a_source_that_is_a_symlink_loop_or_a_fifo_is_refused_in_one_line(tmp_path):
    """A loop gave RuntimeError's traceback from pathlib; a FIFO named like a shard blocked the build."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(UsageError, match=r"a is a symlink loop \(it leads back to itself\); point it at"):
        build_memmap(tmp_path / "a", tmp_path / "out", progress=False)
    os.mkfifo(tmp_path / "shard.tar")
    with pytest.raises(UsageError, match=r"shard.tar is not a regular file \(a FIFO, a device, a socket\?\)"):
        build_memmap(tmp_path / "shard.tar", tmp_path / "out", progress=False)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a", "b", "shard.tar"]


def test_file_and_folder_names_that_are_not_utf8(photo_folder, tmp_path):
    """Names written by another system's encoding (latin-1's é as one byte): Python gives them
    surrogate-escaped, and the table's encode refused them (a UnicodeEncodeError traceback)."""
    folder = os.path.join(os.fsencode(tmp_path), b"src", b"caf\xe9")
    os.makedirs(folder)
    for number, photo_path in enumerate(sorted(photo_folder.rglob("*.jpg"))[:2]):
        shutil.copy(photo_path, os.path.join(folder, b"x\xe9%d.jpg" % number))
    ds = MemmapImageDataset(build_memmap(tmp_path / "src", tmp_path / "out", progress=False))
    assert ds.classes == ["caf\udce9"] and ds.table.path(1) == "caf\udce9/x\udce91.jpg"
    assert Path(ds.samples[1][0]).is_file() and verify_memmap(ds.path, progress=False) == []


class TestWritingAsTheScanGoes:
    """A source of samples built in its own order (raw at a given size, jpeg in the source's order) has
    each image's job started as the scan stages it, not after the whole scan."""

    @pytest.mark.parametrize(
        "options, streams",
        [
            ({"size": SIZE}, True),
            ({"format": "jpeg", "order": "source"}, True),
            ({}, False),
            ({"format": "jpeg"}, False),
        ],
    )
    def test_the_first_job_starts_after_the_first_sample(self, photo_folder, tmp_path, monkeypatch, options, streams):
        """Scanned first, 1.28M samples in tar shards kept the decoders idle for minutes (and the
        build's folder held a copy of every image)."""
        shard = shard_of(photo_folder, tmp_path / "train.tar")
        scanned, at_first_job = [], []
        add, raw, jpeg = SampleScan.add, gpuload.writing.build._RawStore.submit, gpuload.writing.build._JpegStore.submit
        monkeypatch.setattr(SampleScan, "add", lambda self, sample: scanned.append(1) or add(self, sample))
        for store, submit in ((gpuload.writing.build._RawStore, raw), (gpuload.writing.build._JpegStore, jpeg)):
            monkeypatch.setattr(
                store,
                "submit",
                lambda self, *args, submit=submit: at_first_job.append(len(scanned)) or submit(self, *args),
            )
        ds = MemmapImageDataset(build_memmap(shard, tmp_path / "out", progress=False, **options))
        assert len(ds) == len(scanned) > 1 and verify_memmap(ds.path, progress=False) == []
        assert at_first_job[0] == (1 if streams else len(scanned))

    @pytest.mark.parametrize("bad", ["truncated.jpg", "notes.jpg"])
    def test_the_same_dataset_as_a_build_that_scans_first(self, photo_folder, tmp_path, bad):
        """Raw at the given size (written as the scan goes) and at the images' common size (scanned
        first: the same size here): the same images, labels, checksums, names and skipped images."""
        shard = shard_of(photo_folder, tmp_path / "src" / "train.tar", bad=bad)
        streamed = MemmapImageDataset(build_memmap(shard, tmp_path / "a", size=SIZE, progress=False))
        scanned = MemmapImageDataset(build_memmap(shard, tmp_path / "b", progress=False))
        for name in ("images.memmap", "labels.memmap", "checksums.memmap", "paths.memmap", "path_offsets.memmap"):
            assert (streamed.path / name).read_bytes() == (scanned.path / name).read_bytes(), name
        assert streamed.manifest.skipped == scanned.manifest.skipped
        assert [entry["path"] for entry in streamed.manifest.skipped] == ["train.tar/000003.jpg"]

    @pytest.mark.parametrize("options", [{"size": SIZE}, {"format": "jpeg", "order": "source"}])
    @pytest.mark.parametrize("failure", ["strict", "cut"])
    def test_a_build_that_fails_as_the_scan_goes_leaves_no_file_open(self, photo_folder, tmp_path, options, failure):
        """A failure after the first job (a bad image with strict, a shard cut after its first samples) left
        the shard and the removed dataset's data file open (descriptors no object closes), its space
        reserved, until the process ended."""
        bad = "truncated.jpg" if failure == "strict" else None
        (tmp_path / "src").mkdir()
        shard = shard_of(photo_folder, tmp_path / "src" / "train.tar", bad=bad)
        if failure == "cut":
            shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2 + 100])
        with pytest.raises(DecodeError if failure == "strict" else SourceError):
            build_memmap(shard, tmp_path / "out", strict=True, progress=False, **options)
        gc.collect()  # the files of the objects the failure's traceback held
        held = []
        for fd in Path("/proc/self/fd").iterdir():
            try:
                held += [target] if str(tmp_path) in (target := os.readlink(fd)) else []
            except OSError:  # the listing's own descriptor, closed
                pass
        assert held == [] and not (tmp_path / "out").exists()
