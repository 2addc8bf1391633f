"""``gpuload.DataLoader``: shuffled uint8 batches gathered from the memmap and prefetched onto the device."""

from __future__ import annotations

import hashlib
import math
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import ConcatDataset

from ..errors import UsageError
from ..format.dataset import ImageData, MemmapImageDataset
from ..machine import default_workers
from .concat import ConcatGather, ConcatImages
from .crop import CenterCropDecode, RandomResizedCropDecode, counter_uniforms
from .device import check_gpu_decode, current_device, resolve_device
from .fields import FieldGather
from .gathers import dataset_gather, stored_pixels
from .masks import MaskCrop
from .order import distributed_rank, epoch_order, image_blocks
from .per_image import PerImage
from .pipeline import BatchTransform, EpochIterator, Gather, Ring, RingPool, ServedBatch
from .prefetch import DEFAULT_AHEAD_BLOCKS, BlockPrefetcher, BlockPrefetchers
from .subsets import check_positions, subset_indices

__all__ = ["DataLoader"]

# As torch's DataLoader: what shapes the batches is fixed once made (here also the buffers' device and count).
_FIXED = frozenset(
    {
        "dataset", "batch_size", "sampler", "drop_last", "device", "prefetch", "threads", "transform", "decode",
        "block_shuffle", "per_image",
    }
)  # fmt: skip
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

    Yields ``(images, labels)`` (a dataset with fields: a dict, below): uint8 ``[B, 3, H, W]`` in channels-last memory (as raw datasets
    store pixels, as decoders write them and as convolutions on tensor cores read them;
    ``.contiguous()`` gives NCHW; whole batches of a channel-first dataset, format version 1 or 2 or
    an NCHW :class:`ImageData`, keep its layout) and int64 ``[B]``, on ``device``. On the CPU the batch is yours to
    keep: its buffer is only reused once nothing references it.

    A dataset with named fields (:mod:`gpuload.format.fields`) yields a ``dict`` per batch, the keys of
    ``ds[i]``: ``"image"``, ``"label"`` and each field by name; every fixed-shape field (numbers, the
    float32 multi-hot vector of a multi-label field, a segmentation mask: uint8 ``[B, H, W]``, cropped
    with its image's box and flip where ``decode`` crops, see :mod:`gpuload.loading.masks`) is gathered
    into a buffer of the ring beside the images and copied to ``device`` with them, text stays on the
    host as a list of ``str``. The stock ``torch.utils.data.DataLoader`` collates ``ds[i]`` into the
    same dict. ``transform=`` and ``per_image=`` get the images only: with masks, a transform that crops,
    flips or moves pixels (a gpuload crop, flip or policy) is refused.

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
    uniform shuffle (each image a ranged read, or its block's). A ``ConcatDataset`` with such a part
    gets the block-aware order over the blocks of all its parts (each part's numbered after the
    previous part's), and each such part a read-ahead of its own.

    Args:
        dataset: a :class:`MemmapImageDataset`, or an :class:`ImageData` with ``images`` and ``labels``,
            or a ``torch.utils.data.Subset`` of one: its images in the Subset's order (the Subset's
            indices become the ``sampler``; a ``sampler`` given too picks positions in the Subset).
            A Subset with ``shuffle=True`` is refused: pass the whole dataset with
            ``sampler=torch.utils.data.SubsetRandomSampler(subset.indices)`` (a new permutation of those
            indices every epoch, drawn from torch's global generator: no mid-epoch resume, no sharding
            over ranks), or build a dataset of those images. A ``torch.utils.data.ConcatDataset`` of them
            (raw or jpeg, local or at a URL, Subsets and nested ConcatDatasets) is read as one dataset of its
            indices (:mod:`gpuload.loading.concat`): ordered, shuffled, sharded and resumed across all its
            parts, a batch mixing them, each part read by its own reader. Its parts must make one batch:
            without ``decode``, raw images of one size; the same fields; class lists that agree on every
            label (one the start of the other: torch's ConcatDataset would mix two label spaces silently).
            Anything else, and ``gpu=True`` decoding, is refused in one line.
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
        num_workers: accepted so that a stock ``torch.utils.data.DataLoader`` call runs unchanged:
            gpuload has no worker processes, and ``num_workers`` sets ``threads`` (``0``, "in the main
            process" for torch, gives one background thread). Leave both out for the tuned default.
        pin_memory: accepted and type-checked, nothing to set: the host buffers are pinned whenever
            ``device`` is CUDA, and batches arrive on the device already.
        persistent_workers: accepted and type-checked, nothing to set: there are no worker processes
            to keep, and the threads start again in microseconds each epoch.
        torch_only: torch's ``batch_sampler``, ``collate_fn``, ``worker_init_fn``, ``prefetch_factor``,
            ``timeout``, ``multiprocessing_context``, ``in_order`` and ``pin_memory_device`` are refused, each
            in one line saying what to pass instead, unless given at torch's default (``None``, ``0``, ``True``,
            ``""``: they ask for nothing); any other name is a ``TypeError`` as for any function.
        block_shuffle: with ``shuffle``, the window of the block-aware order in blocks of the image
            file (4 MiB, the cache's): ``0`` shuffles every image uniformly (the stock semantics),
            ``K`` permutes the blocks and shuffles the images of each ``K`` consecutive blocks together
            (see :func:`gpuload.loading.order.block_sequence`). ``None`` (default): 32 for a dataset at a
            URL read through a cache, else 0. Images stored by class (ImageFolder order) fill a window
            with about ``K`` blocks' worth of classes: raise ``K`` for more mixing.
        per_image: a callable run on each uint8 image ``[3, H, W]`` of a batch in the loader's threads,
            after the ``decode`` crop and before the copy to the device, returning it the same size (any
            torchvision v2 transform works): each image's draws are seeded by (seed, epoch, index), so
            they replay after a resume; see :mod:`gpuload.loading.per_image` for what it costs.

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
        dataset: MemmapImageDataset | ImageData | torch.utils.data.Subset | ConcatDataset,
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
        per_image: Callable[..., torch.Tensor] | None = None,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        persistent_workers: bool | None = None,
        **torch_only: Any,
    ) -> None:
        _refuse_torch_only(torch_only)
        threads = _torch_options(threads, num_workers, pin_memory, persistent_workers)
        dataset, sampler = _unwrap(dataset, shuffle, sampler)
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
        if decode is not None and not isinstance(decode, (RandomResizedCropDecode, CenterCropDecode)):
            raise UsageError(
                "decode must be a gpuload.RandomResizedCropDecode (training) or a gpuload.CenterCropDecode "
                f"(evaluation), got {type(decode).__name__}: {decode!r}"
            )
        # A ConcatDataset's parts: each checked as a dataset of its own, then against each other.
        self._concat = ConcatImages(dataset, decode) if isinstance(dataset, ConcatDataset) else None
        parts = [dataset] if self._concat is None else self._concat.parts
        data = dataset.data if isinstance(dataset, MemmapImageDataset) else dataset
        if self._concat is None and (not (jpeg or remote or hasattr(data, "images")) or not hasattr(data, "labels")):
            raise TypeError(f"DataLoader needs a MemmapImageDataset or an ImageData, got {type(dataset).__name__}")
        if per_image is not None and not callable(per_image):
            raise TypeError(f"per_image must be callable, got {type(per_image).__name__}: {per_image!r}")
        if per_image is not None and decode is not None and decode.gpu:
            raise UsageError("per_image runs on the host, and gpu=True decodes on the GPU: pass gpu=False")
        if decode is not None and _crops(transform):
            raise UsageError(
                f"decode={type(decode).__name__}(...) crops each image in the loader, and the transform crops it "
                "again (a gpuload.RandomResizedCrop with crop=True; its eval() zooms a 224 crop 1.14x): crop once, "
                "with decode= or in the transform (RandomResizedCrop(crop=False) keeps its flip and jitter), or "
                "build both from one gpuload.Recipe"
            )
        fields = dataset.fields if isinstance(dataset, MemmapImageDataset) else {}
        masks = sorted(name for name, column in fields.items() if column.spec.kind == "mask")
        if masks and _moves_pixels(transform):
            raise UsageError(
                f"the segmentation mask {masks[0]!r} would not follow the transform's crop, flip or geometric ops "
                "(transform= gets the images only): crop with decode=, and call the transform in the loop with the "
                f"masks, images, masks = transform(batch['image'], masks=batch[{masks[0]!r}]) (gpuload.RandomResizedCrop, "
                "Recipe and the policies take masks=)"
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
        for part in parts:
            if not isinstance(part, MemmapImageDataset):  # a dataset's arrays are checked when it opens
                _check_image_data(part, decode)
        self.dataset = dataset
        self.decode = decode
        if self._concat is None:
            # Plain tensors over the same memory, in the order of the file's bytes (a raw dataset's
            # channels-last [N, H, W, 3]): gathers move bytes as they lie and skip tensordict's dispatch.
            self._stored_channels_last = stored_pixels(dataset)[1]
            self._image_view = None if jpeg or remote else torch.Tensor.as_subclass(data.images, torch.Tensor)
            self._labels = torch.Tensor.as_subclass(data.labels, torch.Tensor)
        else:
            self._stored_channels_last, self._image_view = self._concat.channels_last, None
            self._labels = self._concat.labels
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.sampler = sampler
        self.drop_last = drop_last
        if block_shuffle is None:
            block_shuffle = DEFAULT_BLOCK_WINDOW if shuffle and any(_cached(part) for part in parts) else 0
        self.block_shuffle = block_shuffle
        self._blocks: torch.Tensor | None = None  # each image's block, when block_shuffle asks for it
        self._order_world_size: int | None = None  # the world size that started a loaded state's epoch
        # The seed decides the order and the random draws of transforms and decoded crops; when it decides
        # nothing (an unshuffled loader, as for validation on rank 0 only), no collective is made.
        random = (
            shuffle or transform is not None or per_image is not None or isinstance(decode, RandomResizedCropDecode)
        )
        self.seed = seed if seed is not None else _draw_seed(generator, broadcast=random, datasets=parts)
        self.device = resolve_device(device)
        if decode is not None and decode.gpu:
            check_gpu_decode(self.device)
        self.prefetch = prefetch
        self.threads = threads
        self.transform = transform
        self.per_image = per_image
        self.epoch = 0
        self._start = 0  # where the next iteration starts in self.epoch: a loaded state's global position
        world_size = distributed_rank()[1]
        self._position = Position(0, 0, batch_size, world_size, order_world_size=world_size)  # what state_dict reports
        # + 2 buffers: on the CPU the batch being used and the one before it (still bound to the
        # loop variable while the next is fetched) are views of their buffers.
        # Batches are channels-last in memory, as raw datasets store pixels and as decoders write
        # them (so are FFCV's); a raw dataset of format version 1 or 2 keeps its channel-first order.
        if decode is not None:
            shape = torch.Size((3, *decode.size))
        elif self._concat is not None:
            shape = torch.Size(self._concat.image_shape)
        else:
            shape = torch.Size(dataset.image_shape) if remote and not jpeg else self._image_view.shape[1:]
        channels_last = decode is not None or self._stored_channels_last
        # One batch ahead per cropping thread; nvJPEG batches are made on the device, so their ring
        # holds pinned labels only (no host image buffer a GPU decode would never use).
        self._ahead = max(prefetch, threads) if decode is not None and not gpu_decode else prefetch
        self._ring_rows = _largest_batch(batch_size, sampler, len(self._labels))  # grown by a padded order
        if self._concat is not None:
            self._fields: FieldGather = self._concat.fields
        else:
            self._fields = FieldGather(
                dataset.fields if isinstance(dataset, MemmapImageDataset) else {},
                None if decode is None else decode.size,
            )
        self._make_ring = partial(
            Ring,
            shape=shape,
            slots=self._ahead + 2,
            channels_last=channels_last,
            host_images=not gpu_decode,
            fields=self._fields,
        )
        self._rings: dict[torch.device, RingPool] = {}  # per device: "cuda" resolves at each iteration
        self._served: ServedBatch | None = None  # the batch served last (set by its EpochIterator)
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
        self._position = Position(
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
        self._position = Position(
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
            self._blocks = image_blocks(self.dataset) if self._concat is None else self._concat.image_blocks()
        return self._blocks

    # -- iteration ---------------------------------------------------------------------

    def _ring_pool(self, device: torch.device, rows: int = 1) -> RingPool:
        """The rings of ``device``, their buffers ``rows`` batch rows or more. A block-aware order resumed
        on fewer ranks may serve more entries than the dataset holds (the padding of the world size that
        started the epoch): then buffers of the larger size replace the pool."""
        if rows > self._ring_rows:
            self._ring_rows, self._rings = rows, {}
        if device not in self._rings:
            self._rings[device] = RingPool(partial(self._make_ring, device=device, batch_size=self._ring_rows))
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
        self._position = Position(epoch, start, self.batch_size, world_size, end=end, order_world_size=order_world_size)
        transform = None
        if self.transform is not None:
            transform = BatchTransform(self.transform, (self.seed, epoch, rank, start, self.batch_size * world_size))
        device = current_device(self.device)  # a loader made before torch.cuda.set_device follows it
        gather = self._gather(epoch, device)
        if self.per_image is not None:
            gather = PerImage(self.per_image, gather, seed=self.seed, epoch=epoch)
        pool = self._ring_pool(device, max((len(batch) for batch in batches), default=1))
        fields = self._fields
        if self._concat is None and self.decode is not None:  # masks cropped with their images' boxes and flips
            scaled = getattr(self.dataset, "storage", "raw") == "jpeg" and not self.decode.gpu  # DCT-scaled
            fields = fields.at_epoch(MaskCrop(self.decode, seed=self.seed, epoch=epoch, scaled=scaled))
        prefetcher = self._prefetcher(batches)
        return EpochIterator(self, pool, batches, self._position, gather, transform, prefetcher, fields)

    def _gather(self, epoch: int, device: torch.device) -> Gather:
        """What fills a batch of ``epoch``: the dataset's gather, or one per part of a ConcatDataset."""
        if self._concat is None:
            return dataset_gather(self.dataset, self.decode, seed=self.seed, epoch=epoch, device=device)
        gathers = [
            dataset_gather(part, self.decode, seed=self.seed, epoch=epoch, device=device) for part in self._concat.parts
        ]
        return ConcatGather(self._concat, gathers, keyed=self.decode is not None)

    def _prefetcher(self, batches: list[torch.Tensor]) -> BlockPrefetchers | None:
        """The read-ahead of the epoch's blocks into the node's cache, one per object read by range (the
        images, each mask field) of a dataset at a URL with a cache (each part of a ConcatDataset its own,
        given its rows of each batch); ``None`` without one."""
        ahead = max(DEFAULT_AHEAD_BLOCKS, self.block_shuffle)
        if self._concat is None:
            reads = [(self.dataset, batches)] if _cached(self.dataset) else []
        else:
            concat = self._concat
            reads = [
                (part, [concat.local[batch][concat.part[batch] == number] for batch in batches])
                for number, part in enumerate(concat.parts)
                if _cached(part)
            ]
        prefetchers = [
            BlockPrefetcher(file, starts, lengths, part_batches, ahead=ahead)
            for part, part_batches in reads
            for file, starts, lengths in [
                (part.image_file, part._starts, part._lengths),
                *((column.file, *column.ranges()) for column in part._remote_masks()),
            ]
        ]
        return BlockPrefetchers(prefetchers) if prefetchers else None

    def uniforms(self, count: int) -> torch.Tensor:
        """``count`` uniform draws in [0, 1) per sample of the batch served last: float32 ``[B, count]`` on the
        batch's device, a pure function of (seed, epoch, dataset index), like the decode-time crop's (but
        not the same numbers). Give them to a recipe run in the training loop (``uniform=``), and a
        resumed run repeats its per-sample draws exactly, whatever the world size, as it repeats the
        order and the crops; a sample that comes twice in a batch gets the same draws twice.

        Example:
            >>> import tempfile
            >>> from pathlib import Path
            >>> from gpuload import build_memmap, make_sample_folder
            >>> src = make_sample_folder(Path(tempfile.mkdtemp()) / "photos", images_per_class=2, size=(12, 16))
            >>> loader = DataLoader(MemmapImageDataset(build_memmap(src, progress=False)), batch_size=4, device="cpu")
            >>> images, labels = next(iter(loader))
            >>> draws = loader.uniforms(3)
            >>> draws.shape, bool(((draws >= 0) & (draws < 1)).all())
            (torch.Size([4, 3]), True)
        """
        _check_int("count", count)
        if count < 0:  # 0: a recipe that draws nothing on the device (recipe.draws == 0) gets [B, 0]
            raise ValueError(f"count must be at least 0, got {count}")
        if self._served is None:
            raise UsageError("loader.uniforms() gives the draws of the batch served last, and none was: call it "
                             "inside the loop over the loader, after each batch")  # fmt: skip
        served = self._served
        draws = counter_uniforms(_stream_seed(self.seed), served.epoch, served.indices, count)
        # float32 keeps 24 bits: cut each draw to them, as torch.rand does, or one above 1 - 2**-25 rounds to 1.0
        draws = (torch.floor(draws * 2**24) * 2**-24).to(torch.float32)
        if served.device.type == "cuda":  # pinned: a pageable copy would wait for every step queued before
            return draws.pin_memory().to(served.device, non_blocking=True)
        return draws.to(served.device)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(images={len(self._labels)}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last}, device={str(self.device)!r}, prefetch={self.prefetch}, "
            f"block_shuffle={self.block_shuffle})"
        )


@dataclass
class Position:
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


def _stream_seed(seed: int) -> int:
    """The key of :meth:`DataLoader.uniforms`' draws: another stream than the crop's, which keys on ``seed``."""
    return int.from_bytes(hashlib.blake2b(repr(("uniforms", seed)).encode(), digest_size=8).digest(), "big")


def _modules(transform: object) -> list[torch.nn.Module]:
    """The modules of ``transform`` (or of the module ``torch.compile`` wrapped); none for a plain function."""
    module = getattr(transform, "_orig_mod", transform)
    return list(module.modules()) if isinstance(module, torch.nn.Module) else []


def _crops(transform: object) -> bool:
    """Whether ``transform`` crops: holds a cropping :class:`gpuload.RandomResizedCrop`."""
    from ..transforms.augment import RandomResizedCrop

    return any(isinstance(part, RandomResizedCrop) and part.crop for part in _modules(transform))


def _moves_pixels(transform: object) -> bool:
    """Whether ``transform`` moves pixels, which a batch's masks would have to follow: holds a
    :class:`gpuload.RandomResizedCrop` that crops or flips, or a policy."""
    from ..transforms.augment import RandomResizedCrop
    from ..transforms.policies import _Policy

    return any(
        (isinstance(part, RandomResizedCrop) and (part.crop or part.flip)) or isinstance(part, _Policy)
        for part in _modules(transform)
    )


def _draw_seed(generator: torch.Generator | None, *, broadcast: bool, datasets: Sequence[object] = ()) -> int:
    """A seed from ``generator`` (or torch's global RNG); with ``broadcast`` under ``torch.distributed``,
    rank 0's on every rank, so that the ranks shard one permutation however each was seeded, sent with
    the version of each of ``datasets`` (the dataset, or a ConcatDataset's parts) that rank 0 opened: a
    rank that opened another (a dataset pushed again or rebuilt between the ranks' opens) refuses it,
    rather than disagree on the epoch's length."""
    versions = [getattr(dataset, "version", None) for dataset in datasets]
    sent = [int(torch.randint(0, 2**62, (), generator=generator)), versions]
    if broadcast and dist.is_available() and dist.is_initialized():
        _check_rank_device()
        dist.broadcast_object_list(sent, src=0)
        for dataset, version in zip(datasets, sent[1]):
            if isinstance(dataset, MemmapImageDataset):
                dataset.check_version(version, "by rank 0")
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


def _torch_options(
    threads: int | None, num_workers: int | None, pin_memory: bool | None, persistent_workers: bool | None
) -> int | None:
    """The threads asked for, from ``threads`` or torch's ``num_workers`` (see :class:`DataLoader`);
    ``pin_memory`` and ``persistent_workers`` checked (they set nothing)."""
    for name, value in (("pin_memory", pin_memory), ("persistent_workers", persistent_workers)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {type(value).__name__}: {value!r}")
    if num_workers is None:
        return threads
    _check_int("num_workers", num_workers)
    if num_workers < 0:
        raise ValueError(f"num_workers must be 0 or more, got {num_workers}")
    if threads is not None and threads != max(1, num_workers):
        raise ValueError(
            f"num_workers={num_workers} and threads={threads} both set the loader's background threads "
            "(gpuload has no worker processes): pass one of them"
        )
    return max(1, num_workers)


# What torch.utils.data.DataLoader takes and this loader does not, and what to do instead.
_TORCH_ONLY = {
    "batch_sampler": "pass its sampler and batch_size instead (sampler=bs.sampler, batch_size=bs.batch_size)",
    "collate_fn": "batches are gathered whole into uint8 [B, 3, H, W] and int64 [B]; transform the batch "
    "with transform= (on the device) or in your model",
    "worker_init_fn": "there are no worker processes: set up in your process before the loop",
    "prefetch_factor": "pass prefetch= (batches prepared ahead, default 3)",
    "timeout": "the loader's threads have no timeout: leave it out",
    "multiprocessing_context": "there are no worker processes: leave it out",
    "in_order": "batches always come in the sampler's order: leave it out",
    "pin_memory_device": "buffers are pinned whenever device is CUDA: pass device= instead",
}


# torch's defaults of those options: asking for nothing this loader does not do, they are taken (code that
# spells out every argument, DataLoader(**config), passes them).
_TORCH_DEFAULTS = {
    "batch_sampler": None, "collate_fn": None, "worker_init_fn": None, "prefetch_factor": None, "timeout": 0,
    "multiprocessing_context": None, "in_order": True, "pin_memory_device": "",
}  # fmt: skip


def _refuse_torch_only(options: dict[str, Any]) -> None:
    """A stock loader's option that this one does not take: one line with what to pass instead (torch's
    default value, spelt out by a stock call, passes)."""
    for name, value in options.items():
        if name not in _TORCH_ONLY:
            raise TypeError(f"DataLoader() got an unexpected keyword argument {name!r}")
        default = _TORCH_DEFAULTS[name]
        if value is default or (type(value) is type(default) and value == default):
            continue
        raise UsageError(f"gpuload.DataLoader takes no {name} (torch.utils.data.DataLoader's): {_TORCH_ONLY[name]}")


def _unwrap(dataset: object, shuffle: bool, sampler: Iterable[int] | None) -> tuple[object, Iterable[int] | None]:
    """A ``Subset`` of a gpuload dataset (or of a ConcatDataset of them) as the dataset and a sampler of the
    Subset's indices (see :class:`DataLoader`); anything else as given."""
    if not isinstance(dataset, torch.utils.data.Subset):
        return dataset, sampler
    indices, inner = subset_indices(dataset), dataset.dataset
    while isinstance(inner, torch.utils.data.Subset):  # a Subset of a Subset: positions in the inner one
        outer = subset_indices(inner)
        indices, inner = outer[check_positions(indices, len(outer), "the Subset's indices")], inner.dataset
    if shuffle:
        raise UsageError(
            "gpuload.DataLoader shuffles a whole dataset, got a Subset with shuffle=True: pass "
            "DataLoader(subset.dataset, sampler=torch.utils.data.SubsetRandomSampler(subset.indices)) (a new "
            "permutation of those indices each epoch, from torch's global generator: no mid-epoch resume, no "
            "sharding over ranks), or build a dataset of those images"
        )
    if not isinstance(inner, (MemmapImageDataset, ImageData, ConcatDataset)):
        raise TypeError(
            "DataLoader needs a Subset of a MemmapImageDataset, an ImageData or a ConcatDataset of them, got one of "
            f"{type(inner).__name__}"
        )
    # indices into the dataset: negative ones count from its end, as torch's Subset indexes (those beyond are refused)
    length = len(inner)
    indices = torch.where((indices < 0) & (indices >= -length), indices + length, indices)
    if sampler is None:
        return inner, indices.tolist()
    if not hasattr(sampler, "__len__"):  # an iterator of positions: mapped as it goes
        return inner, (int(indices[_position(position, len(indices))]) for position in sampler)
    return inner, _SubsetSampler(sampler, indices)


@dataclass
class _SubsetSampler:
    """A sampler of positions in a Subset, giving the indices of the Subset's dataset."""

    positions: Iterable[int]
    indices: torch.Tensor

    def __iter__(self) -> Iterator[int]:
        # One gather for the epoch: an index per position costs seconds at ImageNet's count (2.5 s for 1.28M)
        positions = torch.tensor([operator.index(position) for position in self.positions], dtype=torch.int64)
        yield from self.indices[check_positions(positions, len(self.indices), "the sampler")].tolist()

    def __len__(self) -> int:
        return len(self.positions)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.positions, "set_epoch"):
            self.positions.set_epoch(epoch)


def _position(position: int, length: int) -> int:
    """One position a sampler gave in a Subset of ``length`` images (see :func:`~gpuload.loading.subsets.check_positions`)."""
    return int(check_positions(torch.tensor([operator.index(position)]), length, "the sampler")[0])


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


def _cached(dataset: object) -> bool:
    """Whether ``dataset`` is read from a URL through a node's block cache (what the read-ahead fills)."""
    return isinstance(dataset, MemmapImageDataset) and dataset.remote and dataset.cache is not None


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
