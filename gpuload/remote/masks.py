"""A mask field at a URL: its data read by range for the samples asked for, as the images are.

A mask field is as large as the images (a raw dataset's ``[N, H, W]``, a jpeg dataset's PNGs), so its
``fields/<name>.memmap`` is not an index object: it is read through a :class:`RemoteFile` (the node's
block cache, or ranged requests without one), a batch's masks in one :meth:`RemoteFile.read_many`. A
jpeg dataset's ``fields/<name>.offsets.memmap`` (8 bytes an image) is read whole at open, as the
images' offsets are. Masks have no checksum of their own (the build digests the whole file, which
``gpuload verify`` checks): a jpeg dataset's PNG that does not decode is dropped from the cache and read
again, once; a raw dataset's bytes cannot be checked when read.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import DatasetError
from ..format.columns import FieldColumn
from ..format.fields import FieldSpec
from .file import RemoteFile

__all__ = ["RemoteMasks"]


class RemoteMasks(FieldColumn):
    """The masks of field ``spec``, their bytes in ``file``; ``offsets`` cut them (jpeg: int64 ``[N + 1]``),
    or each image's is ``spec.row_bytes()`` long (raw: ``None``).

    Example:
        >>> import fsspec
        >>> from gpuload.remote.store import open_store
        >>> fsspec.filesystem("memory").pipe("/masks-doc/fields/m.memmap", bytes(range(8)))
        >>> file = RemoteFile(open_store("memory://masks-doc"), "fields/m.memmap", block_size=4)
        >>> RemoteMasks(FieldSpec("m", "mask", "uint8", (2, 2)), file, None, 2).sample(1)
        tensor([[4, 5],
                [6, 7]], dtype=torch.uint8)
    """

    def __init__(self, spec: FieldSpec, file: RemoteFile, offsets: np.ndarray | None, count: int) -> None:
        self.spec, self.count, self.file, self._offsets = spec, count, file, offsets

    def ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """int64 ``[N]`` each: where each image's mask starts in :attr:`file`, and its length."""
        if self._offsets is None:
            row = self.spec.row_bytes()
            return np.arange(self.count, dtype=np.int64) * row, np.full(self.count, row, dtype=np.int64)
        return self._offsets[:-1], np.diff(self._offsets)

    def check(self, where: str) -> None:
        """As :meth:`FieldColumn.check`; a raw dataset's data holds ``N`` masks of its shape.

        Raises:
            DatasetError: it does not.
        """
        super().check(where)
        expected = self.count * self.spec.row_bytes()
        if self._offsets is None and self.file.size != expected:
            raise DatasetError(
                f"{where} is damaged: {self.file.name} has {self.file.size:,} bytes, {self.count} masks of "
                f"{list(self.spec.shape)} are {expected:,}; push the dataset again"
            )

    def sample(self, index: int) -> torch.Tensor:
        return self.masks(torch.tensor([index]))[0]

    def _decode(self, index: int, data: bytes | np.ndarray) -> torch.Tensor:
        """As :meth:`FieldColumn._decode`; a PNG that does not decode has its cached blocks dropped and is
        read again, once (a block that a power cut damaged), as an image that fails its checksum is."""
        try:
            return super()._decode(index, data)
        except DatasetError:
            start, length = self._range(index)
            self.file.invalidate(start, length)
            again = "also when downloaded again; run gpuload verify on the URL, then push the dataset again"
            return super()._decode(index, self.file.read(start, length), again)

    def _size(self) -> int:
        return self.file.size

    def _values(self, indices: list[int]) -> list[bytes]:
        return self.file.read_many([self._range(index) for index in indices])

    def _range(self, index: int) -> tuple[int, int]:
        if self._offsets is None:
            return index * self.spec.row_bytes(), self.spec.row_bytes()
        start = int(self._offsets[index])
        return start, int(self._offsets[index + 1]) - start

    def _select(self, indices: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        rows = np.frombuffer(bytearray().join(self._values(indices.tolist())), np.uint8)  # one copy, writable
        values = torch.from_numpy(rows).view(len(indices), *self.spec.shape)
        return values if out is None else out.copy_(values)
