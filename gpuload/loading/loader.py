"""``gpuload.DataLoader``: shuffled uint8 batches gathered from the memmap and prefetched onto the device."""

from __future__ import annotations

import atexit
import functools
import hashlib
import inspect
import itertools
import math
import operator
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..errors import UsageError
from ..machine import default_workers, limit_torch_threads
from ..store.dataset import ImageData, MemmapImageDataset, storage_order
from .crop import CenterCropDecode, RandomResizedCropDecode, crop_raw, crop_remote_raw, decode_batch, decode_crops
from .order import distributed_rank, epoch_order
from .prefetch import DEFAULT_AHEAD_BLOCKS, BlockPrefetcher

__all__ = ["DataLoader", "check_gpu_decode", "current_device", "resolve_device", "uses_cuda_graphs"]

# As torch's DataLoader: what shapes the batches is fixed once made (here also the buffers' device and count).
_FIXED = frozenset(
    {
        "dataset", "batch_size", "sampler", "drop_last", "device", "prefetch", "threads", "transform", "decode",
        "block_shuffle",
    }
)  # fmt: skip
_EXIT_JOIN_S = 10  # at exit, how long to wait for each producer's last gather
_POLL_S = 0.1  # how often a waiting producer looks at the stop flag, in case no notification reached it
_STATE_KEYS = ("epoch", "global_position", "batch_size", "world_size", "dataset_length", "seed")
DEFAULT_BLOCK_WINDOW = 32  # blocks shuffled together: 128 MiB of 4 MiB blocks


class DataLoader:
    """A drop-in ``torch.utils.data.DataLoader`` for :class:`MemmapImageDataset`.

    Each batch is gathered with one ``index_select`` per field straight from the page-cached
    memmap into a reused host buffer (pinned when the device is CUDA) by background threads,
    ``prefetch`` batches ahead; no worker processes, no pickling, no per-sample Python. On CUDA
    the host-to-device copy runs ``non_blocking`` on a side stream of the ring of buffers, an
    event per buffer keeps a buffer from being refilled while its copy is in flight, and the
    consumer's current stream waits for the copy (and is recorded on the batch, so the caching
    allocator cannot hand its memory back early) before the batch is yielded.

    Yields ``(images, labels)``: uint8 ``[B, 3, H, W]`` in channels-last memory (as raw datasets
    store pixels, as decoders write them and as convolutions on tensor cores read them;
    ``.contiguous()`` gives NCHW; whole batches of a channel-first dataset, format version 1 or 2 or
    an NCHW :class:`ImageData`, keep its layout) and int64 ``[B]``, on ``device``. On the CPU the batch is yours to
    keep: its buffer is only reused once nothing references it.

    Each ``iter()`` is an independent iterator over the next epoch with a ring of buffers of its
    own (``zip(loader, loader)`` pairs two epochs); sequential epochs reuse one ring. The end of
    an epoch, or an error in it, stops the background threads and waits for them; a ``break``
    (dropping the iterator) stops them without waiting.

    Order: like ``DistributedSampler`` (see :func:`gpuload.loading.order.epoch_order`): a permutation
    seeded with ``seed + epoch``; ``set_epoch`` chooses the epoch, otherwise it advances by one
    at every new iteration. Under an initialised ``torch.distributed`` each rank gets its shard,
    padded to the same length on every rank. ``state_dict``/``load_state_dict`` resume in the
    middle of an epoch: each rank exactly where it stopped, or, on another world size, with the
    rest of the epoch resharded over the new ranks.

    A dataset at a URL (``MemmapImageDataset("s3://...", cache=...)``) is read through the node's
    block cache, and a shuffled epoch follows a **block-aware order** by default (``block_shuffle``):
    the cache's blocks permuted, the images of each window of ``block_shuffle`` blocks shuffled
    together, each rank given one contiguous piece of that sequence (its own blocks), every rank the
    same number of batches, all a pure function of (seed, epoch), with the same exact and elastic
    resume; a background thread fetches the blocks of the coming batches into the cache, in the
    epoch's order, at most 32 blocks (or one window) ahead. ``block_shuffle=0`` keeps the exact
    uniform shuffle (each image a ranged read, or its block's).

    Args:
        dataset: a :class:`MemmapImageDataset`, or an :class:`ImageData` with ``images`` and ``labels``.
        batch_size: images per batch.
        shuffle: visit the images in a new random order every epoch.
        sampler: an iterable of indices to use instead (``shuffle`` must be ``False``).
        drop_last: drop the last incomplete batch (distributed: each rank's, as torch's DataLoader
            with a ``DistributedSampler``, whose shards are padded to the same length).
        generator: a ``torch.Generator`` to draw ``seed`` from when ``seed`` is ``None``.
        seed: the base seed of the permutations; drawn from ``generator`` or torch's global RNG
            when ``None``, so ``torch.manual_seed`` makes the order reproducible, as with torch.
            Under ``torch.distributed``, when the seed decides anything (``shuffle``, a ``transform``,
            a random ``decode``), rank 0's draw is broadcast to all ranks: a collective call in the
            constructor, so every rank must construct that loader.
        device: where batches go, ``"cpu"`` or ``"cuda"``; ``"cuda"`` when available, else ``"cpu"``.
            Other devices (``"mps"``, ``"xpu"``...) are refused: load to the CPU and move the batches.
        prefetch: batches prepared ahead of the consumer (host buffers: ``prefetch + 2``). With a
            ``decode``, at least ``threads`` batches ahead, one per cropping thread.
        threads: background threads preparing batches, each running its torch ops on its share
            of the cores (one core each on a 2-core machine: a team of intra-op threads per
            thread as large as the machine would fight the others for the cores). Whole raw
            batches: 2 by default (two gatherers hide each other's hand-off gaps; ``gpuload bench``
            compares them with bare ``index_select`` loops). With a ``decode``: the number of cores
            (each thread crops its batch).
        transform: applied to each uint8 image batch on ``device`` right after its copy, by the
            background threads (on CUDA on the loader's side stream, before the batch is handed
            over), without autograd; e.g. :class:`gpuload.RandomResizedCrop` for a user who prefers
            augmentation outside the model. One compiled with CUDA graphs (``mode="reduce-overhead"``)
            runs in the consumer's thread on its stream as each batch is taken, and its output is copied
            (see :func:`uses_cuda_graphs`). When it (or the module that ``torch.compile`` wrapped)
            takes a ``generator`` argument it gets one seeded by ``(seed, epoch, rank, the batch's
            position in the epoch)``: its random draws do not depend on thread timing and replay
            exactly after a resume. A transform without one (an ``nn.Sequential``, a lambda) that
            draws from torch's global generator gets draws that depend on thread timing; pass
            ``threads=1`` or a transform with a ``generator`` argument.
        decode: how each image is cropped into the batch by the loader's threads, fixed-size
            ``[B, 3, S, S]`` batches: :class:`gpuload.RandomResizedCropDecode` (training) or
            :class:`gpuload.CenterCropDecode` (evaluation); see :mod:`gpuload.loading.crop`. A jpeg
            dataset needs one (its images have their own sizes) and decodes only what the crop
            needs; a raw dataset reads only the crop's rows: on a CPU the cheapest place to crop,
            and only the crop crosses to the device.
        block_shuffle: with ``shuffle``, the window of the block-aware order in blocks of the image
            file (4 MiB, the cache's): ``0`` shuffles every image uniformly (the stock semantics),
            ``K`` permutes the blocks and shuffles the images of each ``K`` consecutive blocks together
            (see :func:`gpuload.loading.order.block_sequence`). ``None`` (default): 32 for a dataset at a
            URL read through a cache, else 0. Images stored by class (ImageFolder order) fill a window
            with about ``K`` blocks' worth of classes: raise ``K`` for more mixing.

    Raises:
        TypeError: an argument of the wrong type (``batch_size=4.0``, ``shuffle=None``...).
        ValueError: an argument out of range, ``sampler`` with ``shuffle``, a device other than
            ``"cpu"`` and ``"cuda"``, or ``"cuda"`` without CUDA. Setting ``dataset``, ``batch_size``,
            ``sampler``, ``drop_last``, ``device`` or ``prefetch`` after construction, as torch's DataLoader.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from gpuload import build_memmap, make_sample_folder
        >>> src = make_sample_folder(Path(tempfile.mkdtemp()) / "photos", images_per_class=2, size=(12, 16))
        >>> loader = DataLoader(MemmapImageDataset(build_memmap(src, progress=False)), batch_size=4, shuffle=True, device="cpu")
        >>> images, labels = next(iter(loader))
        >>> len(loader), images.shape, images.dtype, labels.dtype
        (3, torch.Size([4, 3, 12, 16]), torch.uint8, torch.int64)
        >>> loader.state_dict()["epoch"], loader.state_dict()["global_position"]  # one batch of epoch 0 served
        (0, 4)
    """

    def __init__(
        self,
        dataset: MemmapImageDataset | ImageData,
        batch_size: int = 1,
        shuffle: bool = False,
        sampler: Iterable[int] | None = None,
        drop_last: bool = False,
        *,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        device: str | torch.device | None = None,
        prefetch: int = 3,
        threads: int | None = None,
        transform: Callable[..., torch.Tensor] | None = None,
        decode: RandomResizedCropDecode | CenterCropDecode | None = None,
        block_shuffle: int | None = None,
    ) -> None:
        jpeg = isinstance(dataset, MemmapImageDataset) and dataset.storage == "jpeg"
        remote = isinstance(dataset, MemmapImageDataset) and dataset.remote
        gpu_decode = decode is not None and getattr(decode, "gpu", False)
        if threads is None:  # a thread per core where each crops its batch; two to gather or feed nvJPEG
            threads = default_workers() if decode is not None and not gpu_decode else 2
        for name, value in (("batch_size", batch_size), ("prefetch", prefetch), ("threads", threads)):
            _check_int(name, value)
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        for name, value in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {type(value).__name__}: {value!r}")
        if seed is not None:
            _check_int("seed", seed)
            if not 0 <= seed < 2**63:
                raise ValueError(f"seed must be in [0, 2**63), got {seed}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator or None, got {type(generator).__name__}: {generator!r}"
            )
        if sampler is not None and not isinstance(sampler, Iterable):
            raise TypeError(f"sampler must be an iterable of indices, got {type(sampler).__name__}: {sampler!r}")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if block_shuffle is not None:
            _check_int("block_shuffle", block_shuffle)
            if block_shuffle < 0:
                raise ValueError(
                    f"block_shuffle must be 0 (exact shuffle) or a positive number of blocks, got {block_shuffle}"
                )
            if block_shuffle and not shuffle:
                raise ValueError(
                    f"block_shuffle={block_shuffle} orders a shuffled epoch; pass shuffle=True, or leave block_shuffle out"
                )
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}: {transform!r}")
        data = dataset.data if isinstance(dataset, MemmapImageDataset) else dataset
        if not (jpeg or remote or hasattr(data, "images")) or not hasattr(data, "labels"):
            raise TypeError(f"DataLoader needs a MemmapImageDataset or an ImageData, got {type(dataset).__name__}")
        if decode is not None and not isinstance(decode, (RandomResizedCropDecode, CenterCropDecode)):
            raise UsageError(
                "decode must be a gpuload.RandomResizedCropDecode (training) or a gpuload.CenterCropDecode "
                f"(evaluation), got {type(decode).__name__}: {decode!r}"
            )
        if jpeg and decode is None:
            raise UsageError(
                "a jpeg dataset's images have their own sizes: pass decode=gpuload.RandomResizedCropDecode(224) "
                "(training) or decode=gpuload.CenterCropDecode(224) (evaluation), got decode=None"
            )
        if not jpeg and decode is not None and decode.gpu:
            raise UsageError(
                "gpu=True decodes JPEGs on the GPU, and a raw dataset holds decoded pixels: crop them in the "
                "loader's threads with gpu=False, or on the device with transform=gpuload.RandomResizedCrop(...)"
            )
        if not isinstance(dataset, MemmapImageDataset):  # a dataset's arrays are checked when it opens
            _check_image_data(data, decode)
        self.dataset = dataset
        self.decode = decode
        # Plain tensors over the same memory, in the order of the file's bytes (a raw dataset's
        # channels-last [N, H, W, 3]): gathers move bytes as they lie and skip tensordict's dispatch.
        if remote and not jpeg:  # pixels in storage: read by ranges into the batch's buffer
            images, self._stored_channels_last = None, dataset.manifest.layout == "channels_last"
        else:
            images, self._stored_channels_last = (None, False) if jpeg else storage_order(data.images)
        self._images = images
        self._image_view = None if jpeg or remote else torch.Tensor.as_subclass(data.images, torch.Tensor)
        self._labels = torch.Tensor.as_subclass(data.labels, torch.Tensor)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.sampler = sampler
        self.drop_last = drop_last
        if block_shuffle is None:
            block_shuffle = DEFAULT_BLOCK_WINDOW if shuffle and remote and dataset.cache is not None else 0
        self.block_shuffle = block_shuffle
        self._blocks: torch.Tensor | None = None  # each image's block, when block_shuffle asks for it
        self._order_world_size: int | None = None  # the world size that started a loaded state's epoch
        # The seed decides the order and the random draws of transforms and decoded crops; when it decides
        # nothing (an unshuffled loader, as for validation on rank 0 only), no collective is made.
        random = shuffle or transform is not None or isinstance(decode, RandomResizedCropDecode)
        self.seed = seed if seed is not None else _draw_seed(generator, broadcast=random, dataset=dataset)
        self.device = resolve_device(device)
        if decode is not None and decode.gpu:
            check_gpu_decode(self.device)
        self.prefetch = prefetch
        self.threads = threads
        self.transform = transform
        self.epoch = 0
        self._start = 0  # where the next iteration starts in self.epoch: a loaded state's global position
        world_size = distributed_rank()[1]
        self._position = _Position(0, 0, batch_size, world_size, order_world_size=world_size)  # what state_dict reports
        # + 2 buffers: on the CPU the batch being used and the one before it (still bound to the
        # loop variable while the next is fetched) are views of their buffers.
        # Batches are channels-last in memory, as raw datasets store pixels and as decoders write
        # them (so are FFCV's); a raw dataset of format version 1 or 2 keeps its channel-first order.
        if decode is not None:
            shape = torch.Size((3, *decode.size))
        else:
            shape = torch.Size(dataset.image_shape) if remote and not jpeg else self._image_view.shape[1:]
        channels_last = decode is not None or self._stored_channels_last
        # One batch ahead per cropping thread; nvJPEG batches are made on the device, so their ring
        # holds pinned labels only (no host image buffer a GPU decode would never use).
        self._ahead = max(prefetch, threads) if decode is not None and not gpu_decode else prefetch
        self._ring_rows = _largest_batch(batch_size, sampler, len(self._labels))  # grown by a padded order
        self._make_ring = partial(
            _Ring,
            shape=shape,
            slots=self._ahead + 2,
            channels_last=channels_last,
            host_images=not gpu_decode,
        )
        self._rings: dict[torch.device, _RingPool] = {}  # per device: "cuda" resolves at each iteration
        self._initialized = True

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIXED and getattr(self, "_initialized", False):
            raise ValueError(f"{name} attribute should not be set after {type(self).__name__} is initialized")
        super().__setattr__(name, value)

    # -- order -------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` for the next iteration (as ``DistributedSampler.set_epoch``).

        A state loaded for another epoch is discarded.

        Raises:
            TypeError: ``epoch`` is not an integer (int, numpy or 0-d tensor). ValueError: it is negative or past ``2**62``.
        """
        epoch = _integer("epoch", epoch)
        if not 0 <= epoch < 2**62:  # seed + epoch seeds a 64-bit generator
            raise ValueError(f"epoch must be in [0, 2**62), got {epoch}")
        if epoch != self.epoch:
            self._start = 0
            self._order_world_size = None
        self.epoch = epoch
        world_size = distributed_rank()[1]
        self._position = _Position(
            epoch, self._start, self.batch_size, world_size, order_world_size=self._order_world_size or world_size
        )

    def _batches(self, samples: int) -> int:
        return samples // self.batch_size if self.drop_last else math.ceil(samples / self.batch_size)

    def __len__(self) -> int:
        if self.sampler is not None:
            if not hasattr(self.sampler, "__len__"):  # as torch's DataLoader: an iterator's length is unknown
                raise TypeError(f"the loader's sampler ({type(self.sampler).__name__}) has no len()")
            return self._batches(len(self.sampler))
        _, world_size = distributed_rank()
        return self._batches(math.ceil(len(self._labels) / world_size))  # a shard: see epoch_order

    # -- resume ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """Where the latest iteration got, as plain ints (``torch.save`` them with the model).

        ``global_position`` counts the entries of the epoch's order that all ranks together
        consumed: after ``b`` batches of ``batch_size`` on each of ``world_size`` ranks,
        ``b * batch_size * world_size``, at most the length of the epoch's order (``dataset_length``;
        with ``block_shuffle``, rounded up to a multiple of ``order_world_size``, the world size that
        started the epoch and cut its order into pieces). After a finished epoch the state is the next
        epoch at 0; after ``set_epoch`` or ``load_state_dict``, where the next iteration will start.
        """
        position = self._position
        epoch, at = (position.epoch + 1, 0) if position.finished else (position.epoch, position.global_position)
        return {
            "epoch": epoch,
            "global_position": at,
            "batch_size": position.batch_size,
            "world_size": position.world_size,
            "dataset_length": len(self._labels),
            "seed": self.seed,
            "block_shuffle": self.block_shuffle,
            "order_world_size": position.order_world_size,
            "block_layout": self._block_layout(),
        }

    def _block_layout(self) -> int:
        """A fingerprint of the images' blocks, which a block-aware order is drawn from (0 without one):
        the same length with other blocks (another ``block_size``, a rebuilt dataset) is another order."""
        if not (self.shuffle and self.block_shuffle and self.sampler is None):
            return 0
        digest = hashlib.blake2b(self._image_blocks().numpy().tobytes(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 1  # a non-negative int64, as torch.save keeps ints

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from ``state``: the next iteration over its epoch serves what was not consumed.

        On the world size that saved it, each rank continues its ``DistributedSampler`` shard
        exactly where it stopped (bit-identical to an uninterrupted run, also with another batch
        size); on another world size the rest of the epoch's order is resharded over the new ranks
        (elastic resume, see :func:`~gpuload.loading.order.epoch_order`). What was consumed is never
        read again. A ``set_epoch`` to another epoch discards the resume.

        A state saved before ``block_shuffle`` existed loads as an exact shuffle (``block_shuffle=0``).

        Raises:
            ValueError: ``state`` lacks a key of :meth:`state_dict`, is for a dataset of another
                length, was saved on another world size while this loader has a ``sampler``
                (whose order cannot be resharded), or with another ``block_shuffle`` or another
                layout of the images' blocks (another order).
        """
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"state_dict lacks {', '.join(missing)}; pass what gpuload.DataLoader.state_dict returned")
        length, position = len(self._labels), int(state["global_position"])
        if state["dataset_length"] != length:
            raise ValueError(
                f"state_dict is for a dataset of {state['dataset_length']} images, this loader's has {length}"
            )
        _, world_size = distributed_rank()
        if self.sampler is not None and state["world_size"] != world_size:
            raise ValueError(
                f"state_dict was saved with world size {state['world_size']}, this run has world size {world_size}; "
                f"a user-given sampler cannot be resharded: resume on {state['world_size']} processes"
            )
        window = int(state.get("block_shuffle", 0))
        order_world_size = int(state.get("order_world_size", state["world_size"]))
        if window != self.block_shuffle:
            raise ValueError(
                f"state_dict was saved with block_shuffle={window}, this loader has block_shuffle={self.block_shuffle}: "
                f"another order; pass block_shuffle={window} to resume it"
            )
        layout = int(state.get("block_layout") or 0)
        if window and layout and layout != self._block_layout():
            raise ValueError(
                "state_dict was saved on another layout of the dataset's blocks (another block_size, or a dataset "
                "rebuilt since): its block-aware order is another; resume with the dataset and block_size that saved "
                "it, or start the epoch again (set_epoch)"
            )
        if self.sampler is None:
            end = self._order_length(order_world_size)
        else:  # a sampler's indices on every rank, where its length is known
            end = len(self.sampler) * world_size if hasattr(self.sampler, "__len__") else None
        if end is not None and not 0 <= position <= end:
            raise ValueError(f"global_position {position} is not in [0, {end}]")
        self.seed, self.epoch, self._start = int(state["seed"]), int(state["epoch"]), position
        self._order_world_size = order_world_size
        self._position = _Position(
            self.epoch, position, int(state["batch_size"]), int(state["world_size"]), order_world_size=order_world_size
        )

    def _order_length(self, order_world_size: int) -> int:
        """Entries in an epoch's global order: the dataset, or its block-aware order's pieces with their padding."""
        length = len(self._labels)
        if self.shuffle and self.block_shuffle and self.sampler is None:
            return math.ceil(length / order_world_size) * order_world_size
        return length

    def _image_blocks(self) -> torch.Tensor:
        """int64 ``[N]``: the block each image starts in, which the block-aware order groups by."""
        if self._blocks is None:
            if isinstance(self.dataset, MemmapImageDataset):
                self._blocks = self.dataset.image_blocks()
            else:  # an ImageData: images one after the other in 4 MiB blocks
                from ..store.remote_file import DEFAULT_BLOCK_SIZE

                size = self._image_view[0].numel()
                self._blocks = torch.arange(len(self._labels), dtype=torch.int64) * size // DEFAULT_BLOCK_SIZE
        return self._blocks

    # -- iteration ---------------------------------------------------------------------

    def _ring_pool(self, device: torch.device, rows: int = 1) -> _RingPool:
        """The rings of ``device``, their buffers ``rows`` batch rows or more. A block-aware order resumed
        on fewer ranks may serve more entries than the dataset holds (the padding of the world size that
        started the epoch): then buffers of the larger size replace the pool."""
        if rows > self._ring_rows:
            self._ring_rows, self._rings = rows, {}
        if device not in self._rings:
            self._rings[device] = _RingPool(partial(self._make_ring, device=device, batch_size=self._ring_rows))
        return self._rings[device]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        rank, world_size = distributed_rank()
        epoch, start = self.epoch, self._start
        order_world_size = self._order_world_size or world_size  # the world size that started the epoch
        blocks = self._image_blocks() if self.shuffle and self.block_shuffle and self.sampler is None else None
        order = epoch_order(
            len(self._labels),
            epoch=epoch,
            seed=self.seed,
            shuffle=self.shuffle,
            rank=rank,
            world_size=world_size,
            start=start,
            sampler=self.sampler,
            blocks=blocks,
            window=self.block_shuffle,
            order_world_size=order_world_size,
        )
        if self.sampler is not None:
            _check_indices(order, len(self._labels))  # before anything changes: a caught error skips no epoch
        self.epoch, self._start, self._order_world_size = epoch + 1, 0, None
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        # The end of the epoch's global order: the dataset, or the sampler's indices on all ranks.
        end = self._order_length(order_world_size) if self.sampler is None else start + len(order) * world_size
        self._position = _Position(
            epoch, start, self.batch_size, world_size, end=end, order_world_size=order_world_size
        )
        transform = None
        if self.transform is not None:
            transform = _BatchTransform(self.transform, (self.seed, epoch, rank, start, self.batch_size * world_size))
        device = current_device(self.device)  # a loader made before torch.cuda.set_device follows it
        remote_raw = self._images is None and self._image_view is None and self.dataset.storage == "raw"
        if self.decode is None and remote_raw:
            gather: _Gather = partial(_read_raw, self.dataset, self._stored_channels_last)
        elif self.decode is None:
            gather = partial(_index_select, self._images, self._stored_channels_last)
        elif remote_raw:
            gather = partial(crop_remote_raw, self.dataset, decode=self.decode, seed=self.seed, epoch=epoch)
        elif self._images is not None:
            gather = partial(crop_raw, self._image_view, decode=self.decode, seed=self.seed, epoch=epoch)
        elif self.decode.gpu:
            gather = partial(_decode_on_device, self.dataset, self.decode, self.seed, epoch, device)
        else:
            gather = partial(decode_crops, self.dataset, decode=self.decode, seed=self.seed, epoch=epoch)
        prefetcher = None
        if isinstance(self.dataset, MemmapImageDataset) and self.dataset.remote and self.dataset.cache is not None:
            prefetcher = BlockPrefetcher(
                self.dataset.image_file,
                self.dataset._starts,
                self.dataset._lengths,
                batches,
                ahead=max(DEFAULT_AHEAD_BLOCKS, self.block_shuffle),
            )
        pool = self._ring_pool(device, max((len(batch) for batch in batches), default=1))
        return _EpochIterator(self, pool, batches, self._position, gather, transform, prefetcher)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(images={len(self._labels)}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last}, device={str(self.device)!r}, prefetch={self.prefetch}, "
            f"block_shuffle={self.block_shuffle})"
        )


@dataclass
class _Position:
    """How far into ``epoch`` an iteration got (see :meth:`DataLoader.state_dict`)."""

    epoch: int
    global_position: int  # entries of the epoch's order that all ranks together consumed
    batch_size: int
    world_size: int
    end: int = 0  # the global position that ends the epoch (set while iterating)
    finished: bool = False
    order_world_size: int = 1  # the world size that started the epoch (and cut a block-aware order)

    def advance(self, samples: int) -> None:
        """Count a batch of ``samples`` served on every rank."""
        self.global_position = min(self.global_position + samples * self.world_size, self.end)


# The images of a batch (its dataset indices): written into the uint8 host buffer [B, 3, H, W]
# (returns None), or made on the loader's device (returns that tensor: jpeg decoded on the GPU,
# whose host buffer is None).
_Gather = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor | None]


def _index_select(images: torch.Tensor, channels_last: bool, indices: torch.Tensor, out: torch.Tensor) -> None:
    """A raw dataset's batch: one gather straight from the memory-mapped pixels, in the order they lie
    in (``images`` is ``[N, H, W, 3]`` when ``channels_last``, and ``out`` then a channels-last view)."""
    torch.index_select(images, 0, indices, out=out.permute(0, 2, 3, 1) if channels_last else out)


def _read_raw(dataset: MemmapImageDataset, channels_last: bool, indices: torch.Tensor, out: torch.Tensor) -> None:
    """A raw dataset's batch at a URL: each image's stored bytes (read in parallel through the block
    cache, checksums checked) copied into the host buffer in the order they lie."""
    stored = (out.permute(0, 2, 3, 1) if channels_last else out).numpy()
    for row, data in enumerate(dataset.read_images(indices.tolist())):
        stored[row] = np.frombuffer(data, dtype=np.uint8).reshape(stored.shape[1:])


def _decode_on_device(
    dataset: MemmapImageDataset,
    decode: RandomResizedCropDecode | CenterCropDecode,
    seed: int,
    epoch: int,
    device: torch.device,
    indices: torch.Tensor,
    out: None,
) -> torch.Tensor:
    """A jpeg batch decoded and cropped on the loader's device (``decode.gpu``), on the current stream."""
    return decode_batch(dataset, indices, decode, seed=seed, epoch=epoch, device=device)


def _draw_seed(generator: torch.Generator | None, *, broadcast: bool, dataset: object = None) -> int:
    """A seed from ``generator`` (or torch's global RNG); with ``broadcast`` under ``torch.distributed``,
    rank 0's on every rank, so that the ranks shard one permutation however each was seeded, sent with
    the version of ``dataset`` that rank 0 opened: a rank that opened another (the dataset was pushed
    again or rebuilt between the ranks' opens) refuses it, rather than disagree on the epoch's length."""
    version = getattr(dataset, "version", None)
    sent = [int(torch.randint(0, 2**62, (), generator=generator)), version]
    if broadcast and dist.is_available() and dist.is_initialized():
        _check_rank_device()
        dist.broadcast_object_list(sent, src=0)
        if isinstance(dataset, MemmapImageDataset):
            dataset.check_version(sent[1], "by rank 0")
    return sent[0]


def _check_rank_device() -> None:
    """NCCL broadcasts through the current CUDA device: a loader made before ``torch.cuda.set_device``
    would send every rank's seed through cuda:0 (NCCL refuses two ranks on one GPU, or hangs)."""
    local_rank = os.environ.get("LOCAL_RANK")
    if dist.get_backend() != "nccl" or local_rank is None or not local_rank.isdigit():
        return
    # The mistake: still on cuda:0, where torch starts, on a rank that is not the node's first; any
    # other mapping of ranks to devices (several GPUs a rank, a custom order) is the user's choice.
    if int(local_rank) != 0 and torch.cuda.device_count() > 1 and torch.cuda.current_device() == 0:
        raise UsageError(
            f"this rank's current CUDA device is cuda:{torch.cuda.current_device()} while LOCAL_RANK is "
            f"{local_rank}: call torch.cuda.set_device(local_rank) before constructing gpuload.DataLoader "
            "(its seed is broadcast with NCCL through the current device)"
        )


def _check_image_data(data: ImageData, decode: object) -> None:
    """An :class:`ImageData` given to the loader: uint8 images ``[N, C, H, W]`` (3 channels to crop) and
    int64 labels ``[N]``, what the loader's buffers hold."""
    images, labels = data.images, data.labels
    if images.dtype != torch.uint8 or images.dim() != 4:
        raise UsageError(
            f"DataLoader serves uint8 images [N, C, H, W], got {images.dtype} {list(images.shape)}: convert them "
            "(a float image: (x * 255).round().to(torch.uint8))"
        )
    if labels.dtype != torch.int64 or labels.shape != images.shape[:1]:
        raise UsageError(
            f"DataLoader serves int64 labels [N] beside images [N, ...], got {labels.dtype} {list(labels.shape)} "
            f"for {len(images)} images: pass labels.long()"
        )
    if decode is not None and images.shape[1] != 3:
        raise UsageError(f"decode= crops RGB images [N, 3, H, W], got {images.shape[1]} channels")


def _largest_batch(batch_size: int, sampler: Iterable[int] | None, length: int) -> int:
    """The largest batch an epoch can have, what the buffers hold: a batch is never larger than the
    epoch (the dataset's shard, or a sampler's indices where it has a length), whatever ``batch_size``."""
    if sampler is None:
        return min(batch_size, max(1, length))
    return min(batch_size, max(1, len(sampler))) if hasattr(sampler, "__len__") else batch_size


def _check_indices(order: torch.Tensor, length: int) -> None:
    """A sampler's indices must lie in the dataset: found before anything is read or decoded."""
    bad = order[(order < 0) | (order >= length)]
    if len(bad):
        raise UsageError(
            f"the sampler gave index {int(bad[0])}, and the dataset has {length} images (indices 0 to {length - 1}); "
            "give a sampler of indices into this dataset"
        )


def _check_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")


def _integer(name: str, value: object) -> int:
    """``value`` as a Python int: an int, a numpy integer or a 0-d integer tensor (``operator.index``)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool: {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}") from None


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` checked; CUDA when available and ``device`` is ``None``. ``"cuda"`` without an index
    stays so: it means the current device when a batch is made (see :func:`current_device`).

    Raises:
        UsageError: not a device torch knows, not CPU or CUDA, or CUDA where there is none.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except RuntimeError:  # torch's own message lists every device type it knows
        raise UsageError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(
            f"gpuload.DataLoader copies to 'cpu' or 'cuda' devices, got {str(device)!r}; "
            "use device='cpu' and move batches yourself"
        )
    if device.type == "cpu":
        return device
    if not torch.cuda.is_available():
        raise UsageError(f"device {str(device)!r} was asked for but CUDA is not available here; use device='cpu'")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"device {str(device)!r} was asked for and this machine has {torch.cuda.device_count()} GPUs")
    return device


def current_device(device: torch.device) -> torch.device:
    """``device`` with its CUDA index filled in from the current device (the rank's, once
    ``torch.cuda.set_device(local_rank)`` ran).

    Example:
        >>> current_device(torch.device("cpu"))
        device(type='cpu')
    """
    if device.type != "cuda" or device.index is not None:
        return device
    return torch.device("cuda", torch.cuda.current_device())


MIN_TORCHCODEC = (0, 17)  # 0.16 lacks the stream synchronisation before nvJPEG's hardware decoder


def check_gpu_decode(device: torch.device) -> None:
    """``gpu=True`` decodes with nvJPEG through TorchCodec on the loader's CUDA device: a small JPEG is
    decoded there now, so that a TorchCodec that is missing, too old (before 0.17, nvJPEG's hardware
    engine could write while kernels still ran on the stream), built without nvJPEG or unable to start
    its decoder is refused here, not found at the first batch.

    Raises:
        UsageError: any of those, in one line that says what to install, or to use ``gpu=False``.
    """
    if device.type != "cuda":
        raise UsageError(f"gpu=True decodes on a CUDA device, and this loader's device is {device.type}: use gpu=False")
    advice = "pip install 'gpuload[cuda]' (TorchCodec 0.17 or newer), or use gpu=False"
    try:  # decode_jpeg first appears in TorchCodec 0.16
        import torchcodec
        from torchcodec.decoders import decode_jpeg
    except Exception as error:  # ImportError, or the RuntimeError/OSError of a TorchCodec that cannot load
        raise UsageError(
            f"gpu=True decodes with TorchCodec's nvJPEG (torchcodec.decoders.decode_jpeg), which does not load "
            f"here ({_first_line(error)}): {advice}"
        ) from None
    version = getattr(torchcodec, "__version__", "0")
    if _release(version) < MIN_TORCHCODEC:
        raise UsageError(f"gpu=True needs TorchCodec 0.17 or newer, found {version}: {advice}")
    try:
        (decoded,) = decode_jpeg([_probe_jpeg()], mode="RGB", device=current_device(device))
        found = tuple(decoded.shape)
    except Exception as error:  # nvJPEG missing from the build, its decoder failing to start...
        raise UsageError(
            f"gpu=True: TorchCodec {version} could not decode a 16x16 JPEG on {device} ({_first_line(error)}): {advice}"
        ) from None
    if found != (3, 16, 16):
        raise UsageError(f"gpu=True: TorchCodec {version} decoded a 16x16 RGB JPEG to shape {list(found)}: {advice}")


@functools.cache
def _probe_jpeg() -> bytes:
    """A 16x16 colour JPEG (4:2:0, as photos are), for :func:`check_gpu_decode`."""
    import simplejpeg

    pixels = np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3)
    return simplejpeg.encode_jpeg(pixels, quality=90, colorsubsampling="420")


def _release(version: str) -> tuple[int, ...]:
    """``"0.17.0+cu130"`` -> ``(0, 17, 0)``: the numbers of a version string's release part."""
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


class _HostSlot:
    """A CPU buffer of the ring, whose batches are handed to the user as they are.

    Its memory is a numpy array, and each batch is a fresh ``torch.from_numpy(array)[:count]``:
    the tensor's storage holds a reference to the array for as long as any tensor, view or numpy
    view of the batch lives, so the array's reference count tells whether the user still holds it.
    """

    def __init__(self, shape: torch.Size, batch_size: int, channels_last: bool) -> None:
        self.shape, self.batch_size, self.channels_last = shape, batch_size, channels_last
        self._allocate()

    def _allocate(self) -> None:
        channels, *plane = self.shape
        shape = (self.batch_size, *plane, channels) if self.channels_last else (self.batch_size, *self.shape)
        self.images = np.empty(shape, dtype=np.uint8)
        self.labels = np.empty((self.batch_size,), dtype=np.int64)
        self._unheld = self._references()

    def _references(self) -> tuple[int, int]:
        return sys.getrefcount(self.images), sys.getrefcount(self.labels)

    def held(self) -> bool:
        """Whether a batch gathered into this buffer (or anything viewing it) is still alive."""
        return self._references() != self._unheld

    def fill(
        self,
        gather: _Gather,
        labels: torch.Tensor,
        indices: torch.Tensor,
        transform: Callable | None,
        stream: None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        if self.held():
            self._allocate()  # the user kept a batch: it keeps that memory
        count = len(indices)
        batch_images = torch.from_numpy(self.images)[:count]
        batch_images = batch_images.permute(0, 3, 1, 2) if self.channels_last else batch_images
        batch_labels = torch.from_numpy(self.labels)[:count]
        made = gather(indices, batch_images)
        batch_images = batch_images if made is None else made
        torch.index_select(labels, 0, indices, out=batch_labels)
        return batch_images if transform is None else transform(batch_images), batch_labels, None


class _PinnedSlot:
    """A pinned buffer of a CUDA ring, copied to the device on the stream of the producer that filled
    it, with the event of its last copy: it is refilled only once that copy is done. A ring for
    batches decoded on the device holds pinned labels only (``images`` is ``None``)."""

    def __init__(
        self, shape: torch.Size, batch_size: int, channels_last: bool, device: torch.device, images: bool
    ) -> None:
        channels, *plane = shape
        self.images: torch.Tensor | None = None
        if images and channels_last:
            self.images = torch.empty((batch_size, *plane, channels), dtype=torch.uint8, pin_memory=True)
            self.images = self.images.permute(0, 3, 1, 2)
        elif images:
            self.images = torch.empty((batch_size, *shape), dtype=torch.uint8, pin_memory=True)
        self.labels = torch.empty((batch_size,), dtype=torch.int64, pin_memory=True)
        self.device = device
        self.event: torch.cuda.Event | None = None

    def held(self) -> bool:
        return False  # the user gets device copies, never this buffer

    def fill(
        self,
        gather: _Gather,
        labels: torch.Tensor,
        indices: torch.Tensor,
        transform: Callable | None,
        stream: torch.cuda.Stream,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.Event]:
        if self.event is not None:
            _host_waits(self.event)  # the last copy out of this buffer has read it
        count = len(indices)
        host_images = None if self.images is None else self.images[:count]
        host_labels = self.labels[:count]
        torch.index_select(labels, 0, indices, out=host_labels)
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            made = gather(indices, host_images)  # a batch decoded on the device is queued on this stream
            images = host_images.to(self.device, non_blocking=True) if made is None else made
            labels = host_labels.to(self.device, non_blocking=True)
            self.event = torch.cuda.Event(blocking=True)  # the host waits on it: block, do not spin
            self.event.record(stream)  # the copy out of the pinned buffer, for its next fill
            if transform is not None:
                images = transform(images)  # queued on the same stream: the consumer waits for it too
                done = torch.cuda.Event()
                done.record(stream)
                return images, labels, done
        return images, labels, self.event


# The three steps of the stream protocol, each a function of its own (the deletion check of the
# `cuda` tests replaces each with nothing and expects them to fail).


def _host_waits(event: torch.cuda.Event) -> None:
    """A producer waits until the copy out of a pinned buffer is done before refilling it."""
    event.synchronize()


def _stream_waits(stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
    """The consumer's stream waits for a batch's copy (and transform) before anything it queues."""
    stream.wait_event(event)


def _record_on(stream: torch.cuda.Stream, *tensors: torch.Tensor) -> None:
    """The caching allocator keeps a batch's memory until the consumer's stream is done with it."""
    for tensor in tensors:
        tensor.record_stream(stream)


_Slot = _HostSlot | _PinnedSlot


class _Ring:
    """The host buffers of one iteration and, on CUDA, a stream per producer thread for their copies
    (one stream for all would make each batch wait for the other producers' work queued before it)."""

    def __init__(
        self,
        shape: torch.Size,
        batch_size: int,
        slots: int,
        device: torch.device,
        channels_last: bool,
        host_images: bool = True,
    ) -> None:
        self.device = device
        self._streams: list[torch.cuda.Stream] = []
        if device.type == "cuda":
            self.slots: list[_Slot] = [
                _PinnedSlot(shape, batch_size, channels_last, device, host_images) for _ in range(slots)
            ]
        else:
            self.slots = [_HostSlot(shape, batch_size, channels_last) for _ in range(slots)]

    def stream(self, producer: int) -> torch.cuda.Stream | None:
        """The side stream of producer ``producer`` (made once, kept with the ring); ``None`` on the CPU."""
        if self.device.type != "cuda":
            return None
        while len(self._streams) <= producer:
            self._streams.append(torch.cuda.Stream(self.device))
        return self._streams[producer]


class _RingPool:
    """Rings of host buffers: one per live iterator, kept for the next iterations (a few of them),
    so that sequential epochs reuse one ring instead of allocating pinned memory again."""

    def __init__(self, make: Callable[[], _Ring], keep: int = 2) -> None:
        self._make, self._keep = make, keep
        self._free: list[_Ring] = []
        self._lock = threading.Lock()

    def take(self) -> _Ring:
        with self._lock:
            if self._free:
                return self._free.pop()
        return self._make()

    def give_back(self, ring: _Ring) -> None:
        """Keep ``ring`` for another iterator: only once no producer can write into it any more."""
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(ring)


class _BatchTransform:
    """The loader's ``transform`` for the batches of one iteration, without autograd; a transform that
    takes a ``generator`` gets one seeded by ``(seed, epoch, rank, global position of the batch)``."""

    def __init__(self, function: Callable[..., torch.Tensor], key: tuple[int, int, int, int, int]) -> None:
        self.function = function
        self.seed, self.epoch, self.rank, self.start, self.step = key
        # CUDA graphs (torch.compile's "reduce-overhead" and "max-autotune") return static buffers that
        # the next replay overwrites, while the consumer may still be reading the batch before: keep a copy.
        self.copy_output = uses_cuda_graphs(function)
        signed = getattr(function, "_orig_mod", function)  # what torch.compile wrapped
        signed = signed.forward if isinstance(signed, torch.nn.Module) else signed  # a module's __call__ hides it
        try:
            self.takes_generator = "generator" in inspect.signature(signed).parameters
        except (TypeError, ValueError):  # a builtin without a signature
            self.takes_generator = False

    def __call__(self, images: torch.Tensor, *, number: int) -> torch.Tensor:
        with torch.no_grad():
            if not self.takes_generator:
                out = self.function(images)
            else:
                position = self.start + number * self.step  # where this batch starts in the epoch's order
                digest = hashlib.blake2b(repr((self.seed, self.epoch, self.rank, position)).encode(), digest_size=8)
                seed = int.from_bytes(digest.digest(), "big") >> 1
                out = self.function(images, generator=torch.Generator(device=images.device).manual_seed(seed))
            return out.clone() if self.copy_output and out.is_cuda else out


def _on_consumer_side(transform: _BatchTransform | None) -> bool:
    """Whether ``transform`` runs in the consumer's thread, on its stream, when it takes the batch: one
    compiled with CUDA graphs. Its graphs replay into static buffers that every caller shares, with no
    order between replays queued on two producers' streams (each would overwrite the other's batch),
    and torch keeps the graphs' state per thread (torch 2.11 fails an assertion when another thread
    captures one); the consumer's thread is where the user's compiled model runs too, one batch at a time."""
    return transform is not None and transform.copy_output


def uses_cuda_graphs(function: Callable) -> bool:
    """Whether ``function`` was made by ``torch.compile`` with CUDA graphs (``mode="reduce-overhead"``,
    ``"max-autotune"``, or ``options={"triton.cudagraphs": True}``).

    Example:
        >>> uses_cuda_graphs(torch.compile(torch.nn.Identity(), mode="reduce-overhead")), uses_cuda_graphs(abs)
        (True, False)
    """
    config = getattr(function, "get_compiler_config", None)
    return bool(callable(config) and (config() or {}).get("triton.cudagraphs"))


class _Failed:
    """A batch whose gather raised ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Pipeline:
    """The producer threads of one iteration and what they share with it (nothing that keeps the
    iterator alive, so that dropping it runs its finaliser).

    One condition guards it all: the free slots, the batches ready for the consumer, how many
    are prepared ahead (at most ``ahead``), and the stop flag, so stopping wakes every thread at once.
    """

    def __init__(
        self,
        ring: _Ring,
        gather: _Gather,
        labels: torch.Tensor,
        batches: list[torch.Tensor],
        ahead: int,
        producers: int,
        give_back: Callable[[_Ring], None],
        transform: _BatchTransform | None,
        prefetcher: BlockPrefetcher | None = None,
    ) -> None:
        self.ring, self.gather, self.labels, self.batches, self.ahead = ring, gather, labels, batches, ahead
        self.transform = transform
        self.prefetcher = prefetcher  # fetches the coming batches' blocks into the node's cache
        self.give_back = give_back  # called by the last producer to exit
        # Buffers the user may still hold (the last batch of the previous epoch is still bound
        # to the loop variable) go last: by their turn the user has let go of them.
        self.free = deque(sorted(ring.slots, key=lambda slot: slot.held()))
        self.ready: dict[int, Any] = {}
        self.condition = threading.Condition()
        self.next_batch = 0
        self.in_flight = 0  # claimed by a producer, not yet taken by the consumer
        self.stopped = False
        # Streams are made here, in the consumer's thread: a producer never creates CUDA state.
        streams = [ring.stream(i) for i in range(producers)]
        self.threads = [
            threading.Thread(target=self._produce, args=(stream,), name=f"gpuload-gather-{i}", daemon=True)
            for i, stream in enumerate(streams)
        ]
        self.running = producers

    def start(self) -> None:
        with _RUNNING_LOCK:
            _RUNNING.add(self)
        if self.prefetcher is not None:
            self.prefetcher.start()
        for thread in self.threads:
            thread.start()

    def join(self, timeout: float | None = None) -> None:
        current = threading.current_thread()
        for thread in self.threads:
            if thread is not current:
                thread.join(timeout)
        if self.prefetcher is not None:
            self.prefetcher.join(timeout)

    def _produce(self, stream: torch.cuda.Stream | None) -> None:
        limit_torch_threads(default_workers() // len(self.threads))  # the producers share the cores
        try:
            while (claim := self._claim()) is not None:
                self._fill_and_publish(*claim, stream)
        finally:
            self._exit()

    def _exit(self) -> None:
        with self.condition:
            self.running -= 1
            last = self.running == 0
        if last:
            with _RUNNING_LOCK:
                _RUNNING.discard(self)
            self.give_back(self.ring)

    def _fill_and_publish(self, number: int, slot: _Slot, stream: torch.cuda.Stream | None) -> None:
        # A function of its own so that no local keeps a view of the batch once it is published:
        # on the CPU a view left behind would make its slot look held by the user.
        try:
            transform = None
            if self.transform is not None and not _on_consumer_side(self.transform):
                transform = partial(self.transform, number=number)
            item = (slot, *slot.fill(self.gather, self.labels, self.batches[number], transform, stream))
        except BaseException as error:  # raised in the consumer when it reaches this batch
            item = _Failed(error)
        with self.condition:
            self.ready[number] = item
            self.condition.notify_all()

    def _claim(self) -> tuple[int, _Slot] | None:
        with self.condition:
            while not self.stopped and self.next_batch < len(self.batches):
                if self.free and self.in_flight < self.ahead:
                    self.in_flight += 1
                    self.next_batch += 1
                    return self.next_batch - 1, self.free.popleft()
                self.condition.wait(_POLL_S)  # a timeout: stop_soon may have set the flag without notifying
            return None

    def take(self, number: int) -> tuple:
        with self.condition:
            while number not in self.ready:
                self.condition.wait()
            self.in_flight -= 1
            self.condition.notify_all()
            item = self.ready.pop(number)
        if isinstance(item, _Failed):
            raise item.error
        return item

    def release(self, slot: _Slot) -> None:
        with self.condition:
            self.free.append(slot)
            self.condition.notify_all()

    def stop(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.stop()
        with self.condition:
            self.stopped = True
            self.condition.notify_all()

    def stop_soon(self) -> None:
        """Stop without waiting for anything: the garbage collector's path, in whatever thread it runs
        (maybe a producer holding the condition, or while another waits on it). The producers see
        the flag when notified now, if the condition is free, or else at their next poll."""
        if self.prefetcher is not None:
            self.prefetcher.stop()
        self.stopped = True
        if self.condition.acquire(blocking=False):
            try:
                self.condition.notify_all()
            finally:
                self.condition.release()


class _EpochIterator:
    """One epoch of a :class:`DataLoader`; closing it (or dropping it) stops its threads."""

    def __init__(
        self,
        loader: DataLoader,
        rings: _RingPool,
        batches: list[torch.Tensor],
        position: _Position,
        gather: _Gather,
        transform: _BatchTransform | None,
        prefetcher: BlockPrefetcher | None = None,
    ) -> None:
        self.position = position
        self.served = 0
        self.total = len(batches)
        self.closed = False
        self._pipeline = _Pipeline(
            rings.take(),
            gather,
            loader._labels,
            batches,
            loader._ahead,
            min(loader.threads, max(1, self.total)),
            rings.give_back,
            transform,
            prefetcher,
        )
        self._held: deque[_Slot] = deque()  # CPU: slots of the last two batches yielded
        self._pipeline.start()
        # Dropping the iterator (a `break`, the garbage collector) stops its producers without
        # waiting for them; the last one to exit gives the ring back.
        self._finalizer = weakref.finalize(self, self._pipeline.stop_soon)

    def __iter__(self) -> _EpochIterator:
        return self

    def __len__(self) -> int:
        return self.total - self.served

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.closed:
            raise StopIteration
        if self.served == self.total:
            self.position.finished = True
            self.close()
            raise StopIteration
        if len(self._held) == 2:
            self._pipeline.release(self._held.popleft())
        try:
            slot, images, labels, event = self._pipeline.take(self.served)
        except BaseException:
            self.close()
            raise
        if event is None:
            self._held.append(slot)  # the CPU batch is a view of the slot
        else:
            stream = torch.cuda.current_stream(images.device)
            _stream_waits(stream, event)
            _record_on(stream, images, labels)
            self._pipeline.release(slot)  # refilled only after its event: the copy is done
        if _on_consumer_side(self._pipeline.transform):  # after the wait: queued on the consumer's stream
            images = self._pipeline.transform(images, number=self.served)
        self.served += 1
        if self._pipeline.prefetcher is not None:
            self._pipeline.prefetcher.served(self.served)
        self.position.advance(len(labels))
        self.position.finished = self.served == self.total  # a checkpoint now resumes at the next epoch
        return images, labels

    def close(self) -> None:
        """Stop the background threads and wait for them (done at the end of the epoch and on errors).

        Dropping the iterator (a ``break``) stops them too, without waiting.
        """
        self.closed = True
        self._finalizer.detach()
        self._pipeline.stop()
        self._pipeline.join()


# Pipelines whose producers run. Daemon threads still inside torch when the interpreter finalises
# abort the process ("terminate called without an active exception"), so they are stopped and
# joined at exit, before that happens.
_RUNNING: set[_Pipeline] = set()
_RUNNING_LOCK = threading.Lock()


@atexit.register
def _stop_producers_at_exit() -> None:
    with _RUNNING_LOCK:
        pipelines = list(_RUNNING)
    for pipeline in pipelines:
        pipeline.stop_soon()
    for pipeline in pipelines:
        pipeline.join(timeout=_EXIT_JOIN_S)
