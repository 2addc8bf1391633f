"""gpuload/format/table.py: each image's path, label and checksum in flat files (format version 4)."""

import gc
import subprocess
import sys
import textwrap
from unittest import mock

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuload.writing.build
from gpuload import DatasetError, MemmapImageDataset, build_memmap, make_sample_folder
from gpuload.format.table import SampleTable, TableWriter, file_digest


@settings(max_examples=50, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.text(min_size=1, max_size=30).filter(lambda text: "\x00" not in text), st.integers(0, 999),
                  st.integers(0, 2**64 - 1)),
        min_size=1,
        max_size=40,
    ),
    chunk=st.integers(1, 50),
)  # fmt: skip
def test_what_is_written_is_read_back_by_index(tmp_path_factory, rows, chunk):
    """Whatever the rows, and however many the writer holds between writes."""
    folder = tmp_path_factory.mktemp("table")
    with mock.patch("gpuload.format.table._CHUNK", chunk), TableWriter(folder) as writer:
        for path, label, checksum in rows:
            writer.append(path, label, checksum)
    table = SampleTable.open(folder, len(rows))
    table.check(str(folder), 1000)
    assert len(table) == len(rows)
    assert [table.path(i) for i in range(len(rows))] == [path for path, _, _ in rows]  # any UTF-8, any length
    assert table.labels.tolist() == [label for _, label, _ in rows]
    assert table.checksums.tolist() == [checksum for _, _, checksum in rows]
    assert not table.labels.flags.writeable and not table.checksums.flags.writeable


def test_version_3_lists_are_served_the_same_way():
    table = SampleTable.from_lists([["a/1.jpg", 1], ["b/é.jpg", 0]], ["00000000000000ff", "ffffffffffffffff"])
    assert [table.path(0), table.path(1)] == ["a/1.jpg", "b/é.jpg"] and table.checksums.tolist() == [255, 2**64 - 1]


@pytest.mark.parametrize(
    ("name", "damage", "message"),
    [
        ("path_offsets.memmap", lambda data: data[:-8], r"path_offsets.memmap has 16 bytes, the manifest means 24"),
        ("labels.memmap", lambda data: b"", r"labels.memmap has 0 bytes, the manifest means 16"),
        ("paths.memmap", lambda data: data + b"x", r"path_offsets.memmap does not cut paths.memmap into 2 paths"),
    ],
)
def test_a_damaged_table_is_refused_in_one_line(tmp_path, name, damage, message):
    with TableWriter(tmp_path) as writer:
        writer.append("a.jpg", 0, 1)
        writer.append("b.jpg", 1, 2)
    (tmp_path / name).write_bytes(damage((tmp_path / name).read_bytes()))
    with pytest.raises(DatasetError, match=message) as refused:
        SampleTable.open(tmp_path, 2).check(str(tmp_path), 2)
    assert "\n" not in str(refused.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(DatasetError, match=r"is damaged: path_offsets.memmap is missing"):
        SampleTable.open(tmp_path, 1)


def test_the_digest_is_of_the_files_bytes(tmp_path):
    (tmp_path / "f").write_bytes(b"gpuload" * 1000)
    assert file_digest(tmp_path / "f") == f"{xxhash.xxh3_64_intdigest(b'gpuload' * 1000):016x}"


class TestOpen:
    """A dataset of format version 4 keeps nothing per image in Python: opening it costs the same at any size."""

    def test_opening_makes_no_object_per_image(self, tmp_path):
        small = build_memmap(make_sample_folder(tmp_path / "small", images_per_class=2, size=(8, 8)), progress=False)
        large = build_memmap(make_sample_folder(tmp_path / "large", images_per_class=200, size=(8, 8)), progress=False)

        def objects_made(path) -> int:
            gc.collect()
            before = len(gc.get_objects())
            dataset = MemmapImageDataset(path)
            made = len(gc.get_objects()) - before
            del dataset
            return made

        objects_made(small)  # the first open makes the module-level objects
        assert abs(objects_made(large) - objects_made(small)) < 50  # 1,000 images against 10

    def test_samples_and_targets_are_read_when_indexed_and_kept(self, tmp_path):
        dataset = MemmapImageDataset(
            build_memmap(make_sample_folder(tmp_path / "p", images_per_class=3, size=(8, 8)), progress=False)
        )
        assert dataset.samples is dataset.samples and dataset.targets is dataset.targets  # made once
        assert dataset.samples[-1] == (str(tmp_path / "p" / "sleeve_right" / "0002.jpg"), 4)
        assert dataset.samples[:2] == [dataset.samples[0], dataset.samples[1]]
        assert np.asarray(dataset.targets).dtype == np.int64 and list(dataset.targets) == sorted(dataset.targets)
        with pytest.raises(IndexError, match="sample 15 is out of range for a dataset of 15 images"):
            dataset.samples[15]


class TestJpegOrder:
    """A jpeg build stores its images in a seeded random order, none across a block's end, the index in
    ImageFolder's order: the blocks a reader at a URL fetches together hold images of every class."""

    @pytest.fixture
    def photos(self, tmp_path):
        return make_sample_folder(tmp_path / "photos", images_per_class=12, size=(48, 64))

    def test_images_lie_shuffled_and_no_image_crosses_a_block(self, photos, tmp_path, monkeypatch):
        monkeypatch.setattr(gpuload.writing.build, "BLOCK_SIZE", 32768)  # about ten images a block

        def classes_per_block(dataset) -> float:
            blocks, labels = (dataset.data.starts // 32768).numpy(), dataset.data.labels.numpy()
            return float(np.mean([len(set(labels[blocks == block])) for block in set(blocks)]))

        dataset = MemmapImageDataset(build_memmap(photos, tmp_path / "shuffled", format="jpeg", progress=False))
        starts, ends = dataset.data.starts.numpy(), (dataset.data.starts + dataset.data.lengths).numpy()
        assert (starts // 32768 == (ends - 1) // 32768).all()  # each image within one block
        assert not (np.diff(starts) > 0).all()  # not in ImageFolder's order
        assert dataset.manifest.order == {"shuffled": 0, "block_size": 32768}
        assert [dataset.samples[i][1] for i in range(len(dataset))] == sorted(
            dataset.targets
        )  # the index: ImageFolder's
        source = MemmapImageDataset(build_memmap(photos, tmp_path / "s", format="jpeg", order="source", progress=False))
        assert classes_per_block(dataset) > classes_per_block(source) + 1.5  # about 4 of 5 classes a block, against 1-2

    def test_the_same_seed_gives_the_same_dataset_and_another_seed_another_order(self, photos, tmp_path):
        first = build_memmap(photos, tmp_path / "a", format="jpeg", seed=7, progress=False)
        again = build_memmap(photos, tmp_path / "b", format="jpeg", seed=7, progress=False)
        other = build_memmap(photos, tmp_path / "c", format="jpeg", seed=8, progress=False)
        assert (first / "data.memmap").read_bytes() == (again / "data.memmap").read_bytes()
        assert (first / "data.memmap").read_bytes() != (other / "data.memmap").read_bytes()
        assert MemmapImageDataset(first)[5][0].equal(MemmapImageDataset(other)[5][0])  # the same image 5

    def test_source_order_stores_them_in_imagefolder_order(self, photos, tmp_path):
        dataset = MemmapImageDataset(
            build_memmap(photos, tmp_path / "s", format="jpeg", order="source", progress=False)
        )
        assert (np.diff(dataset.data.starts.numpy()) > 0).all() and dataset.manifest.order == {}

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"order": "shuffled"}, "order applies only to format='jpeg'"),
            ({"format": "jpeg", "order": "random"}, "order must be one of shuffled, source, got 'random'"),
            ({"format": "jpeg", "seed": -1}, r"seed must be an integer in \[0, 2\*\*63\), got -1"),
        ],
    )
    def test_bad_options_are_refused_before_anything_is_written(self, photos, tmp_path, options, message):
        with pytest.raises(ValueError, match=message):
            build_memmap(photos, tmp_path / "out", progress=False, **options)
        assert not (tmp_path / "out").exists()


def test_plain_numpy_reads_the_table_without_gpuload(tmp_path):
    """The files are flat little-endian arrays: any tool reads them."""
    built = build_memmap(make_sample_folder(tmp_path / "p", images_per_class=1, size=(8, 8)), progress=False)
    code = textwrap.dedent(f"""
        import sys, numpy as np
        folder = {str(built)!r}
        offsets = np.fromfile(folder + "/path_offsets.memmap", "<i8")
        paths = open(folder + "/paths.memmap", "rb").read()
        print(paths[offsets[1]:offsets[2]].decode(), np.fromfile(folder + "/labels.memmap", "<i8").tolist())
        assert "gpuload" not in sys.modules
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.split() == ["collar/0000.jpg", "[0,", "1,", "2,", "3,", "4]"]
