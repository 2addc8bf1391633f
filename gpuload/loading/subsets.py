"""The indices of a ``torch.utils.data.Subset`` as the loader reads them: int64, checked."""

from __future__ import annotations

import torch

from ..errors import UsageError

__all__ = ["check_positions", "subset_indices"]


def subset_indices(subset: torch.utils.data.Subset) -> torch.Tensor:
    """A Subset's indices as int64, or one line where they are not integers (1.5 would be truncated to 1).

    Example:
        >>> subset_indices(torch.utils.data.Subset(range(5), [4, 0])).tolist()
        [4, 0]
    """
    values = list(subset.indices)
    try:
        indices = torch.as_tensor(values) if values else torch.empty(0, dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError):
        indices = None
    if indices is None or indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
        got = f"{indices.dtype}" if indices is not None else f"{type(values[0]).__name__}"
        raise UsageError(
            f"a Subset's indices must be integers, got {got} (first {values[0]!r}); give the positions of the "
            "images in its dataset as ints"
        )
    return indices.to(torch.int64)


def check_positions(positions: torch.Tensor, length: int, what: str) -> torch.Tensor:
    """``positions`` in a Subset of ``length`` images (negative ones count from its end, as torch's Subset
    indexes), or one line naming the first outside it.

    Example:
        >>> check_positions(torch.tensor([2, -1]), 3, "the sampler").tolist()
        [2, -1]
    """
    bad = positions[(positions < -length) | (positions >= length)]
    if len(bad):
        raise UsageError(
            f"{what} gave position {int(bad[0])} in a Subset of {length} images (positions 0 to {length - 1}); "
            "give positions in the Subset (or pass its dataset with the indices you mean)"
        )
    return positions
