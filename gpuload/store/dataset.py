"""The built dataset, memory-mapped read-only, behind an ImageFolder-like API."""

from __future__ import annotations

import mmap
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from tensordict import tensorclass

from ..errors import DatasetError
from .manifest import Manifest

__all__ = ["GatheredSamples", "ImageData", "MemmapImageDataset"]

# Linux's MAP_NORESERVE (Python 3.11's mmap module has no constant for it): a private mapping
# without it is charged in full against RAM + swap, so datasets larger than that could not open.
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


@tensorclass
class ImageData:
    """Images and their labels, batched along the first dimension.

    Attributes:
        images: uint8 ``[N, 3, height, width]``.
        labels: int64 ``[N]``.

    Example:
        >>> data = ImageData(images=torch.zeros(2, 3, 4, 4, dtype=torch.uint8), labels=torch.tensor([0, 1]), batch_size=[2])
        >>> data[1].labels
        tensor(1)
    """

    images: torch.Tensor
    labels: torch.Tensor


class GatheredSamples(Sequence):
    """Samples gathered from the memmap in one copy per field.

    It is what :meth:`MemmapImageDataset.__getitems__` gives a ``torch.utils.data.DataLoader``:
    a sequence of ``(image, label)`` pairs, so the default collate works unchanged, whose
    ``data`` (an :class:`ImageData` batch) lets :class:`gpuload.Collate` skip the per-sample stacking.
    """

    def __init__(self, data: ImageData) -> None:
        self.data = data

    def __len__(self) -> int:
        return self.data.batch_size[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.data.images[index], int(self.data.labels[index])


class MemmapImageDataset(torch.utils.data.Dataset):
    """A dataset built by :func:`gpuload.build_memmap`, opened read-only.

    It behaves like ``torchvision.datasets.ImageFolder`` with ``PILToTensor``: ``ds[i]`` is
    ``(uint8 [3, H, W] image, int label)``, and ``classes``, ``class_to_idx``, ``samples``
    and ``targets`` mean the same. ``data`` is the whole :class:`ImageData`, mapped
    copy-on-write without reserving memory (``MAP_PRIVATE | MAP_NORESERVE``): writing into its
    tensors never reaches the files, its fields cannot be replaced, and a dataset far larger
    than RAM + swap opens at once, its pages read from disk only when touched. Pickling it
    (for DataLoader workers) sends the path, not the pixels.

    The files must not change while they are mapped: a file truncated under a running reader
    ends that process with ``SIGBUS`` (the kernel's answer to reading a page that no longer exists).

    Args:
        path: the folder that :func:`gpuload.build_memmap` wrote.

    Raises:
        DatasetError: the folder is not a complete gpuload dataset, or its files disagree
            with its manifest (truncated, resized or missing files, a damaged manifest).

    Example:
        >>> import tempfile
        >>> from gpuload import build_memmap, make_sample_folder
        >>> src = make_sample_folder(Path(tempfile.mkdtemp()) / "photos", images_per_class=1, size=(12, 16))
        >>> ds = MemmapImageDataset(build_memmap(src, progress=False))
        >>> image, label = ds[0]
        >>> image.dtype, image.shape[0], ds.classes[label] in ds.classes
        (torch.uint8, 3, True)
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path).absolute()
        self.manifest: Manifest = Manifest.read(self.path)
        self.classes: list[str] = list(self.manifest.classes)
        self.image_shape: tuple[int, int, int] = tuple(self.manifest.image_shape)
        self.data: ImageData = _open_data(self.path, self.manifest)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: index for index, name in enumerate(self.classes)}

    @property
    def samples(self) -> list[tuple[str, int]]:
        """``(source path, label)`` per image, as in ImageFolder."""
        root = Path(self.manifest.source)
        return [(str(root / path), label) for path, label in self.manifest.samples]

    @property
    def targets(self) -> list[int]:
        return [label for _, label in self.manifest.samples]

    @property
    def skipped(self) -> list[dict]:
        """``{"path", "reason"}`` for each source file that the build could not decode."""
        return self.manifest.skipped

    def __len__(self) -> int:
        return self.data.batch_size[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for a dataset of {len(self)} images")
        return self.data.images[index].clone(), int(self.data.labels[index])

    def __getitems__(self, indices: Sequence[int]) -> GatheredSamples:
        """Gather a batch with one copy per field; used by ``torch.utils.data.DataLoader``."""
        return GatheredSamples(self.data[torch.as_tensor(indices, dtype=torch.long)])

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    def __repr__(self) -> str:
        height, width = self.image_shape[1:]
        return (
            f"{type(self).__name__}({str(self.path)!r}, images={len(self)}, size={height}x{width}, "
            f"classes={len(self.classes)})"
        )


def _open_data(path: Path, manifest: Manifest) -> ImageData:
    for name, size in manifest.files.items():
        file = path / name
        if not file.is_file():
            raise DatasetError(f"{path} is damaged: {name} is missing")
        if file.stat().st_size != size:
            raise DatasetError(
                f"{path} is damaged: {name} has {file.stat().st_size:,} bytes, the manifest says {size:,}"
            )
    count = len(manifest.samples)
    images = _map(path, manifest.array_path("images"), torch.uint8, (count, *manifest.image_shape))
    labels = _map(path, manifest.array_path("labels"), torch.int64, (count,))
    return ImageData(images=images, labels=labels, batch_size=[count]).lock_()


def _map(folder: Path, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Map ``folder/name`` copy-on-write and without reserving memory, as a tensor of ``shape``."""
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    try:
        file = open(folder / name, "rb")  # read-only: a private mapping needs no write permission
    except FileNotFoundError:
        raise DatasetError(f"{folder} is damaged: {name} is missing") from None
    with file:
        size = os.fstat(file.fileno()).st_size
        if size != nbytes:
            raise DatasetError(
                f"{folder} is damaged: {name} has {size:,} bytes, the manifest says {nbytes:,} "
                f"({shape[0]} x {list(shape[1:])} {dtype})"
            )
        mapping = mmap.mmap(
            file.fileno(), nbytes, flags=mmap.MAP_PRIVATE | _MAP_NORESERVE, prot=mmap.PROT_READ | mmap.PROT_WRITE
        )
    return torch.frombuffer(mapping, dtype=dtype).view(shape)
