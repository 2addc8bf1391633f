"""Where the random draws of the per-sample transforms come from: given uniforms, a generator, or torch's own.

Every per-sample transform of :mod:`gpuload.transforms` (the policies, the erasing, the mix-ups) takes its
randomness as ``draws`` uniform numbers in [0, 1) per sample, a ``[B, draws]`` tensor on the batch's device:
given as ``uniform=`` (for instance from :func:`gpuload.loading.crop.counter_uniforms`, the counter-based
generator of the decode-time crops, a pure function of (seed, epoch, index)), or drawn from a ``generator``
(``gpuload.DataLoader(transform=...)`` passes one seeded by (seed, epoch, rank, the batch's position), so
that a resumed epoch repeats them), or from torch's generator for the device, like dropout.
"""

from __future__ import annotations

import torch

from ..errors import UsageError

__all__ = ["index", "uniforms"]


def uniforms(
    batch: int,
    count: int,
    *,
    device: torch.device,
    generator: torch.Generator | None = None,
    uniform: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[batch, count]`` uniforms in [0, 1): the first ``count`` columns of ``uniform`` when given, else drawn
    on ``device`` from ``generator`` (torch's generator for the device when ``None``).

    Example:
        >>> uniforms(2, 3, device=torch.device("cpu"), generator=torch.Generator().manual_seed(0)).shape
        torch.Size([2, 3])
    """
    if uniform is not None:
        if not isinstance(uniform, torch.Tensor) or uniform.dim() != 2 or uniform.shape[0] != batch:
            got = list(uniform.shape) if isinstance(uniform, torch.Tensor) else type(uniform).__name__
            raise UsageError(f"uniform must be [{batch}, {count}] (a row per sample), got {got}")
        if uniform.shape[1] < count:
            raise UsageError(f"uniform must hold {count} draws per sample, got {uniform.shape[1]}")
        return uniform[:, :count]
    if generator is None:  # torch.compile with a dynamic batch size fails on an explicit generator=None
        return torch.rand((batch, count), device=device)
    return torch.rand((batch, count), device=device, generator=generator)


def index(uniform: torch.Tensor, count: int) -> torch.Tensor:
    """A uniform choice among ``count`` (int64) from uniforms in [0, 1), as ``torch.randint(count)``
    (a uniform rounded up to 1.0 in float32 still gives ``count - 1``).

    Example:
        >>> index(torch.tensor([0.0, 0.49, 0.5, 0.99999999]), 2).tolist()
        [0, 0, 1, 1]
    """
    return torch.floor(uniform * count).to(torch.int64).clamp(0, count - 1)
