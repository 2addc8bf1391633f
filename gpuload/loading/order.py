"""Which samples an epoch visits, in which order, on which rank: seeded like ``DistributedSampler``."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist

__all__ = ["epoch_order", "distributed_rank"]


def distributed_rank() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised default process group, else ``(0, 1)``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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
) -> torch.Tensor:
    """The int64 indices one rank visits in one epoch, from the global position ``start``.

    Without a ``sampler``, the order is exactly ``DistributedSampler(dataset, world_size, rank,
    shuffle, seed).set_epoch(epoch)``'s (``drop_last=False``): ``randperm(length)`` seeded with
    ``seed + epoch`` (or ``arange``), padded by repeating its start to a multiple of
    ``world_size``, then every ``world_size``-th index from ``rank``. Every rank gets the same
    number of indices and every index is visited. With one rank that is a plain seeded permutation.

    ``start`` resumes an interrupted epoch: how many entries of the epoch's order all ranks together
    consumed (after ``b`` batches of ``B`` on each of ``W`` ranks, ``b * B * W``, at most ``length``).
    The rest, ``order[start:]``, is padded and dealt out the same way. On the world size that
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
        return torch.as_tensor(list(sampler), dtype=torch.int64).reshape(-1)[start // world_size :]
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    if not 0 <= start <= length:
        raise ValueError(f"start {start} is not in [0, {length}]")
    if shuffle:
        generator = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(length, generator=generator)
    else:
        order = torch.arange(length)
    rest = order[start:]
    padding = -len(rest) % world_size
    if padding:
        rest = torch.cat([rest, order.repeat(math.ceil(padding / length))[:padding]])
    return rest[rank::world_size]
