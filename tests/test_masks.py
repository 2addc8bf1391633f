"""Segmentation masks end to end: read (gpuload.format.masks), built (gpuload.writing.masks), cropped in the
loader's threads (gpuload.loading.masks) and on the device (gpuload.transforms.masks, RandomResizedCrop,
Recipe), opened, verified, pushed and streamed.

Geometry is checked on images whose pixels encode their own coordinates (red = x, green = y) with two
masks that encode them too (``mx`` = x, ``my`` = y): after any crop and flip, each output pixel of an
image and of its masks must come from the same place. On real photos (skimage's), a semantic mask must
equal, at every output pixel, the full mask at the place the coordinate masks name.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import skimage.data
import torch
from PIL import Image
from tensordict import TensorDict

import gpuload
from gpuload import (
    CenterCropDecode,
    DataLoader,
    DatasetError,
    DecodeError,
    MemmapImageDataset,
    RandomResizedCrop,
    RandomResizedCropDecode,
    Recipe,
    UsageError,
    build_memmap,
    verify_memmap,
)
from gpuload.format.masks import decode_mask
from gpuload.remote.dataset import verify_remote
from gpuload.remote.push import push_memmap
from gpuload.remote.store import Store
from gpuload.transforms.masks import crop_masks

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
SIZES = [(192, 256), (208, 240), (224, 224), (240, 208), (256, 192), (200, 200)]  # (height, width), all <= 256
CROPS = [
    RandomResizedCropDecode(16, scale=(0.05, 1.0)),
    RandomResizedCropDecode(64, scale=(0.05, 1.0)),
    CenterCropDecode(16),
    CenterCropDecode((60, 80), ratio=1.0),  # wider than some images: padded, 255 in the masks
]


def png(ids: np.ndarray, mode: str | None = None) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(ids, mode).save(buffer, "PNG")
    return buffer.getvalue()


NOISE = png(np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8))


def coordinates(height: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An RGB image whose red is x and green y, and its masks ``mx`` (x) and ``my`` (y)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.uint8)
    return np.stack([x, y, np.full_like(x, 128)], axis=-1), x, y


def write_table(folder: Path, rows: list[list[str]]) -> None:
    with open(folder / "metadata.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["file_name", "label", "mx", "my"])
        writer.writerows(rows)


@pytest.fixture(scope="session")
def coordinate_folder(tmp_path_factory) -> Path:
    """6 PNG images of :data:`SIZES` encoding their coordinates, their masks ``mx`` and ``my`` as PNG files,
    and a ``metadata.csv`` naming them. Do not modify it."""
    folder = tmp_path_factory.mktemp("coordinates") / "src"
    (folder / "masks").mkdir(parents=True)
    rows = []
    for position, (height, width) in enumerate(SIZES):
        image, x, y = coordinates(height, width)
        Image.fromarray(image).save(folder / f"{position}.png")
        (folder / "masks" / f"{position}.x.png").write_bytes(png(x))
        (folder / "masks" / f"{position}.y.png").write_bytes(png(y))
        rows.append([f"{position}.png", "ab"[position % 2], f"masks/{position}.x.png", f"masks/{position}.y.png"])
    write_table(folder, rows)
    return folder


@pytest.fixture(scope="session")
def coordinate_datasets(coordinate_folder, tmp_path_factory) -> dict[str, Path]:
    """``coordinate_folder`` built raw (96x96, crop and pad) and jpeg. Do not modify them."""
    out = tmp_path_factory.mktemp("built")
    roles = {"mx": "mask", "my": "mask"}
    return {
        "crop": build_memmap(coordinate_folder, out / "crop", size=(96, 96), columns=roles, progress=False),
        "pad": build_memmap(coordinate_folder, out / "pad", size=(96, 96), resize="pad", columns=roles, progress=False),
        "jpeg": build_memmap(coordinate_folder, out / "jpeg", format="jpeg", columns=roles, progress=False),
    }


@pytest.fixture(scope="session")
def photo_dataset(tmp_path_factory) -> Path:
    """skimage's photos (160x224 crops), each with a semantic mask (its luminance in 5 classes) and the
    coordinate masks, in a table, built jpeg. Do not modify it."""
    folder = tmp_path_factory.mktemp("photos") / "src"
    folder.mkdir()
    rows = []
    for name in ("astronaut", "coffee", "chelsea", "rocket"):
        photo = getattr(skimage.data, name)()[:160, :224]
        _, x, y = coordinates(*photo.shape[:2])
        Image.fromarray(photo).save(folder / f"{name}.jpg", quality=95)
        (folder / f"{name}.seg.png").write_bytes(png((photo.mean(axis=2) // 52).astype(np.uint8)))
        (folder / f"{name}.x.png").write_bytes(png(x))
        (folder / f"{name}.y.png").write_bytes(png(y))
        rows.append([f"{name}.jpg", name, f"{name}.seg.png", f"{name}.x.png", f"{name}.y.png"])
    with open(folder / "metadata.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["file_name", "label", "seg", "mx", "my"])
        writer.writerows(rows)
    roles = {"seg": "mask", "mx": "mask", "my": "mask"}
    return build_memmap(folder, folder.parent / "photos.jpeg", format="jpeg", columns=roles, progress=False)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def check_coordinates(images: torch.Tensor, mx: torch.Tensor, my: torch.Tensor, tolerance: float) -> None:
    """Each output pixel of an image and of its masks comes from the same place (masks: 255 where padded)."""
    images, mx, my = images.cpu().float(), mx.cpu(), my.cpu()
    assert mx.dtype == my.dtype == torch.uint8 and mx.shape == my.shape == images[:, 0].shape
    inside = (mx != 255) & (my != 255)
    assert inside.any()
    assert (images[:, 0] - mx.float()).abs()[inside].max() <= tolerance
    assert (images[:, 1] - my.float()).abs()[inside].max() <= tolerance


class TestDecodeMask:
    def test_class_ids_of_grey_palette_and_bilevel_pngs(self):
        ids = np.array([[0, 1, 2], [3, 254, 255]], np.uint8)
        assert decode_mask(png(ids), "m").tolist() == ids.tolist()
        palette = Image.fromarray(ids, "L").convert("P")  # indices into a palette: the ids, never its colours
        palette.putpalette([value for index in range(256) for value in (index, 255 - index, 7)])
        buffer = io.BytesIO()
        palette.save(buffer, "PNG")
        assert decode_mask(buffer.getvalue(), "m").tolist() == np.asarray(palette).tolist()
        bilevel = io.BytesIO()
        Image.fromarray(np.array([[True, False]])).save(bilevel, "PNG")
        assert decode_mask(bilevel.getvalue(), "m").tolist() == [[1, 0]]

    def test_a_16_bit_mask_of_small_ids_is_taken(self):
        assert decode_mask(png(np.array([[3, 255]], np.uint16)), "m").tolist() == [[3, 255]]

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            (png(np.array([[3, 300]], np.uint16)), "16-bit and holds the class id 300; gpuload keeps ids 0 to 255"),
            (png(np.zeros((2, 2, 3), np.uint8)), r"in mode RGB \(colours, not class ids\): convert it"),
            (NOISE[: len(NOISE) // 2], "truncated or corrupt"),
            (b"", r"empty \(0 bytes\)"),
            (b"not an image", "not an image; save it as an 8-bit PNG"),
        ],
        ids=["16-bit", "rgb", "truncated", "empty", "text"],
    )
    def test_what_is_not_a_mask_is_refused_in_one_line(self, data, message):
        with pytest.raises(DecodeError, match=f"^m: {message}") as raised:
            decode_mask(data, "m")
        assert "\n" not in str(raised.value)

    def test_a_lossy_mask_is_refused(self):
        buffer = io.BytesIO()
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(buffer, "JPEG")
        with pytest.raises(DecodeError, match="a JPEG, not a PNG; save it as an 8-bit PNG"):
            decode_mask(buffer.getvalue(), "m")


class TestBuild:
    def test_a_raw_build_fits_each_mask_as_its_image(self, coordinate_datasets):
        for resize in ("crop", "pad"):
            ds = MemmapImageDataset(coordinate_datasets[resize])
            assert [spec.to_json() for spec in ds.manifest.field_specs] == [
                {"name": name, "kind": "mask", "dtype": "uint8", "shape": [96, 96]} for name in ("mx", "my")
            ]
            for position in range(len(ds)):
                sample = ds[position]
                image, mx, my = sample["image"], sample["mx"], sample["my"]
                check_coordinates(image[None], mx[None], my[None], tolerance=1)
                padded = (mx == 255) | (my == 255)
                square = SIZES[position][0] == SIZES[position][1]
                assert bool(padded.any()) == (resize == "pad" and not square)
                assert (image[:, padded] == 0).all()  # black where the image is padded, 255 in its masks

    def test_plain_tensordict_opens_a_raw_mask(self, coordinate_datasets):
        ds = MemmapImageDataset(coordinate_datasets["crop"])
        opened = TensorDict.load_memmap(coordinate_datasets["crop"])
        assert opened["fields", "mx"].shape == (len(ds), 96, 96) and opened["fields", "mx"].dtype == torch.uint8
        assert torch.equal(opened["fields", "my"][2], ds[2]["my"])

    def test_a_jpeg_build_keeps_each_mask_as_it_came(self, coordinate_datasets, coordinate_folder):
        ds = MemmapImageDataset(coordinate_datasets["jpeg"])
        assert ds.fields["mx"].spec.shape == () and ds.manifest.fields[0]["shape"] == []
        for position in range(len(ds)):
            number = Path(ds.table.path(position)).stem
            source = (coordinate_folder / "masks" / f"{number}.x.png").read_bytes()
            assert bytes(ds.fields["mx"]._bytes(position)) == source
            assert tuple(ds[position]["mx"].shape) == tuple(ds[position]["image"].shape[1:])

    def test_max_side_is_refused_with_masks(self, coordinate_folder, tmp_path):
        with pytest.raises(UsageError, match="max_side scales images down, and .* has masks \\(mx, my\\)"):
            build_memmap(
                coordinate_folder, tmp_path / "out", format="jpeg", max_side=50,
                columns={"mx": "mask", "my": "mask"}, progress=False,
            )  # fmt: skip
        assert not (tmp_path / "out").exists()

    def test_a_raw_build_counts_its_masks_in_the_disk_space_it_needs(self, tmp_path, monkeypatch):
        """6 images of 96x96x3 bytes need 166,176 bytes with their index; their two masks 110,592 more (a
        build at the images' common size: it scans them all before it writes)."""
        folder = tmp_path / "src"
        (folder / "masks").mkdir(parents=True)
        rows = []
        for position in range(6):
            image, x, y = coordinates(96, 96)
            Image.fromarray(image).save(folder / f"{position}.png")
            (folder / "masks" / f"{position}.x.png").write_bytes(png(x))
            (folder / "masks" / f"{position}.y.png").write_bytes(png(y))
            rows.append([f"{position}.png", "ab"[position % 2], f"masks/{position}.x.png", f"masks/{position}.y.png"])
        write_table(folder, rows)
        usage = type("Usage", (), {"total": 10**6, "used": 0, "free": 200_000})
        monkeypatch.setattr(gpuload.writing.build.shutil, "disk_usage", lambda path: usage)
        with pytest.raises(OSError, match=r"the dataset needs 276,768 bytes .*\(6 images of 96x96x3 bytes, each with 2 "
                           r"masks of 96x96 bytes\) but .* has 200,000 bytes"):  # fmt: skip
            build_memmap(folder, tmp_path / "out", columns={"mx": "mask", "my": "mask"}, progress=False)
        assert not (tmp_path / "out").exists()

    def test_a_build_that_writes_as_it_scans_finds_a_full_disk_as_it_writes(
        self, coordinate_folder, tmp_path, monkeypatch
    ):
        """A raw build at a given size writes each image as the scan stages it: how many come is not known
        before, so the disk is reserved a step ahead, and a disk without room says so, and leaves nothing."""
        import errno

        def full(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(gpuload.writing.writer.os, "posix_fallocate", full)
        with pytest.raises(OSError, match=r"not enough disk space to write .*out/images.memmap: it needs 27,648 bytes"):
            build_memmap(
                coordinate_folder, tmp_path / "out", size=(96, 96), columns={"mx": "mask", "my": "mask"}, progress=False
            )
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize("format", ["raw", "jpeg"])
    @pytest.mark.parametrize(
        ("case", "reason"),
        [
            ("size", r"its mask 'mx' is 50x40 where the image is 256x192 \(width x height\); give each image a mask"),
            ("missing", r"its mask masks/0.x.png \('mx'\) cannot be read \(No such file or directory\)"),
            ("rgb", r"its mask 'mx' is in mode RGB \(colours, not class ids\): convert it to one class id per pixel"),
            ("large", "its mask 'mx' is 16-bit and holds the class id 300; gpuload keeps ids 0 to 255"),
            ("truncated", "its mask 'mx' is truncated or corrupt"),
        ],
    )
    def test_a_bad_mask_skips_its_image_or_stops_a_strict_build(
        self, coordinate_folder, tmp_path, format, case, reason
    ):
        folder = Path(shutil.copytree(coordinate_folder, tmp_path / "src"))
        mask = folder / "masks" / "0.x.png"
        if case == "size":
            mask.write_bytes(png(np.zeros((40, 50), np.uint8)))
        elif case == "missing":
            mask.unlink()
        elif case == "rgb":
            mask.write_bytes(png(np.zeros((96, 128, 3), np.uint8)))
        elif case == "large":
            mask.write_bytes(png(np.full((96, 128), 300, np.uint16)))
        else:
            mask.write_bytes(mask.read_bytes()[:-40])
        before = snapshot(folder)
        options = {"format": format, "columns": {"mx": "mask", "my": "mask"}, "progress": False}
        options.update({"size": (96, 96)} if format == "raw" else {})
        with pytest.raises(DecodeError, match=f"0.png: {reason}") as raised:
            build_memmap(folder, tmp_path / "strict", strict=True, **options)
        assert "\n" not in str(raised.value) and not (tmp_path / "strict").exists()
        ds = MemmapImageDataset(build_memmap(folder, tmp_path / "out", **options))
        assert len(ds) == len(SIZES) - 1
        assert [entry["path"] for entry in ds.skipped] == ["0.png"]
        assert re.search(reason, ds.skipped[0]["reason"])
        assert verify_memmap(ds.path, progress=False) == []
        assert snapshot(folder) == before

    def test_a_png_beside_a_tar_samples_jpg_is_its_mask(self, tmp_path):
        import webdataset as wds  # only here: the GPU image has no webdataset (gpu_check runs this file)

        photo = skimage.data.coffee()[:96, :128]
        seg = (photo.mean(axis=2) // 52).astype(np.uint8)
        jpeg = io.BytesIO()
        Image.fromarray(photo).save(jpeg, "JPEG")
        with wds.TarWriter(str(tmp_path / "train-000000.tar")) as sink:
            for key in range(3):
                sink.write({"__key__": f"{key:06d}", "jpg": jpeg.getvalue(), "png": png(seg), "cls": "0"})
        ds = MemmapImageDataset(build_memmap(tmp_path / "train-000000.tar", tmp_path / "out", progress=False))
        assert sorted(ds[0]) == ["image", "label", "mask"] and np.array_equal(ds[2]["mask"].numpy(), seg)
        left_out = build_memmap(
            tmp_path / "train-000000.tar", tmp_path / "plain", columns={"mask": "ignore"}, progress=False
        )
        assert MemmapImageDataset(left_out).fields == {}

    def test_a_parquet_mask_column(self, tmp_path):
        import pyarrow as pa  # only here: the GPU image has no pyarrow (gpu_check runs this file)
        import pyarrow.parquet as pq

        photo = skimage.data.chelsea()[:96, :128]
        seg = (photo.mean(axis=2) // 52).astype(np.uint8)
        jpeg = io.BytesIO()
        Image.fromarray(photo).save(jpeg, "JPEG")
        table = pa.table(
            {
                "image": [{"bytes": jpeg.getvalue(), "path": "cat.jpg"}] * 2,
                "label": ["cat", "cat"],
                "mask": [{"bytes": png(seg), "path": "cat.png"}, {"bytes": png(seg[::-1].copy()), "path": "b.png"}],
            }
        )
        pq.write_table(table, tmp_path / "train.parquet")
        ds = MemmapImageDataset(build_memmap(tmp_path / "train.parquet", tmp_path / "out", progress=False))
        assert np.array_equal(ds[1]["mask"].numpy(), seg[::-1]) and ds.fields["mask"].spec.shape == (96, 128)

    @pytest.mark.parametrize(
        ("cell", "reason"),
        [
            (b"", r"its mask \('mask'\) is empty \(0 bytes\)"),
            ({"bytes": b"", "path": "b.png"}, r"its mask b.png \('mask'\) is empty \(0 bytes\)"),
            ({"bytes": None, "path": "b.png"}, r"its mask b.png \('mask'\) holds no bytes, only a path"),
        ],
        ids=["empty", "empty struct", "path only"],
    )
    def test_a_parquet_mask_without_bytes_skips_its_image(self, tmp_path, cell, reason):
        """An empty mask (or one given by its path alone) is a mask that cannot be read, as a table's empty
        file: its image is skipped and listed (``strict`` stops there), not the whole build refused as "a
        column of mixed types" with advice to ignore the column."""
        import pyarrow as pa  # only here: the GPU image has no pyarrow (gpu_check runs this file)
        import pyarrow.parquet as pq

        photo = skimage.data.chelsea()[:96, :128]
        seg = (photo.mean(axis=2) // 52).astype(np.uint8)
        jpeg = io.BytesIO()
        Image.fromarray(photo).save(jpeg, "JPEG")
        whole = png(seg) if isinstance(cell, bytes) else {"bytes": png(seg), "path": "a.png"}
        table = pa.table(
            {"image": [{"bytes": jpeg.getvalue(), "path": f"{key}.jpg"} for key in "ab"], "label": ["cat", "cat"],
             "mask": [whole, cell]}
        )  # fmt: skip
        pq.write_table(table, tmp_path / "train.parquet")
        built = build_memmap(tmp_path / "train.parquet", tmp_path / "out", progress=False)
        skipped = json.loads((built / "manifest.json").read_text())["skipped"]
        assert len(MemmapImageDataset(built)) == 1 and len(skipped) == 1 and re.search(reason, skipped[0]["reason"])
        with pytest.raises(DecodeError, match=reason):
            build_memmap(tmp_path / "train.parquet", tmp_path / "strict", strict=True, progress=False)
        assert not (tmp_path / "strict").exists()


class TestOpen:
    def test_a_mask_shape_other_than_the_images_is_refused_at_open(self, coordinate_datasets, tmp_path):
        copy = Path(shutil.copytree(coordinate_datasets["crop"], tmp_path / "copy"))
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest["fields"][0]["shape"] = [48, 192]
        (copy / "manifest.json").chmod(0o644)
        (copy / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(DatasetError, match=r"the mask 'mx' has shape \[48, 192\] in a raw dataset"):
            MemmapImageDataset(copy)

    @pytest.mark.parametrize("kind", ["crop", "jpeg"])
    def test_verify_finds_a_flipped_byte_in_a_mask(self, coordinate_datasets, tmp_path, kind):
        copy = Path(shutil.copytree(coordinate_datasets[kind], tmp_path / "copy"))
        assert verify_memmap(copy, progress=False) == []
        mask = copy / "fields" / "my.memmap"
        mask.chmod(0o644)
        data = bytearray(mask.read_bytes())
        data[len(data) // 2] ^= 0x01
        mask.write_bytes(bytes(data))
        problems = verify_memmap(copy, progress=False)
        assert problems and "fields/my.memmap" in " ".join(map(str, problems))

    @pytest.mark.parametrize("damage", ["flip", "shape"])
    def test_verify_finds_a_damaged_tensordict_meta_of_the_fields(self, coordinate_datasets, tmp_path, damage):
        """``fields/meta.json`` is how plain tensordict opens a raw dataset's masks (the README's
        ``TensorDict.load_memmap``): gpuload never reads it, so verify called it OK when it no longer parsed
        or gave another shape."""
        copy = Path(shutil.copytree(coordinate_datasets["crop"], tmp_path / "copy"))
        meta = copy / "fields" / "meta.json"
        meta.chmod(0o644)
        if damage == "flip":
            data = bytearray(meta.read_bytes())
            data[10] ^= 0xFF
            meta.write_bytes(bytes(data))
        else:
            meta.write_text(meta.read_text().replace("96, 96]", "96, 95]", 1))
        problems = verify_memmap(copy, progress=False)
        assert len(problems) == 1 and "fields/meta.json" in problems[0] and "rebuild the dataset" in problems[0]

    @pytest.mark.parametrize("kind", ["crop", "jpeg"])
    def test_pushed_and_streamed_at_a_file_url(self, coordinate_datasets, tmp_path, kind):
        url = (tmp_path / "bucket" / kind).as_uri()
        push_memmap(coordinate_datasets[kind], url, progress=False)
        local, remote = MemmapImageDataset(coordinate_datasets[kind]), MemmapImageDataset(url)
        try:
            for position in range(len(local)):
                assert torch.equal(local[position]["mx"], remote[position]["mx"])
            decode = CenterCropDecode(32)
            here = next(iter(DataLoader(local, batch_size=6, decode=decode)))
            there = next(iter(DataLoader(remote, batch_size=6, decode=decode)))
            assert torch.equal(here["my"], there["my"]) and torch.equal(here["image"], there["image"])
        finally:
            remote.close()

    def test_torch_dataloader_collates_raw_masks(self, coordinate_datasets):
        ds = MemmapImageDataset(coordinate_datasets["crop"])
        batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
        assert batch["mx"].shape == (4, 96, 96) and torch.equal(batch["mx"][3], ds[3]["mx"])


class TestAtUrl:
    """A mask field's data at a URL is read by range, through the block cache, for the samples asked
    for; its offsets (jpeg) are index objects, read whole at open."""

    BLOCK = 256  # the masks' data files span many blocks

    @pytest.fixture
    def reads(self, monkeypatch) -> list[tuple[str, int, int]]:
        """``(object, start, length)`` of each read from the store from here on."""
        found: list[tuple[str, int, int]] = []
        real = Store.read

        def read(store, name, start, length, expect=None, **options):
            found.append((name, start, length))
            return real(store, name, start, length, expect, **options)

        monkeypatch.setattr(Store, "read", read)
        return found

    @pytest.fixture(params=["crop", "jpeg"])
    def pushed(self, request, s3, coordinate_datasets) -> tuple[Path, str]:
        local = coordinate_datasets[request.param]
        push_memmap(local, s3.url(request.param), progress=False)
        return local, s3.url(request.param)

    def open(self, url: str, cache: Path | None) -> MemmapImageDataset:
        if cache is None:
            return MemmapImageDataset(url, block_size=self.BLOCK)
        return MemmapImageDataset(url, cache=cache, cache_size="10MB", block_size=self.BLOCK)

    @staticmethod
    def blocks(local: Path, name: str, positions: list[int], block: int) -> set[int]:
        """The blocks of ``fields/<name>.memmap`` that the masks of ``positions`` lie in."""
        field = local / "fields"
        if (field / f"{name}.offsets.memmap").exists():
            offsets = np.fromfile(field / f"{name}.offsets.memmap", np.int64)
        else:
            offsets = np.arange(7, dtype=np.int64) * 96 * 96
        return {
            index
            for position in positions
            for index in range(int(offsets[position]) // block, (int(offsets[position + 1]) - 1) // block + 1)
        }

    def fetched(self, reads: list[tuple[str, int, int]], name: str) -> list[int]:
        return [
            index
            for found, start, length in reads
            if found == f"fields/{name}.memmap"
            for index in range(start // self.BLOCK, (start + length - 1) // self.BLOCK + 1)
        ]

    @pytest.mark.parametrize("cached", [True, False])
    def test_an_open_fetches_none_of_a_masks_data(self, pushed, tmp_path, reads, cached):
        local, url = pushed
        cache = tmp_path / "cache" if cached else None
        for _ in ("cold", "warm"):
            reads.clear()
            with self.open(url, cache) as remote:
                assert len(remote) == 6
            names = {name for name, _, _ in reads}
            assert not names & {"fields/mx.memmap", "fields/my.memmap"}, names
            if local.name == "jpeg" and not cached:
                assert "fields/mx.offsets.memmap" in names  # an index object

    @pytest.mark.parametrize("cached", [True, False])
    def test_a_sample_and_a_batch_read_only_their_masks_blocks(self, pushed, tmp_path, reads, cached):
        local, url = pushed
        here = MemmapImageDataset(local)
        size = (local / "fields" / "mx.memmap").stat().st_size
        assert size > 4 * self.BLOCK  # several blocks
        decode = CenterCropDecode(32) if local.name == "jpeg" else None
        with self.open(url, tmp_path / "cache" if cached else None) as remote:
            reads.clear()
            sample = remote[3]
            for name in ("mx", "my"):
                assert torch.equal(sample[name], here[3][name])
                assert set(self.fetched(reads, name)) == self.blocks(local, name, [3], self.BLOCK)
            reads.clear()
            (batch,) = DataLoader(remote, batch_size=2, sampler=[4, 1], decode=decode, device="cpu")
            (expected,) = DataLoader(here, batch_size=2, sampler=[4, 1], decode=decode, device="cpu")
            for name in ("mx", "my"):
                assert torch.equal(batch[name], expected[name])
                fetched = self.fetched(reads, name)
                cached_before = self.blocks(local, name, [3], self.BLOCK) if cached else set()
                assert set(fetched) == self.blocks(local, name, [4, 1], self.BLOCK) - cached_before
                assert len(fetched) == len(set(fetched))  # each block once

    def test_a_png_damaged_in_the_cache_is_fetched_again(self, s3, coordinate_datasets, tmp_path, reads):
        url, cache = s3.url("jpeg"), tmp_path / "cache"
        push_memmap(coordinate_datasets["jpeg"], url, progress=False)
        with self.open(url, cache) as remote:
            expected = remote[0]["my"]
        (block,) = [
            path / "0"
            for path in (cache / "objects").iterdir()
            if json.loads((path / "object.json").read_text())["url"].endswith("/fields/my.memmap")
        ]
        block.write_bytes(bytes(block.stat().st_size))  # what a power cut leaves of an unsynced block
        reads.clear()
        with self.open(url, cache) as remote:
            assert torch.equal(remote[0]["my"], expected)
        assert 0 in self.fetched(reads, "my") and block.read_bytes() != bytes(block.stat().st_size)

    def test_a_mask_damaged_at_the_url_is_refused(self, pushed, s3, tmp_path):
        """Masks have no checksum of their own (images do: each read is checked against it): the build's
        digest of the whole file is what gpuload verify checks, and a jpeg dataset's PNG that no longer
        decodes is refused when read, naming the image."""
        local, url = pushed
        data = bytearray((local / "fields" / "my.memmap").read_bytes())
        data[: len(data) // 2] = bytes(len(data) // 2)  # the first masks' bytes zeroed, the size unchanged
        s3.client().put_object(Bucket=s3.bucket, Key=f"{local.name}/fields/my.memmap", Body=bytes(data))
        problems = verify_remote(url, progress=False)
        assert any("fields/my.memmap differs from what was built" in problem for problem in problems), problems
        if local.name != "jpeg":
            return
        for cache in (None, tmp_path / "cache"):
            with self.open(url, cache) as remote:
                assert torch.equal(remote[5]["mx"], MemmapImageDataset(local)[5]["mx"])  # the rest is served
                with pytest.raises(DatasetError, match=r"image 0's my: .*damaged"):
                    remote[0]


class TestLoaderCrop:
    @pytest.mark.parametrize("decode", CROPS, ids=repr)
    @pytest.mark.parametrize(("kind", "tolerance"), [("crop", 3), ("jpeg", 4)])  # resized twice; lossy
    def test_masks_are_cropped_with_their_images(self, coordinate_datasets, decode, kind, tolerance):
        ds = MemmapImageDataset(coordinate_datasets[kind])
        loader = DataLoader(ds, batch_size=4, shuffle=True, decode=decode)
        flipped = 0
        for epoch in range(3):
            loader.set_epoch(epoch)
            for batch in loader:
                check_coordinates(batch["image"], batch["mx"], batch["my"], tolerance)
                mx = batch["mx"].long()
                flipped += int((mx[:, :, 0] > mx[:, :, -1]).any(dim=1).sum())
        assert (flipped > 0) == isinstance(decode, RandomResizedCropDecode)

    @pytest.mark.cuda
    @pytest.mark.parametrize("kind", ["crop", "jpeg"])
    def test_masks_go_through_the_pinned_ring_to_the_gpu(self, coordinate_datasets, kind):
        ds, decode = MemmapImageDataset(coordinate_datasets[kind]), RandomResizedCropDecode(32)
        on_cpu = list(DataLoader(ds, batch_size=4, shuffle=True, decode=decode, seed=3, device="cpu"))
        on_gpu = list(DataLoader(ds, batch_size=4, shuffle=True, decode=decode, seed=3, device="cuda"))
        for here, there in zip(on_cpu, on_gpu, strict=True):
            assert there["mx"].is_cuda and torch.equal(here["mx"], there["mx"].cpu())
            assert torch.equal(here["image"], there["image"].cpu())

    def test_raw_masks_without_decode_are_whole(self, coordinate_datasets):
        ds = MemmapImageDataset(coordinate_datasets["pad"])
        batch = next(iter(DataLoader(ds, batch_size=6)))
        assert batch["mx"].shape == (6, 96, 96)
        assert all(torch.equal(batch["my"][position], ds[position]["my"]) for position in range(6))

    @pytest.mark.parametrize("decode", CROPS, ids=repr)
    def test_a_photos_mask_follows_its_crop(self, photo_dataset, decode):
        ds = MemmapImageDataset(photo_dataset)
        full = {position: ds[position]["seg"] for position in range(len(ds))}
        for batch_indices, batch in zip([[0, 1, 2, 3]], DataLoader(ds, batch_size=4, decode=decode)):
            inside = (batch["mx"] != 255) & (batch["my"] != 255)
            for row, position in enumerate(batch_indices):
                mx, my, seg = batch["mx"][row].long(), batch["my"][row].long(), batch["seg"][row]
                expected = full[position][my.clamp(max=159), mx.clamp(max=223)]
                assert torch.equal(seg[inside[row]], expected[inside[row]])
                assert (seg[~inside[row]] == 255).all()

    def test_exact_resume_replays_the_masks(self, coordinate_datasets):
        ds = MemmapImageDataset(coordinate_datasets["jpeg"])
        loader = DataLoader(ds, batch_size=2, shuffle=True, decode=RandomResizedCropDecode(16))
        iterator = iter(loader)
        next(iterator)
        state = loader.state_dict()
        expected = [batch["mx"] for batch in iterator]
        resumed = DataLoader(ds, batch_size=2, shuffle=True, decode=RandomResizedCropDecode(16))
        resumed.load_state_dict(state)
        assert all(torch.equal(a, b) for a, b in zip(expected, (batch["mx"] for batch in resumed), strict=True))

    @pytest.mark.parametrize(
        "transform",
        [
            RandomResizedCrop(32),
            RandomResizedCrop(32, crop=False, flip=True),
            gpuload.TrivialAugmentWide(),
            Recipe(32, crop="device", flip=False),
        ],
        ids=["crop", "flip", "policy", "recipe"],
    )
    def test_a_transform_that_moves_pixels_is_refused_with_masks(self, coordinate_datasets, transform):
        """The loader's transform= gets the images only: a crop, flip or geometric op there would leave the
        masks where they were, every pixel's class id then another pixel's."""
        ds = MemmapImageDataset(coordinate_datasets["crop"])
        with pytest.raises(UsageError, match="the segmentation mask 'mx' would not follow the transform"):
            DataLoader(ds, batch_size=2, device="cpu", transform=transform)
        with pytest.raises(UsageError, match="would not follow the transform"):
            DataLoader(ds, batch_size=2, device="cpu", transform=torch.compile(transform))
        kept = DataLoader(ds, batch_size=2, device="cpu", transform=RandomResizedCrop(32, crop=False, brightness=0.2))
        batch = next(iter(kept))  # a jitter moves no pixel: the masks still match
        assert batch["image"].shape[-2:] == batch["mx"].shape[-2:] == (96, 96)

    def test_a_concat_dataset_of_datasets_with_masks_is_refused_in_one_line(self, coordinate_datasets):
        """A ConcatDataset's parts are gathered part by part; their masks' crops are not: refused, not wrong."""
        ds = MemmapImageDataset(coordinate_datasets["crop"])
        with pytest.raises(UsageError, match="part 0 of the ConcatDataset holds the segmentation mask 'mx'"):
            DataLoader(torch.utils.data.ConcatDataset([ds, ds]), batch_size=2, device="cpu")


class TestDevice:
    @pytest.mark.parametrize("device", DEVICES)
    @pytest.mark.parametrize(
        "augment",
        [
            RandomResizedCrop(32, scale=(0.05, 1.0), flip=True),
            RandomResizedCrop(32).eval(),
            RandomResizedCrop((100, 140), eval_ratio=1.0).eval(),
            RandomResizedCrop(32, flip=True, crop=False),
        ],
        ids=repr,
    )
    def test_masks_are_cropped_and_flipped_with_their_images(self, augment, device):
        image, x, y = coordinates(96, 128)
        images = torch.from_numpy(image).permute(2, 0, 1)[None].repeat(8, 1, 1, 1).to(device)
        mx, my = (torch.from_numpy(side)[None].repeat(8, 1, 1).to(device) for side in (x, y))
        generator = torch.Generator(device).manual_seed(0)
        out, moved_x = augment(images, generator, masks=mx)
        again, moved_y = augment(images, torch.Generator(device).manual_seed(0), masks=my[:, None])
        assert torch.equal(out, again) and moved_y.dim() == 4
        check_coordinates(out, moved_x, moved_y[:, 0], tolerance=1)
        assert (moved_x[:, 0, 0] > moved_x[:, 0, -1]).any() == (augment.training and augment.flip)

    @pytest.mark.cuda
    @pytest.mark.parametrize(
        "augment", [RandomResizedCrop(32), RandomResizedCrop(32).eval(), RandomResizedCrop(32, crop=False)], ids=repr
    )
    def test_masks_are_moved_on_the_gpu_without_a_host_synchronisation(self, augment):
        images = torch.zeros((4, 3, 48, 64), dtype=torch.uint8, device="cuda")
        masks = torch.zeros((4, 48, 64), dtype=torch.uint8, device="cuda")
        generator = torch.Generator("cuda").manual_seed(0)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any host synchronisation inside raises
        try:
            _, moved = augment(images, generator, masks=masks)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert moved.is_cuda and moved.dtype == torch.uint8

    def test_masks_of_another_size_are_refused(self):
        with pytest.raises(UsageError, match=r"masks must be \[B, H, W\] or \[B, 1, H, W\] beside images"):
            RandomResizedCrop(8)(torch.zeros((2, 3, 16, 16), dtype=torch.uint8), masks=torch.zeros((2, 8, 8)))
        with pytest.raises(UsageError, match=r"beside images \[2, 3, 16, 16\], got \[2, 2, 16, 16\]"):  # two channels
            RandomResizedCrop(8)(torch.zeros((2, 3, 16, 16), dtype=torch.uint8), masks=torch.zeros((2, 2, 16, 16)))

    def test_crop_masks_takes_the_id_under_each_centre(self):
        masks = torch.arange(16, dtype=torch.uint8).reshape(1, 4, 4)
        zoom = torch.tensor([[1.0, 0.5, 0.0, 4.0, 2.0, 1.0, 2.0, 4.0, 0.0]])  # rows 1.25, 1.75; columns 2.5, 3.5
        assert crop_masks(masks, zoom, (2, 2)).tolist() == [[[6, 7], [6, 7]]]
        outside = torch.tensor([[-1.0, 1.0, 0.0, 4.0, 0.0, 1.0, 0.0, 4.0, 1.0]])
        assert crop_masks(masks, outside, (1, 2))[0, 0].tolist() == [255, 255]

    def test_a_recipe_moves_masks_through_its_geometric_steps(self):
        image, x, y = coordinates(96, 128)
        images = torch.from_numpy(image).permute(2, 0, 1)[None].repeat(4, 1, 1, 1)
        masks = torch.from_numpy(x)[None].repeat(16, 1, 1)
        images = images.repeat(4, 1, 1, 1)
        policy = gpuload.TrivialAugmentWide()
        recipe = Recipe(32, crop="device", augment=policy)
        out, labels, moved = recipe(images, torch.arange(16), masks=masks, generator=torch.Generator().manual_seed(1))
        assert out.shape == (16, 3, 32, 32) and labels.tolist() == list(range(16)) and moved.shape == (16, 32, 32)
        generator = torch.Generator().manual_seed(1)  # the same draws, step by step
        cropped, cropped_masks = RandomResizedCrop(32, flip=True)(images, generator, masks=masks)
        expected = policy(cropped, masks=cropped_masks, mask_fill=255, generator=generator)[1]
        assert torch.equal(moved, expected) and not torch.equal(moved, cropped_masks)  # some op moved pixels
        cropped = Recipe(32, crop="device")(images, masks=masks, generator=torch.Generator().manual_seed(1))[1]
        alone = RandomResizedCrop(32, flip=True)(images, torch.Generator().manual_seed(1), masks=masks)[1]
        assert torch.equal(cropped, alone)
        evaluated = recipe.eval()(images, masks=masks)[1]
        assert torch.equal(evaluated, RandomResizedCrop(32).eval()(images, masks=masks)[1])

    def test_a_recipe_refuses_to_mix_masks(self):
        recipe = Recipe.torchvision(num_classes=4, size=32, crop="device")
        images = torch.zeros((2, 3, 48, 48), dtype=torch.uint8)
        with pytest.raises(UsageError, match="a mask's class ids cannot be mixed: for segmentation build the recipe"):
            recipe(images, torch.tensor([0, 1]), masks=torch.zeros((2, 48, 48), dtype=torch.uint8))
