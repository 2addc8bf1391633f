"""The loader's per-image hook on the host: any callable on each uint8 image, in the loader's threads.

For a transform gpuload does not have (any torchvision v2 transform, a user's own), ``DataLoader(...,
per_image=fn)`` calls ``fn`` on each image of a batch right after it is gathered or cropped, in the
loader's background threads, before the copy to the device: each image gets its own random draws,
without worker processes. Each image's draws are a pure function of (seed, epoch, index), so thread
timing, the batch size and a resume do not change them:

- a function with a ``generator`` argument gets a ``torch.Generator`` seeded from them;
- any other (torchvision's transforms draw from torch's global generator) runs under a lock with torch's
  global CPU generator seeded from them, and that generator's state is put back afterwards. While it
  runs, draws the training thread makes from the same global CPU generator interleave with the hook's:
  give it a ``generator`` argument where that matters.

What it costs: the function runs in Python, one image at a time, holding the GIL except inside torch's
and Pillow's kernels, so the loader's threads take turns at it (and, without a ``generator`` argument,
the lock serialises it whole): a transform batched on the device (:mod:`gpuload.transforms`) is much
cheaper; the hook is for what is not there.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable

import torch

from ..errors import UsageError
from .calls import stop_iteration_as_error, takes_generator

__all__ = ["PerImage", "image_seed"]

_GLOBAL_RNG = threading.Lock()  # one hook at a time borrows torch's global CPU generator


def image_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one image's draws: a hash of (seed, epoch, index), 63 bits.

    Example:
        >>> image_seed(0, 1, 7) == image_seed(0, 1, 7) != image_seed(0, 2, 7)
        True
    """
    digest = hashlib.blake2b(repr(("per_image", seed, epoch, index)).encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") >> 1


class PerImage:
    """A gather of the loader (``gather(indices, out)``) followed by ``function`` on each image of the batch.

    Example:
        >>> def gather(indices, out):
        ...     out.zero_()
        >>> hook = PerImage(lambda image: image + 1, gather, seed=0, epoch=0)
        >>> out = torch.empty((2, 3, 4, 4), dtype=torch.uint8)
        >>> hook(torch.tensor([5, 9]), out) is None, out.unique().tolist()
        (True, [1])
    """

    def __init__(
        self,
        function: Callable[..., torch.Tensor],
        gather: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None],
        *,
        seed: int,
        epoch: int,
    ) -> None:
        self.function, self.gather, self.seed, self.epoch = function, gather, seed, epoch
        self.takes_generator = takes_generator(function)

    def __call__(self, indices: torch.Tensor, out: torch.Tensor) -> torch.Tensor | None:
        made = self.gather(indices, out)
        batch = out if made is None else made
        for row, index in enumerate(indices.tolist()):
            image = batch[row]
            seed = image_seed(self.seed, self.epoch, index)
            with stop_iteration_as_error("per_image"):
                if self.takes_generator:
                    result = self.function(image, generator=torch.Generator().manual_seed(seed))
                else:
                    with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
                        torch.default_generator.manual_seed(seed)
                        result = self.function(image)
            if not isinstance(result, torch.Tensor) or result.shape != image.shape or result.dtype != image.dtype:
                got = f"{result.dtype} {list(result.shape)}" if isinstance(result, torch.Tensor) else type(result)
                fix = (
                    "return uint8 pixels (.round().clamp(0, 255).to(torch.uint8)), or convert after the loader"
                    if isinstance(result, torch.Tensor) and result.shape == image.shape
                    else "a transform that changes the size belongs in decode= or after the loader"
                )
                raise UsageError(
                    f"per_image must return the image as it came, {image.dtype} {list(image.shape)}, got {got}: {fix}"
                )
            if result.data_ptr() != image.data_ptr() or result.stride() != image.stride():
                # a view of the image in another order (a transposed square) is read whole before it is written
                shared = result.untyped_storage().data_ptr() == image.untyped_storage().data_ptr()
                image.copy_(result.clone() if shared else result)
        return made
