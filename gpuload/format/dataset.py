"""The built dataset, memory-mapped read-only, behind an ImageFolder-like API."""

from __future__ import annotations

import json
import mmap
import operator
import os
import sys
import weakref
from collections.abc import Callable, Sequence
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import simplejpeg
import torch
import xxhash
from tensordict import tensorclass

from ..errors import DatasetError, UsageError
from ..remote.store import is_url
from ..text import image_size
from .columns import FieldColumn
from .fields import FieldSpec, field_path
from .manifest import Manifest
from .table import SampleTable

if TYPE_CHECKING:
    from ..remote.cache import BlockCache
    from ..remote.masks import RemoteMasks

__all__ = [
    "FieldSamples",
    "GatheredSamples",
    "ImageData",
    "JpegData",
    "JpegSamples",
    "MemmapImageDataset",
    "RemoteRawData",
    "Samples",
    "Targets",
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


@tensorclass
class RemoteRawData:
    """What a raw dataset at a URL holds in memory: its labels (its pixels stay in storage, read on demand).

    Attributes:
        labels: int64 ``[N]``.
    """

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


class FieldSamples(Sequence):
    """The samples of a batch of a dataset with fields, gathered: each a dict of the image, the label and
    every field by name (what ``ds[i]`` gives), and ``batch``, the same keys batched (images stacked where
    they share a size, text a list of ``str``), which :class:`gpuload.Collate` takes as it is.
    It is what :meth:`MemmapImageDataset.__getitems__` gives ``torch.utils.data.DataLoader``, whose default
    collate makes the same dict of the samples.
    """

    def __init__(self, batch: dict[str, object], count: int, pairs: Sequence[tuple[torch.Tensor, int]]) -> None:
        self.batch, self.count, self.pairs = batch, count, pairs  # pairs: the images and labels, as without fields

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, object]:
        return {name: value[index] for name, value in self.batch.items()}


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


class Samples(Sequence):
    """``(source path, label)`` of each image of a dataset, as ``ImageFolder.samples`` gives them, read
    from the dataset's table when indexed: nothing is made per image until asked for.

    Example:
        >>> from gpuload.format.table import SampleTable
        >>> samples = Samples("/photos", SampleTable.from_lists([["cat/1.jpg", 0]], ["0000000000000000"]))
        >>> samples[0], len(samples), list(samples)
        (('/photos/cat/1.jpg', 0), 1, [('/photos/cat/1.jpg', 0)])
    """

    def __init__(self, source: str, table: SampleTable) -> None:
        self._root, self._table = Path(source), table

    def __len__(self) -> int:
        return len(self._table)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[position] for position in range(*index.indices(len(self)))]
        position = operator.index(index)
        if not -len(self) <= position < len(self):
            raise IndexError(f"sample {position} is out of range for a dataset of {len(self)} images")
        position %= len(self)
        return str(self._root / self._table.path(position)), int(self._table.labels[position])

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"Samples({len(self)} images from {str(self._root)!r})"


class Targets(Sequence):
    """The label of each image of a dataset, as ``ImageFolder.targets`` gives them: ints over the
    labels file, which ``numpy.asarray`` gives without a copy.

    Example:
        >>> targets = Targets(np.array([2, 0, 1]))
        >>> targets[0], targets[1:], list(targets) == [2, 0, 1], np.asarray(targets).dtype
        (2, [0, 1], True, dtype('int64'))
    """

    def __init__(self, labels: np.ndarray) -> None:
        self._labels = labels

    def __len__(self) -> int:
        return len(self._labels)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._labels[index].tolist()
        return int(self._labels[operator.index(index)])

    def __iter__(self):
        for chunk in range(0, len(self._labels), 1 << 16):
            yield from self._labels[chunk : chunk + (1 << 16)].tolist()

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._labels, dtype=dtype)

    def __repr__(self) -> str:
        return f"Targets({len(self)} labels)"


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

    **Fields.** A dataset built with named fields (numbers, text, multi-label, masks: see
    :mod:`gpuload.format.fields`) gives ``ds[i]`` as a dict: ``{"image": ..., "label": ..., <field>:
    <value>...}`` (a number a tensor, 0-d for a scalar; a multi-label field a float32 multi-hot vector;
    text a ``str``; a mask uint8 ``[H, W]``, its image's size); ``fields`` holds each field's column (:class:`gpuload.format.columns.FieldColumn`) by
    name. A dataset without fields (an ImageFolder's) keeps the ``(image, label)`` pairs.

    **At a URL** (``s3://``, ``gs://``, ``az://``, ``https://``, ``file://``: a dataset that
    :func:`gpuload.push_memmap` wrote): the manifest, the objects' versions (ETags) and the index
    (each image's label, checksum and path; jpeg: its place and size) are read whole at open, checked
    against the build's digests (with a ``cache``, kept in it and mapped from there: a warm open reads
    none of it and holds none of it in memory), the image bytes (and a mask field's) on
    demand by byte ranges, through the node's block cache when ``cache`` is given (see
    :class:`gpuload.BlockCache`: 4 MiB blocks, downloaded once per node, shared by its processes).
    Every image read is checked against its build checksum: a cached block that fails it is dropped
    and fetched again, once. Every request carries the ETag seen at open: an object replaced under
    a running job stops it with :class:`gpuload.ObjectChangedError`, never mixing versions. A raw
    dataset's ``data`` then holds its labels only (``data.images`` stays in storage). ``path`` is the
    redacted URL.

    Pickling it (for DataLoader workers) sends the path (or URL and cache settings), not the data. A
    dataset at a URL read through obstore (``s3://``, ``gs://``, ``az://``) cannot be used in a process
    forked after it was opened (obstore's runtime is not fork-safe): give torch's DataLoader
    ``multiprocessing_context="spawn"``, or use :class:`gpuload.DataLoader` (threads).
    The files must not change while a process reads them: a raw file truncated under a running
    reader ends that process with ``SIGBUS`` (the kernel's answer to reading a page that no longer exists).

    Args:
        path: the folder that :func:`gpuload.build_memmap` wrote, or the URL that
            :func:`gpuload.push_memmap` wrote to.
        cache: (URL only) the node's cache folder, or a :class:`gpuload.BlockCache`; ``None``: no
            cache, each image one ranged read.
        cache_size: (URL only, with a folder ``cache``) the most bytes the cache keeps, e.g. ``"200GB"``.
        storage_options: (URL only) options for the store (see :func:`gpuload.open_store`).
        block_size: (URL only) bytes per cached block.

    Raises:
        DatasetError: the folder (URL) is not a complete gpuload dataset, or its files disagree
            with its manifest (truncated, resized or missing files, a damaged manifest).
        UsageError: cache options for a local folder, or a cache folder without a ``cache_size``.
        RemoteError: a request to the store failed after its retries.

    Example:
        >>> import tempfile
        >>> from gpuload import build_memmap, make_sample_folder
        >>> src = make_sample_folder(Path(tempfile.mkdtemp()) / "photos", images_per_class=1, size=(12, 16))
        >>> ds = MemmapImageDataset(build_memmap(src, progress=False))
        >>> image, label = ds[0]
        >>> image.dtype, image.shape[0], ds.classes[label] in ds.classes, ds.storage
        (torch.uint8, 3, True, 'raw')
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        cache: str | os.PathLike | BlockCache | None = None,
        cache_size: int | str | None = None,
        storage_options: dict | None = None,
        block_size: int | None = None,
    ) -> None:
        self.remote: bool = is_url(path)
        self._file = None
        if self.remote:
            self._open_remote(str(path), cache, cache_size, storage_options, block_size)
            return
        if cache is not None or cache_size is not None or storage_options is not None or block_size is not None:
            raise UsageError(
                f"cache, cache_size, storage_options and block_size are for datasets at a URL; {path} is a local "
                "folder, read through the page cache: leave them out"
            )
        self.path = Path(path).absolute()
        self.manifest: Manifest = Manifest.read(self.path)
        self.version = f"{xxhash.xxh3_64_intdigest((self.path / 'manifest.json').read_bytes()):016x}"
        self.storage: str = self.manifest.storage
        self.classes: list[str] = list(self.manifest.classes)
        _check_files(self.path, self.manifest)
        self.table = _open_table(self.path, self.manifest)
        self._checksums = self.table.checksums
        index: list[mmap.mmap] = []  # the mappings of the per-image index, which the checks below read whole
        self.fields: dict[str, FieldColumn] = {
            spec.name: _open_field(self.path, spec, len(self.manifest), index) for spec in self.manifest.field_specs
        }
        if self.storage == "raw":
            self.image_shape: tuple[int, int, int] | None = tuple(self.manifest.image_shape)
            self.data: ImageData | JpegData = _open_raw(self.path, self.manifest, index)
        else:
            self.image_shape = None
            self.data = _open_jpeg_index(self.path, self.manifest, index)
            self._jpegs = _JpegFile(self.path / self.manifest.array_path("data"))
            self._starts, self._lengths = self.data.starts.numpy(), self.data.lengths.numpy()  # views, fast to index
        self.manifest.check_labels(
            self.data.labels.numpy(), str(self.path), "run gpuload verify, then rebuild the dataset"
        )
        for mapping in index:  # the pages the checks read leave this process (the page cache keeps them)
            mapping.madvise(mmap.MADV_DONTNEED)

    def _open_remote(
        self,
        url: str,
        cache: str | os.PathLike | BlockCache | None,
        cache_size: int | str | None,
        storage_options: dict | None,
        block_size: int | None,
    ) -> None:
        from ..remote.cache import BlockCache, parse_bytes
        from ..remote.dataset import open_remote
        from ..remote.file import DEFAULT_BLOCK_SIZE
        from ..remote.store import open_store

        if cache is None and cache_size is not None:
            raise UsageError(
                f"cache_size={cache_size!r} was given without a cache folder; pass cache='/local/disk/gpuload-cache'"
            )
        block_size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
        if cache is not None and not isinstance(cache, BlockCache):
            if cache_size is None:
                raise UsageError(
                    f"cache={str(cache)!r} needs cache_size, the most bytes it may keep on that disk, e.g. "
                    "cache_size='200GB'"
                )
            limit = parse_bytes(cache_size)
            if isinstance(block_size, int) and limit < block_size:
                raise UsageError(
                    f"cache_size={cache_size!r} ({limit:,} bytes) is less than one block ({block_size:,} bytes), so "
                    "the cache could keep nothing and every read would download its block again; pass a cache_size "
                    "of many blocks, e.g. '10GB'"
                )
            cache = BlockCache(cache, limit)
        self._url, self._options, self.cache = url, storage_options, cache
        self.block_size = block_size
        index = open_remote(open_store(url, storage_options=storage_options), cache, self.block_size)
        self.path = index.store.display
        self.version = index.version
        self.manifest = index.manifest
        self.storage = self.manifest.storage
        self.classes = list(self.manifest.classes)
        self.table = index.table
        self.fields = index.fields
        labels = torch.from_numpy(index.labels)  # mapped from the cache, or read into memory: writable either way
        self._starts, self._lengths = index.starts, index.lengths
        self._checksums = index.checksums()
        self._file = index.image_file(cache=cache, block_size=self.block_size)
        self._pid = os.getpid()
        if self.storage == "raw":
            self.image_shape = tuple(self.manifest.image_shape)
            self.data = RemoteRawData(labels=labels, batch_size=[len(labels)]).lock_()
        else:
            self.image_shape = None
            self.data = JpegData(
                starts=torch.from_numpy(self._starts),
                lengths=torch.from_numpy(self._lengths),
                shapes=torch.from_numpy(index.shapes),
                labels=labels,
                batch_size=[len(labels)],
            ).lock_()

    @property
    def image_file(self):
        """The :class:`gpuload.RemoteFile` of a dataset at a URL (its reads, cache and ``stats``); ``None`` for a folder."""
        return self._file

    def image_blocks(self, block_size: int | None = None) -> torch.Tensor:
        """int64 ``[N]``: the block of the image file (``block_size`` bytes, default the cache's 4 MiB
        blocks) each image starts in: what the loader's block-aware order groups images by."""
        from ..remote.file import DEFAULT_BLOCK_SIZE

        block_size = block_size or (self.block_size if self.remote else DEFAULT_BLOCK_SIZE)
        if self.storage == "jpeg":
            return torch.as_tensor(np.asarray(self._starts) // block_size, dtype=torch.int64)
        size = int(np.prod(self.manifest.image_shape))
        return torch.arange(len(self), dtype=torch.int64) * size // block_size

    def image_ranges(self, indices: Sequence[int]) -> list[tuple[int, int]]:
        """``(start, length)`` in the image file of each image ``indices`` (a dataset at a URL)."""
        return [(int(self._starts[index]), int(self._lengths[index])) for index in indices]

    def read_images(self, indices: Sequence[int]) -> list[bytes]:
        """The stored bytes of the images ``indices`` (JPEGs, or a raw dataset's pixels as they lie),
        each checked against its build checksum; a dataset at a URL reads them in parallel and drops
        and reads again, once, the cached blocks of an image that fails it.

        Raises:
            DatasetError: an image's bytes differ from what was built (also after downloading them
                again), naming the image and its source.
            ObjectChangedError: the image object was replaced since the dataset was opened.
            RemoteError: a request failed after its retries.
        """
        if not self.remote:
            if self.storage == "jpeg":
                return [self.read_jpeg(index) for index in indices]
            stored, _ = storage_order(self.data.images)
            return [stored[int(index)].numpy().tobytes() for index in indices]
        if self._pid != os.getpid():
            self._after_fork()
        indices = [int(index) for index in indices]
        ranges = self.image_ranges(indices)
        try:  # a block damaged in the cache (a power cut) is fetched again, once per node
            return self._file.read_many(ranges, [int(self._checksums[index]) for index in indices])
        except DatasetError as error:
            row = getattr(error, "position", None)
            if row is None:
                raise
            start, length = ranges[row]
            raise DatasetError(
                f"{self.describe(indices[row])} does not match its build checksum, also when downloaded "
                f"again: {self._file.url} is damaged at bytes {start}-{start + length - 1}; run gpuload "
                "verify on the URL, then push the dataset again"
            ) from None

    def _after_fork(self) -> None:
        """In a process forked after the open (a stock DataLoader worker started with ``fork``): an fsspec
        store is opened again here; obstore's runtime cannot run in a forked process at all."""
        from ..remote.file import RemoteFile
        from ..remote.store import open_store

        if self._file.store.backend == "obstore":
            raise UsageError(
                f"{self.path} was opened before this process was forked (a DataLoader worker started with 'fork'), "
                "and obstore cannot run in a forked process: pass multiprocessing_context='spawn' (or 'forkserver') "
                "to torch's DataLoader, or use gpuload.DataLoader, whose threads need no worker processes"
            )
        old = self._file
        store = open_store(self._url, backend=old.store.backend, retry=old.store.retry, storage_options=self._options)

        def again(file: RemoteFile) -> RemoteFile:
            return RemoteFile(store, file.name, info=file.info, cache=self.cache, block_size=self.block_size)

        self._file = again(old)
        for column in self._remote_masks():
            column.file = again(column.file)
        self._pid = os.getpid()

    def _remote_masks(self) -> list[RemoteMasks]:
        """The columns of the mask fields of a dataset at a URL (:class:`gpuload.remote.masks.RemoteMasks`)."""
        from ..remote.masks import RemoteMasks

        return [column for column in self.fields.values() if isinstance(column, RemoteMasks)]

    def raw_pixels(self, data: bytes) -> torch.Tensor:
        """A raw image's stored bytes as ``[3, H, W]`` (channels-last memory where the dataset stores it so)."""
        channels, height, width = self.image_shape
        if self.manifest.layout == "channels_last":
            return torch.from_numpy(np.frombuffer(data, np.uint8).reshape(height, width, channels).copy()).permute(
                2, 0, 1
            )
        return torch.from_numpy(np.frombuffer(data, np.uint8).reshape(channels, height, width).copy())

    def close(self) -> None:
        """Stop the request threads of a dataset at a URL (a folder has none); it reopens them when read again."""
        if self._file is not None:
            self._file.close()
            for column in self._remote_masks():
                column.file.close()

    def __enter__(self) -> MemmapImageDataset:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: index for index, name in enumerate(self.classes)}

    @cached_property
    def samples(self) -> Samples:
        """``(source path, label)`` per image, as in ImageFolder: a sequence read from the dataset's table
        when indexed (nothing made per image up front)."""
        return Samples(self.manifest.source, self.table)

    @cached_property
    def targets(self) -> Targets:
        """The label of each image, as in ImageFolder: a sequence of ints over the labels file (``numpy.asarray``
        of it is the int64 array, no copy)."""
        return Targets(self.table.labels)

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
        if self.remote:
            return self.read_images([index])[0]
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
        return f"{self.path}: image {index} ({self.table.path(index)})"

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
                    f"{self.describe(index)} decodes to {image_size(*found)} where its recorded size is "
                    f"{image_size(*recorded)}: shapes.memmap is damaged; run gpuload verify, then rebuild the dataset"
                )
        return not others.size

    def __len__(self) -> int:
        return self.data.batch_size[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int] | dict[str, object]:
        try:
            index = operator.index(index)  # an int, a numpy or 0-d torch integer; not 1.5
        except TypeError:
            raise TypeError(
                f"a dataset index must be an integer, got {type(index).__name__} {index!r}; "
                "use __getitems__ or a DataLoader for several images"
            ) from None
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for a dataset of {len(self)} images")
        index = index % len(self)
        image, label = self.image_and_label(index)
        if not self.fields:
            return image, label
        return {"image": image, "label": label, **{name: field.sample(index) for name, field in self.fields.items()}}

    def image_and_label(self, index: int) -> tuple[torch.Tensor, int]:
        """Image ``index`` (in range, not negative) and its label, whatever fields the dataset has."""
        if self.storage == "raw" and self.remote:
            return self.raw_pixels(self.read_images([index])[0]), int(self.data.labels[index])
        if self.storage == "raw":
            return self.data.images[index].clone(), int(self.data.labels[index])
        pixels = decode_jpeg_bytes(self.read_jpeg(index), partial(self.describe, index))
        return torch.from_numpy(pixels).permute(2, 0, 1).contiguous(), int(self.data.labels[index])

    def __getitems__(self, indices: Sequence[int]) -> Sequence[tuple[torch.Tensor, int]] | FieldSamples:
        """Gather a batch (raw: with one copy per field; jpeg: each image decoded at its own size);
        used by ``torch.utils.data.DataLoader``. A dataset with fields gives :class:`FieldSamples`."""
        if self.fields:
            pairs = self._pairs(indices)
            at = torch.as_tensor([operator.index(index) for index in indices], dtype=torch.long)
            images = pairs.data.images if isinstance(pairs, GatheredSamples) else [image for image, _ in pairs]
            labels = pairs.data.labels if isinstance(pairs, GatheredSamples) else [label for _, label in pairs]
            batch = {"image": images, "label": labels, **{name: field.batch(at) for name, field in self.fields.items()}}
            return FieldSamples(batch, len(indices), pairs)
        return self._pairs(indices)

    def _pairs(self, indices: Sequence[int]) -> Sequence[tuple[torch.Tensor, int]]:
        if self.storage == "jpeg":  # the batch's bytes in one read (at a URL: its requests in parallel)
            blobs, samples = self.read_images([operator.index(index) for index in indices]), []
            for index, data in zip(indices, blobs):
                pixels = decode_jpeg_bytes(data, partial(self.describe, index))
                samples.append((torch.from_numpy(pixels).permute(2, 0, 1).contiguous(), int(self.data.labels[index])))
            return JpegSamples(samples, self.path, self._one_size)
        if self.remote:
            images = torch.stack([self.raw_pixels(data) for data in self.read_images(indices)])
            labels = self.data.labels[torch.as_tensor(indices, dtype=torch.long)]
            return GatheredSamples(ImageData(images=images, labels=labels, batch_size=[len(indices)]))
        indices = torch.as_tensor(indices, dtype=torch.long)
        stored, channels_last = storage_order(self.data.images)
        images = torch.index_select(stored, 0, indices)  # in the file's order: no transposition
        images = images.permute(0, 3, 1, 2) if channels_last else images
        labels = torch.index_select(self.data.labels, 0, indices)
        return GatheredSamples(ImageData(images=images, labels=labels, batch_size=[len(indices)]))

    def __getstate__(self) -> dict:
        """The path (or URL and cache settings), and the version seen at open: a process that unpickles
        it (a spawned worker, another rank's copy) opens the same version or refuses."""
        if self.remote:
            return {
                "path": self._url,
                "cache": self.cache,
                "storage_options": self._options,
                "block_size": self.block_size,
                "version": self.version,
            }
        return {"path": self.path, "version": self.version}

    def __setstate__(self, state: dict) -> None:
        path, version = state.pop("path"), state.pop("version", None)
        self.__init__(path, **state)
        self.check_version(version, "when it was pickled (for a DataLoader worker, say)")

    def check_version(self, version: str | None, when: str) -> None:
        """Refuse to serve another version of the dataset than the one opened ``when``: a dataset replaced
        in between (pushed again, rebuilt with --overwrite) would mix two versions' images in one job.

        Raises:
            ObjectChangedError: at a URL, the objects are not those seen then; DatasetError: in a folder,
                the manifest is not the one seen then.
        """
        if version is None or version == self.version:
            return
        message = (
            f"{self.path} is not the version that was opened {when}: it was replaced since (pushed again, or "
            "rebuilt with --overwrite), and serving it would mix two versions in one job; restart the job"
        )
        if self.remote:
            from ..errors import ObjectChangedError

            raise ObjectChangedError(message)
        raise DatasetError(message)

    def __repr__(self) -> str:
        size = image_size(*self.image_shape[1:]) if self.image_shape else "each its own"
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
    :func:`gpuload.writing.jpeg.row_window`, whose data may go on after their last row).

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


def _check_files(path: Path, manifest: Manifest) -> None:
    for name, size in manifest.files.items():
        file = path / name
        if not file.is_file():
            raise DatasetError(f"{path} is damaged: {name} is missing")
        if file.stat().st_size != size:
            raise DatasetError(
                f"{path} is damaged: {name} has {file.stat().st_size:,} bytes, the manifest says {size:,}"
            )


def check_meta_shape(
    manifest: Manifest,
    read_meta: Callable[[], bytes | str],
    where: str,
    unreadable: str,
    edited: str,
    errors: tuple[type[Exception], ...] = (ValueError, KeyError, TypeError),
) -> None:
    """The manifest's image layout and shape must be those tensordict's ``meta.json`` (``read_meta()``) recorded
    for the file (format version 2 on): a manifest edited by hand (``layout``, ``image_shape``, an older
    ``format_version``) would otherwise serve the same bytes as scrambled pixels, without an error. A local
    and a remote open check it alike; ``unreadable`` and ``edited`` say what to do in each case.

    Raises:
        DatasetError: they differ, or meta.json does not give the shape (``errors`` while reading it).
    """
    if manifest.format_version < 2:
        return  # version 1's metadata records no shapes
    try:
        recorded = json.loads(read_meta())["images"]["shape"]
    except errors as error:
        raise DatasetError(
            f"{where} is damaged: meta.json does not give the images' shape ({error!r}); {unreadable}"
        ) from None
    expected = list(manifest.array_shapes["images"])
    if recorded != expected:
        raise DatasetError(
            f"{where} is damaged: its manifest ({manifest.layout}, image_shape {manifest.image_shape}) means "
            f"images.memmap is {expected}, and meta.json recorded {recorded} when it was built: the manifest was "
            f"edited; {edited}"
        )


def _open_table(path: Path, manifest: Manifest) -> SampleTable:
    """The dataset's per-image table: its files mapped (format version 4), or its manifest's lists."""
    if manifest.format_version < 4:
        return SampleTable.from_lists(manifest.samples, manifest.checksums)
    table = SampleTable.open(path, len(manifest))
    table.check(str(path), len(manifest.classes))
    return table


def _open_field(path: Path, spec: FieldSpec, count: int, index: list[mmap.mmap]) -> FieldColumn:
    """A field's files mapped (the mappings appended to ``index``), checked for their sizes and ends."""
    if spec.fixed:
        data = _map(path, field_path(spec.name), torch.uint8, (count * spec.row_bytes(),), index).numpy()
        column = FieldColumn(spec, {"data": data.view(spec.stored_dtype)}, count)
    else:
        ragged = np.dtype(np.int32 if spec.kind == "multilabel" else np.uint8)
        offsets = _map(path, field_path(spec.name, "offsets"), torch.int64, (count + 1,), index).numpy()
        size = (path / field_path(spec.name)).stat().st_size
        data = _map(path, field_path(spec.name), torch.uint8, (size,), index).numpy() if size else np.zeros(0, np.uint8)
        column = FieldColumn(spec, {"data": data.view(ragged), "offsets": offsets}, count)
    column.check(str(path))
    return column


def _open_raw(path: Path, manifest: Manifest, index: list[mmap.mmap]) -> ImageData:
    shapes = manifest.array_shapes
    images = _map(path, manifest.array_path("images"), torch.uint8, shapes["images"])
    check_meta_shape(  # the bytes fit the manifest's shape: is it the shape they were written in?
        manifest,
        (path / "meta.json").read_text,
        str(path),
        "rebuild it",
        "run gpuload verify, then rebuild the dataset",
        errors=(OSError, ValueError, KeyError, TypeError),
    )
    if manifest.layout == "channels_last":
        images = images.permute(0, 3, 1, 2)  # [N, 3, H, W] with channels-last strides: a view
    labels = _map(path, manifest.array_path("labels"), torch.int64, shapes["labels"], index)
    return ImageData(images=images, labels=labels, batch_size=[len(manifest)]).lock_()


def _open_jpeg_index(path: Path, manifest: Manifest, index: list[mmap.mmap]) -> JpegData:
    """The index of a jpeg dataset, mapped (the mappings appended to ``index``): where each image lies
    (format version 4: ``offsets`` holds each image's start and end, ``[N, 2]``, the images stored in
    another order than the index's; before, ``[N + 1]`` boundaries of images stored one after the
    other), its size and its label."""
    count = len(manifest)
    shapes = _map(path, manifest.array_path("shapes"), torch.int32, (count, 2), index)
    labels = _map(path, manifest.array_path("labels"), torch.int64, (count,), index)
    if manifest.format_version >= 4:
        bounds = _map(path, manifest.array_path("offsets"), torch.int64, (count, 2), index)
        starts, ends = bounds[:, 0], bounds[:, 1]
    else:
        offsets = _map(path, manifest.array_path("offsets"), torch.int64, (count + 1,), index)
        starts, ends = offsets[:-1], offsets[1:]
    lengths = ends - starts
    if bool((starts < 0).any()) or bool((lengths <= 0).any()) or int(ends.max()) > manifest.files.get("data.memmap"):
        raise DatasetError(f"{path} is damaged: offsets.memmap does not cut data.memmap into {count} images")
    if bool((shapes <= 0).any()):
        raise DatasetError(f"{path} is damaged: shapes.memmap holds a size that is not positive")
    return JpegData(starts=starts, lengths=lengths, shapes=shapes, labels=labels, batch_size=[count]).lock_()


def _map(
    folder: Path, name: str, dtype: torch.dtype, shape: tuple[int, ...], mappings: list[mmap.mmap] | None = None
) -> torch.Tensor:
    """Map ``folder/name`` copy-on-write and without reserving memory, as a tensor of ``shape`` (the
    mapping appended to ``mappings``)."""
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
    if mappings is not None:
        mappings.append(mapping)
    return torch.frombuffer(mapping, dtype=dtype).view(shape)
