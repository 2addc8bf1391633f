"""Parquet files as a source (gpuload.sources.parquet): files written by pyarrow in the layout Hugging
Face ``datasets`` exports (an ``image`` struct column of ``{bytes, path}``, a ``ClassLabel`` label)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import open_files, write_parquet

from gpuload import MemmapImageDataset, SourceError, build_memmap, verify_memmap


@pytest.fixture
def sources(photo_folder) -> list[Path]:
    return sorted(photo_folder.rglob("*.jpg"))


@pytest.fixture
def classes(photo_folder) -> list[str]:
    return sorted(path.name for path in photo_folder.iterdir())


class TestHuggingFaceLayout:
    def test_images_labels_and_fields(self, sources, classes, photo_folder, tmp_path):
        embedding = [[float(position), -1.0, 0.5] for position in range(len(sources))]
        path = write_parquet(tmp_path / "train.parquet", sources, classes, embedding=embedding, flag=[True] * 20)
        ds = MemmapImageDataset(build_memmap(path, tmp_path / "out", progress=False))
        assert ds.manifest.source_format == "parquet" and ds.classes == classes
        plain = MemmapImageDataset(build_memmap(photo_folder, tmp_path / "plain", progress=False))
        assert torch.equal(ds.data.images, plain.data.images) and torch.equal(ds.data.labels, plain.data.labels)
        assert ds[4]["embedding"].tolist() == embedding[4] and ds[4]["flag"].dtype == torch.bool
        assert ds.table.path(3) == "train.parquet/3"
        assert verify_memmap(ds.path, progress=False) == []

    def test_a_folder_of_files_in_the_order_of_their_names(self, sources, classes, tmp_path):
        folder = tmp_path / "data"
        folder.mkdir()
        write_parquet(folder / "train-00001-of-00002.parquet", sources[10:], classes)
        write_parquet(folder / "train-00000-of-00002.parquet", sources[:10], classes)
        ds = MemmapImageDataset(build_memmap(folder, tmp_path / "out", format="jpeg", order="source", progress=False))
        assert len(ds) == len(sources) and ds.read_jpeg(12) == sources[12].read_bytes()
        assert ds.table.path(12) == "train-00001-of-00002.parquet/2"

    def test_plain_binary_images_and_class_names(self, sources, tmp_path):
        table = pa.table(
            {"picture": [path.read_bytes() for path in sources], "label": [p.parent.name for p in sources]}
        )
        pq.write_table(table, tmp_path / "t.parquet")
        ds = MemmapImageDataset(
            build_memmap(tmp_path / "t.parquet", tmp_path / "out", columns={"picture": "image"}, progress=False)
        )
        assert ds.classes == sorted({path.parent.name for path in sources}) and isinstance(ds[0], tuple)

    @pytest.mark.parametrize("kind", ["binary", "large_binary", "struct", "fixed_size_binary"])
    def test_each_image_bytes_exactly_whatever_the_arrow_layout(self, sources, classes, tmp_path, kind):
        """The scan cuts a batch's images out of Arrow's one buffer: a batch that starts mid-buffer (row
        groups of 7 read in batches of 64), 64-bit offsets, structs: each image its own bytes."""
        data = [path.read_bytes() for path in sources]
        images = {
            "binary": pa.array(data, pa.binary()),
            "large_binary": pa.array(data, pa.large_binary()),
            "struct": pa.array([{"bytes": item, "path": "x.jpg"} for item in data]),
            "fixed_size_binary": None,
        }[kind]
        if kind == "fixed_size_binary":  # images of one byte length (padded after their end marker)
            width = max(map(len, data))
            data = [item + bytes(width - len(item)) for item in data]
            images = pa.array(data, pa.binary(width))
        pq.write_table(pa.table({"image": images, "label": [0] * len(data)}), tmp_path / "t.parquet", row_group_size=7)
        ds = MemmapImageDataset(
            build_memmap(tmp_path / "t.parquet", tmp_path / "out", format="jpeg", order="source", progress=False)
        )
        assert [ds.read_jpeg(index) for index in range(len(ds))] == data


class TestBadParquet:
    def test_a_truncated_file(self, sources, classes, tmp_path):
        path = write_parquet(tmp_path / "train.parquet", sources, classes)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        with pytest.raises(SourceError, match=rf"^{path}: is not a readable Parquet file .* download it again$"):
            build_memmap(path, tmp_path / "out", progress=False)
        assert not (tmp_path / "out").exists()

    def test_an_image_of_a_path_only(self, sources, classes, tmp_path):
        path = tmp_path / "t.parquet"
        pq.write_table(pa.table({"image": [{"bytes": None, "path": "a.jpg"}], "label": [0]}), path)
        with pytest.raises(SourceError, match="row 0 of .*: 'image' holds no image bytes .* embeds them"):
            build_memmap(path, tmp_path / "out", progress=False)

    def test_an_empty_image_among_others_names_its_row(self, sources, classes, tmp_path):
        data = [path.read_bytes() for path in sources]
        data[9] = b""
        pq.write_table(
            pa.table({"image": pa.array(data, pa.binary()), "label": [0] * len(data)}), tmp_path / "t.parquet"
        )
        with pytest.raises(SourceError, match=r"row 9 of .*: 'image' holds no image bytes \(bytes\)") as raised:
            build_memmap(tmp_path / "t.parquet", tmp_path / "out", progress=False)
        assert not (tmp_path / "out").exists()
        # the scan's files closed by the failure, not left to the garbage collector (the error's frames hold them)
        assert raised.value and [path for path in open_files() if path.startswith(f"{tmp_path}/.out.tmp-")] == []

    def test_the_image_column_given_another_role_leaves_none(self, sources, classes, tmp_path):
        """``--column image=mask`` left no image column: a StopIteration traceback."""
        path = write_parquet(tmp_path / "t.parquet", sources, classes)
        with pytest.raises(SourceError, match=r"no column holds the images: 'image' is given the role 'mask'"):
            build_memmap(path, tmp_path / "out", columns={"image": "mask"}, progress=False)

    def test_a_mask_column_that_is_not_bytes(self, sources, classes, tmp_path):
        path = write_parquet(tmp_path / "t.parquet", sources, classes, mask=["a.png"] * len(sources))
        with pytest.raises(SourceError, match=r"row 0 of .*: 'mask' holds 'a.png' where the column holds masks"):
            build_memmap(path, tmp_path / "out", progress=False)

    def test_a_full_disk_while_staging_is_not_blamed_on_the_file(self, sources, classes, tmp_path, monkeypatch):
        """An ``OSError`` of the build's own disk (the scan stages the images there) stays what it is: the
        Parquet file is fine, and "download it again" would send the user the wrong way."""
        import errno

        from gpuload.sources.samples import SampleScan

        def full(self, sample):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(SampleScan, "add", full)
        path = write_parquet(tmp_path / "train.parquet", sources, classes)
        with pytest.raises(OSError, match="not enough disk space to build .*out: its index of the source's") as raised:
            build_memmap(path, tmp_path / "out", progress=False)
        assert not isinstance(raised.value, SourceError)
        assert not (tmp_path / "out").exists()
