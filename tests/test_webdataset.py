"""WebDataset tar shards as a source (gpuload.sources.webdataset): real shards written by webdataset's
TarWriter and by Python's tarfile; an uncompressed shard's images read where they lie, a compressed one
read as a stream."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
import torch
import webdataset as wds
from PIL import Image

from gpuload import MemmapImageDataset, SourceError, UsageError, build_memmap, verify_memmap
from gpuload.sources.samples import Stored
from gpuload.sources.webdataset import expand_braces, read_shard, scan_webdataset


def photos(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.jpg"))


def write_shards(folder: Path, sources: list[Path], shards: int = 2, **extra) -> Path:
    """``sources`` in ``shards`` tar shards written by webdataset's TarWriter: each sample its ``jpg``, its
    class folder's name as ``cls``, a ``txt`` caption and a ``json`` of a score; returns the folder."""
    folder.mkdir()
    for shard in range(shards):
        with wds.TarWriter(str(folder / f"train-{shard:06d}.tar")) as sink:
            for position in range(shard, len(sources), shards):
                path = sources[position]
                sample = {
                    "__key__": f"{position:06d}",
                    "jpg": path.read_bytes(),
                    "cls": path.parent.name,
                    "txt": f"caption {position}",
                    "json": {"score": position / 2, "box": [position, 1, 2, 3]},
                }
                for key, value in extra.items():
                    sample[key] = value(position)
                sink.write(sample)
    return folder


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


class TestShards:
    def test_a_brace_pattern_of_webdataset_shards(self, photo_folder, tmp_path):
        sources = photos(photo_folder)
        shards = write_shards(tmp_path / "shards", sources)
        out = build_memmap(f"{shards}/train-{{000000..000001}}.tar", tmp_path / "out", progress=False)
        ds = MemmapImageDataset(out)
        assert ds.manifest.source_format == "webdataset" and len(ds) == len(sources)
        assert ds.classes == sorted({path.parent.name for path in sources})
        order = [*range(0, len(sources), 2), *range(1, len(sources), 2)]  # shard 0's, then shard 1's
        first = ds[0]
        assert sorted(first) == ["box", "image", "label", "score", "txt"]
        for position, source in enumerate(order[:6]):
            sample = ds[position]
            assert ds.table.path(position) == f"train-{source % 2:06d}.tar/{source:06d}.jpg"
            assert ds.classes[sample["label"]] == sources[source].parent.name
            assert sample["txt"] == f"caption {source}" and sample["score"].item() == source / 2
            assert sample["box"].tolist() == [source, 1, 2, 3]
        plain = build_memmap(photo_folder, tmp_path / "plain", progress=False)  # the same pixels as from files
        folder_images = MemmapImageDataset(plain).data.images
        assert torch.equal(ds.data.images, folder_images[order])
        assert verify_memmap(out, progress=False) == []
        with pytest.raises(UsageError, match="built from webdataset files, whose images verify does not read"):
            verify_memmap(out, sources=3, progress=False)

    def test_a_folder_of_shards_into_a_jpeg_dataset_keeps_the_bytes(self, photo_folder, tmp_path):
        sources = photos(photo_folder)
        shards = write_shards(tmp_path / "shards", sources, shards=3)
        ds = MemmapImageDataset(build_memmap(shards, tmp_path / "out", format="jpeg", order="source", progress=False))
        assert ds.read_jpeg(0) == sources[0].read_bytes()  # stored as it was in the shard

    def test_a_tarfile_shard_with_class_indices_and_a_missing_image(self, photo_folder, tmp_path):
        sources = photos(photo_folder)[:5]
        shard = tmp_path / "one.tar.gz"
        with tarfile.open(shard, "w:gz") as tar:
            for position, path in enumerate(sources):
                add(tar, f"part/{position:04d}.jpeg", path.read_bytes())
                add(tar, f"part/{position:04d}.cls", str(position % 2).encode())
            add(tar, "part/0099.cls", b"1")  # a sample with no image
        ds = MemmapImageDataset(build_memmap(shard, tmp_path / "out", progress=False))
        assert ds.classes == ["0", "1"] and ds.data.labels.tolist() == [0, 1, 0, 1, 0]
        assert isinstance(ds[0], tuple)  # no field: (image, label)
        assert ds.skipped == [{"path": "one.tar.gz/part/0099", "reason": "no image among its members (cls)"}]

    def test_a_zero_padded_cls_is_a_class_name(self, photo_folder, tmp_path):
        """``cls`` members ``001``, ``002`` (an ImageFolder's folder names) are names, as a metadata table's
        labels are: not the indices 1 and 2, which would add an empty class ``0``."""
        shard = tmp_path / "one.tar"
        with tarfile.open(shard, "w") as tar:
            for position, path in enumerate(photos(photo_folder)[:4]):
                add(tar, f"{position:04d}.jpg", path.read_bytes())
                add(tar, f"{position:04d}.cls", f"{position % 2 + 1:03d}".encode())
        ds = MemmapImageDataset(build_memmap(shard, tmp_path / "out", progress=False))
        assert ds.classes == ["001", "002"] and ds.data.labels.tolist() == [0, 1, 0, 1]

    def test_read_as_a_stream_one_sample_at_a_time(self, photo_folder, tmp_path):
        shards = write_shards(tmp_path / "shards", photos(photo_folder)[:4], shards=1)
        samples = list(read_shard(shards / "train-000000.tar"))
        assert [key for key, _ in samples] == ["000000", "000001", "000002", "000003"]
        assert sorted(samples[0][1]) == ["cls", "jpg", "json", "txt"]

    def test_the_stream_keeps_no_member_it_has_read(self, photo_folder, tmp_path, monkeypatch):
        """tarfile's stream mode (a compressed shard's) keeps every member's TarInfo in ``members``
        (millions in one big shard): the reader empties it as it goes, as webdataset's
        ``tar_file_iterator`` does."""
        shards = write_shards(tmp_path / "shards", photos(photo_folder)[:6], shards=1)
        plain = shards / "train-000000.tar"
        (shards / "train-000000.tar.gz").write_bytes(gzip.compress(plain.read_bytes()))
        plain.unlink()
        opened, real_open = [], tarfile.open

        def spy(*args, **kwargs):
            opened.append(real_open(*args, **kwargs))
            return opened[-1]

        monkeypatch.setattr(tarfile, "open", spy)
        kept = [len(opened[-1].members) for _ in read_shard(shards / "train-000000.tar.gz")]
        assert len(kept) == 6 and max(kept) <= 1

    @pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
    def test_an_uncompressed_shards_images_are_read_where_they_lie_not_copied(self, photo_folder, tmp_path, suffix):
        """A build from tars once copied every image into its own folder before decoding the first: a
        second write and read of the whole dataset, where the shard already holds the bytes."""
        sources = photos(photo_folder)
        shards = write_shards(tmp_path / "shards", sources, shards=1)
        shard = shards / "train-000000.tar"
        if suffix == ".tar.gz":
            shard = shard.rename(shard.with_suffix(".tar.gz"))
            shard.write_bytes(gzip.compress(shard.read_bytes()))
        index = scan_webdataset(shard, classes=None, roles={}, into=tmp_path / "scan")
        try:
            copied = (tmp_path / "scan" / "blobs").stat().st_size
            assert copied == (0 if suffix == ".tar" else sum(path.stat().st_size for path in sources))
            assert [index.image(position)[1] for position in range(len(sources))] == [
                path.read_bytes() for path in sources
            ]
        finally:
            index.close()
        stored = dict(read_shard(shard))["000000"]
        assert isinstance(stored["jpg"], Stored) == (suffix == ".tar") and isinstance(stored["json"], bytes)

    def test_a_shard_cut_after_the_scan_is_named_when_its_image_is_read(self, photo_folder, tmp_path):
        shards = write_shards(tmp_path / "shards", photos(photo_folder)[:4], shards=1)
        shard = shards / "train-000000.tar"
        index = scan_webdataset(shard, classes=None, roles={}, into=tmp_path / "scan")
        try:
            shard.write_bytes(shard.read_bytes()[:2048])
            with pytest.raises(SourceError, match=rf"^{shard}: ends before byte [\d,]+, where the scan found an image"):
                index.image(3)
        finally:
            index.close()

    @pytest.mark.parametrize("streamed", [False, True])
    def test_the_images_of_many_shards_are_read_with_a_few_files_open(self, photo_folder, tmp_path, streamed):
        """A descriptor per shard kept open until the build's end ran out of them (1,024 on most machines)
        in a build from more shards than that."""
        shards = write_shards(tmp_path / "shards", photos(photo_folder), shards=20)
        most = [0]

        def open_shards(*_) -> None:
            fds = Path("/proc/self/fd")
            held = [fd for fd in fds.iterdir() if os.path.realpath(fd).startswith(str(shards))]
            most[0] = max(most[0], len(held))

        index = scan_webdataset(
            shards, classes=None, roles={}, into=tmp_path / "scan", sink=open_shards if streamed else None
        )
        try:
            for position in range(len(index.samples) if not streamed else 0):
                index.image(position)
                open_shards()
        finally:
            index.close()
        assert 0 < most[0] <= 8

    def test_expand_braces_as_webdataset(self):
        pattern = "s-{000..002}-{a,b}.tar"
        assert expand_braces(pattern) == list(wds.shardlists.expand_urls(pattern))


class TestBadShards:
    def test_a_truncated_shard_names_it_and_writes_nothing(self, photo_folder, tmp_path):
        shards = write_shards(tmp_path / "shards", photos(photo_folder))
        shard = shards / "train-000001.tar"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2 + 100])
        with pytest.raises(SourceError, match=rf"^{shard}: is truncated or damaged after \d+ samples"):
            build_memmap(shards, tmp_path / "out", progress=False)
        assert not (tmp_path / "out").exists()

    def test_a_shard_cut_inside_an_image_it_leaves_unread(self, photo_folder, tmp_path):
        """The image members are not read in the scan: a shard cut inside the last one's bytes is still
        found out, by its size."""
        sources = photos(photo_folder)[:3]
        shards = write_shards(tmp_path / "shards", sources, shards=1)
        shard = shards / "train-000000.tar"
        [(key, members)] = [sample for sample in read_shard(shard) if sample[0] == "000002"]
        shard.write_bytes(shard.read_bytes()[: members["jpg"].offset + 100])
        with pytest.raises(SourceError, match=rf"^{shard}: is truncated or damaged after 2 samples"):
            build_memmap(shard, tmp_path / "out", progress=False)
        assert not (tmp_path / "out").exists()

    def test_a_missing_shard_of_a_pattern(self, photo_folder, tmp_path):
        shards = write_shards(tmp_path / "shards", photos(photo_folder))
        with pytest.raises(FileNotFoundError, match=r"train-000002.tar does not exist \(1 of the 3 shards"):
            build_memmap(f"{shards}/train-{{000000..000002}}.tar", tmp_path / "out", progress=False)

    def test_a_png_beside_the_image_is_its_mask_unless_left_out(self, photo_folder, tmp_path):
        sources = photos(photo_folder)
        mask = io.BytesIO()
        Image.new("L", (64, 48), 3).save(mask, "PNG")  # the photos' size
        shards = write_shards(tmp_path / "shards", sources, png=lambda position: mask.getvalue())
        ds = MemmapImageDataset(build_memmap(shards, tmp_path / "out", progress=False))
        assert ds.fields["mask"].spec.kind == "mask" and ds[0]["mask"].unique().tolist() == [3]
        ds = MemmapImageDataset(build_memmap(shards, tmp_path / "plain", columns={"mask": "ignore"}, progress=False))
        assert len(ds) == len(sources) and "mask" not in ds.fields

    def test_a_role_given_to_an_image_extension_is_its(self, photo_folder, tmp_path):
        """``--column png=ignore`` and ``--column png=mask`` were not heard: the png was the mask
        ``mask`` whatever the roles said."""
        sources = photos(photo_folder)[:4]
        mask = io.BytesIO()
        Image.new("L", (64, 48), 3).save(mask, "PNG")
        shards = write_shards(tmp_path / "shards", sources, png=lambda position: mask.getvalue())
        ignored = MemmapImageDataset(build_memmap(shards, tmp_path / "a", columns={"png": "ignore"}, progress=False))
        named = MemmapImageDataset(build_memmap(shards, tmp_path / "b", columns={"png": "mask"}, progress=False))
        assert "mask" not in ignored.fields and "png" not in ignored.fields
        assert named.fields["png"].spec.kind == "mask" and "mask" not in named.fields
        assert named[0]["png"].unique().tolist() == [3]
        assert torch.equal(named[0]["image"], ignored[0]["image"])  # the jpg is the image in both

    def test_a_json_field_missing_from_a_sample(self, photo_folder, tmp_path):
        sources = photos(photo_folder)[:4]
        shard = tmp_path / "s.tar"
        with tarfile.open(shard, "w") as tar:
            for position, path in enumerate(sources):
                add(tar, f"{position}.jpg", path.read_bytes())
                add(tar, f"{position}.json", json.dumps({"score": 1.0} if position != 2 else {}).encode())
        with pytest.raises(SourceError, match=r"sample '2' of .*s.tar has no 'score'; every sample must have the same"):
            build_memmap(shard, tmp_path / "out", progress=False)

    def test_a_member_twice_in_one_sample_is_refused(self, photo_folder, tmp_path):
        """Two ``000001.jpg`` one after the other (a shard appended to twice): which is the image? Refused,
        as webdataset refuses it ("duplicate file name in tar file"), and nothing written."""
        sources = photos(photo_folder)[:2]
        shard = tmp_path / "s.tar"
        with tarfile.open(shard, "w") as tar:
            add(tar, "000001.jpg", sources[0].read_bytes())
            add(tar, "000001.jpg", sources[1].read_bytes())
        with pytest.raises(SourceError, match=rf"^{shard}: sample '000001' holds the member 'jpg' twice; "):
            build_memmap(shard, tmp_path / "out", progress=False)
        assert not (tmp_path / "out").exists()


def test_the_scan_shows_its_progress(photo_folder, tmp_path, capsys):
    shards = write_shards(tmp_path / "shards", photos(photo_folder)[:6], shards=1)
    build_memmap(shards, tmp_path / "out")
    assert "scan shards: 6sample" in capsys.readouterr().err
    build_memmap(shards, tmp_path / "quiet", progress=False)
    assert capsys.readouterr().err == ""


def test_a_member_name_that_is_not_utf8(photo_folder, tmp_path):
    """A tar written with latin-1 names (a café's é as one byte): a UnicodeEncodeError traceback in the
    scan's name hash; the name is kept as it is (surrogate-escaped, as Python gives such a file's name)."""
    data = sorted(photo_folder.rglob("*.jpg"))[0].read_bytes()
    with tarfile.open(tmp_path / "s.tar", "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tar:
        for name in ("café-1.jpg", "café-2.jpg"):
            add(tar, name, data)
    ds = MemmapImageDataset(build_memmap(tmp_path / "s.tar", tmp_path / "out", format="jpeg", progress=False))
    assert [ds.table.path(index) for index in range(2)] == ["s.tar/caf\udce9-1.jpg", "s.tar/caf\udce9-2.jpg"]
    assert ds.read_jpeg(1) == data and verify_memmap(ds.path, progress=False) == []
