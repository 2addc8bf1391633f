"""One object of a dataset at a URL, read by byte ranges in aligned blocks through the node's block cache.

:class:`RemoteFile` has the contract of the local jpeg reader (``read(start, length) -> bytes``: exactly
those bytes, or an error), plus :meth:`RemoteFile.read_many` for a batch (the blocks it needs, neighbours
coalesced into one request, many requests in flight) and a way to drop the blocks of a range that failed
its checksum and read them again once (:meth:`RemoteFile.invalidate`, or ``checksums=`` on the reads).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor, as_completed
from contextlib import ExitStack

import xxhash

from ..errors import DatasetError, UsageError
from .cache import BlockCache, Namespace
from .store import ObjectInfo, RemoteError, Store

__all__ = ["DEFAULT_BLOCK_SIZE", "RemoteFile", "object_digest"]

DEFAULT_BLOCK_SIZE = (
    4 * 2**20
)  # the fastest of 1, 4, 16 MiB in experiments/remote_reads.py, and 4x fewer requests than 1 MiB
DEFAULT_WORKERS = 16
_DIGEST_CHUNK = 8 * 2**20


class RemoteFile:
    """Object ``name`` of ``store``, read by byte ranges through a :class:`~gpuload.remote.cache.BlockCache`.

    With a cache, reads are served in aligned blocks of ``block_size`` bytes: a block is fetched once
    per node (whoever asks first), kept on disk, and read from there by every process; consecutive
    missing blocks are fetched in one request of up to ``blocks_per_request`` blocks, ``workers``
    requests in flight. Without a cache, exactly the ranges asked for are fetched, neighbours less
    than ``block_size`` apart merged into one request.

    Every request carries the version seen at open (``info``; see :mod:`gpuload.remote.store`): an
    object replaced while it is read raises :class:`~gpuload.remote.store.ObjectChangedError`, and a
    changed object gets a new cache namespace, so two versions never mix.

    Args:
        store: the dataset's folder.
        name: the object's name in it (``"data.memmap"``).
        info: its size and version as seen when the dataset was opened (default: asked now).
        cache: the node's block cache, or ``None`` to read without one.
        block_size: bytes per block (and the largest gap merged without a cache).
        blocks_per_request: the most consecutive blocks one request fetches.
        workers: requests in flight at once.

    Raises:
        FileNotFoundError: no such object.
        UsageError: bad arguments.

    Example:
        >>> from gpuload.remote.store import open_store
        >>> import fsspec
        >>> fsspec.filesystem("memory").pipe("/doc/ds/data.memmap", bytes(range(100)))
        >>> with RemoteFile(open_store("memory://doc/ds"), "data.memmap", block_size=16) as file:
        ...     file.read(10, 4), [bytes(part) for part in file.read_many([(0, 2), (98, 2)])]
        (b'\\n\\x0b\\x0c\\r', [b'\\x00\\x01', b'bc'])
    """

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        info: ObjectInfo | None = None,
        cache: BlockCache | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        blocks_per_request: int = 4,
        workers: int = DEFAULT_WORKERS,
    ) -> None:
        for label, value in (
            ("block_size", block_size),
            ("blocks_per_request", blocks_per_request),
            ("workers", workers),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UsageError(f"{label} must be a positive int, got {value!r}")
        self.store, self.name = store, name
        self.info = info if info is not None else store.info(name)
        self.size = self.info.size
        self.url = store.object_url(name)
        self.cache, self.block_size = cache, block_size
        self.blocks_per_request, self.workers = blocks_per_request, workers
        self._space: Namespace | None = (
            cache.namespace(self.url, self.info.key(), block_size=block_size) if cache is not None else None
        )
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._cancel = threading.Event()  # set by close(): the retries of the reads in flight stop
        self._closer = None
        self._stats_lock = threading.Lock()
        self.stats = {"requests": 0, "bytes_fetched": 0, "blocks_fetched": 0, "block_hits": 0}

    # -- reads ---------------------------------------------------------------------------------------------
    def read(self, start: int, length: int, checksum: int | None = None) -> bytes:
        """Exactly ``length`` bytes from ``start``; with ``checksum`` (xxh3-64), checked as in :meth:`read_many`.

        Raises:
            DatasetError: the range lies outside the object, or fails its checksum twice.
            ObjectChangedError, RemoteError: see :meth:`read_many`.
        """
        return self.read_many([(start, length)], None if checksum is None else [checksum])[0]

    def read_many(self, ranges: Sequence[tuple[int, int]], checksums: Sequence[int] | None = None) -> list[bytes]:
        """The bytes of each ``(start, length)`` range, in order, fetched in parallel.

        With ``checksums`` (xxh3-64 of each range), a range whose bytes differ has its blocks dropped
        from the cache and is read again, once; if it still differs, the object itself is damaged.

        Raises:
            DatasetError: a range lies outside the object, or fails its checksum after a fresh download
                (naming the URL and the byte range; its ``position`` attribute is the range's).
            ObjectChangedError: the object was replaced since it was opened.
            RemoteError: a request failed after its retries (naming the URL and the byte range).
        """
        for start, length in ranges:
            if start < 0 or length < 0 or start + length > self.size:
                raise DatasetError(
                    f"{self.url}: bytes {start}-{start + length - 1} lie outside its {self.size:,} bytes; "
                    "the dataset's index does not match its data (run gpuload verify)"
                )
        results = self._read(ranges)
        if checksums is None:
            return results
        bad = [
            position for position, data in enumerate(results) if xxhash.xxh3_64_intdigest(data) != checksums[position]
        ]
        if not bad:
            return results
        for position in bad:
            self.invalidate(*ranges[position], checksums[position])
        again = self._read([ranges[position] for position in bad])
        for position, data in zip(bad, again):
            if xxhash.xxh3_64_intdigest(data) != checksums[position]:
                start, length = ranges[position]
                error = DatasetError(
                    f"{self.url}: bytes {start}-{start + length - 1} do not match their checksum, also when "
                    "downloaded again: the object is damaged; run gpuload verify on the URL and push the dataset again"
                )
                error.position = position  # which range, for a caller that names what it holds
                raise error
            results[position] = data
        return results

    def invalidate(self, start: int, length: int, checksum: int | None = None) -> None:
        """Drop the cached blocks holding bytes ``start`` to ``start + length`` (after a checksum failure):
        the next read fetches them again. With ``checksum``, only while the cached bytes still fail it:
        another thread or process that met the same damage may have fetched them again already, and a
        second drop would download them twice. Without a cache, nothing to do."""
        if self.cache is None or length <= 0:
            return
        blocks = range(start // self.block_size, (start + length - 1) // self.block_size + 1)
        with ExitStack() as locks:
            stripes = {}
            for index in blocks:  # in one order, as _fetch_run takes them
                stripes.setdefault(self.cache.stripe(self._space, index), index)
            for _, index in sorted(stripes.items()):
                if not locks.enter_context(self.cache.writing(self._space, index)):
                    break  # its holder is stuck: dropped all the same (a drop is one unlink, safe without it)
            if checksum is not None:
                pieces = [
                    self.cache.get(
                        self._space,
                        index,
                        self._block_length(index),
                        max(start, index * self.block_size) - index * self.block_size,
                        min(start + length, (index + 1) * self.block_size) - max(start, index * self.block_size),
                    )
                    for index in blocks
                ]
                if any(piece is None for piece in pieces):
                    return  # dropped by another reader: the next read fetches it
                if xxhash.xxh3_64_intdigest(b"".join(pieces)) == checksum:
                    return  # fetched again by another reader: good now
            for index in blocks:
                self.cache.drop(self._space, index)

    def prefetch(self, blocks: Sequence[int]) -> int:
        """Fetch the blocks ``blocks`` that the cache lacks into it (in parallel, neighbours merged),
        returning nothing but how many were fetched: the loader's read-ahead. Without a cache, nothing.

        Raises:
            ObjectChangedError, RemoteError: see :meth:`read_many`.
        """
        if self.cache is None:
            return 0
        last = (self.size - 1) // self.block_size
        missing = sorted(
            {
                index
                for index in blocks
                if 0 <= index <= last and not self.cache.has(self._space, index, self._block_length(index))
            }
        )
        self._fetch_blocks(missing, None, None)
        return len(missing)

    def _read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        if self.cache is None:
            return self._read_direct(ranges)
        block = self.block_size
        parts: list[list[bytes | None]] = []
        wanted: dict[int, list[tuple[int, int, int, int]]] = {}  # block -> (range, part, start in block, length)
        for position, (start, length) in enumerate(ranges):
            pieces: list[bytes | None] = []
            offset, end = start, start + length
            while offset < end:
                index = offset // block
                stop = min(end, (index + 1) * block)
                piece = self.cache.get(
                    self._space, index, self._block_length(index), offset - index * block, stop - offset
                )
                if piece is None:
                    wanted.setdefault(index, []).append((position, len(pieces), offset - index * block, stop - offset))
                else:
                    self._count(block_hits=1)
                pieces.append(piece)
                offset = stop
            parts.append(pieces)
        self._fetch_blocks(sorted(wanted), wanted, parts)
        return [b"".join(pieces) for pieces in parts]

    def _fetch_blocks(
        self,
        indices: list[int],
        wanted: dict[int, list[tuple[int, int, int, int]]] | None,
        parts: list[list[bytes | None]] | None,
    ) -> None:
        """Fetch runs of consecutive blocks in parallel into the cache; each run's worker cuts the pieces
        ``wanted`` of its blocks into ``parts`` and lets the blocks go, so memory holds at most the runs
        in flight (``workers`` x ``blocks_per_request`` blocks), whatever the number of blocks asked for."""
        runs: list[list[int]] = []
        for index in indices:
            if runs and index == runs[-1][-1] + 1 and len(runs[-1]) < self.blocks_per_request:
                runs[-1].append(index)
            else:
                runs.append([index])
        if len(runs) <= 1:
            for run in runs:
                self._fetch_run(run, wanted, parts)
            return
        futures = [self._executor().submit(self._fetch_run, run, wanted, parts) for run in runs]
        try:
            for future in as_completed(futures):
                future.result()
        except CancelledError:
            raise self._closed() from None
        finally:
            for future in futures:
                future.cancel()

    def _fetch_run(
        self,
        run: list[int],
        wanted: dict[int, list[tuple[int, int, int, int]]] | None,
        parts: list[list[bytes | None]] | None,
    ) -> None:
        cache, space = self.cache, self._space

        def deliver(index: int, data: bytes) -> None:
            for position, part, begin, length in (wanted or {}).get(index, ()):
                parts[position][part] = data[begin : begin + length]

        with ExitStack() as locks:
            stripes = {}
            for index in run:  # stripes locked in one order: two runs never wait on each other in a cycle
                stripes.setdefault(cache.stripe(space, index), index)
            held = True
            for _, index in sorted(stripes.items()):
                if not locks.enter_context(cache.writing(space, index)):
                    held = False  # its holder is stuck: the run's blocks are fetched and served, not kept
                    break
            missing = []
            for index in run:  # another process may have fetched it while this one waited
                length = self._block_length(index)
                if wanted is None:
                    found = cache.has(space, index, length)
                else:
                    data = cache.get(space, index, length)
                    found = data is not None
                    if found:
                        deliver(index, data)
                if found:
                    self._count(block_hits=1)
                else:
                    missing.append(index)
            for first, last in _spans(missing):
                start = first * self.block_size
                data = self._get(start, min(self.size, (last + 1) * self.block_size) - start)
                for index in range(first, last + 1):
                    block = data[(index - first) * self.block_size : (index - first + 1) * self.block_size]
                    if held:
                        cache.put(space, index, block)
                    deliver(index, block)
                self._count(blocks_fetched=last - first + 1)

    def _read_direct(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Without a cache: the ranges, neighbours closer than a block merged into one request."""
        order = sorted(range(len(ranges)), key=lambda position: ranges[position][0])
        spans: list[list] = []  # [start, end, positions]
        for position in order:
            start, length = ranges[position]
            if (
                spans
                and start - spans[-1][1] < self.block_size
                and start + length - spans[-1][0] <= self.block_size * self.blocks_per_request
            ):
                spans[-1][1] = max(spans[-1][1], start + length)
                spans[-1][2].append(position)
            else:
                spans.append([start, start + length, [position]])
        results: list[bytes] = [b""] * len(ranges)

        def fetch(span) -> tuple[list, bytes]:
            return span, self._get(span[0], span[1] - span[0])

        jobs = [fetch(span) for span in spans] if len(spans) == 1 else self._executor().map(fetch, spans)
        try:
            for (begin, _, positions), data in jobs:
                for position in positions:
                    start, length = ranges[position]
                    results[position] = data[start - begin : start - begin + length]
        except CancelledError:
            raise self._closed() from None
        return results

    def _closed(self) -> RemoteError:
        return RemoteError(f"{self.url}: the file was closed while it was read")

    def _get(self, start: int, length: int) -> bytes:
        data = self.store.read(self.name, start, length, self.info, cancel=self._cancel)
        self._count(requests=1, bytes_fetched=length)
        return data

    def _block_length(self, index: int) -> int:
        return min(self.block_size, self.size - index * self.block_size)

    def _count(self, **counts: int) -> None:
        with self._stats_lock:
            for key, value in counts.items():
                self.stats[key] += value

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="gpuload-remote")
                self._closer = weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
            return self._pool

    # -- lifetime ----------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the reads in flight and the request threads, at once: queued requests are dropped, no
        retry is made (a read waiting for one raises :class:`~gpuload.remote.store.RemoteError`), and a
        request on the wire ends in its thread, its answer unused. The file can be read again after."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
            cancel, self._cancel = self._cancel, threading.Event()
            if self._closer is not None:
                self._closer.detach()
                self._closer = None
        cancel.set()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> RemoteFile:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __getstate__(self) -> dict:
        state = {
            key: getattr(self, key)
            for key in ("store", "name", "info", "cache", "block_size", "blocks_per_request", "workers")
        }
        return state

    def __setstate__(self, state: dict) -> None:
        store, name = state.pop("store"), state.pop("name")
        self.__init__(store, name, **state)

    def __repr__(self) -> str:
        return f"RemoteFile({self.url!r}, size={self.size:,}, cache={self.cache!r})"


def _spans(indices: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of sorted block indices as ``(first, last)``.

    Example:
        >>> _spans([1, 2, 3, 7, 9, 10])
        [(1, 3), (7, 7), (9, 10)]
    """
    spans: list[tuple[int, int]] = []
    for index in indices:
        if spans and index == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], index)
        else:
            spans.append((index, index))
    return spans


def object_digest(store: Store, name: str, info: ObjectInfo) -> int:
    """xxh3-64 of object ``name``'s bytes as a reader gets them: ranged reads of 8 MiB, 8 in flight."""
    digest = xxhash.xxh3_64()
    if info.size == 0:
        return digest.intdigest()
    ranges = [(start, min(_DIGEST_CHUNK, info.size - start)) for start in range(0, info.size, _DIGEST_CHUNK)]
    with RemoteFile(store, name, info=info, block_size=_DIGEST_CHUNK, blocks_per_request=1, workers=8) as file:
        for first in range(0, len(ranges), 8):
            for data in file.read_many(ranges[first : first + 8]):
                digest.update(data)
    return digest.intdigest()
