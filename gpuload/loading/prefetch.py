"""Read-ahead for a dataset at a URL: the blocks of an epoch's batches fetched into the node's cache
before the loader's threads need them, in the epoch's order, a bounded number of blocks ahead."""

from __future__ import annotations

import threading
from collections import deque

import numpy as np
import torch

from ..errors import ObjectChangedError, RemoteError
from ..remote.file import RemoteFile

__all__ = ["DEFAULT_AHEAD_BLOCKS", "BlockPrefetcher", "BlockPrefetchers"]

DEFAULT_AHEAD_BLOCKS = 32  # 128 MiB of 4 MiB blocks: several requests in flight at any latency
_GROUP_BLOCKS = 16  # blocks handed to the request threads at once (4 requests of 4 blocks)
_POLL_S = 0.1


class BlockPrefetcher:
    """Fetches the blocks of ``batches`` (this rank's batches of an epoch, in order) into ``file``'s
    cache, at most ``ahead`` blocks beyond the batch the consumer has reached (:meth:`served`), each
    block once (a block already cached, by this process or another of the node, is not fetched).

    It only warms the cache: the loader's threads read every image themselves (checksums checked),
    so an error here never reaches the user from this thread: a request that failed after its
    retries leaves its blocks to the readers, a changed object (or anything else) stops the
    read-ahead; the reader that needs the block meets the same error and reports it. Memory: the requests in flight (see :class:`RemoteFile`); disk:
    the cache's limit.

    Example:
        >>> import fsspec, tempfile
        >>> from gpuload.remote.cache import BlockCache
        >>> from gpuload.remote.store import open_store
        >>> fsspec.filesystem("memory").pipe("/prefetch-doc/data.memmap", bytes(64))
        >>> file = RemoteFile(open_store("memory://prefetch-doc"), "data.memmap", block_size=16,
        ...                   cache=BlockCache(tempfile.mkdtemp(), "1MB"))
        >>> prefetcher = BlockPrefetcher(file, np.arange(8) * 8, np.full(8, 8), [torch.tensor([7, 0])], ahead=8)
        >>> prefetcher.start(); prefetcher.join(); file.close()
        >>> file.stats["blocks_fetched"]  # image 7 lies in block 3, image 0 in block 0
        2
    """

    def __init__(
        self,
        file: RemoteFile,
        starts: np.ndarray,
        lengths: np.ndarray,
        batches: list[torch.Tensor],
        *,
        ahead: int = DEFAULT_AHEAD_BLOCKS,
    ) -> None:
        self.file, self.starts, self.lengths, self.batches = file, starts, lengths, batches
        self.ahead = max(1, ahead)
        self.error: BaseException | None = None
        self._condition = threading.Condition()
        self._served = 0
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="gpuload-prefetch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def served(self, batches: int) -> None:
        """The consumer has taken ``batches`` batches: the read-ahead may move on."""
        with self._condition:
            self._served = batches
            self._condition.notify_all()

    def stop(self) -> None:
        """Stop after the requests in flight (without waiting for them)."""
        self._stopped = True
        if self._condition.acquire(blocking=False):  # the garbage collector's path must never block
            try:
                self._condition.notify_all()
            finally:
                self._condition.release()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _blocks(self, batch: torch.Tensor) -> list[int]:
        """The blocks a batch's images lie in, in the order the batch first needs them."""
        rows = batch.numpy()
        first = self.starts[rows] // self.file.block_size
        last = (self.starts[rows] + self.lengths[rows] - 1) // self.file.block_size
        seen: dict[int, None] = {}
        for a, b in zip(first.tolist(), last.tolist()):
            for block in range(a, b + 1):
                seen.setdefault(block, None)
        return list(seen)

    def _run(self) -> None:
        fetched: set[int] = set()
        owed: deque[tuple[int, int]] = deque()  # (batch, blocks first needed by it) not yet consumed
        held, number = 0, 0
        try:
            while number < len(self.batches):
                with self._condition:
                    while not self._stopped:
                        while owed and owed[0][0] < self._served:  # consumed: those blocks are behind
                            held -= owed.popleft()[1]
                        if held < self.ahead:
                            break
                        self._condition.wait(_POLL_S)
                    if self._stopped:
                        return
                group: list[int] = []  # the next batches' new blocks, fetched together (requests in parallel)
                while number < len(self.batches) and len(group) < _GROUP_BLOCKS:
                    new = [block for block in self._blocks(self.batches[number]) if block not in fetched]
                    if group and held + len(group) + len(new) > self.ahead:
                        break
                    fetched.update(new)
                    owed.append((number, len(new)))
                    group += new
                    number += 1
                held += len(group)
                try:
                    self.file.prefetch(group)
                except ObjectChangedError:
                    raise
                except RemoteError as error:  # failed after its retries: the readers fetch those blocks themselves
                    self.error = error
        except BaseException as error:  # the readers meet it themselves, with their context
            self.error = error


class BlockPrefetchers:
    """The read-aheads of one epoch as one: a dataset's, or each of a ``ConcatDataset``'s parts at a URL with
    its rows of every batch (each up to its own ``ahead`` blocks, in its own thread).

    Example:
        >>> both = BlockPrefetchers([])
        >>> both.start(); both.served(1); both.stop(); both.join()
    """

    def __init__(self, prefetchers: list[BlockPrefetcher]) -> None:
        self.prefetchers = prefetchers

    def start(self) -> None:
        for prefetcher in self.prefetchers:
            prefetcher.start()

    def served(self, batches: int) -> None:
        """The consumer has taken ``batches`` batches (see :meth:`BlockPrefetcher.served`)."""
        for prefetcher in self.prefetchers:
            prefetcher.served(batches)

    def stop(self) -> None:
        for prefetcher in self.prefetchers:
            prefetcher.stop()

    def join(self, timeout: float | None = None) -> None:
        for prefetcher in self.prefetchers:
            prefetcher.join(timeout)
