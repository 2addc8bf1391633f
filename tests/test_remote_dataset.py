"""gpuload.remote.dataset and a dataset at a URL (``MemmapImageDataset(url, cache=...)``) under the
loader: a pushed dataset opened from moto's S3 and from the Range HTTP server, its faults, and ranks of two
simulated nodes under torchrun."""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash
from conftest import FAST_RETRY, resident_kib
from servers import FaultProxy

from gpuload import CenterCropDecode, DataLoader, RandomResizedCropDecode
from gpuload.cli import main
from gpuload.errors import DatasetError, ObjectChangedError, UsageError
from gpuload.format.dataset import MemmapImageDataset
from gpuload.format.verify import describe_memmap
from gpuload.loading.order import epoch_order
from gpuload.remote.dataset import describe_remote, open_remote, verify_remote
from gpuload.remote.push import push_memmap
from gpuload.remote.store import Store, open_store


@pytest.fixture(params=["jpeg", "raw"])
def pushed(request, s3, jpeg_dataset, built_dataset):
    """``(local dataset, its URL on moto)``."""
    local = jpeg_dataset if request.param == "jpeg" else built_dataset
    url = s3.url(local.name)
    push_memmap(local, url, store=open_store(url, retry=FAST_RETRY), progress=False)
    return local, url


class TestOpen:
    def test_the_index_and_the_images_are_the_local_ones(self, pushed):
        local, url = pushed
        index, dataset = open_remote(url), MemmapImageDataset(local)
        assert index.manifest == dataset.manifest
        assert np.array_equal(index.labels, dataset.data.labels.numpy())
        stored = (local / index.image_object).read_bytes()  # as the file lies, whatever its layout
        with index.image_file() as file:
            for position in (0, 7, len(dataset) - 1):
                start, length = int(index.starts[position]), int(index.lengths[position])
                assert file.read(start, length) == stored[start : start + length]
                assert xxhash.xxh3_64_intdigest(stored[start : start + length]) == index.checksums()[position]
        if dataset.storage == "jpeg":
            assert np.array_equal(index.shapes, dataset.data.shapes.numpy())
        assert index.objects == {name: open_store(url).info(name) for name in dataset.manifest.files}

    def test_describe_says_what_the_local_describe_says(self, pushed):
        local, url = pushed
        remote, here = describe_remote(url), describe_memmap(local)
        assert remote["path"] == url and remote["bytes_on_disk"] == here["bytes_on_disk"]
        assert {**remote, "path": "", "bytes_on_disk": 0} == {**here, "path": "", "bytes_on_disk": 0}

    def test_over_https(self, jpeg_dataset, http, http_root):
        push_memmap(jpeg_dataset, (http_root / "photos.jpeg").as_uri(), progress=False)
        url = f"{http.url}/photos.jpeg?X-Amz-Signature=SECRET"
        assert open_remote(url).manifest.storage == "jpeg"
        assert verify_remote(url, progress=False) == []


class TestDamage:
    def test_an_empty_location_is_no_dataset(self, s3):
        with pytest.raises(DatasetError, match=r"is not a gpuload dataset: it has no manifest.json"):
            open_remote(s3.url("nothing"))
        with pytest.raises(UsageError, match="pass the URL that gpuload push wrote"):
            verify_remote(s3.url("nothing"), progress=False)

    def test_an_unfinished_push(self, pushed, s3):
        local, url = pushed
        s3.client().delete_object(Bucket=s3.bucket, Key=f"{local.name}/manifest.json")
        with pytest.raises(DatasetError, match=r"is not a gpuload dataset: it has no manifest.json"):
            open_remote(url)  # no push marker: not a push of ours
        s3.client().put_object(Bucket=s3.bucket, Key=f"{local.name}/.gpuload-push.json", Body=b'{"push": "x"}')
        with pytest.raises(DatasetError, match="has no manifest.json and holds a push that did not finish"):
            open_remote(url)

    def test_a_missing_or_cut_object(self, pushed, s3):
        local, url = pushed
        s3.client().put_object(Bucket=s3.bucket, Key=f"{local.name}/labels.memmap", Body=b"\0" * 8)
        assert verify_remote(url, progress=False) == [
            f"{url} is damaged: labels.memmap has 8 bytes, the manifest says 160; push the dataset again"
        ]
        s3.client().delete_object(Bucket=s3.bucket, Key=f"{local.name}/labels.memmap")
        with pytest.raises(DatasetError, match="is damaged: labels.memmap is missing; push the dataset again"):
            open_remote(url)

    @pytest.mark.parametrize("edit", [{"layout": "channels_first"}, {"image_shape": [3, 64, 48]}])
    def test_a_raw_manifest_edited_to_another_layout_or_shape_is_refused(self, s3, built_dataset, edit):
        """The same bytes read in another order are scrambled pixels: a local open refuses them, and so
        does an open at a URL."""
        url = s3.url("edited")
        push_memmap(built_dataset, url, store=open_store(url, retry=FAST_RETRY), progress=False)
        manifest = json.loads((built_dataset / "manifest.json").read_text()) | edit
        s3.client().put_object(Bucket=s3.bucket, Key="edited/manifest.json", Body=json.dumps(manifest).encode())
        with pytest.raises(
            DatasetError, match=r"meta.json recorded \[20, 48, 64, 3\] when it was built: the manifest was edited"
        ):
            MemmapImageDataset(url)

    def test_wrong_labels(self, pushed, s3):
        local, url = pushed
        labels = np.fromfile(local / "labels.memmap", dtype=np.int64)
        labels[3] = (labels[3] + 1) % 5
        s3.client().put_object(Bucket=s3.bucket, Key=f"{local.name}/labels.memmap", Body=labels.tobytes())
        with pytest.raises(
            DatasetError, match=r"is damaged: labels.memmap differs from what was built; push the dataset again"
        ):
            open_remote(url)

    def test_damaged_images_are_reported(self, pushed, s3):
        local, url = pushed
        name = "data.memmap" if (local / "data.memmap").exists() else "images.memmap"
        data = bytearray((local / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        s3.client().put_object(Bucket=s3.bucket, Key=f"{local.name}/{name}", Body=bytes(data))
        [problem] = verify_remote(url, progress=False)
        assert problem.startswith("1 image does not match its build checksum: ")


class TestCommandLine:
    def test_info_and_verify_take_urls(self, capsys, pushed, s3):
        local, url = pushed
        assert main(["info", url]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"{url}\n") and "classes: 5" in out
        assert main(["verify", url]) == 0
        assert capsys.readouterr().out.startswith(f"{url}: OK; checked the manifest and the ")
        s3.client().delete_object(Bucket=s3.bucket, Key=f"{local.name}/meta.json")
        assert main(["verify", url]) == 1
        assert "problem: " in capsys.readouterr().out

    def test_verify_of_a_url_without_a_dataset_is_exit_2_and_never_shows_secrets(self, capsys, http):
        assert main(["verify", f"{http.url}/nothing?sig=TOPSECRET"]) == 2
        err = capsys.readouterr().err
        assert (
            err.startswith(f"gpuload: error: {http.url}/nothing?<redacted> is not a gpuload dataset")
            and "TOPSECRET" not in err
        )

    def test_sources_need_the_local_dataset(self, capsys, s3):
        assert main(["verify", s3.url("x"), "--sources", "3"]) == 2
        assert "run it on the local dataset, not a URL" in capsys.readouterr().err


# -- the dataset and the loader at a URL (phase 2) -------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
BLOCK = 8_192  # small blocks: the tests' datasets (a few hundred KB) span several


class TestIndexInTheCache:
    """With a cache, each index object (labels, checksums, paths; jpeg: offsets and sizes) is kept in it
    whole and mapped: at ImageNet's count they were 115 MB read into every process's memory at each open."""

    @pytest.fixture
    def reads(self, monkeypatch) -> list[str]:
        """The names of the objects read whole from here on."""
        names: list[str] = []
        real = Store.read_all

        def read_all(store, name, expect=None):
            names.append(name)
            return real(store, name, expect)

        monkeypatch.setattr(Store, "read_all", read_all)
        return names

    @staticmethod
    def cached(cache: Path, name: str) -> Path:
        (found,) = [
            path / "0"
            for path in (cache / "objects").iterdir()
            if json.loads((path / "object.json").read_text())["url"].endswith(f"/{name}")
        ]
        return found

    def test_a_warm_open_downloads_none_of_it_and_holds_none_of_it_in_memory(self, pushed, tmp_path, reads):
        local, url = pushed
        here = MemmapImageDataset(local)
        with open_at(url, tmp_path / "cache"):
            pass
        index = {"labels.memmap", "checksums.memmap", "paths.memmap", "path_offsets.memmap"}
        index |= {"offsets.memmap", "shapes.memmap"} if here.storage == "jpeg" else set()
        assert index <= set(reads)  # the cold open fetched them
        reads.clear()
        with open_at(url, tmp_path / "cache") as dataset:
            assert not index & set(reads), reads  # the warm open: the manifest (and a raw dataset's meta.json)
            resident = resident_kib(tmp_path / "cache")
            assert {
                str(self.cached(tmp_path / "cache", name).relative_to(tmp_path / "cache")) for name in index
            } <= set(resident)  # mapped from the cache...
            assert sum(resident.values()) == 0, resident  # ...and none of it in this process's memory
            assert torch.equal(dataset.data.labels, here.data.labels) and dataset.samples == here.samples
            assert [dataset[i][1] for i in range(len(here))] == here.targets

    def test_a_copy_damaged_in_the_cache_is_fetched_again(self, pushed, tmp_path, reads):
        local, url = pushed
        with open_at(url, tmp_path / "cache"):
            pass
        damaged = self.cached(tmp_path / "cache", "checksums.memmap")
        damaged.write_bytes(bytes(damaged.stat().st_size))  # what a power cut leaves of an unsynced block
        reads.clear()
        with open_at(url, tmp_path / "cache") as dataset:
            assert "checksums.memmap" in reads
            assert damaged.read_bytes() == (local / "checksums.memmap").read_bytes()
            assert torch.equal(dataset[0][0], MemmapImageDataset(local)[0][0])

    def test_an_index_object_changed_at_the_url_is_refused(self, pushed, s3, tmp_path):
        local, url = pushed
        paths = (local / "paths.memmap").read_bytes()
        s3.client().put_object(Bucket=s3.bucket, Key=f"{local.name}/paths.memmap", Body=paths[::-1])
        for cache in (None, tmp_path / "cache"):
            with pytest.raises(DatasetError, match=r"is damaged: paths.memmap differs from what was built; push"):
                open_at(url, cache)


def open_at(url: str, cache: Path | None, **options) -> MemmapImageDataset:
    if cache is None:
        return MemmapImageDataset(url, **options)
    return MemmapImageDataset(url, cache=cache, cache_size="50MB", block_size=BLOCK, **options)


def batches(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), labels.clone()) for images, labels in loader]


def same(first, second) -> bool:
    return len(first) == len(second) and all(
        torch.equal(a_images, b_images) and torch.equal(a_labels, b_labels)
        for (a_images, a_labels), (b_images, b_labels) in zip(first, second)
    )


def decoder(storage: str):
    return RandomResizedCropDecode(24) if storage == "jpeg" else None


@pytest.fixture
def at_url(pushed, tmp_path):
    """``(local dataset, URL dataset with a cache, URL)``; the URL dataset's threads stopped at the end."""
    local, url = pushed
    with open_at(url, tmp_path / "cache") as dataset:
        yield local, dataset, url


class TestDatasetAtUrl:
    def test_it_serves_what_the_local_dataset_serves(self, at_url):
        local, dataset, url = at_url
        here = MemmapImageDataset(local)
        assert (dataset.path, dataset.storage, dataset.classes, len(dataset)) == (
            url,
            here.storage,
            here.classes,
            len(here),
        )
        assert torch.equal(dataset.data.labels, here.data.labels)
        for index in (0, 7, len(here) - 1):
            (image, label), (expected, expected_label) = dataset[index], here[index]
            assert torch.equal(image, expected) and label == expected_label
        for mine, theirs in zip(dataset.__getitems__([3, 1]), here.__getitems__([3, 1])):
            assert torch.equal(mine[0], theirs[0]) and mine[1] == theirs[1]
        assert pickle.loads(pickle.dumps(dataset))[5][1] == here[5][1]

    def test_a_copy_made_after_a_push_over_it_refuses_the_new_version(self, s3, built_dataset, jpeg_dataset, tmp_path):
        """A spawned worker (or another rank) opens the URL again: pushed over meanwhile, it would serve
        another dataset next to the parent's, or another length; the version seen at open travels with
        the pickle, and a copy that finds another refuses."""
        url = s3.url("replaced")
        push_memmap(jpeg_dataset, url, store=open_store(url, retry=FAST_RETRY), progress=False)
        with open_at(url, tmp_path / "cache") as dataset:
            pickled = pickle.dumps(dataset)
            pickle.loads(pickled).close()  # the same version: fine
            push_memmap(built_dataset, url, store=open_store(url, retry=FAST_RETRY), overwrite=True, progress=False)
            with pytest.raises(ObjectChangedError, match=r"is not the version that was opened when it was pickled"):
                pickle.loads(pickled)

    def test_the_stock_loader_reads_a_batch_in_one_go(self, at_url, monkeypatch):
        """torch's DataLoader calls __getitems__ with a batch: its images are read together (at a URL, in
        parallel), not one request after the other (about 256 round trips a batch, without a cache)."""
        _, dataset, _ = at_url
        reads = []
        real = dataset.read_images
        monkeypatch.setattr(dataset, "read_images", lambda indices: reads.append(len(indices)) or real(indices))
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=list)
        served = [sample for batch in loader for sample in batch]
        assert reads == [4] * (len(dataset) // 4) + ([len(dataset) % 4] if len(dataset) % 4 else [])
        assert [label for _, label in served] == list(dataset.targets)

    def test_the_exact_shuffle_is_the_local_loaders(self, at_url):
        local, dataset, _ = at_url
        options = dict(
            batch_size=3, shuffle=True, seed=2, device="cpu", decode=decoder(dataset.storage), block_shuffle=0
        )
        assert same(batches(DataLoader(dataset, **options)), batches(DataLoader(MemmapImageDataset(local), **options)))

    def test_the_block_order_is_the_default_and_reads_each_block_once(self, s3, at_url):
        local, dataset, _ = at_url
        loader = DataLoader(dataset, batch_size=3, shuffle=True, seed=2, device="cpu", decode=decoder(dataset.storage))
        assert loader.block_shuffle == 32 and loader.state_dict()["block_shuffle"] == 32
        s3.proxy.clear()
        served = batches(loader)
        assert sorted(torch.cat([labels for _, labels in served]).tolist()) == sorted(dataset.targets)
        size = dataset.image_file.size
        fetched = [block for request in s3.proxy.gets(dataset.image_file.name) for block in blocks_of(request)]
        assert sorted(fetched) == list(range(-(-size // BLOCK)))  # each block once: the object's size, downloaded once
        s3.proxy.clear()
        assert len(batches(loader)) == len(served) and s3.proxy.gets() == []  # a warm epoch downloads nothing

    def test_training_resumes_exactly(self, at_url):
        local, dataset, url = at_url
        options = dict(batch_size=3, shuffle=True, seed=4, device="cpu", decode=decoder(dataset.storage))
        loader = DataLoader(dataset, **options)
        loader.set_epoch(1)
        uninterrupted = batches(loader)
        loader.set_epoch(1)
        first = [batch for _, batch in zip(range(2), loader)]
        state = loader.state_dict()
        with open_at(url, dataset.cache.path) as again:
            resumed = DataLoader(again, **options)
            resumed.load_state_dict(state)
            assert same(
                [(images.clone(), labels.clone()) for images, labels in first] + batches(resumed), uninterrupted
            )

    def test_without_a_cache_each_image_is_a_ranged_read(self, s3, pushed):
        local, url = pushed
        with open_at(url, None) as dataset:
            loader = DataLoader(
                dataset, batch_size=4, shuffle=True, seed=0, device="cpu", decode=decoder(dataset.storage)
            )
            assert loader.block_shuffle == 0 and dataset.cache is None
            expected = DataLoader(
                MemmapImageDataset(local),
                batch_size=4,
                shuffle=True,
                seed=0,
                device="cpu",
                decode=decoder(dataset.storage),
            )
            assert same(batches(loader), batches(expected))

    @pytest.mark.parametrize("storage", ["jpeg", "raw"])
    def test_over_https_with_a_signed_url(self, storage, jpeg_dataset, built_dataset, http, http_root, tmp_path):
        local = jpeg_dataset if storage == "jpeg" else built_dataset
        push_memmap(local, (http_root / local.name).as_uri(), progress=False)
        url = f"{http.proxy.url}/{local.name}?X-Amz-Signature=SECRET"
        assert verify_remote(url, progress=False) == []
        with open_at(url, tmp_path / "cache") as dataset:
            assert "SECRET" not in dataset.path + repr(dataset) + dataset.describe(0)
            options = dict(batch_size=5, shuffle=True, seed=1, device="cpu", decode=CenterCropDecode(24))
            loader = DataLoader(dataset, **options)
            assert loader.block_shuffle == 32
            expected = DataLoader(MemmapImageDataset(local), **options)
            loader.set_epoch(2)
            served = batches(loader)
            assert sorted(torch.cat([labels for _, labels in served]).tolist()) == sorted(dataset.targets)
            loader.set_epoch(2)
            first = [batch for _, batch in zip(range(2), loader)]
            resumed = DataLoader(dataset, **options)
            resumed.load_state_dict(loader.state_dict())
            assert same(
                [(images.clone(), labels.clone()) for images, labels in first] + batches(resumed), served
            )  # exact resume
            exact = DataLoader(dataset, **options, block_shuffle=0)
            assert same(batches(exact), batches(expected))
        name = dataset.image_file.name
        assert all(request.path.endswith("X-Amz-Signature=SECRET") for request in http.proxy.gets(name))
        assert not [
            path for path in (tmp_path / "cache").rglob("*") if path.is_file() and b"SECRET" in path.read_bytes()
        ]

    def test_a_file_url_through_fsspec(self, jpeg_dataset, tmp_path):
        url = (tmp_path / "bucket" / "photos.jpeg").as_uri()
        push_memmap(jpeg_dataset, url, progress=False)
        with open_at(url, tmp_path / "cache") as dataset:
            assert dataset.image_file.store.backend == "fsspec"
            options = dict(
                batch_size=6, shuffle=True, seed=3, device="cpu", decode=CenterCropDecode(24), block_shuffle=0
            )
            assert same(
                batches(DataLoader(dataset, **options)),
                batches(DataLoader(MemmapImageDataset(jpeg_dataset), **options)),
            )

    def test_bad_arguments(self, pushed, jpeg_dataset, tmp_path):
        _, url = pushed
        with pytest.raises(
            UsageError, match=r"needs cache_size, the most bytes it may keep on that disk, e.g. cache_size='200GB'"
        ):
            MemmapImageDataset(url, cache=tmp_path / "cache")
        with pytest.raises(UsageError, match="cache_size='1GB' was given without a cache folder"):
            MemmapImageDataset(url, cache_size="1GB")
        with pytest.raises(UsageError, match="are for datasets at a URL; .* is a local folder"):
            MemmapImageDataset(jpeg_dataset, cache=tmp_path / "cache", cache_size="1GB")
        with pytest.raises(
            UsageError, match=r"cache_size='1MB' \(1,000,000 bytes\) is less than one block \(4,194,304"
        ):
            MemmapImageDataset(url, cache=tmp_path / "cache", cache_size="1MB")  # it would keep nothing
        assert not (tmp_path / "cache").exists()


def blocks_of(request) -> list[int]:
    """The blocks a recorded GET's ``Range`` covers."""
    first, last = (int(side) for side in request.headers["Range"].removeprefix("bytes=").split("-"))
    return list(range(first // BLOCK, last // BLOCK + 1))


class TestFaults:
    """Each fault of object storage, end to end through the dataset and the loader."""

    def test_an_object_replaced_during_an_epoch_stops_it_naming_the_object(self, pushed, s3):
        local, url = pushed
        name = "data.memmap" if (local / "data.memmap").exists() else "images.memmap"
        with open_at(url, None) as dataset:  # no cache, no read-ahead: the second batch reads after the change
            loader = DataLoader(
                dataset, batch_size=4, device="cpu", decode=decoder(dataset.storage), prefetch=1, threads=1
            )
            iterator = iter(loader)
            next(iterator)
            data = bytearray((local / name).read_bytes())
            data[-1] ^= 0xFF  # the same size, another ETag
            s3.client().put_object(Bucket=s3.bucket, Key=f"{local.name}/{name}", Body=bytes(data))
            with pytest.raises(ObjectChangedError) as caught:
                list(iterator)
            assert str(caught.value).startswith(f"{url}/{name} changed since it was opened (ETag ")
            assert "open the dataset again to read the new version" in str(caught.value)

    def test_an_object_replaced_before_its_blocks_are_cached_stops_the_read_ahead_and_the_readers(
        self, pushed, s3, tmp_path
    ):
        local, url = pushed
        name = "data.memmap" if (local / "data.memmap").exists() else "images.memmap"
        with open_at(url, tmp_path / "cache") as dataset:
            data = bytearray((local / name).read_bytes())
            data[0] ^= 0xFF
            s3.client().put_object(Bucket=s3.bucket, Key=f"{local.name}/{name}", Body=bytes(data))
            loader = DataLoader(
                dataset, batch_size=4, shuffle=True, seed=0, device="cpu", decode=decoder(dataset.storage)
            )
            with pytest.raises(ObjectChangedError, match=f"{name} changed since it was opened"):
                batches(loader)
            assert not [
                path
                for path in (tmp_path / "cache").glob("objects/*/[0-9]*")
                if json.loads((path.parent / "object.json").read_text())["url"].endswith(f"/{name}")
            ]  # nothing of the new version kept (the index objects are, as opened)

    def test_a_damaged_cached_block_is_dropped_and_fetched_again_once(self, at_url, s3):
        local, dataset, _ = at_url
        options = dict(batch_size=4, shuffle=True, seed=1, device="cpu", decode=decoder(dataset.storage))
        expected = batches(DataLoader(dataset, **options))  # fills the cache
        block = sorted(dataset.cache.path.glob("objects/*/1"))[0]
        block.write_bytes(bytes(block.stat().st_size))  # zeros of the same size (a power cut): only checksums tell
        s3.proxy.clear()
        assert same(batches(DataLoader(dataset, **options)), expected)
        fetched = [block for request in s3.proxy.gets() for block in blocks_of(request)]
        # that block, once, with its neighbours where an image that failed lies across two blocks
        assert 1 in fetched and len(fetched) == len(set(fetched)) and set(fetched) <= {0, 1, 2}
        assert block.read_bytes() != bytes(block.stat().st_size)  # replaced in the cache

    def test_bytes_damaged_at_the_source_are_an_error_naming_the_image(self, pushed, s3, tmp_path):
        local, url = pushed
        name = "data.memmap" if (local / "data.memmap").exists() else "images.memmap"
        s3.client().delete_object(Bucket=s3.bucket, Key=f"{local.name}/manifest.json")
        data = bytearray((local / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        s3.client().put_object(Bucket=s3.bucket, Key=f"{local.name}/{name}", Body=bytes(data))
        s3.client().upload_file(str(local / "manifest.json"), s3.bucket, f"{local.name}/manifest.json")
        with open_at(url, tmp_path / "cache") as dataset:
            loader = DataLoader(dataset, batch_size=4, device="cpu", decode=decoder(dataset.storage))
            with pytest.raises(
                DatasetError,
                match=r"image \d+ \(.*\) does not match its build checksum, also when downloaded again: .* is damaged at bytes \d+-\d+; run gpuload verify on the URL, then push the dataset again",
            ):
                batches(loader)

    @pytest.mark.parametrize("fault", ["503", "reset", "short"])
    def test_transient_failures_are_retried_under_the_loader(self, pushed, s3, fault):
        local, url = pushed
        with open_at(url, None) as dataset:  # no read-ahead: the loader's own reads meet the faults
            options = dict(batch_size=4, shuffle=True, seed=1, device="cpu", decode=decoder(dataset.storage), threads=1)
            s3.proxy.clear()
            s3.proxy.fail(fault, times=3)
            assert same(
                batches(DataLoader(dataset, **options)), batches(DataLoader(MemmapImageDataset(local), **options))
            )
        assert len(s3.proxy.gets()) == 5 + 3  # a request per batch, 3 of them faulted and retried


def test_two_nodes_of_two_ranks_with_torchrun(s3, s3_server, built_dataset, tmp_path):
    """4 ranks on 2 simulated nodes (2 cache folders, a proxy each) read a raw dataset from moto in the
    block-aware order: every image once per epoch, each block downloaded at most once per node, and an
    elastic resume on 2 ranks serves exactly the rest of the epoch."""
    url = s3.url("photos.memmap")
    push_memmap(built_dataset, url, store=open_store(url, retry=FAST_RETRY), progress=False)
    script = str(Path(__file__).with_name("distributed_remote.py"))
    with FaultProxy(s3_server.endpoint) as second:
        nodes = [s3.proxy, second]
        s3.proxy.clear()
        for processes, mode in ((4, "run"), (2, "resume")):
            command = [
                sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
                script, url, str(built_dataset), str(tmp_path / "caches"), ",".join(node.url for node in nodes), mode,
                str(tmp_path),
            ]  # fmt: skip
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
            )
            assert result.returncode == 0, result.stderr[-3000:]
        downloads = [
            [block for request in node.gets("images.memmap") for block in blocks_of_size(request, 32_768)]
            for node in nodes
        ]
    run = [json.loads((tmp_path / f"run{rank}.json").read_text())["served"] for rank in range(4)]
    rest = [json.loads((tmp_path / f"resume{rank}.json").read_text())["served"] for rank in range(2)]
    state = json.loads((tmp_path / "state.json").read_text())
    blocks = MemmapImageDataset(built_dataset).image_blocks(32_768)

    def expected(epoch: int, rank: int, world: int, start: int = 0) -> list[int]:
        return epoch_order(
            20, epoch=epoch, seed=3, shuffle=True, rank=rank, world_size=world, start=start, blocks=blocks, window=1,
            order_world_size=4,
        ).tolist()  # fmt: skip

    assert [served["epoch0"]["indices"] for served in run] == [expected(0, rank, 4) for rank in range(4)]
    assert sorted(sum((served["epoch0"]["indices"] for served in run), [])) == list(range(20))
    assert {served["epoch0"]["length"] for served in run} == {3}  # 5 images a rank, batches of 2
    assert (state["global_position"], state["order_world_size"], state["world_size"]) == (16, 4, 4)
    assert [served["epoch1_rest"]["indices"] for served in rest] == [
        expected(1, rank, 2, start=16) for rank in range(2)
    ]
    epoch1 = sum((served["epoch1_start"]["indices"] for served in run), []) + sum(
        (s["epoch1_rest"]["indices"] for s in rest), []
    )
    assert sorted(epoch1) == list(range(20))  # every image once, across the stop and the resume on 2 ranks
    for node in downloads:  # a node's cache serves its ranks: a block downloaded at most once per node
        assert len(node) == len(set(node)) and node
    assert set(downloads[0]) | set(downloads[1]) == set(range(-(-20 * 9_216 // 32_768)))


def blocks_of_size(request, size: int) -> list[int]:
    first, last = (int(side) for side in request.headers["Range"].removeprefix("bytes=").split("-"))
    return list(range(first // size, last // size + 1))


def test_a_forked_worker_is_told_to_spawn(s3, pushed, tmp_path):
    """obstore's runtime cannot run in a forked process: a stock DataLoader worker started with fork gets
    a clear error instead of a hang."""
    _, url = pushed
    with open_at(url, tmp_path / "cache") as dataset:
        loader = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=1, multiprocessing_context="fork")
        with pytest.raises(
            UsageError, match="obstore cannot run in a forked process: pass multiprocessing_context='spawn'"
        ):
            next(iter(loader))
