"""gpuload.remote.file: ranged reads through the node's block cache, against moto behind a fault proxy."""

import os
import pickle
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import xxhash
from conftest import FAST_RETRY

from gpuload.errors import DatasetError, UsageError
from gpuload.remote.cache import BlockCache
from gpuload.remote.file import RemoteFile
from gpuload.remote.store import ObjectChangedError, RemoteError, Retry, open_store

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = random.Random(1).randbytes(100_000)
BLOCK = 8_192  # 13 blocks, the last one shorter


@pytest.fixture
def data_object(s3):
    s3.client().put_object(Bucket=s3.bucket, Key="ds/data.memmap", Body=PAYLOAD)
    return open_store(s3.url("ds"), retry=FAST_RETRY)


@pytest.fixture
def cache(tmp_path) -> BlockCache:
    return BlockCache(tmp_path / "cache", "10MB")


def checksum(start: int, length: int) -> int:
    return xxhash.xxh3_64_intdigest(PAYLOAD[start : start + length])


RANGES = [(0, 10), (8_000, 500), (8_192, 8_192), (50_000, 20_000), (99_990, 10), (30_000, 0), (5, 99_990)]


class TestReads:
    @pytest.mark.parametrize("cached", [True, False])
    def test_ranges_are_exact(self, data_object, cache, cached):
        with RemoteFile(data_object, "data.memmap", cache=cache if cached else None, block_size=BLOCK) as file:
            assert file.size == len(PAYLOAD)
            assert file.read_many(RANGES) == [PAYLOAD[start : start + length] for start, length in RANGES]
            rng = random.Random(0)
            for _ in range(20):
                start = rng.randrange(len(PAYLOAD))
                length = rng.randrange(len(PAYLOAD) - start + 1)
                assert file.read(start, length) == PAYLOAD[start : start + length]

    def test_a_range_outside_the_object(self, data_object, cache):
        with RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK) as file:
            with pytest.raises(DatasetError, match=r"bytes 99990-100009 lie outside its 100,000 bytes"):
                file.read(99_990, 20)

    @pytest.mark.parametrize("bad", [{"block_size": 0}, {"workers": -1}, {"blocks_per_request": 1.5}])
    def test_bad_arguments(self, data_object, bad):
        with pytest.raises(UsageError, match="must be a positive int"):
            RemoteFile(data_object, "data.memmap", **bad)

    def test_blocks_are_fetched_once_and_then_read_from_disk(self, s3, data_object, cache):
        with RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK, blocks_per_request=1) as file:
            s3.proxy.clear()
            file.read_many(RANGES)
            assert len(s3.proxy.gets()) == 13 == file.stats["blocks_fetched"]
            file.read_many(RANGES)
            assert len(s3.proxy.gets()) == 13 and file.stats["block_hits"] > 0
        with RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK) as again:  # another run
            assert again.read_many(RANGES) == [PAYLOAD[start : start + length] for start, length in RANGES]
        assert len(s3.proxy.gets()) == 13  # the next run reads the blocks from disk (its HEAD is no GET)

    def test_neighbouring_blocks_are_fetched_in_one_request(self, s3, data_object, cache):
        with RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK, blocks_per_request=4) as file:
            s3.proxy.clear()
            assert file.read(0, 6 * BLOCK) == PAYLOAD[: 6 * BLOCK]
        ranges = [request.headers["Range"] for request in s3.proxy.gets()]
        assert sorted(ranges) == [f"bytes=0-{4 * BLOCK - 1}", f"bytes={4 * BLOCK}-{6 * BLOCK - 1}"]

    def test_without_a_cache_near_ranges_share_a_request(self, s3, data_object):
        with RemoteFile(data_object, "data.memmap", block_size=1_000) as file:
            s3.proxy.clear()
            assert file.read_many([(0, 10), (500, 10), (90_000, 10)]) == [
                PAYLOAD[0:10],
                PAYLOAD[500:510],
                PAYLOAD[90_000:90_010],
            ]
        assert sorted(request.headers["Range"] for request in s3.proxy.gets()) == ["bytes=0-509", "bytes=90000-90009"]

    def test_requests_are_in_flight_at_once(self, s3, data_object, cache):
        s3.proxy.latency = 0.2
        with RemoteFile(
            data_object, "data.memmap", cache=cache, block_size=BLOCK, blocks_per_request=1, workers=16
        ) as file:
            started = time.perf_counter()
            file.read_many([(index * BLOCK, 1) for index in range(12)])
            assert time.perf_counter() - started < 12 * 0.2 / 3  # sequential requests would take 2.4 s

    def test_every_request_carries_the_version_seen_at_open(self, s3, data_object, cache):
        with RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK) as file:
            s3.proxy.clear()
            file.read(0, 10)
            assert [request.headers.get("If-Match") for request in s3.proxy.gets()] == [file.info.etag]

    def test_pickles_as_what_opens_it_again(self, data_object, cache):
        file = RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK)
        again = pickle.loads(pickle.dumps(file))
        assert again.read(100, 50) == PAYLOAD[100:150]
        assert (again.info, again.cache.path, again.block_size) == (file.info, cache.path, BLOCK)
        file.close()
        again.close()


class TestClose:
    @pytest.mark.parametrize(("spans", "workers"), [(1, 16), (2, 16), (3, 1)])
    def test_close_cancels_pending_retries_and_returns_promptly(self, s3, data_object, monkeypatch, spans, workers):
        """A read waits out 503s with 2 s of backoff each (10 s in all): close() stops it at once, whether
        the read runs in the caller's thread (one span), in the file's request threads (two), or waits
        in their queue (three spans, one thread)."""
        import gpuload.remote.store as remote

        monkeypatch.setattr(remote.random, "uniform", lambda low, high: high)
        slow = Retry(attempts=6, base_delay=2.0, max_delay=2.0, timeout=2.0)
        file = RemoteFile(open_store(s3.url("ds"), retry=slow), "data.memmap", block_size=BLOCK, workers=workers)
        s3.proxy.clear()
        s3.proxy.fail("503", times=100)
        errors = []

        def read():
            try:
                file.read_many([(0, 10), (50_000, 10), (90_000, 10)][:spans])
            except RemoteError as error:
                errors.append(error)

        reader = threading.Thread(target=read)
        reader.start()
        while len(s3.proxy.gets()) < min(spans, workers):  # the first attempts failed: retries are pending
            time.sleep(0.01)
        started = time.monotonic()
        file.close()
        reader.join(5)
        assert time.monotonic() - started < 1 and not reader.is_alive()
        assert len(s3.proxy.gets()) == min(spans, workers)  # no retry, no queued request after the close
        [error] = errors
        assert "the file was closed" in str(error)


class TestDamage:
    def test_a_damaged_cached_block_is_dropped_and_fetched_again_once(self, s3, data_object, cache):
        with RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK) as file:
            file.read(0, BLOCK)
            block = next(path for path in cache.path.glob("objects/*/0"))
            block.write_bytes(b"\0" * BLOCK)  # the same size: only the checksum can tell
            s3.proxy.clear()
            assert file.read(100, 50) == b"\0" * 50  # without a checksum, the cache is believed
            assert file.read(100, 50, checksum=checksum(100, 50)) == PAYLOAD[100:150]
            assert len(s3.proxy.gets()) == 1
            assert block.read_bytes() == PAYLOAD[:BLOCK]  # replaced in the cache too

    def test_bytes_damaged_at_the_source_fail_after_one_fresh_download(self, s3, data_object, cache):
        with RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK) as file:
            s3.proxy.clear()
            with pytest.raises(DatasetError) as caught:
                file.read_many([(0, 10), (200, 10)], checksums=[checksum(0, 10), checksum(0, 10)])
            assert str(caught.value) == (
                f"{file.url}: bytes 200-209 do not match their checksum, also when downloaded again: the object is "
                "damaged; run gpuload verify on the URL and push the dataset again"
            )
            assert len(s3.proxy.gets()) == 2  # the first fetch, and one more

    def test_an_object_replaced_during_the_epoch_stops_it(self, s3, data_object, cache):
        with RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK) as file:
            file.read(0, 10)
            s3.client().put_object(Bucket=s3.bucket, Key="ds/data.memmap", Body=PAYLOAD[::-1])
            assert file.read(5, 5) == PAYLOAD[5:10]  # cached: of the version seen at open
            with pytest.raises(ObjectChangedError):
                file.read(50_000, 10)
        with RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK) as reopened:
            assert reopened.read(0, 10) == PAYLOAD[::-1][:10]  # a new version, a new namespace: no mixing


class TestFullDisk:
    def test_a_cache_on_a_full_disk_serves_every_block_uncached_and_warns_once(self, s3, data_object, tmp_path):
        """A 32 KiB tmpfs under a 10 MB cache: the object's 100 KB read whole, right, and training goes on."""
        disk = tmp_path / "small-disk"
        disk.mkdir()
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(disk)], capture_output=True, text=True
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
        try:
            cache = BlockCache(disk / "cache", "10MB")
            with RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK, blocks_per_request=1) as file:
                with pytest.warns(UserWarning, match="the disk of the cache .* is full") as warned:
                    assert file.read(0, len(PAYLOAD)) == PAYLOAD
                    assert file.read_many(RANGES) == [PAYLOAD[start : start + length] for start, length in RANGES]
            assert len(warned) == 1
        finally:
            subprocess.run(["umount", str(disk)], check=True)


class TestStuckLock:
    def test_a_block_whose_lock_another_process_holds_too_long_is_read_uncached(
        self, s3, data_object, cache, monkeypatch
    ):
        import fcntl

        import gpuload.remote.cache as cache_module

        monkeypatch.setattr(cache_module, "STRIPE_WAIT", 0.2)
        with RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK) as file:
            stuck = os.open(cache.path / "locks" / str(cache.stripe(file._space, 0)), os.O_RDWR | os.O_CREAT)
            fcntl.flock(stuck, fcntl.LOCK_EX)  # a process that stopped while it held block 0's lock
            try:
                with pytest.warns(UserWarning, match="reading such blocks uncached"):
                    assert file.read(0, 100) == PAYLOAD[:100]
                assert not cache.has(file._space, 0, BLOCK)  # served, not kept: its holder may still write it
            finally:
                os.close(stuck)
            assert file.read(0, 100) == PAYLOAD[:100] and cache.has(file._space, 0, BLOCK)


class TestSharedCache:
    def test_one_download_per_block_per_node(self, s3, data_object, cache):
        """Three processes of four threads read every block at once through one cache folder: each
        block is fetched once, and every reader gets the right bytes."""
        s3.proxy.latency = 0.05
        child = textwrap.dedent(f"""
            import threading
            from gpuload.remote.cache import BlockCache
            from gpuload.remote.store import Retry, open_store
            from gpuload.remote.file import RemoteFile
            store = open_store({s3.url("ds")!r}, retry=Retry(attempts=3, base_delay=0.001))
            file = RemoteFile(store, "data.memmap", cache=BlockCache({str(cache.path)!r}, "10MB"), block_size={BLOCK},
                              blocks_per_request=1)
            ranges = [(index * {BLOCK}, min({BLOCK}, {len(PAYLOAD)} - index * {BLOCK})) for index in range(13)]
            results = []
            threads = [threading.Thread(target=lambda: results.append(b"".join(file.read_many(ranges)))) for _ in range(4)]
            for thread in threads: thread.start()
            for thread in threads: thread.join()
            file.close()
            import xxhash; print(len(results), len(set(results)), xxhash.xxh3_64_hexdigest(results[0]))
        """)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        processes = [
            subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, env=env)
            for _ in range(3)
        ]
        outputs = [process.communicate(timeout=120)[0].split() for process in processes]
        assert all(process.returncode == 0 for process in processes)
        assert all(output[:2] == ["4", "1"] for output in outputs) and len({output[2] for output in outputs}) == 1
        ranges = [request.headers["Range"] for request in s3.proxy.gets()]
        assert sorted(ranges) == sorted(set(ranges)) and len(ranges) == 13
        with RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK) as file:
            assert file.read(0, len(PAYLOAD)) == PAYLOAD

    def test_threads_of_one_process_share_downloads(self, s3, data_object, cache):
        s3.proxy.latency = 0.05
        with RemoteFile(data_object, "data.memmap", cache=cache, block_size=BLOCK, blocks_per_request=1) as file:
            s3.proxy.clear()
            threads = [threading.Thread(target=file.read, args=(0, 4 * BLOCK)) for _ in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert len(s3.proxy.gets()) == 4
