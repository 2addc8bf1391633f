"""gpuload.remote.push (and ``gpuload push``): a checked, resumable copy to moto's S3 and to file:// URLs."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import FAST_RETRY

import gpuload.remote.push as push_module
import gpuload.remote.store as remote
from gpuload.cli import main
from gpuload.errors import DatasetError, RemoteError, UsageError
from gpuload.format.manifest import MANIFEST_NAME
from gpuload.remote.dataset import PUSH_MARKER
from gpuload.remote.push import PUSH_RECORD, push_memmap
from gpuload.remote.store import open_store

ROOT = Path(__file__).resolve().parent.parent
JPEG_FILES = [
    "checksums.memmap",
    "data.memmap",
    "labels.memmap",
    "meta.json",
    "offsets.memmap",
    "path_offsets.memmap",
    "paths.memmap",
    "shapes.memmap",
]


@pytest.fixture(params=["s3", "file"])
def target(request, s3, tmp_path):
    """A store of an empty location on moto (through the fault proxy) or on the local disk."""
    if request.param == "s3":
        return open_store(s3.url("photos.jpeg"), retry=FAST_RETRY)
    return open_store((tmp_path / "bucket" / "photos.jpeg").as_uri(), retry=FAST_RETRY)


def pushed(store) -> dict[str, bytes]:
    """The dataset's objects at the URL (the push record aside: the push's own note)."""
    return {name: store.read_all(name) for name in store.list() if name != PUSH_RECORD}


def data_gets(proxy) -> list[str]:
    """The objects of the dataset whose bytes a client read through ``proxy`` (GETs of the manifest
    and of the push record, and listings, aside)."""
    reads = [request.path for request in proxy.gets() if "uploadId=" not in request.path]  # ListParts is no read
    return sorted(name for name in (path.split("?")[0].rsplit("/", 1)[-1] for path in reads) if name in JPEG_FILES)


def local(dataset) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in dataset.iterdir()}


class TestPush:
    def test_a_push_copies_every_file_and_the_manifest_comes_last(self, jpeg_dataset, target, monkeypatch):
        order = []
        put = type(target).put
        monkeypatch.setattr(
            type(target),
            "put",
            lambda self, name, path, **options: order.append(name) or put(self, name, path, **options),
        )
        report = push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        assert pushed(target) == local(jpeg_dataset)
        assert [name for name in order if name != PUSH_RECORD] == [PUSH_MARKER, *JPEG_FILES, MANIFEST_NAME]
        assert order[-1] == PUSH_RECORD  # the marker first, the manifest last, then the record of what it checked
        assert report.uploaded == [*JPEG_FILES, MANIFEST_NAME] and PUSH_MARKER not in target.list()
        assert report.skipped == [] and report.bytes_uploaded == sum(len(data) for data in local(jpeg_dataset).values())
        assert report.summary().startswith(f"pushed to {target.display}: 9 objects uploaded")

    def test_a_second_push_uploads_nothing(self, jpeg_dataset, target, monkeypatch):
        push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        monkeypatch.setattr(type(target), "put", lambda *args: pytest.fail("uploaded again"))
        report = push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        assert report.uploaded == [] and report.skipped == [*JPEG_FILES, MANIFEST_NAME]

    def test_an_interrupted_push_has_no_manifest_and_resumes(self, jpeg_dataset, s3):
        store = open_store(s3.url("photos.jpeg"), retry=FAST_RETRY)
        s3.proxy.fail("503", times=100, methods=("PUT",), path="offsets.memmap")
        with pytest.raises(RemoteError, match=r"PUT s3://.*/photos.jpeg/offsets.memmap failed 3 times"):
            push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        # no manifest: not a dataset; the marker says a push did not finish
        assert sorted(store.list()) == [
            PUSH_MARKER,
            PUSH_RECORD,
            "checksums.memmap",
            "data.memmap",
            "labels.memmap",
            "meta.json",
        ]
        s3.proxy.clear()
        report = push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        assert report.skipped == ["checksums.memmap", "data.memmap", "labels.memmap", "meta.json"]
        assert report.uploaded == [
            "offsets.memmap",
            "path_offsets.memmap",
            "paths.memmap",
            "shapes.memmap",
            MANIFEST_NAME,
        ]
        assert [
            request.path.split("/")[-1].split("?")[0] for request in s3.proxy.requests if request.method == "PUT"
        ] == [
            PUSH_MARKER,
            "offsets.memmap",
            PUSH_RECORD,  # after each object: an interrupted push's finished ones are vouched for
            "path_offsets.memmap",
            PUSH_RECORD,
            "paths.memmap",
            PUSH_RECORD,
            "shapes.memmap",
            PUSH_RECORD,
            MANIFEST_NAME,
            PUSH_RECORD,
        ]
        assert data_gets(s3.proxy) == report.uploaded[:-1]  # each upload read back; what was there: not read
        assert pushed(store) == local(jpeg_dataset)

    @pytest.mark.parametrize("backend", ["obstore", "fsspec"])
    def test_a_second_push_reads_back_no_object(self, jpeg_dataset, s3, backend):
        """The push record vouches for each object's size, ETag and checksum: one LIST and a few small
        GETs (the record, the manifest), none of the data (at 140 GB: hours and egress saved)."""
        store = open_store(s3.url("photos.jpeg"), backend=backend, retry=FAST_RETRY)
        push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        s3.proxy.clear()
        report = push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        assert report.uploaded == [] and report.read_back == [] and data_gets(s3.proxy) == []
        assert [request.method for request in s3.proxy.requests if request.method != "GET"] == []

    def test_a_changed_object_is_still_found_and_only_it_is_read_back(self, jpeg_dataset, s3, tmp_path):
        store = open_store(s3.url("photos.jpeg"), retry=FAST_RETRY)
        push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        damaged = bytearray((jpeg_dataset / "labels.memmap").read_bytes())
        damaged[0] ^= 1
        s3.client().put_object(Bucket=s3.bucket, Key="photos.jpeg/labels.memmap", Body=bytes(damaged))  # a new ETag
        s3.proxy.clear()
        report = push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        assert report.read_back == ["labels.memmap"] and report.uploaded == ["labels.memmap", MANIFEST_NAME]
        assert data_gets(s3.proxy) == ["labels.memmap", "labels.memmap"]  # compared, then read back once uploaded
        assert pushed(store) == local(jpeg_dataset)

    def test_verify_reads_every_object_back(self, jpeg_dataset, s3):
        store = open_store(s3.url("photos.jpeg"), retry=FAST_RETRY)
        push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        s3.proxy.clear()
        report = push_memmap(jpeg_dataset, store.url, store=store, verify=True, progress=False)
        assert report.uploaded == [] and report.read_back == [*JPEG_FILES, MANIFEST_NAME]
        assert data_gets(s3.proxy) == JPEG_FILES
        assert "9 already there, 0 removed, 9 read back to compare" in report.summary()

    def test_without_an_etag_the_record_is_not_believed(self, jpeg_dataset, tmp_path):
        """memory:// gives no version of an object: one replaced by bytes of the same size is found."""
        store = open_store(f"memory://push-{tmp_path.name}/photos.jpeg", retry=FAST_RETRY)
        push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        assert store.info("labels.memmap").etag is None
        (tmp_path / "labels.memmap").write_bytes(bytes((jpeg_dataset / "labels.memmap").stat().st_size))
        store.put("labels.memmap", tmp_path / "labels.memmap")
        report = push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        assert report.uploaded == ["labels.memmap", MANIFEST_NAME] and pushed(store) == local(jpeg_dataset)

    def test_a_record_that_is_not_ours_is_not_believed(self, jpeg_dataset, target, tmp_path):
        push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        (tmp_path / "record").write_text("{not json")
        target.put(PUSH_RECORD, tmp_path / "record")
        report = push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        assert report.uploaded == [] and report.read_back == [*JPEG_FILES, MANIFEST_NAME]  # checked the slow way
        assert json.loads(target.read_all(PUSH_RECORD))["format"] == "gpuload.push-record"  # and noted again

    def test_an_object_that_differs_is_uploaded_again(self, jpeg_dataset, target, tmp_path):
        push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        damaged = tmp_path / "labels.memmap"
        damaged.write_bytes(b"\0" * len((jpeg_dataset / "labels.memmap").read_bytes()))
        target.put("labels.memmap", damaged)  # same size, other bytes
        report = push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        assert report.uploaded == ["labels.memmap", MANIFEST_NAME]
        assert pushed(target) == local(jpeg_dataset)

    def test_an_upload_that_reads_back_other_bytes_stops_before_the_manifest(
        self, jpeg_dataset, target, tmp_path, monkeypatch
    ):
        garbled = tmp_path / "garbled"
        original = type(target)._put

        def damaging(self, name, path, part):
            if name == "data.memmap":
                data = bytearray(path.read_bytes())
                data[100] ^= 0xFF
                garbled.write_bytes(bytes(data))
                path = garbled
            original(self, name, path, part)

        monkeypatch.setattr(type(target), "_put", damaging)
        with pytest.raises(RemoteError, match=r"data.memmap reads back other bytes than .* after its upload"):
            push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        assert MANIFEST_NAME not in target.list()


class TestRefusals:
    def test_a_damaged_dataset_is_not_pushed(self, jpeg_dataset, target, tmp_path):
        copy = shutil.copytree(jpeg_dataset, tmp_path / "copy.jpeg")
        data = bytearray((copy / "data.memmap").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (copy / "data.memmap").write_bytes(bytes(data))
        with pytest.raises(
            DatasetError, match=r"is not intact, so it is not pushed: 1 image does not match its build checksum"
        ):
            push_memmap(copy, target.url, store=target, progress=False)
        assert target.list() == {}

    def test_another_dataset_is_replaced_only_with_overwrite(self, built_dataset, jpeg_dataset, target):
        push_memmap(built_dataset, target.url, store=target, progress=False)
        before = pushed(target)
        with pytest.raises(
            FileExistsError, match=r"holds another gpuload dataset \(20 images from .*\); pass overwrite=True"
        ):
            push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        assert pushed(target) == before
        report = push_memmap(jpeg_dataset, target.url, store=target, overwrite=True, progress=False)
        assert report.removed == ["images.memmap"]
        assert pushed(target) == local(jpeg_dataset)

    def test_what_is_not_a_dataset_is_never_replaced(self, jpeg_dataset, target, tmp_path):
        (tmp_path / "notes.txt").write_text("mine")
        target.put("notes.txt", tmp_path / "notes.txt")
        for overwrite in (False, True):
            with pytest.raises(
                UsageError, match=r"is not a gpuload dataset \(it holds 'notes.txt', no manifest.json and no "
            ):
                push_memmap(jpeg_dataset, target.url, store=target, overwrite=overwrite, progress=False)
        assert sorted(target.list()) == ["notes.txt"]

    def test_a_users_files_with_a_datasets_names_are_never_replaced(self, jpeg_dataset, target, tmp_path):
        """No manifest and no push marker: the user's own meta.json is not a push that did not finish."""
        (tmp_path / "meta.json").write_text('{"my": "notes"}')
        (tmp_path / "labels.memmap").write_bytes(b"mine")
        target.put("meta.json", tmp_path / "meta.json")
        target.put("labels.memmap", tmp_path / "labels.memmap")
        before = pushed(target)
        for overwrite in (False, True):
            with pytest.raises(UsageError, match=r"is not a gpuload dataset \(it holds 'labels.memmap', no manifest"):
                push_memmap(jpeg_dataset, target.url, store=target, overwrite=overwrite, progress=False)
        assert pushed(target) == before

    def test_a_dataset_with_foreign_objects_is_not_replaced(self, built_dataset, jpeg_dataset, target, tmp_path):
        push_memmap(built_dataset, target.url, store=target, progress=False)
        (tmp_path / "notes.txt").write_text("mine")
        target.put("notes.txt", tmp_path / "notes.txt")
        with pytest.raises(UsageError, match=r"also 1 object it does not list \(first 'notes.txt'\)"):
            push_memmap(jpeg_dataset, target.url, store=target, overwrite=True, progress=False)
        assert "notes.txt" in target.list() and "images.memmap" in target.list()

    def test_a_broken_manifest_at_the_url_is_not_replaced(self, jpeg_dataset, target, tmp_path):
        (tmp_path / MANIFEST_NAME).write_text("{not json")
        target.put(MANIFEST_NAME, tmp_path / MANIFEST_NAME)
        with pytest.raises(
            UsageError,
            match=r"is not a valid gpuload dataset: its manifest.json is not valid JSON .*; push never replaces it",
        ):
            push_memmap(jpeg_dataset, target.url, store=target, overwrite=True, progress=False)
        assert sorted(target.list()) == [MANIFEST_NAME]

    @pytest.mark.parametrize("where", ["inner", "", ".."])
    def test_a_file_url_inside_or_around_the_dataset_is_refused(self, jpeg_dataset, where):
        before = local(jpeg_dataset)
        url = (jpeg_dataset / where).resolve().as_uri() if where else jpeg_dataset.as_uri()
        with pytest.raises(UsageError, match=r"the dataset .* that it would receive; push to a folder outside it"):
            push_memmap(jpeg_dataset, url, progress=False)
        assert local(jpeg_dataset) == before and not (jpeg_dataset / "inner").exists()

    @pytest.mark.parametrize("backend", ["obstore", "fsspec"])
    def test_a_missing_bucket_is_one_line_that_says_to_create_it(self, jpeg_dataset, s3, backend):
        store = open_store(f"s3://missing-{s3.bucket}/photos.jpeg", backend=backend, retry=FAST_RETRY)
        with pytest.raises(RemoteError, match=rf"^no such bucket: missing-{s3.bucket} at .*; create it first"):
            push_memmap(jpeg_dataset, store.url, store=store, progress=False)

    def test_http_is_read_only(self, jpeg_dataset, http):
        with pytest.raises(UsageError, match="cannot be listed or written; push to s3:// or file://"):
            push_memmap(jpeg_dataset, f"{http.url}/photos.jpeg", progress=False)


def errors(stderr: str) -> list[str]:
    """The lines of ``stderr`` that are not progress bars."""
    return [line for line in stderr.replace("\r", "\n").split("\n") if line.startswith("gpuload:")]


class TestCommandLine:
    def test_push_prints_a_summary(self, capsys, jpeg_dataset, s3):
        assert main(["push", str(jpeg_dataset), s3.url("photos.jpeg")]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"pushed to {s3.url('photos.jpeg')}: 9 objects uploaded") and "0 already there" in out
        assert main(["push", str(jpeg_dataset), s3.url("photos.jpeg")]) == 0
        assert "0 objects uploaded (0 bytes), 9 already there, 0 removed" in capsys.readouterr().out
        assert main(["push", "--verify", str(jpeg_dataset), s3.url("photos.jpeg")]) == 0
        assert (
            "0 objects uploaded (0 bytes), 9 already there, 0 removed, 9 read back to compare"
            in capsys.readouterr().out
        )

    def test_errors_are_one_line_with_exit_code_2(self, capsys, built_dataset, jpeg_dataset, s3, monkeypatch):
        monkeypatch.setattr(push_module, "open_store", lambda url: open_store(url, retry=FAST_RETRY))
        assert main(["push", str(built_dataset), s3.url("photos")]) == 0
        capsys.readouterr()
        assert main(["push", str(jpeg_dataset), s3.url("photos")]) == 2
        [error] = errors(capsys.readouterr().err)  # one line, beside the progress bars
        assert error.startswith(f"gpuload: error: {s3.url('photos')} holds another gpuload dataset")
        s3.proxy.fail("503", times=100, methods=("PUT",))
        assert main(["push", str(jpeg_dataset), s3.url("other")]) == 2
        [error] = errors(capsys.readouterr().err)
        assert error.startswith(f"gpuload: error: PUT {s3.url('other')}/{PUSH_MARKER} failed 3 times")

    def test_a_presigned_url_never_shows_its_secret(self, capsys, jpeg_dataset, http):
        assert main(["push", str(jpeg_dataset), f"{http.url}/d?X-Amz-Signature=TOPSECRET"]) == 2
        err = capsys.readouterr().err
        assert "TOPSECRET" not in err and "?<redacted>" in err


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of at least 1 KiB, at most 4 of them (90 % of 5): data.memmap (about 30 KB) goes up in 4
    parts; moto's least part size lowered to match (its server runs in this process)."""
    import moto.s3.models

    monkeypatch.setattr(remote, "MIN_PART", 1024)
    monkeypatch.setattr(remote, "MAX_PARTS", 5)
    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 1024)


def part_puts(proxy, name: str = "data.memmap") -> list[int]:
    """The part numbers of the UploadPart requests of ``name`` that the proxy saw, sorted."""
    return sorted(
        int(re.search(r"partNumber=(\d+)", r.path)[1])
        for r in proxy.requests
        if f"/{name}?" in r.path and "partNumber=" in r.path
    )


def unfinished(s3) -> list[str]:
    """The keys of the multipart uploads in the bucket that were neither completed nor aborted."""
    return sorted(upload["Key"] for upload in s3.client().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []))


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
class TestLargeObjects:
    def test_a_large_object_goes_up_in_parts_and_a_failed_part_is_retried_alone(
        self, jpeg_dataset, s3, small_parts, backend
    ):
        store = open_store(s3.url("photos.jpeg"), backend=backend, retry=FAST_RETRY)
        s3.proxy.fail("503", times=1, methods=("PUT",), path="partNumber=3")
        push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        assert part_puts(s3.proxy) == [1, 2, 3, 3, 4]
        assert pushed(store) == local(jpeg_dataset) and unfinished(s3) == []

    def test_a_part_that_fails_for_good_leaves_no_hidden_parts(self, jpeg_dataset, s3, small_parts, backend):
        store = open_store(s3.url("photos.jpeg"), backend=backend, retry=FAST_RETRY)
        s3.proxy.fail("503", times=100, methods=("PUT",), path="partNumber=3")
        with pytest.raises(RemoteError, match=r"PUT s3://.*/photos.jpeg/data.memmap part 3 of 4 failed 3 times"):
            push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        assert unfinished(s3) == [] and MANIFEST_NAME not in store.list()

    def test_a_push_killed_mid_object_resumes_its_parts_and_leaves_no_unfinished_upload(
        self, jpeg_dataset, s3, small_parts, backend
    ):
        """kill -9 while part 4 of data.memmap is on the wire (parts 1 to 3 stored): the next push uploads
        part 4 alone, completes the upload, and no multipart upload is left."""
        s3.proxy.fail("stall", times=1, methods=("PUT",), path="partNumber=4")
        child = textwrap.dedent(f"""
            import gpuload.remote.store as remote
            from gpuload.remote.push import push_memmap
            remote.MIN_PART, remote.MAX_PARTS = 1024, 5
            store = remote.open_store({s3.url("photos.jpeg")!r}, backend={backend!r})
            push_memmap({str(jpeg_dataset)!r}, store.url, store=store, progress=False)
        """)
        process = subprocess.Popen([sys.executable, "-c", child], env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            deadline = time.monotonic() + 60
            while not (4 in part_puts(s3.proxy) and len(stored_parts(s3, "photos.jpeg/data.memmap")) == 3):
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.02)
        finally:
            process.kill()
            process.wait(10)
        assert unfinished(s3) == ["photos.jpeg/data.memmap"]  # parts 1 to 3, hidden
        s3.proxy.clear()
        store = open_store(s3.url("photos.jpeg"), backend=backend, retry=FAST_RETRY)
        report = push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        assert part_puts(s3.proxy) == [4] and "data.memmap" in report.uploaded
        assert "checksums.memmap" in report.skipped  # uploaded before the kill, and not read back
        assert data_gets(s3.proxy) == sorted(name for name in report.uploaded if name != MANIFEST_NAME)
        assert pushed(store) == local(jpeg_dataset) and unfinished(s3) == []

    def test_unfinished_uploads_a_push_left_are_aborted_and_others_left_alone(self, jpeg_dataset, s3, backend):
        client = s3.client()
        for key in ("photos.jpeg/images.memmap", "photos.jpeg/notes.bin"):  # a raw dataset's, and the user's own
            client.create_multipart_upload(Bucket=s3.bucket, Key=key)
        store = open_store(s3.url("photos.jpeg"), backend=backend, retry=FAST_RETRY)
        report = push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        assert report.aborted == ["images.memmap"] and "1 unfinished upload aborted" in report.summary()
        assert unfinished(s3) == ["photos.jpeg/notes.bin"]


def stored_parts(s3, key: str) -> list[int]:
    """The parts stored so far of the one unfinished upload of ``key`` (none when there is none)."""
    client = s3.client()
    uploads = [
        upload for upload in client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) if upload["Key"] == key
    ]
    if not uploads:
        return []
    parts = client.list_parts(Bucket=s3.bucket, Key=key, UploadId=uploads[0]["UploadId"]).get("Parts", [])
    return [part["PartNumber"] for part in parts]


class TestKilledAndConcurrentPushes:
    def test_a_file_push_killed_mid_upload_resumes(self, jpeg_dataset, tmp_path):
        """kill -9 during a file:// upload leaves the marker and ``.<name>.tmp-<pid>-<thread>``: ours, removed."""
        store = open_store((tmp_path / "bucket" / "photos.jpeg").as_uri(), retry=FAST_RETRY)
        folder = tmp_path / "bucket" / "photos.jpeg"
        folder.mkdir(parents=True)
        (folder / PUSH_MARKER).write_text('{"push": "dead"}')
        shutil.copy(jpeg_dataset / "meta.json", folder / "meta.json")
        dead = 2**30  # beyond any pid_max: its writer is gone
        (folder / f".data.memmap.tmp-{dead}-139724954659712").write_bytes(b"half")
        report = push_memmap(jpeg_dataset, store.url, store=store, progress=False)
        assert report.skipped == ["meta.json"] and report.removed == [f".data.memmap.tmp-{dead}-139724954659712"]
        assert pushed(store) == local(jpeg_dataset)

    def test_a_push_killed_after_its_manifest_is_complete_and_loses_its_marker(self, jpeg_dataset, target, tmp_path):
        push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        (tmp_path / "marker").write_text('{"push": "dead"}')
        target.put(PUSH_MARKER, tmp_path / "marker")
        report = push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        assert report.uploaded == [] and pushed(target) == local(jpeg_dataset)

    def test_a_temporary_file_of_a_running_push_is_left_alone(self, jpeg_dataset, tmp_path):
        folder = tmp_path / "bucket" / "photos.jpeg"
        folder.mkdir(parents=True)
        (folder / PUSH_MARKER).write_text('{"push": "running"}')
        running = folder / f".data.memmap.tmp-{os.getpid()}-1"  # this process is alive
        running.write_bytes(b"half")
        with pytest.raises(UsageError, match=rf"another push \(process {os.getpid()}\) is writing"):
            push_memmap(jpeg_dataset, folder.as_uri(), progress=False)
        assert running.read_bytes() == b"half"

    def test_a_marker_push_did_not_write_is_not_ours(self, jpeg_dataset, tmp_path):
        folder = tmp_path / "bucket" / "photos.jpeg"
        folder.mkdir(parents=True)
        (folder / PUSH_MARKER).write_text("not json")
        (folder / "meta.json").write_text("{}")
        with pytest.raises(UsageError, match=r"is not a gpuload dataset \(it holds '.gpuload-push.json'"):
            push_memmap(jpeg_dataset, folder.as_uri(), progress=False)
        assert (folder / "meta.json").read_text() == "{}"

    def test_a_push_that_finishes_while_another_looks_stops_the_other(self, built_dataset, jpeg_dataset, target):
        """B lists the URL while A runs, A finishes, then B writes its marker: B must not replace A's
        finished dataset without --overwrite (it re-lists after its marker and stops)."""
        same = push_module._same_objects

        def meanwhile(*args):
            found = same(*args)
            push_module._same_objects = same
            push_memmap(built_dataset, target.url, store=target, progress=False)  # A, to the end
            return found

        push_module._same_objects = meanwhile
        try:
            with pytest.raises(RemoteError, match=r"another push wrote .* while this one looked at it"):
                push_memmap(jpeg_dataset, target.url, store=target, progress=False)  # B
        finally:
            push_module._same_objects = same
        assert "images.memmap" in target.list() and MANIFEST_NAME in target.list()  # A's dataset, whole

    def test_a_temporary_name_not_of_ours_is_foreign(self, jpeg_dataset, tmp_path):
        folder = tmp_path / "bucket" / "photos.jpeg"
        folder.mkdir(parents=True)
        (folder / ".notes.txt.tmp-1-2").write_text("mine")
        with pytest.raises(UsageError, match=r"it holds '.notes.txt.tmp-1-2'"):
            push_memmap(jpeg_dataset, folder.as_uri(), progress=False)

    @pytest.mark.parametrize("when", ["before_manifest", "after_manifest"])
    def test_a_push_that_another_took_over_stops_and_leaves_no_dataset(self, jpeg_dataset, target, tmp_path, when):
        """Another push writes its marker (a new token) while this one runs: this one stops, and does not
        leave its manifest over objects that may be the other's."""
        check = push_module._check_still_ours

        def meanwhile(store, token, versions, *, written=False):
            if written == (when == "after_manifest"):
                (tmp_path / "other").write_text('{"push": "another"}')
                store.put(PUSH_MARKER, tmp_path / "other")
            return check(store, token, versions, written=written)

        push_module._check_still_ours = meanwhile
        try:
            with pytest.raises(RemoteError, match=r"another push wrote .* \(its push marker was replaced\)"):
                push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        finally:
            push_module._check_still_ours = check
        assert MANIFEST_NAME not in target.list()

    def test_an_object_replaced_by_another_push_stops_this_one(self, jpeg_dataset, target, tmp_path, monkeypatch):
        upload = push_module._upload

        def then_replaced(store, name, path, *args):
            info = upload(store, name, path, *args)
            if name == "offsets.memmap":
                (tmp_path / "theirs").write_bytes(b"\1" * path.stat().st_size)
                store.put("labels.memmap", tmp_path / "theirs")  # another push's labels, after ours
            return info

        monkeypatch.setattr(push_module, "_upload", then_replaced)
        with pytest.raises(RemoteError, match=r"another push wrote .* \('labels.memmap' was replaced\)"):
            push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        assert MANIFEST_NAME not in target.list()


def test_the_manifest_pushed_is_byte_for_byte_the_local_one(jpeg_dataset, tmp_path):
    store = open_store((tmp_path / "out").as_uri())
    push_memmap(jpeg_dataset, store.url, store=store, progress=False)
    assert json.loads(store.read_all(MANIFEST_NAME)) == json.loads((jpeg_dataset / MANIFEST_NAME).read_text())
