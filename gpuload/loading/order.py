"""Which samples an epoch visits, in which order, on which rank: seeded like ``DistributedSampler``.

Two orders of a shuffled epoch, both a pure function of (seed, epoch):

- **exact** (:func:`epoch_order` without ``blocks``): a uniform permutation of every image, dealt
  out round-robin as ``DistributedSampler`` deals it;
- **block-aware** (:func:`block_sequence`, :func:`epoch_order` with ``blocks`` and ``window``): for
  data read in blocks from object storage, the blocks are permuted, the images of each window of
  ``window`` consecutive blocks are shuffled together, the sequence is cut into one contiguous piece
  per rank (so each rank streams its own consecutive blocks) and the pieces are interleaved
  (:func:`deal_pieces`) so that round-robin dealing gives rank ``r`` exactly piece ``r``: the global
  position, the exact resume and the elastic resume keep their meaning.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable

import torch
import torch.distributed as dist

from ..errors import UsageError
from ..format.dataset import ImageData, MemmapImageDataset

__all__ = [
    "block_sequence",
    "deal_pieces",
    "distributed_rank",
    "epoch_order",
    "global_order",
    "image_blocks",
    "sampler_indices",
]


def sampler_indices(sampler: Iterable[int]) -> torch.Tensor:
    """The int64 indices a sampler gives (ints, numpy or 0-d torch integers).

    Raises:
        UsageError: a value that is not an integer index (a float, a string, a batch of indices
            from a ``BatchSampler``...) or one out of int64's range, named.

    Example:
        >>> sampler_indices(iter(torch.tensor([3, 1]))).tolist()
        [3, 1]
    """
    indices = []
    for value in sampler:
        try:
            if isinstance(value, bool):
                raise TypeError
            index = operator.index(value)
        except TypeError:
            raise UsageError(
                f"a sampler gives one integer index at a time, got {type(value).__name__}: {value!r}; "
                "for batches of indices (a BatchSampler), pass its sampler and batch_size instead"
            ) from None
        if not -(2**63) <= index < 2**63:
            raise UsageError(f"the sampler gave index {index}, beyond int64; give indices into the dataset")
        indices.append(index)
    return torch.tensor(indices, dtype=torch.int64)


def distributed_rank() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised default process group, else ``(0, 1)``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def image_blocks(dataset: MemmapImageDataset | ImageData) -> torch.Tensor:
    """int64 ``[N]``: the block each image of ``dataset`` starts in, what :func:`block_sequence` groups by: a
    :class:`MemmapImageDataset`'s blocks of its image file, an :class:`ImageData`'s images taken one after the
    other in 4 MiB blocks.

    Example:
        >>> image_blocks(ImageData(images=torch.zeros(3, 3, 1024, 1024, dtype=torch.uint8), labels=torch.zeros(3), batch_size=[3])).tolist()
        [0, 0, 1]
    """
    if isinstance(dataset, MemmapImageDataset):
        return dataset.image_blocks()
    from ..remote.file import DEFAULT_BLOCK_SIZE

    size = dataset.images.shape[1:].numel()
    return torch.arange(len(dataset), dtype=torch.int64) * size // DEFAULT_BLOCK_SIZE


def block_sequence(blocks: torch.Tensor, *, epoch: int, seed: int, window: int) -> torch.Tensor:
    """The block-aware order of one epoch (before it is cut between ranks): every image once.

    ``blocks[i]`` is the block image ``i`` starts in (any int64 ids; images of one block are
    neighbours in storage). The distinct blocks are permuted with ``seed + epoch``; each window of
    ``window`` consecutive blocks of that permutation then gives its images in a uniform random order
    (the windows one after the other). A reader that follows it touches one window of blocks at a time.

    Example:
        >>> blocks = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
        >>> order = block_sequence(blocks, epoch=0, seed=1, window=1)
        >>> [blocks[order[i : i + 3]].unique().numel() for i in range(0, 9, 3)]  # one block at a time
        [1, 1, 1]
        >>> sorted(order.tolist()) == list(range(9))
        True
    """
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int of blocks, got {window!r}")
    generator = torch.Generator().manual_seed(seed + epoch)
    length = len(blocks)
    ids, inverse = torch.unique(blocks, return_inverse=True)
    place = torch.empty(len(ids), dtype=torch.int64)
    place[torch.randperm(len(ids), generator=generator)] = torch.arange(len(ids))  # each block's turn
    windows = place[inverse] // window
    keys = torch.randperm(length, generator=generator)  # distinct: a uniform order inside each window
    return torch.argsort(windows * max(1, length) + keys)


def deal_pieces(sequence: torch.Tensor, world_size: int) -> torch.Tensor:
    """``sequence`` cut into ``world_size`` contiguous pieces of one length (the last padded by
    repeating the sequence's start, as ``DistributedSampler`` pads) and interleaved: entry
    ``i * world_size + r`` is piece ``r``'s ``i``-th, so dealing it round-robin gives rank ``r``
    exactly piece ``r``.

    Example:
        >>> deal_pieces(torch.arange(7), 2).tolist()   # pieces [0, 1, 2, 3] and [4, 5, 6, 0]
        [0, 4, 1, 5, 2, 6, 3, 0]
    """
    length = len(sequence)
    if length == 0:
        return sequence
    per_rank = math.ceil(length / world_size)
    padding = per_rank * world_size - length
    if padding:
        sequence = torch.cat([sequence, sequence.repeat(math.ceil(padding / length))[:padding]])
    return sequence.view(world_size, per_rank).t().reshape(-1)


def global_order(
    length: int,
    *,
    epoch: int,
    seed: int,
    shuffle: bool,
    blocks: torch.Tensor | None = None,
    window: int = 0,
    order_world_size: int = 1,
) -> torch.Tensor:
    """The order of the whole epoch that :func:`epoch_order` deals out: ``randperm(length)`` seeded
    with ``seed + epoch`` (exact shuffle), ``arange(length)`` (no shuffle), or with ``blocks`` and a
    ``window`` the block-aware order for ``order_world_size`` ranks, :func:`deal_pieces` of
    :func:`block_sequence` (``ceil(length / order_world_size) * order_world_size`` entries: the
    padding is inside it).

    Example:
        >>> len(global_order(7, epoch=0, seed=0, shuffle=True, blocks=torch.arange(7) // 3, window=2, order_world_size=2))
        8
    """
    if shuffle and window and blocks is not None:
        if len(blocks) != length:
            raise ValueError(f"blocks has {len(blocks)} entries, the dataset {length} images")
        return deal_pieces(block_sequence(blocks, epoch=epoch, seed=seed, window=window), order_world_size)
    if shuffle:
        return torch.randperm(length, generator=torch.Generator().manual_seed(seed + epoch))
    return torch.arange(length)


def epoch_order(
    length: int,
    *,
    epoch: int,
    seed: int,
    shuffle: bool,
    rank: int = 0,
    world_size: int = 1,
    start: int = 0,
    sampler: Iterable[int] | None = None,
    blocks: torch.Tensor | None = None,
    window: int = 0,
    order_world_size: int | None = None,
) -> torch.Tensor:
    """The int64 indices one rank visits in one epoch, from the global position ``start``.

    Without a ``sampler``, the order is exactly ``DistributedSampler(dataset, world_size, rank,
    shuffle, seed).set_epoch(epoch)``'s (``drop_last=False``): ``randperm(length)`` seeded with
    ``seed + epoch`` (or ``arange``), padded by repeating its start to a multiple of
    ``world_size``, then every ``world_size``-th index from ``rank``. Every rank gets the same
    number of indices and every index is visited. With one rank that is a plain seeded permutation.

    With ``blocks`` (the block each image starts in) and a ``window`` of blocks, a shuffled epoch
    follows the block-aware order of :func:`global_order` instead, built for ``order_world_size``
    ranks (the world size that started the epoch; default ``world_size``): on that world size rank
    ``r`` gets the ``r``-th contiguous piece of the block sequence, every rank as many indices.

    ``start`` resumes an interrupted epoch: how many entries of the epoch's order all ranks together
    consumed (after ``b`` batches of ``B`` on each of ``W`` ranks, ``b * B * W``, at most the order's
    length). The rest, ``order[start:]``, is padded and dealt out the same way. On the world size that
    consumed the start this continues each rank's shard exactly where it stopped; on another it
    reshards the rest over the new ranks (elastic resume). Either way every index is visited once,
    plus the padding.

    A ``sampler`` (any iterable of this rank's indices; its ``set_epoch`` is called when it has one)
    replaces all of this; from ``start`` each rank skips ``start // world_size`` of its indices.

    Example:
        >>> epoch_order(5, epoch=0, seed=0, shuffle=False, rank=1, world_size=2).tolist()
        [1, 3, 0]
        >>> epoch_order(5, epoch=0, seed=0, shuffle=False, rank=1, world_size=2, start=2).tolist()
        [3, 0]
        >>> epoch_order(5, epoch=0, seed=0, shuffle=False, rank=1, world_size=3, start=2).tolist()
        [3]
        >>> sorted(epoch_order(5, epoch=3, seed=7, shuffle=True).tolist())
        [0, 1, 2, 3, 4]
    """
    if sampler is not None:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        return sampler_indices(sampler)[start // world_size :]
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    order = global_order(
        length,
        epoch=epoch,
        seed=seed,
        shuffle=shuffle,
        blocks=blocks,
        window=window,
        order_world_size=order_world_size or world_size,
    )
    if not 0 <= start <= len(order):
        raise ValueError(f"start {start} is not in [0, {len(order)}]")
    rest = order[start:]
    padding = -len(rest) % world_size
    if padding:
        rest = torch.cat([rest, order.repeat(math.ceil(padding / len(order)))[:padding]])
    return rest[rank::world_size]
