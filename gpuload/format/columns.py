"""A field's values by image index, over its arrays: what a dataset serves for each field it holds."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import DatasetError, DecodeError
from .fields import FieldSpec, field_path
from .masks import decode_mask

__all__ = ["FieldColumn"]


class FieldColumn:
    """One field's values by image index, over its arrays (mapped files, or bytes read at a URL): a
    number, multi-label, text or mask field.

    Example:
        >>> spec = FieldSpec("tags", "multilabel", "float32", (3,), ("cat", "dog", "sky"))
        >>> column = FieldColumn(spec, {"data": np.array([0, 2, 1], np.int32), "offsets": np.array([0, 2, 3])}, 2)
        >>> column.sample(0), column.batch(torch.tensor([1, 0]))
        (tensor([1., 0., 1.]), tensor([[0., 1., 0.],
                [1., 0., 1.]]))
    """

    def __init__(self, spec: FieldSpec, arrays: dict[str, np.ndarray], count: int) -> None:
        self.spec, self.count = spec, count
        self._data = arrays["data"]
        self._offsets = arrays.get("offsets")
        if spec.fixed:
            values = self._data.view(spec.stored_dtype).reshape(count, *spec.shape)
            self._tensor = torch.from_numpy(values.view(np.bool_) if spec.dtype == "bool" else values)

    def check(self, where: str) -> None:
        """The cheap checks of an open: offsets that cut the data into ``count`` values (their ends).

        Raises:
            DatasetError: they do not.
        """
        if self._offsets is None:
            return
        offsets, size = self._offsets, self._size()
        if len(offsets) != self.count + 1 or int(offsets[0]) != 0 or int(offsets[-1]) != size:
            name = field_path(self.spec.name, "offsets")
            raise DatasetError(
                f"{where} is damaged: {name} does not cut {field_path(self.spec.name)} into {self.count} values; "
                "run gpuload verify, then rebuild the dataset"
            )

    def sample(self, index: int) -> torch.Tensor | str:
        """Image ``index``'s value: a tensor (0-d for a scalar), a multi-hot vector, a ``str``, or a mask
        (uint8 ``[H, W]``)."""
        if self.spec.fixed:
            return self._tensor[index].clone()
        if self.spec.kind == "text":
            return bytes(self._bytes(index)).decode()
        if self.spec.kind == "mask":
            return self.masks(torch.tensor([index]))[0]
        return self.batch(torch.tensor([index]))[0]

    def masks(self, indices: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """The masks of ``indices``: a raw dataset's ``[B, H, W]``, a jpeg dataset's decoded from their PNGs
        (a list, each uint8 ``[H, W]``).

        Raises:
            DatasetError: a PNG does not decode (the dataset is damaged).
        """
        if self.spec.fixed:
            return self._select(indices)
        positions = indices.tolist()
        return [self._decode(index, data) for index, data in zip(positions, self._values(positions))]

    def _decode(
        self, index: int, data: bytes | np.ndarray, damaged: str = "run gpuload verify, then rebuild it"
    ) -> torch.Tensor:
        try:
            return torch.from_numpy(decode_mask(bytes(data), f"image {index}'s {self.spec.name}"))
        except DecodeError as error:
            raise DatasetError(f"{error}; the dataset is damaged: {damaged}") from None

    def _size(self) -> int:
        """How many values its data holds (bytes; int32 class indices for multi-label)."""
        return len(self._data)

    def _bytes(self, index: int) -> np.ndarray:
        return self._data[int(self._offsets[index]) : int(self._offsets[index + 1])]

    def _values(self, indices: list[int]) -> list[bytes | np.ndarray]:
        """The stored bytes of the values ``indices`` (a field cut by offsets)."""
        return [self._bytes(index) for index in indices]

    def _select(self, indices: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The rows ``indices`` of a fixed-shape field, into ``out`` where given."""
        return torch.index_select(self._tensor, 0, indices, out=out)

    def batch(self, indices: torch.Tensor) -> torch.Tensor | list[str] | list[torch.Tensor]:
        """The values of ``indices``: a tensor ``[B, *shape]``, or a list: of ``str`` for text, of masks
        at their images' sizes in a jpeg dataset."""
        if self.spec.kind == "text":
            return [self.sample(index) for index in indices.tolist()]
        if self.spec.kind == "mask" and not self.spec.fixed:
            return self.masks(indices)
        out = torch.empty((len(indices), *self.spec.shape), dtype=self.spec.torch_dtype)
        self.gather_into(indices, out)
        return out

    def gather_into(self, indices: torch.Tensor, out: torch.Tensor) -> None:
        """The values of ``indices`` written into ``out`` (``[B, *shape]``: a loader's buffer)."""
        if self.spec.fixed:
            self._select(indices, out)
            return
        out.zero_()
        starts, ends = self._offsets[indices.numpy()], self._offsets[indices.numpy() + 1]
        rows = np.repeat(np.arange(len(indices)), ends - starts)
        columns = np.concatenate([self._data[start:end] for start, end in zip(starts.tolist(), ends.tolist())] or [[]])
        out.numpy()[rows, columns.astype(np.int64)] = 1.0
