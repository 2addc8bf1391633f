"""The built dataset, memory-mapped read-only, behind an ImageFolder-like API."""

from __future__ import annotations

import mmap
import os
import sys
import weakref
from collections.abc import Callable, Sequence
from functools import cached_property, partial
from pathlib import Path

import numpy as np
import simplejpeg
import torch
import xxhash
from tensordict import tensorclass

from ..errors import DatasetError
from .manifest import Manifest

__all__ = [
    "GatheredSamples",
    "ImageData",
    "JpegData",
    "JpegSamples",
    "MemmapImageDataset",
    "decode_jpeg_bytes",
    "storage_order",
]

# Linux's MAP_NORESERVE (Python 3.11's mmap module has no constant for it): a private mapping
# without it is charged in full against RAM + swap, so datasets larger than that could not open.
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


@tensorclass
class ImageData:
    """Images and their labels, batched along the first dimension.

    Attributes:
        images: uint8 ``[N, 3, height, width]``; a raw dataset's are channels-last in memory
            (``images.permute(0, 2, 3, 1)`` is the file's ``[N, H, W, 3]``, see :func:`storage_order`).
        labels: int64 ``[N]``.

    Example:
        >>> data = ImageData(images=torch.zeros(2, 3, 4, 4, dtype=torch.uint8), labels=torch.tensor([0, 1]), batch_size=[2])
        >>> data[1].labels
        tensor(1)
    """

    images: torch.Tensor
    labels: torch.Tensor


@tensorclass
class JpegData:
    """Where each stored JPEG lies in the data file, its image's size and its label (a jpeg dataset).

    Attributes:
        starts: int64 ``[N]``: the byte offset of each JPEG in ``data.memmap``.
        lengths: int64 ``[N]``: its length in bytes.
        shapes: int32 ``[N, 2]``: its image's ``(height, width)``.
        labels: int64 ``[N]``.
    """

    starts: torch.Tensor
    lengths: torch.Tensor
    shapes: torch.Tensor
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


class JpegSamples(list):
    """The samples of a jpeg dataset's batch, decoded, each image at its own size.

    It is what :meth:`MemmapImageDataset.__getitems__` gives a ``torch.utils.data.DataLoader`` for a
    jpeg dataset: a list of ``(image, label)`` pairs, for a collate function that crops or pads them.
    ``path`` names the dataset and ``one_size`` says whether all its images share one size, so that
    :class:`gpuload.Collate`, which stacks, can refuse a dataset of several sizes at its first batch.
    """

    def __init__(self, samples: list[tuple[torch.Tensor, int]], path: Path, one_size: bool) -> None:
        super().__init__(samples)
        self.path, self.one_size = path, one_size


class MemmapImageDataset(torch.utils.data.Dataset):
    """A dataset built by :func:`gpuload.build_memmap`, opened read-only, raw or jpeg.

    It behaves like ``torchvision.datasets.ImageFolder`` with ``PILToTensor``: ``ds[i]`` is
    ``(uint8 [3, H, W] image, int label)``, and ``classes``, ``class_to_idx``, ``samples``
    and ``targets`` mean the same. ``storage`` says how the images are kept (from the manifest).

    - ``"raw"``: ``data`` is the whole :class:`ImageData`, mapped copy-on-write without reserving
      memory (``MAP_PRIVATE | MAP_NORESERVE``): writing into its tensors never reaches the files,
      its fields cannot be replaced, and a dataset far larger than RAM + swap opens at once, its
      pages read from disk only when touched. ``data.images`` is ``[N, 3, H, W]`` with
      channels-last strides (a view of the file's ``[N, H, W, 3]``; datasets built before format
      version 3 are channel-first in memory too, and open as they are); ``ds[i]`` is ``[3, H, W]``
      in the same layout.
    - ``"jpeg"``: ``data`` is a :class:`JpegData` (offsets, sizes, labels, in memory); each image's
      bytes are read with one ``pread`` of their range when asked for (:meth:`read_jpeg`), their
      checksum checked, and ``ds[i]`` decodes them exactly (libjpeg-turbo's accurate DCT) at the
      image's own size. :class:`gpuload.DataLoader` crops them at decode time.

    Pickling it (for DataLoader workers) sends the path, not the data. The files must not change
    while a process reads them: a raw file truncated under a running reader ends that process
    with ``SIGBUS`` (the kernel's answer to reading a page that no longer exists).

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
        >>> image.dtype, image.shape[0], ds.classes[label] in ds.classes, ds.storage
        (torch.uint8, 3, True, 'raw')
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path).absolute()
        self.manifest: Manifest = Manifest.read(self.path)
        self.storage: str = self.manifest.storage
        self.classes: list[str] = list(self.manifest.classes)
        _check_files(self.path, self.manifest)
        if self.storage == "raw":
            self.image_shape: tuple[int, int, int] | None = tuple(self.manifest.image_shape)
            self.data: ImageData | JpegData = _open_raw(self.path, self.manifest)
        else:
            self.image_shape = None
            self.data = _open_jpeg_index(self.path, self.manifest)
            self._jpegs = _JpegFile(self.path / self.manifest.array_path("data"))
            self._starts, self._lengths = self.data.starts.numpy(), self.data.lengths.numpy()  # views, fast to index
            self._checksums = np.array([int(checksum, 16) for checksum in self.manifest.checksums], dtype=np.uint64)
        _check_labels(self.path, self.data.labels.numpy(), self.manifest)

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

    def read_jpeg(self, index: int) -> bytes:
        """The stored JPEG bytes of image ``index`` (jpeg datasets), checked against their build checksum.

        Raises:
            DatasetError: the bytes on disk differ from what was built (disk damage), naming the
                image and its source.
        """
        start, length = int(self._starts[index]), int(self._lengths[index])
        try:
            data = self._jpegs.read(start, length)
        except DatasetError as error:
            raise DatasetError(f"{self.describe(index)}: {error}") from None
        if xxhash.xxh3_64_intdigest(data) != self._checksums[index]:
            raise DatasetError(
                f"{self.describe(index)} does not match its build checksum: the file is damaged; "
                f"run gpuload verify, then rebuild the dataset"
            )
        return data

    def describe(self, index: int) -> str:
        """``"<dataset>: image <index> (<source path>)"``, for messages about one image."""
        return f"{self.path}: image {index} ({self.manifest.samples[index][0]})"

    @cached_property
    def _one_size(self) -> bool:
        """Whether a jpeg dataset's images share one size, for a collate that stacks them. Where
        ``shapes.memmap`` records several, the first image and the first of another recorded size are
        decoded (once) to confirm it: a damaged record is reported as damage, not as several sizes.

        Raises:
            DatasetError: one of them decodes to another size than the one recorded for it.
        """
        shapes = self.data.shapes.numpy()
        others = np.flatnonzero((shapes != shapes[0]).any(axis=1))
        for index in (0, int(others[0])) if others.size else ():
            found, recorded = self[index][0].shape[1:], shapes[index]
            if tuple(found) != tuple(recorded):
                raise DatasetError(
                    f"{self.describe(index)} decodes to {found[0]}x{found[1]} where its recorded size is "
                    f"{recorded[0]}x{recorded[1]}: shapes.memmap is damaged; run gpuload verify, then rebuild the dataset"
                )
        return not others.size

    def __len__(self) -> int:
        return self.data.batch_size[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for a dataset of {len(self)} images")
        if self.storage == "raw":
            return self.data.images[index].clone(), int(self.data.labels[index])
        index = index % len(self)
        pixels = decode_jpeg_bytes(self.read_jpeg(index), partial(self.describe, index))
        return torch.from_numpy(pixels).permute(2, 0, 1).contiguous(), int(self.data.labels[index])

    def __getitems__(self, indices: Sequence[int]) -> Sequence[tuple[torch.Tensor, int]]:
        """Gather a batch (raw: with one copy per field; jpeg: each image decoded at its own size);
        used by ``torch.utils.data.DataLoader``."""
        if self.storage == "jpeg":
            return JpegSamples([self[index] for index in indices], self.path, self._one_size)
        indices = torch.as_tensor(indices, dtype=torch.long)
        stored, channels_last = storage_order(self.data.images)
        images = torch.index_select(stored, 0, indices)  # in the file's order: no transposition
        images = images.permute(0, 3, 1, 2) if channels_last else images
        labels = torch.index_select(self.data.labels, 0, indices)
        return GatheredSamples(ImageData(images=images, labels=labels, batch_size=[len(indices)]))

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    def __repr__(self) -> str:
        size = "x".join(map(str, self.image_shape[1:])) if self.image_shape else "each its own"
        return (
            f"{type(self).__name__}({str(self.path)!r}, storage={self.storage!r}, images={len(self)}, "
            f"size={size}, classes={len(self.classes)})"
        )


def decode_jpeg_bytes(
    data: bytes,
    name: Callable[[], str],
    *,
    fast: bool = False,
    min_height: int = 0,
    min_width: int = 0,
    buffer: np.ndarray | None = None,
    strict: bool = True,
) -> np.ndarray:
    """Decode a stored JPEG to RGB ``[H, W, 3]`` with libjpeg-turbo: exactly (accurate DCT and
    upsampling) unless ``fast``, at the smallest DCT scale that keeps at least ``min_height`` x
    ``min_width``, into ``buffer`` when given (large enough; the result views it). ``name()``
    names the image in an error. ``strict=False`` ignores libjpeg's warnings (for the copies of
    :func:`gpuload.store.jpeg.row_window`, whose data may go on after their last row).

    Raises:
        DatasetError: it does not decode (it passed its checksum: the build stored a bad file).
    """
    try:
        return simplejpeg.decode_jpeg(
            data,
            colorspace="RGB",
            fastdct=fast,
            fastupsample=fast,
            min_height=min_height,
            min_width=min_width,
            buffer=buffer,
            strict=strict,
        )
    except ValueError as error:
        raise DatasetError(f"{name()} does not decode ({error}); rebuild the dataset") from None


class _JpegFile:
    """The data file of a jpeg dataset, read with ``pread``: only each image's bytes are read (no
    readahead, ``POSIX_FADV_RANDOM``), and nothing stays mapped, so its pages can be evicted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
        self._closer = weakref.finalize(self, os.close, self.fd)

    def read(self, start: int, length: int) -> bytes:
        data = os.pread(self.fd, length, start)
        while len(data) < length:  # a short read: rare, but allowed
            more = os.pread(self.fd, length - len(data), start + len(data))
            if not more:
                raise DatasetError(f"{self.path} ends before byte {start + length}: the file was truncated")
            data += more
        return data


def storage_order(images: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``[N, 3, H, W]`` images in the order of their memory: the ``[N, H, W, 3]`` view and ``True``
    where they are channels-last, else themselves and ``False``. Gathering or hashing in that order
    moves bytes as they lie, with no transposition.

    Example:
        >>> stored = torch.zeros(2, 4, 5, 3, dtype=torch.uint8)
        >>> view, channels_last = storage_order(stored.permute(0, 3, 1, 2))
        >>> view.shape, channels_last, view.is_contiguous()
        (torch.Size([2, 4, 5, 3]), True, True)
    """
    images = torch.Tensor.as_subclass(images, torch.Tensor)
    if images.dim() == 4 and not images.is_contiguous() and images.is_contiguous(memory_format=torch.channels_last):
        return images.permute(0, 2, 3, 1), True
    return images, False


def _check_labels(path: Path, labels: np.ndarray, manifest: Manifest) -> None:
    """The labels file must say what the manifest says: a damaged label would train on a wrong class
    without any error (8 bytes per image, compared at every open)."""
    recorded = np.fromiter((label for _, label in manifest.samples), dtype=np.int64, count=len(manifest.samples))
    differ = np.flatnonzero(labels != recorded)
    if differ.size:
        first = int(differ[0])
        raise DatasetError(
            f"{path} is damaged: {differ.size} labels in labels.memmap differ from the manifest (first at index "
            f"{first}: {int(labels[first])} where the manifest says {int(recorded[first])}); run gpuload verify, "
            "then rebuild the dataset"
        )


def _check_files(path: Path, manifest: Manifest) -> None:
    for name, size in manifest.files.items():
        file = path / name
        if not file.is_file():
            raise DatasetError(f"{path} is damaged: {name} is missing")
        if file.stat().st_size != size:
            raise DatasetError(
                f"{path} is damaged: {name} has {file.stat().st_size:,} bytes, the manifest says {size:,}"
            )


def _open_raw(path: Path, manifest: Manifest) -> ImageData:
    shapes = manifest.array_shapes
    images = _map(path, manifest.array_path("images"), torch.uint8, shapes["images"])
    if manifest.layout == "channels_last":
        images = images.permute(0, 3, 1, 2)  # [N, 3, H, W] with channels-last strides: a view
    labels = _map(path, manifest.array_path("labels"), torch.int64, shapes["labels"])
    return ImageData(images=images, labels=labels, batch_size=[len(manifest.samples)]).lock_()


def _open_jpeg_index(path: Path, manifest: Manifest) -> JpegData:
    count = len(manifest.samples)
    offsets = _map(path, manifest.array_path("offsets"), torch.int64, (count + 1,)).clone()
    shapes = _map(path, manifest.array_path("shapes"), torch.int32, (count, 2)).clone()
    labels = _map(path, manifest.array_path("labels"), torch.int64, (count,)).clone()
    lengths = offsets[1:] - offsets[:-1]
    if offsets[0] != 0 or bool((lengths <= 0).any()) or int(offsets[-1]) != manifest.files.get("data.memmap"):
        raise DatasetError(f"{path} is damaged: offsets.memmap does not cut data.memmap into {count} images")
    if bool((shapes <= 0).any()):
        raise DatasetError(f"{path} is damaged: shapes.memmap holds a size that is not positive")
    return JpegData(starts=offsets[:-1], lengths=lengths, shapes=shapes, labels=labels, batch_size=[count]).lock_()


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
