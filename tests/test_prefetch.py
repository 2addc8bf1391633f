"""gpuload.loading.prefetch: the read-ahead of a dataset at a URL, against moto behind a fault proxy."""

import random
import time

import numpy as np
import pytest
import torch
from conftest import FAST_RETRY

from gpuload.loading.prefetch import BlockPrefetcher
from gpuload.remote.cache import BlockCache
from gpuload.remote.file import RemoteFile
from gpuload.remote.store import open_store

BLOCK = 1_000
PAYLOAD = random.Random(2).randbytes(20 * BLOCK)  # 20 blocks
STARTS = np.arange(40) * 500  # 40 images of 500 bytes, two a block
LENGTHS = np.full(40, 500)


@pytest.fixture
def remote_file(s3, tmp_path):
    s3.client().put_object(Bucket=s3.bucket, Key="ds/data.memmap", Body=PAYLOAD)
    cache = BlockCache(tmp_path / "cache", "1MB")
    with RemoteFile(open_store(s3.url("ds"), retry=FAST_RETRY), "data.memmap", cache=cache, block_size=BLOCK) as file:
        yield file


def wait_until(condition, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def blocks_fetched(s3) -> list[int]:
    found = []
    for request in s3.proxy.gets("data.memmap"):
        first, last = (int(side) for side in request.headers["Range"].removeprefix("bytes=").split("-"))
        found += range(first // BLOCK, last // BLOCK + 1)
    return found


class TestReadAhead:
    def test_it_follows_the_order_a_bounded_number_of_blocks_ahead(self, s3, remote_file):
        batches = [torch.tensor([2 * block, 2 * block + 1]) for block in (5, 3, 9, 0, 7, 1, 2)]  # a block a batch
        s3.proxy.clear()
        prefetcher = BlockPrefetcher(remote_file, STARTS, LENGTHS, batches, ahead=3)
        prefetcher.start()
        try:
            assert wait_until(lambda: len(blocks_fetched(s3)) == 3)
            time.sleep(0.3)
            assert sorted(blocks_fetched(s3)) == [3, 5, 9]  # the first three batches' blocks, and no more
            prefetcher.served(2)  # two batches consumed: two more blocks may come
            assert wait_until(lambda: len(blocks_fetched(s3)) == 5)
            time.sleep(0.3)
            assert sorted(blocks_fetched(s3)) == [0, 3, 5, 7, 9]
            prefetcher.served(7)
            assert wait_until(lambda: len(blocks_fetched(s3)) == 7)
        finally:
            prefetcher.stop()
            prefetcher.join()
        assert sorted(blocks_fetched(s3)) == [0, 1, 2, 3, 5, 7, 9] and prefetcher.error is None

    def test_cached_blocks_are_not_fetched_again(self, s3, remote_file):
        remote_file.read(0, 3 * BLOCK)
        s3.proxy.clear()
        prefetcher = BlockPrefetcher(remote_file, STARTS, LENGTHS, [torch.arange(40)], ahead=100)
        prefetcher.start()
        prefetcher.join()
        assert sorted(blocks_fetched(s3)) == list(range(3, 20))

    def test_a_request_that_fails_after_its_retries_leaves_its_blocks_to_the_readers(self, s3, remote_file):
        s3.proxy.clear()
        s3.proxy.fail("503", times=3)  # FAST_RETRY: 3 attempts, all refused
        prefetcher = BlockPrefetcher(remote_file, STARTS, LENGTHS, [torch.tensor([0]), torch.tensor([39])], ahead=1)
        prefetcher.start()
        prefetcher.served(2)
        prefetcher.join()
        assert "failed 3 times" in str(prefetcher.error)
        assert remote_file.cache.has(remote_file._space, 19, BLOCK)  # it went on with the next batch

    def test_stop_ends_it_while_it_waits(self, s3, remote_file):
        prefetcher = BlockPrefetcher(remote_file, STARTS, LENGTHS, [torch.tensor([2 * b]) for b in range(20)], ahead=1)
        prefetcher.start()
        assert wait_until(lambda: remote_file.stats["blocks_fetched"] == 1)
        prefetcher.stop()
        prefetcher.join(5)
        assert not prefetcher._thread.is_alive() and remote_file.stats["blocks_fetched"] == 1
