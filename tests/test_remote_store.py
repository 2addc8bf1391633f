"""gpuload.remote.store against real servers on 127.0.0.1: moto's S3 and a Range HTTP server, behind a fault proxy."""

import os
import random
import re
import shutil
import threading
import time

import pytest
from conftest import FAST_RETRY
from servers import RangeHTTPServer, fake_aws_environment

import gpuload.remote.store as remote
from gpuload.cli import main
from gpuload.errors import UsageError
from gpuload.remote.store import (
    ObjectChangedError,
    ObjectInfo,
    RemoteError,
    Retry,
    is_url,
    join_url,
    open_store,
    redact,
)

PAYLOAD = bytes(random.Random(0).randbytes(300_000))
S3_BACKENDS = ["obstore", "fsspec"]


@pytest.fixture(params=["s3-obstore", "s3-fsspec", "http"])
def served(request, s3, http, http_root):
    """``(store, proxy, replace)`` for one object ``data.memmap`` holding PAYLOAD, on each backend;
    ``replace(data)`` writes a new version of it."""
    if request.param == "http":
        (http_root / "ds").mkdir()
        path = http_root / "ds" / "data.memmap"
        path.write_bytes(PAYLOAD)

        def replace(data: bytes) -> None:
            path.write_bytes(data)
            os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))

        return open_store(f"{http.proxy.url}/ds?X-Amz-Signature=SECRET", retry=FAST_RETRY), http.proxy, replace
    client = s3.client()
    client.put_object(Bucket=s3.bucket, Key="ds/data.memmap", Body=PAYLOAD)

    def replace(data: bytes) -> None:
        client.put_object(Bucket=s3.bucket, Key="ds/data.memmap", Body=data)

    backend = request.param.removeprefix("s3-")
    return open_store(s3.url("ds"), backend=backend, retry=FAST_RETRY), s3.proxy, replace


class TestUrls:
    def test_is_url(self):
        assert is_url("s3://b/k") and is_url("file:///tmp/x") and is_url("https://h/p")
        assert not is_url("photos.jpeg") and not is_url("/data/photos") and not is_url(os.path.join("c:", "x"))

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("https://host/d?X-Amz-Signature=abc&X-Amz-Credential=k", "https://host/d?<redacted>"),
            ("https://user:pass@host/d", "https://<redacted>@host/d"),
            ("error at s3://bucket/key: 503", "error at s3://bucket/key: 503"),
            ("GET 'https://t@h/a?sig=1' failed", "GET 'https://<redacted>@h/a?<redacted>' failed"),
            ("http://host/ds.jpeg#frag=SECRET", "http://host/ds.jpeg#<redacted>"),
            ("https://h/d?sig=1#t=2 failed", "https://h/d?<redacted>#<redacted> failed"),
        ],
    )
    def test_redact_removes_query_strings_and_userinfo(self, text, expected):
        assert redact(text) == expected

    def test_join_url_keeps_the_query_at_the_end(self):
        assert join_url("https://h/ds/?sig=1", "meta.json") == "https://h/ds/meta.json?sig=1"

    @pytest.mark.parametrize(
        ("url", "backend", "match"),
        [
            ("photos.jpeg", "auto", "expected a URL such as s3://bucket/path"),
            ("s3://b/k", "boto", "backend must be one of auto, obstore, fsspec, got 'boto'"),
            ("https://h/k", "obstore", "the obstore backend opens s3, gs, az, abfs, abfss URLs, not https://"),
        ],
    )
    def test_bad_arguments(self, url, backend, match):
        with pytest.raises(UsageError, match=match):
            open_store(url, backend=backend)

    def test_file_localhost_is_this_machines_root_and_other_hosts_are_refused(self, tmp_path):
        (tmp_path / "ds").mkdir()
        (tmp_path / "ds" / "a").write_bytes(b"x")
        assert sorted(open_store(f"file://localhost{tmp_path}/ds").list()) == ["a"]
        with pytest.raises(UsageError, match=r"file:// URLs name this machine's files"):
            open_store(f"file://server{tmp_path}/ds")

    def test_an_http_url_with_a_fragment_is_refused(self):
        with pytest.raises(UsageError, match=r"takes no fragment, got http://127.0.0.1:9/x#<redacted>"):
            open_store("http://127.0.0.1:9/x#SECRET")

    def test_a_scheme_in_capitals_is_the_same_scheme(self, s3):
        upper = "S3://" + s3.url().split("://", 1)[1]
        assert open_store(upper).display == s3.url() and open_store("MEMORY://x/y").list() == {}

    @pytest.mark.parametrize("url", ["file:///tmp/ds?token=SECRET", "file:///tmp/ds#SECRET", "memory://x/y?a=SECRET"])
    def test_a_folder_url_with_a_query_is_refused_without_showing_it(self, url, tmp_path):
        with pytest.raises(UsageError, match=r"names a folder and takes no query string or fragment") as raised:
            open_store(url)
        assert "SECRET" not in str(raised.value)

    def test_a_filesystem_that_connects_as_it_is_made_fails_in_one_line(self):
        pytest.importorskip("fsspec.implementations.ftp")
        with pytest.raises(RemoteError, match=r"^cannot open ftp://127.0.0.1:1/x: .*; check the URL, the network"):
            open_store("ftp://127.0.0.1:1/x", retry=FAST_RETRY)  # nothing listens on port 1

    def test_auto_picks_obstore_for_s3_and_fsspec_for_the_rest(self, s3, monkeypatch):
        monkeypatch.delenv("GPULOAD_REMOTE_BACKEND", raising=False)
        assert open_store(s3.url()).backend == "obstore"
        assert open_store("memory://x/y").backend == "fsspec"
        monkeypatch.setenv("GPULOAD_REMOTE_BACKEND", "fsspec")
        assert open_store(s3.url()).backend == "fsspec"

    @pytest.mark.parametrize("bad", [{"attempts": 0}, {"base_delay": -1}, {"timeout": 0}])
    def test_bad_retry_policy(self, bad):
        with pytest.raises(UsageError, match="Retry"):
            Retry(**bad)


class TestReads:
    def test_info_and_ranges(self, served):
        store, _, _ = served
        info = store.info("data.memmap")
        assert info.size == len(PAYLOAD) and info.etag
        assert store.read("data.memmap", 1000, 5000, info) == PAYLOAD[1000:6000]
        assert store.read("data.memmap", len(PAYLOAD) - 7, 7, info) == PAYLOAD[-7:]
        assert store.read_all("data.memmap") == PAYLOAD

    def test_a_missing_object(self, served):
        store, _, _ = served
        with pytest.raises(FileNotFoundError):
            store.info("nope.memmap")

    def test_a_range_beyond_the_object_is_refused_before_any_request(self, served):
        store, proxy, _ = served
        info = store.info("data.memmap")
        proxy.clear()
        with pytest.raises(RemoteError, match=r"bytes 299999-300009 lie beyond its 300,000 bytes"):
            store.read("data.memmap", len(PAYLOAD) - 1, 11, info)
        assert proxy.gets() == []

    @pytest.mark.parametrize("fault", ["503", "500", "reset", "short"])
    def test_transient_faults_are_retried(self, served, fault):
        store, proxy, _ = served
        info = store.info("data.memmap")
        proxy.clear()
        proxy.fail(fault, times=FAST_RETRY.attempts - 1)
        assert store.read("data.memmap", 10, 100_000, info) == PAYLOAD[10:100_010]
        assert len(proxy.gets()) == FAST_RETRY.attempts  # the faulted ones, then the good one

    def test_info_is_retried_too(self, served):
        store, proxy, _ = served
        proxy.clear()
        proxy.fail("503", times=FAST_RETRY.attempts - 1, methods=("HEAD",))
        assert store.info("data.memmap").size == len(PAYLOAD)
        assert [request.method for request in proxy.requests] == ["HEAD"] * FAST_RETRY.attempts
        proxy.clear()
        proxy.fail("503", times=10, methods=("HEAD",))
        with pytest.raises(RemoteError, match=r"^HEAD .*/data.memmap(\?<redacted>)? failed 3 times"):
            store.info("data.memmap")  # a server in trouble is not a missing object

    def test_a_stalled_request_times_out_and_is_retried(self, served):
        store, proxy, _ = served
        info = store.info("data.memmap")
        quick = Retry(attempts=2, base_delay=0.001, timeout=0.5)
        store = open_store(store.url, backend=store.backend, retry=quick)
        proxy.clear()
        proxy.fail("stall", times=1)
        started = time.perf_counter()
        assert store.read("data.memmap", 0, 10, info) == PAYLOAD[:10]
        assert time.perf_counter() - started < 4  # the stall lasts 5 s: the timeout cut it
        assert len(proxy.gets()) == 2

    def test_a_trickling_answer_is_cut_at_its_deadline_and_retried(self, served):
        """Each piece of the body comes well within the read timeout, the whole would take 5 s: the
        request's deadline (2 s) cuts it, and the retry gets the answer. (A read timeout of 0.5 s and a
        deadline of 1 s cut a busy CI machine's retry too: pieces come every 0.1 s, so 1 s is room enough.)"""
        store, proxy, _ = served
        info = store.info("data.memmap")
        quick = Retry(attempts=2, base_delay=0.001, timeout=1.0, deadline=2.0)
        store = open_store(store.url, backend=store.backend, retry=quick)
        proxy.clear()
        proxy.fail("trickle", times=1)
        started = time.perf_counter()
        assert store.read("data.memmap", 0, 100_000, info) == PAYLOAD[:100_000]
        assert time.perf_counter() - started < 4.5  # the trickle alone takes 5 s
        assert len(proxy.gets()) == 2

    def test_retries_are_bounded_and_the_error_names_the_url_and_range_without_secrets(self, served):
        store, proxy, _ = served
        info = store.info("data.memmap")
        proxy.clear()
        proxy.fail("503", times=10)
        with pytest.raises(RemoteError) as caught:
            store.read("data.memmap", 10, 5, info)
        message = str(caught.value)
        assert message.startswith(f"GET {store.object_url('data.memmap')} bytes 10-14 failed 3 times, last: ")
        assert "SECRET" not in message and "\n" not in message
        assert "<?xml" not in message  # the server's XML error as its code and message
        assert len(proxy.gets()) == FAST_RETRY.attempts

    def test_an_object_replaced_after_open_stops_the_read_without_retrying(self, served):
        store, proxy, replace = served
        info = store.info("data.memmap")
        replace(PAYLOAD[::-1])
        proxy.clear()
        with pytest.raises(ObjectChangedError, match="changed since it was opened"):
            store.read("data.memmap", 0, 10, info)
        assert len(proxy.gets()) == 1
        assert store.info("data.memmap") != info

    def test_a_server_that_ignores_range_is_an_error(self, http, http_root):
        (http_root / "ds").mkdir()
        (http_root / "ds" / "data.memmap").write_bytes(PAYLOAD)
        store = open_store(f"{http.url}/ds", retry=FAST_RETRY)
        info = store.info("data.memmap")
        original = store._read
        store._read = lambda name, start, length, expect: original(name, 0, len(PAYLOAD), expect)
        with pytest.raises(RemoteError, match="does not honour HTTP Range requests"):
            store.read("data.memmap", 10, 5, info)


@pytest.mark.parametrize("client", ["http", *S3_BACKENDS])
def test_a_server_that_ignores_range_is_refused_before_its_body_is_read(http_root, monkeypatch, client):
    """A 64 MiB object answered whole to a GET of 5 bytes (over HTTP, or as an S3 endpoint): refused on
    its status and length, not retried, and the client stops reading (the server could send no more
    than the sockets' buffers hold)."""
    (http_root / "bucket-1" / "ds").mkdir(parents=True)
    (http_root / "bucket-1" / "ds" / "data.memmap").write_bytes(bytes(64 * 2**20))
    with RangeHTTPServer(http_root, ignore_range=True) as server:
        if client == "http":
            store = open_store(f"{server.url}/bucket-1/ds", retry=FAST_RETRY)
        else:
            for name, value in fake_aws_environment(server.url).items():
                monkeypatch.setenv(name, value)
            store = open_store("s3://bucket-1/ds", backend=client, retry=FAST_RETRY)
        info = store.info("data.memmap")
        with pytest.raises(
            RemoteError, match=r"data.memmap: asked for bytes 10-14 and got .*does not honour HTTP Range"
        ):
            store.read("data.memmap", 10, 5, info)
        assert [request.method for request in server.requests] == ["HEAD", "GET"]  # not retried
        time.sleep(0.2)  # the server's thread writes until the client's socket is gone
        assert server.bytes_sent < 32 * 2**20


class TestSecrets:
    def test_an_object_gone_between_its_head_and_its_get_is_named_without_secrets(self, served):
        store, proxy, _ = served
        info = store.info("data.memmap")
        proxy.fail("404")
        with pytest.raises(FileNotFoundError) as caught:
            store.read("data.memmap", 0, 10, info)
        assert "data.memmap" in str(caught.value) and "SECRET" not in str(caught.value)

    def test_verify_of_a_presigned_url_never_prints_its_secret(self, capsys, jpeg_dataset, http, http_root):
        shutil.copytree(jpeg_dataset, http_root / "photos.jpeg")
        http.proxy.fail("404", path="data.memmap")  # HEAD answers, the GET of the images does not
        assert main(["verify", f"{http.proxy.url}/photos.jpeg?X-Amz-Signature=SECRET"]) == 2
        out, err = capsys.readouterr()
        assert "data.memmap" in err and "SECRET" not in out + err

    @pytest.mark.parametrize("classify", [remote._classify, remote._classify_client])
    def test_a_long_message_is_redacted_before_it_is_cut(self, classify):
        """A message cut inside ``user:password@`` no longer looks like userinfo: redact, then cut."""
        text = "x" * 283 + " https://user:hunter2@host/a.bin?X-Amz-Signature=SECRET failed"
        message = str(classify(Exception(text)))
        assert "hun" not in message and "SECRET" not in message


@pytest.mark.parametrize("backend", S3_BACKENDS)
class TestMissingBucket:
    def test_listing_a_missing_bucket_says_so_in_one_line(self, s3, backend):
        store = open_store(f"s3://missing-{s3.bucket}/ds", backend=backend, retry=FAST_RETRY)
        with pytest.raises(
            RemoteError, match=rf"^no such bucket: missing-{s3.bucket} at s3://missing-{s3.bucket}/ds; create it first"
        ) as caught:
            store.list()
        assert "\n" not in str(caught.value) and "<?xml" not in str(caught.value)

    def test_opening_a_dataset_in_a_missing_bucket_says_so(self, s3, backend):
        from gpuload.remote.dataset import open_remote

        store = open_store(f"s3://missing-{s3.bucket}/ds", backend=backend, retry=FAST_RETRY)
        with pytest.raises(RemoteError, match=rf"^no such bucket: missing-{s3.bucket} at "):
            open_remote(store)


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of at least 1 KiB, at most 4 of them (90 % of 5); moto's least part size lowered to match
    (its server runs in this process)."""
    import moto.s3.models

    monkeypatch.setattr(remote, "MIN_PART", 1024)
    monkeypatch.setattr(remote, "MAX_PARTS", 5)
    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 1024)


def part_puts(proxy) -> list[int]:
    """The part numbers of the UploadPart requests the proxy saw, in order."""
    return [int(re.search(r"partNumber=(\d+)", r.path)[1]) for r in proxy.requests if "partNumber=" in r.path]


def test_the_part_size_keeps_a_margin_below_s3s_10000_parts():
    for size in (1, 10**9, 52 * 10**9, 150 * 10**9, 10**12, remote.MAX_OBJECT):
        part = remote.part_size(size)
        assert 5 * 2**20 <= part <= remote.MAX_PART and -(-size // part) <= 9_000
    assert -(-150 * 10**9 // (5 * 2**20)) > 10_000  # obstore's default 5 MiB parts: 28,611 of them


@pytest.mark.parametrize("backend", S3_BACKENDS)
class TestMultipart:
    def test_a_large_file_goes_up_in_parts_and_a_failed_part_is_retried_alone(self, s3, tmp_path, small_parts, backend):
        (tmp_path / "big").write_bytes(PAYLOAD)  # 4 parts of 75,000 bytes
        store = open_store(s3.url("ds"), backend=backend, retry=FAST_RETRY)
        s3.proxy.fail("503", times=1, methods=("PUT",), path="partNumber=2")
        assert store.put("data.memmap", tmp_path / "big").size == len(PAYLOAD)
        assert store.read_all("data.memmap") == PAYLOAD
        assert sorted(part_puts(s3.proxy)) == [1, 2, 2, 3, 4]  # part 2 again, and only it
        assert store.uploads() == []

    def test_a_part_that_keeps_failing_aborts_the_upload(self, s3, tmp_path, small_parts, backend):
        (tmp_path / "big").write_bytes(PAYLOAD)
        store = open_store(s3.url("ds"), backend=backend, retry=FAST_RETRY)
        s3.proxy.fail("503", times=100, methods=("PUT",), path="partNumber=3")
        with pytest.raises(RemoteError, match=r"^PUT s3://.*/ds/data.memmap part 3 of 4 failed 3 times, last: "):
            store.put("data.memmap", tmp_path / "big")
        assert "Uploads" not in s3.client().list_multipart_uploads(Bucket=s3.bucket)  # no hidden parts left
        assert store.list() == {}

    def test_an_unfinished_upload_is_resumed_with_the_parts_that_hold_the_files_bytes(
        self, s3, tmp_path, small_parts, backend
    ):
        (tmp_path / "big").write_bytes(PAYLOAD)
        client = s3.client()  # a push killed after two parts, the second of other bytes
        started = client.create_multipart_upload(Bucket=s3.bucket, Key="ds/data.memmap")["UploadId"]
        for number, data in ((1, PAYLOAD[:75_000]), (2, bytes(75_000))):
            client.upload_part(Bucket=s3.bucket, Key="ds/data.memmap", UploadId=started, PartNumber=number, Body=data)
        store = open_store(s3.url("ds"), backend=backend, retry=FAST_RETRY)
        [upload] = store.uploads()
        assert (upload.name, upload.upload_id) == ("data.memmap", started)
        s3.proxy.clear()
        store.put("data.memmap", tmp_path / "big", resume=upload)
        assert sorted(part_puts(s3.proxy)) == [2, 3, 4]  # part 1 kept, part 2 replaced
        assert store.read_all("data.memmap") == PAYLOAD and store.uploads() == []

    def test_an_upload_gone_meanwhile_starts_again(self, s3, tmp_path, small_parts, backend):
        (tmp_path / "big").write_bytes(PAYLOAD)
        store = open_store(s3.url("ds"), backend=backend, retry=FAST_RETRY)
        store.put("data.memmap", tmp_path / "big", resume=remote.Upload("data.memmap", "no-such-upload"))
        assert store.read_all("data.memmap") == PAYLOAD and sorted(part_puts(s3.proxy)) == [1, 2, 3, 4]


def test_without_botocore_obstore_cuts_the_parts_itself(s3, tmp_path, small_parts, monkeypatch):
    """obstore has no API for the parts of an upload: it cuts them at the part size (its default 5 MiB
    caps an object near 52 GB), and the file is retried whole."""
    monkeypatch.setattr(remote, "_installed", lambda module: module != "botocore")
    (tmp_path / "big").write_bytes(PAYLOAD)
    store = open_store(s3.url("ds"), backend="obstore", retry=FAST_RETRY)
    assert store.put("data.memmap", tmp_path / "big").size == len(PAYLOAD)
    assert sorted(part_puts(s3.proxy)) == [1, 2, 3, 4] and store.uploads() == []
    assert store.read_all("data.memmap") == PAYLOAD
    s3.proxy.fail("503", times=100, methods=("PUT",), path="partNumber=3")
    with pytest.raises(RemoteError, match=r"^PUT s3://.*/ds/data.memmap failed 3 times"):
        store.put("data.memmap", tmp_path / "big")
    assert "Uploads" not in s3.client().list_multipart_uploads(Bucket=s3.bucket)  # obstore aborted each try


class TestBackoff:
    def test_waits_grow_exponentially_with_full_jitter(self, monkeypatch):
        waits, bounds = [], []
        monkeypatch.setattr(remote.time, "sleep", waits.append)
        monkeypatch.setattr(remote.random, "uniform", lambda low, high: bounds.append((low, high)) or high / 2)
        store = remote.Store("memory://x", Retry(attempts=5, base_delay=0.1, max_delay=0.5))

        def always_reset():
            raise remote._Transient("connection reset")

        with pytest.raises(RemoteError, match="failed 5 times, last: connection reset"):
            store._retrying(always_reset, "GET memory://x/y bytes 0-9")
        assert bounds == [(0, 0.1), (0, 0.2), (0, 0.4), (0, 0.5)]
        assert waits == [0.05, 0.1, 0.2, 0.25]

    def test_a_final_error_is_not_retried(self, monkeypatch):
        monkeypatch.setattr(remote.time, "sleep", lambda seconds: None)
        calls = []

        def denied():
            calls.append(1)
            raise RemoteError("access denied")

        with pytest.raises(RemoteError, match="access denied"):
            remote.Store("memory://x", Retry())._retrying(denied, "GET")
        assert calls == [1]


class TestWrites:
    @pytest.mark.parametrize("backend", S3_BACKENDS)
    def test_put_list_delete_on_s3(self, s3, tmp_path, backend):
        store = open_store(s3.url("ds"), backend=backend, retry=FAST_RETRY)
        assert store.list() == {}
        (tmp_path / "a.bin").write_bytes(b"abc")
        info = store.put("sub/a.bin", tmp_path / "a.bin")
        assert info.size == 3 and store.list() == {"sub/a.bin": info}
        store.delete("sub/a.bin")
        store.delete("sub/a.bin")  # gone already: fine
        assert store.list() == {}

    def test_a_local_put_never_shows_a_half_written_file(self, tmp_path, monkeypatch):
        store = open_store((tmp_path / "ds").as_uri(), retry=FAST_RETRY)
        (tmp_path / "a.bin").write_bytes(b"x" * 1000)
        seen = []
        original = store.fs.put_file

        def watching(source, target, **kwargs):
            original(source, target, **kwargs)
            seen.append(((tmp_path / "ds" / "a.bin").exists(), os.path.basename(target)))

        monkeypatch.setattr(store.fs, "put_file", watching)
        store.put("a.bin", tmp_path / "a.bin")
        assert seen == [(False, f".a.bin.tmp-{os.getpid()}-{threading.get_ident()}")]
        assert (tmp_path / "ds" / "a.bin").read_bytes() == b"x" * 1000
        assert sorted(path.name for path in (tmp_path / "ds").iterdir()) == ["a.bin"]

    def test_http_is_read_only(self, http):
        store = open_store(http.url)
        with pytest.raises(UsageError, match="cannot be listed or written; push to s3:// or file://"):
            store.list()

    def test_a_store_pickles_as_what_opens_it(self, s3):
        import pickle

        store = open_store(s3.url("ds"), backend="fsspec", retry=FAST_RETRY)
        again = pickle.loads(pickle.dumps(store))
        assert (again.url, again.backend, again.retry) == (store.url, "fsspec", FAST_RETRY)


def test_object_info_key():
    assert ObjectInfo(10, '"abc"').key() == '10:"abc"' and ObjectInfo(3).key() == "3:"


def test_a_missing_client_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "obstore", None)
    with pytest.raises(
        UsageError, match=r"needs the Python package 'obstore'; install it with pip install 'gpuload\[cloud\]'"
    ):
        open_store("s3://bucket/photos.jpeg", backend="obstore")


def test_aws_profiles_reach_obstore_through_boto3(s3, tmp_path, monkeypatch):
    """Keys in ~/.aws/credentials (here a file named by AWS_SHARED_CREDENTIALS_FILE), not in the environment."""
    pytest.importorskip("boto3")
    import obstore.auth.boto3

    s3.client().put_object(Bucket=s3.bucket, Key="ds/a.bin", Body=b"abc")
    (tmp_path / "credentials").write_text("[reader]\naws_access_key_id = fromprofile\naws_secret_access_key = secret\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_PROFILE", "reader")
    used = []
    original = obstore.auth.boto3.Boto3CredentialProvider.__call__
    monkeypatch.setattr(
        obstore.auth.boto3.Boto3CredentialProvider, "__call__", lambda self: used.append(1) or original(self)
    )
    store = open_store(s3.url("ds"), backend="obstore", retry=FAST_RETRY)
    assert store.read_all("a.bin") == b"abc"
    assert used and "fromprofile" in s3.proxy.requests[-1].headers["Authorization"]


def test_no_credentials_anywhere_is_a_one_line_error_that_says_what_to_set(monkeypatch):
    """boto3 finding no profile hands over to obstore's chain; its last resort, the instance metadata
    service, refusing is named as missing credentials (the text as obstore 0.8 words it; no request
    leaves 127.0.0.1 here)."""
    pytest.importorskip("boto3")
    import obstore.auth.boto3

    def none_found(self):
        raise ValueError("Received None from session.get_credentials")

    monkeypatch.setattr(obstore.auth.boto3.Boto3CredentialProvider, "__init__", none_found)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    assert remote._aws_profiles() is None
    refused = Exception(
        "Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/token in 887µs - "
        "Server returned non-2xx status code: 403 Forbidden: resolve_deny: denied destination\n\nDebug..."
    )
    calls = []

    def metadata_refused():
        calls.append(1)
        raise remote._classify(refused)

    store = remote.open_store("memory://credentials/ds", retry=remote.Retry(attempts=3, base_delay=0, max_delay=0))
    with pytest.raises(RemoteError) as raised:  # retried first: on a cloud instance it may answer next time
        store._retrying(metadata_refused, "GET s3://bucket/ds/meta.json")
    assert len(calls) == 3 and "\n" not in str(raised.value)
    assert str(raised.value).startswith("GET s3://bucket/ds/meta.json: no credentials found (Generic S3 error")
    assert "AWS_PROFILE" in str(raised.value)


def test_a_local_file_replaced_after_open_stops_the_read(tmp_path):
    """file:// has no ETag: its size and modification time, compared after every read, stand for one."""
    (tmp_path / "ds").mkdir()
    path = tmp_path / "ds" / "data.memmap"
    path.write_bytes(PAYLOAD)
    store = open_store((tmp_path / "ds").as_uri(), retry=FAST_RETRY)
    info = store.info("data.memmap")
    assert store.read("data.memmap", 0, 10, info) == PAYLOAD[:10]
    path.write_bytes(PAYLOAD[::-1])
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    with pytest.raises(ObjectChangedError, match="changed since it was opened"):
        store.read("data.memmap", 0, 10, info)


def test_s3fs_listing_and_uploads_are_retried_too(s3, tmp_path):
    store = open_store(s3.url("ds"), backend="fsspec", retry=FAST_RETRY)
    (tmp_path / "a.bin").write_bytes(b"abc")
    s3.proxy.fail("503", times=2, methods=("PUT",))
    assert store.put("a.bin", tmp_path / "a.bin").size == 3
    s3.proxy.fail("503", times=2, methods=("GET",))
    assert list(store.list()) == ["a.bin"]
