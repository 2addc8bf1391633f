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

__all__ = ["GAMMA_DRAWS", "check_uniform", "gamma", "index", "uniforms"]

_GAMMA_ATTEMPTS = 8  # Marsaglia and Tsang accept at least 95 % of candidates: all 8 refused about once in 2.5e10
GAMMA_DRAWS = 1 + 3 * _GAMMA_ATTEMPTS  # the boost below shape 1; per attempt two for a normal and one to accept


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
        check_uniform(uniform, batch, count)
        return uniform[:, :count]
    if generator is None:  # torch.compile with a dynamic batch size fails on an explicit generator=None
        return torch.rand((batch, count), device=device)
    return torch.rand((batch, count), device=device, generator=generator)


def check_uniform(uniform: object, batch: int, count: int) -> None:
    """Refuse a ``uniform=`` that is not ``[batch, >= count]`` floats in [0, 1) (1.0 taken: a float64 uniform
    rounded to float32), in one line. The values of a CPU tensor are checked; a GPU tensor's are not (the check
    would wait for the device), nor a traced one's.

    Example:
        >>> check_uniform(torch.zeros((2, 3), dtype=torch.int64), 2, 3)
        Traceback (most recent call last):
          ...
        gpuload.errors.UsageError: uniform must hold floats in [0, 1), got torch.int64: give draws such as loader.uniforms(count) or torch.rand(...)
    """
    if not isinstance(uniform, torch.Tensor):
        raise UsageError(
            f"uniform must be a tensor of [{batch}, {count}] uniforms in [0, 1), got {type(uniform).__name__}: "
            "give loader.uniforms(count) (or torch.rand(...))"
        )
    if uniform.dim() != 2 or uniform.shape[0] != batch:
        raise UsageError(f"uniform must be [{batch}, {count}] (a row per sample), got {list(uniform.shape)}")
    if uniform.shape[1] < count:
        raise UsageError(f"uniform must hold {count} draws per sample, got {uniform.shape[1]}")
    advice = "give draws such as loader.uniforms(count) or torch.rand(...)"
    if not uniform.is_floating_point():
        raise UsageError(f"uniform must hold floats in [0, 1), got {uniform.dtype}: {advice}")
    if uniform.device.type == "cpu" and uniform.numel() and not torch.compiler.is_compiling():
        outside = ~((uniform >= 0) & (uniform <= 1))  # NaN too
        if bool(outside.any()):
            raise UsageError(f"uniform must hold floats in [0, 1), got {uniform[outside][0].item()}: {advice}")


def index(uniform: torch.Tensor, count: int) -> torch.Tensor:
    """A uniform choice among ``count`` (int64) from uniforms in [0, 1), as ``torch.randint(count)``
    (a uniform rounded up to 1.0 in float32 still gives ``count - 1``).

    Example:
        >>> index(torch.tensor([0.0, 0.49, 0.5, 0.99999999]), 2).tolist()
        [0, 0, 1, 1]
    """
    return torch.floor(uniform * count).to(torch.int64).clamp(0, count - 1)


def gamma(alpha: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Gamma(``alpha``, 1) samples (float64) from ``[k, GAMMA_DRAWS]`` uniforms in [0, 1), one per shape, for a
    Beta draw (MixUp's, CutMix's) that is a pure function of given uniforms: torch draws Gammas only from a
    generator. Marsaglia and Tsang's method (2000): up to 8 candidates from Box-Muller normals (the first
    accepted, else the mode of the last), for a shape below 1 on ``alpha + 1``, scaled by ``u ** (1 / alpha)``.
    Everything runs on the uniforms' device, with no host synchronisation.

    Example:
        >>> draws = torch.rand((20_000, GAMMA_DRAWS), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> samples = gamma(torch.full((20_000,), 0.2, dtype=torch.float64), draws)
        >>> round(float(samples.mean()), 1)  # Gamma(0.2)'s mean is 0.2
        0.2
    """
    uniform, alpha = uniform.to(torch.float64), alpha.to(torch.float64)
    shape = torch.where(alpha < 1, alpha + 1, alpha)
    d = (shape - 1 / 3)[:, None]
    c = 1 / torch.sqrt(9 * d)
    attempts = uniform[:, 1:].view(-1, _GAMMA_ATTEMPTS, 3)
    radius = torch.sqrt(-2 * torch.log1p(-attempts[..., 0]))  # 1 - u in (0, 1]: no log(0)
    normal = radius * torch.cos(2 * torch.pi * attempts[..., 1])
    v = (1 + c * normal) ** 3
    positive = v > 0
    log_v = torch.log(torch.where(positive, v, torch.ones_like(v)))
    accept = positive & (torch.log1p(-attempts[..., 2]) < 0.5 * normal**2 + d - d * v + d * log_v)
    first = accept.to(torch.uint8).argmax(dim=1, keepdim=True)
    candidate = torch.where(accept.any(dim=1, keepdim=True), (d * v).gather(1, first), d)[:, 0]
    boost = torch.where(alpha < 1, torch.pow(1 - uniform[:, 0], 1 / alpha), torch.ones_like(alpha))
    return candidate * boost
