"""gpuload.store.push (and ``gpuload push``): a checked, resumable copy to moto's S3 and to file:// URLs."""

import json
import os
import shutil

import pytest
from conftest import FAST_RETRY

import gpuload.store.push as push_module
from gpuload.cli import main
from gpuload.errors import DatasetError, RemoteError, UsageError
from gpuload.store.manifest import MANIFEST_NAME
from gpuload.store.push import push_memmap
from gpuload.store.remote import open_store
from gpuload.store.remote_dataset import PUSH_MARKER

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
    return {name: store.read_all(name) for name in store.list()}


def local(dataset) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in dataset.iterdir()}


class TestPush:
    def test_a_push_copies_every_file_and_the_manifest_comes_last(self, jpeg_dataset, target, monkeypatch):
        order = []
        put = type(target).put
        monkeypatch.setattr(type(target), "put", lambda self, name, path: order.append(name) or put(self, name, path))
        report = push_memmap(jpeg_dataset, target.url, store=target, progress=False)
        assert pushed(target) == local(jpeg_dataset)
        assert order == [PUSH_MARKER, *JPEG_FILES, MANIFEST_NAME]  # the marker first, the manifest last
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
        assert sorted(store.list()) == [PUSH_MARKER, "checksums.memmap", "data.memmap", "labels.memmap", "meta.json"]
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
            "path_offsets.memmap",
            "paths.memmap",
            "shapes.memmap",
            MANIFEST_NAME,
        ]
        assert pushed(store) == local(jpeg_dataset)

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
            DatasetError, match=r"is not intact, so it is not pushed: 1 images do not match their build checksum"
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
        with pytest.raises(UsageError, match=r"also 1 objects it does not list \(first 'notes.txt'\)"):
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
        assert "0 objects uploaded (0.00 GB), 9 already there" in capsys.readouterr().out

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

        def meanwhile(store, existing, todo, bar):
            found = same(store, existing, todo, bar)
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

        def then_replaced(store, name, path, bar):
            info = upload(store, name, path, bar)
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
