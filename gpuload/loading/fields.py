"""The fields a loader serves beside the images and labels: each fixed-shape one gathered into a buffer
of the ring (and copied to the device with the images), text in a list of ``str`` on the host; a mask
gathered whole (a raw dataset's, without ``decode``) or cropped with its image (:mod:`gpuload.loading.masks`)."""

from __future__ import annotations

import torch

from ..format.columns import FieldColumn
from .masks import MaskCrop

__all__ = ["FieldGather", "tensors", "to_device"]


class FieldGather:
    """How one loader's batches get their fields: ``buffers`` says the shape and dtype of a batch row of
    each fixed-shape field (what a slot of the ring holds for it: a mask's is ``size``, its crop's, where
    the loader crops), ``fill`` gathers a batch's (the masks cropped by ``crop``, one epoch's: see
    :meth:`at_epoch`).

    Example:
        >>> import numpy as np
        >>> from gpuload.format.fields import FieldSpec
        >>> score = FieldColumn(FieldSpec("score", "number", "float32", ()), {"data": np.array([0.5, 2.0], np.float32)}, 2)
        >>> fields = FieldGather({"score": score})
        >>> out = torch.empty(2)
        >>> fields.fill(torch.tensor([1, 0]), {"score": out})["score"]
        tensor([2.0000, 0.5000])
    """

    def __init__(
        self, columns: dict[str, FieldColumn], size: tuple[int, int] | None = None, crop: MaskCrop | None = None
    ) -> None:
        self.columns, self.size, self.crop = columns, size, crop

    def at_epoch(self, crop: MaskCrop | None) -> FieldGather:
        """The same fields, their masks cropped by ``crop`` (an epoch's draws)."""
        return FieldGather(self.columns, self.size, crop)

    def __bool__(self) -> bool:
        return bool(self.columns)

    @property
    def buffers(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Each fixed-shape field's batch row: ``(shape, dtype)``."""
        return {
            name: (
                self.size if column.spec.kind == "mask" and self.size else column.spec.shape,
                column.spec.torch_dtype,
            )
            for name, column in self.columns.items()
            if column.spec.kind != "text"
        }

    def fill(self, indices: torch.Tensor, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | list[str]]:
        """The fields of the batch ``indices``: each fixed-shape one written into its buffer in ``out``
        (``[B, *row]``), text read into lists."""
        batch: dict[str, torch.Tensor | list[str]] = {}
        for name, column in self.columns.items():
            if column.spec.kind == "text":
                batch[name] = column.batch(indices)
            elif column.spec.kind == "mask" and self.crop is not None:
                self.crop(column.masks(indices), indices, out[name])
                batch[name] = out[name]
            else:
                column.gather_into(indices, out[name])
                batch[name] = out[name]
        return batch


def to_device(batch: dict[str, torch.Tensor | list[str]], device: torch.device) -> dict[str, torch.Tensor | list[str]]:
    """A batch's fields with every tensor copied to ``device`` (``non_blocking``: from pinned buffers, on the
    current stream); text stays on the host.

    Example:
        >>> to_device({"score": torch.ones(2), "caption": ["a", "b"]}, torch.device("cpu"))
        {'score': tensor([1., 1.]), 'caption': ['a', 'b']}
    """
    return {
        name: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
        for name, value in batch.items()
    }


def tensors(batch: dict[str, torch.Tensor | list[str]]) -> list[torch.Tensor]:
    """A batch's fields that are tensors (not text).

    Example:
        >>> tensors({"score": torch.ones(2), "caption": ["a", "b"]})
        [tensor([1., 1.])]
    """
    return [value for value in batch.values() if isinstance(value, torch.Tensor)]
