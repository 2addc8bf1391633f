"""``gpuload.Collate``: the collate function for the stock ``torch.utils.data.DataLoader``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.utils.data

from ..errors import UsageError
from ..format.dataset import FieldSamples, GatheredSamples, JpegSamples

__all__ = ["Collate"]


class Collate:
    """Batch samples of a :class:`MemmapImageDataset` and send them to ``device`` non-blocking.

    The talk's recipe for the stock loader: ``DataLoader(ds, batch_size=64,
    collate_fn=Collate("cuda"))``. The dataset's ``__getitems__`` already gathered the batch
    with one copy per field, so no per-sample stacking happens here; on CUDA the batch is
    pinned and copied with ``non_blocking=True``. Any other list of ``(image, label)`` pairs
    is stacked first. Returns ``(images, labels)`` like :class:`gpuload.DataLoader`; for a dataset with
    fields, the dict it gives (``"image"``, ``"label"`` and each field: tensors sent with the images, text a
    list of ``str``).

    A jpeg dataset keeps each image at its own size: one of several sizes is refused (load it with
    :class:`gpuload.DataLoader` and ``decode=gpuload.RandomResizedCropDecode(224)`` or
    ``CenterCropDecode``, which crop at decode time); one whose images share one size is stacked.

    With a CUDA ``device`` it must run in the main process (``num_workers=0``): worker
    processes cannot use CUDA, and it refuses to try.

    Example:
        >>> images = torch.zeros(3, 4, 4, dtype=torch.uint8)
        >>> batch_images, labels = Collate("cpu")([(images, 1), (images, 0)])
        >>> batch_images.shape, labels.tolist()
        (torch.Size([2, 3, 4, 4]), [1, 0])
    """

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))

    def __call__(
        self, samples: Sequence[tuple[torch.Tensor, int]]
    ) -> tuple[torch.Tensor, torch.Tensor] | dict[str, torch.Tensor | list[str]]:
        """Batch ``samples``.

        Raises:
            UsageError: the samples of a jpeg dataset whose images have several sizes (at its first
                batch, even where that batch's images share one).
            DatasetError: (from the dataset, before) its ``shapes.memmap`` records several sizes where
                the images have one: it is damaged.
        """
        if isinstance(samples, FieldSamples):
            images, labels = self(samples.pairs)
            fields = {name: value for name, value in samples.batch.items() if name not in ("image", "label")}
            return {"image": images, "label": labels, **{name: self._send(value) for name, value in fields.items()}}
        if isinstance(samples, JpegSamples) and not samples.one_size:
            raise UsageError(
                f"gpuload.Collate stacks images of one size, and the jpeg dataset {samples.path} holds images of "
                "several sizes; load it with gpuload.DataLoader(dataset, decode=gpuload.RandomResizedCropDecode(224))"
                " (training) or decode=gpuload.CenterCropDecode(224) (evaluation), which crop at decode time"
            )
        if isinstance(samples, GatheredSamples):
            images, labels = samples.data.images, samples.data.labels
            images, labels = (
                torch.Tensor.as_subclass(images, torch.Tensor),
                torch.Tensor.as_subclass(labels, torch.Tensor),
            )
        else:
            images = torch.stack([image for image, _ in samples])
            labels = torch.as_tensor([label for _, label in samples], dtype=torch.int64)
        return self._send(images), self._send(labels)

    def _send(self, value: torch.Tensor | list[str]) -> torch.Tensor | list[str]:
        """A batch's tensor on the device (pinned, non-blocking); text stays on the host."""
        if self.device.type == "cpu" or not isinstance(value, torch.Tensor):
            return value
        if self.device.type == "cuda" and torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("Collate with a CUDA device must run in the main process: use num_workers=0")
        return value.pin_memory().to(self.device, non_blocking=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.device)!r})"
