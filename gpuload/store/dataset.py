"""The built dataset: an ``ImageData`` tensorclass memory-mapped read-only, behind an ImageFolder-like API."""

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from tensordict import TensorDict, tensorclass

from .manifest import DatasetError, Manifest

__all__ = ["ImageData", "MemmapImageDataset", "GatheredSamples"]


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
    and ``targets`` mean the same. ``data`` is the whole :class:`ImageData`, memory-mapped
    copy-on-write: writing into its tensors never reaches the files, and its fields
    cannot be replaced. Pickling it (for DataLoader workers) sends the paths, not the pixels.

    Args:
        path: the folder that :func:`gpuload.build_memmap` wrote.

    Raises:
        DatasetError: the folder is not a complete gpuload dataset, or its files disagree
            with its manifest (truncated, resized, missing or foreign files).

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
        self._manifest: Manifest | None = Manifest.read(self.path)
        self.classes: list[str] = list(self._manifest.classes)
        self.image_shape: tuple[int, int, int] = tuple(self._manifest.image_shape)
        self.data: ImageData = _open_data(self.path, len(self._manifest.samples), self.image_shape)

    @property
    def manifest(self) -> Manifest:
        """The parsed ``manifest.json`` (read again lazily after unpickling)."""
        if self._manifest is None:
            self._manifest = Manifest.read(self.path)
        return self._manifest

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
        state = self.__dict__.copy()
        state["_manifest"] = None
        return state

    def __repr__(self) -> str:
        height, width = self.image_shape[1:]
        return (
            f"{type(self).__name__}({str(self.path)!r}, images={len(self)}, size={height}x{width}, "
            f"classes={len(self.classes)})"
        )


def _open_data(path: Path, count: int, image_shape: tuple[int, int, int]) -> ImageData:
    expected = {"images": ((count, *image_shape), torch.uint8), "labels": ((count,), torch.int64)}
    for name, (shape, dtype) in expected.items():
        file = path / "_tensordict" / f"{name}.memmap"
        if not file.is_file():
            raise DatasetError(f"{path} is damaged: {file.name} is missing")
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        if file.stat().st_size != nbytes:
            raise DatasetError(
                f"{path} is damaged: {file.name} has {file.stat().st_size:,} bytes, "
                f"the manifest says {nbytes:,} ({count} x {list(shape[1:])} {dtype})"
            )
    try:
        data = TensorDict.load_memmap(path, mode="r")
    except Exception as error:
        raise DatasetError(f"{path} is damaged: tensordict cannot load it ({type(error).__name__}: {error})") from None
    if not isinstance(data, ImageData):
        raise DatasetError(f"{path} holds a {type(data).__name__}, not a gpuload ImageData")
    for name, (shape, dtype) in expected.items():
        tensor = getattr(data, name)
        if tensor.shape != shape or tensor.dtype != dtype:
            raise DatasetError(
                f"{path} is damaged: {name} is {tensor.dtype} {list(tensor.shape)}, "
                f"the manifest says {dtype} {list(shape)}"
            )
    return data.lock_()
