"""gpuload.store.remote_dataset: a pushed dataset opened from moto's S3 and from the Range HTTP server."""

import numpy as np
import pytest
import xxhash
from conftest import FAST_RETRY

from gpuload.cli import main
from gpuload.errors import DatasetError, UsageError
from gpuload.store.dataset import MemmapImageDataset
from gpuload.store.push import push_memmap
from gpuload.store.remote import open_store
from gpuload.store.remote_dataset import describe_remote, open_remote, verify_remote
from gpuload.store.verify import describe_memmap


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
        with pytest.raises(DatasetError, match="has no manifest.json but holds objects: a push that did not finish"):
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

    def test_wrong_labels(self, pushed, s3):
        local, url = pushed
        labels = np.fromfile(local / "labels.memmap", dtype=np.int64)
        labels[3] = (labels[3] + 1) % 5
        s3.client().put_object(Bucket=s3.bucket, Key=f"{local.name}/labels.memmap", Body=labels.tobytes())
        with pytest.raises(
            DatasetError, match=r"1 labels in labels.memmap differ from the manifest \(first at index 3"
        ):
            open_remote(url)

    def test_damaged_images_are_reported(self, pushed, s3):
        local, url = pushed
        name = "data.memmap" if (local / "data.memmap").exists() else "images.memmap"
        data = bytearray((local / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        s3.client().put_object(Bucket=s3.bucket, Key=f"{local.name}/{name}", Body=bytes(data))
        [problem] = verify_remote(url, progress=False)
        assert problem.startswith("1 images do not match their build checksum: ")


class TestCommandLine:
    def test_info_and_verify_take_urls(self, capsys, pushed, s3):
        local, url = pushed
        assert main(["info", url]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"{url}\n") and "classes: 5" in out
        assert main(["verify", url]) == 0
        assert capsys.readouterr().out.endswith(f"{url}: OK\n")
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
