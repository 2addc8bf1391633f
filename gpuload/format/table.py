"""Each image's source path, label and checksum: flat files that a dataset maps (format version 4).

A dataset of format version 4 keeps, per image and in dataset order (ImageFolder's):

- ``labels.memmap``: int64 ``[N]``;
- ``checksums.memmap``: the xxh3-64 of the image's stored bytes, as int64 ``[N]`` (the 64 bits of the
  unsigned digest, little-endian; plain tensordict has no uint64);
- ``paths.memmap``: the paths relative to the source folder, UTF-8, one after the other;
- ``path_offsets.memmap``: int64 ``[N + 1]``: path ``i`` is bytes ``offsets[i]`` to ``offsets[i + 1]``.

Opening maps them: no Python object per image, nothing read until asked for, the pages shared by
every process of the machine. Earlier format versions kept the paths, labels and checksums as JSON
lists in ``manifest.json``; :meth:`SampleTable.from_lists` serves those the same way.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xxhash

from ..errors import DatasetError

__all__ = ["TABLE_FILES", "SampleTable", "TableWriter", "file_digest"]

# The table's files besides labels.memmap (which every format version has).
TABLE_FILES = ("checksums.memmap", "paths.memmap", "path_offsets.memmap")
_CHUNK = 4096  # rows kept in memory between writes


class SampleTable:
    """Each image's path (relative to the source folder), label and checksum, by dataset index.

    Attributes:
        labels: int64 ``[N]``, read-only.
        checksums: uint64 ``[N]`` (xxh3-64 of each image's stored bytes), read-only.

    Example:
        >>> table = SampleTable.from_lists([["cat/1.jpg", 0], ["dog/2.jpg", 1]], ["00000000000000ff", "0000000000000001"])
        >>> len(table), table.path(1), int(table.labels[1]), int(table.checksums[0])
        (2, 'dog/2.jpg', 1, 255)
    """

    def __init__(self, labels: np.ndarray, checksums: np.ndarray, paths: np.ndarray, offsets: np.ndarray) -> None:
        self.labels, self.checksums, self._paths, self._offsets = labels, checksums, paths, offsets

    @classmethod
    def open(cls, folder: str | os.PathLike, count: int) -> SampleTable:
        """Map the table of the format-4 dataset in ``folder``, of ``count`` images (its files' sizes
        were checked against the manifest).

        Raises:
            DatasetError: a file is missing or not the size ``count`` images take.
        """
        folder = Path(folder)
        offsets = map_array(folder, "path_offsets.memmap", np.int64, count + 1)
        paths = map_array(folder, "paths.memmap", np.uint8, None)
        return cls(
            map_array(folder, "labels.memmap", np.int64, count),
            map_array(folder, "checksums.memmap", np.int64, count).view(np.uint64),
            paths,
            offsets,
        )

    @classmethod
    def from_bytes(cls, labels: bytes, checksums: bytes, paths: bytes, offsets: bytes) -> SampleTable:
        """A table from the bytes of its four files (a dataset at a URL reads them whole)."""
        return cls(
            np.frombuffer(labels, np.int64),
            np.frombuffer(checksums, np.uint64),
            np.frombuffer(paths, np.uint8),
            np.frombuffer(offsets, np.int64),
        )

    @classmethod
    def from_lists(cls, samples: Sequence[Sequence], checksums: Sequence[str]) -> SampleTable:
        """The table of a dataset of format version 1 to 3: its manifest's ``[path, label]`` pairs and
        hex checksums."""
        encoded = [str(path).encode("utf-8", "surrogateescape") for path, _ in samples]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(path) for path in encoded], out=offsets[1:])
        return cls(
            np.fromiter((label for _, label in samples), dtype=np.int64, count=len(samples)),
            np.fromiter((int(checksum, 16) for checksum in checksums), dtype=np.uint64, count=len(checksums)),
            np.frombuffer(b"".join(encoded), dtype=np.uint8),
            offsets,
        )

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, index: int) -> str:
        """Image ``index``'s path relative to the source folder."""
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        return bytes(self._paths[start:end]).decode("utf-8", "surrogateescape")

    def check(self, where: str, classes: int) -> None:
        """The cheap checks of an open: the path offsets cut the paths file into ``len(self)`` paths.
        (The labels and checksums are checked against their build digests by ``gpuload verify``.)

        Raises:
            DatasetError: the offsets do not start at 0, go backwards, or end elsewhere than the paths file.
        """
        offsets = self._offsets
        if len(offsets) != len(self) + 1 or offsets[0] != 0 or int(offsets[-1]) != len(self._paths):
            raise DatasetError(
                f"{where} is damaged: path_offsets.memmap does not cut paths.memmap into {len(self)} paths; "
                "rebuild the dataset"
            )


class TableWriter:
    """Appends each image's path, label and checksum to a new table in ``folder``, in dataset order,
    written in chunks of 4,096 rows (memory holds one chunk, whatever the count).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> with TableWriter(folder) as writer:
        ...     writer.append("cat/1.jpg", 0, 255)
        >>> SampleTable.open(folder, 1).path(0)
        'cat/1.jpg'
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.count = 0
        self._files = {name: open(self.folder / name, "xb") for name in ("labels.memmap", *TABLE_FILES)}
        self._end = 0  # bytes of paths written
        self._files["path_offsets.memmap"].write(np.int64(0).tobytes())
        self._paths: list[bytes] = []
        self._labels: list[int] = []
        self._checksums: list[int] = []

    def append(self, path: str, label: int, checksum: int) -> None:
        self._paths.append(path.encode("utf-8", "surrogateescape"))
        self._labels.append(label)
        self._checksums.append(checksum)
        self.count += 1
        if len(self._paths) == _CHUNK:
            self._flush()

    def extend(self, paths: Sequence[str], label: int, checksum: int = 0) -> None:
        """Append one row per path, all with ``label`` and ``checksum`` (a scanned folder's images: a
        million rows cost a second less than one :meth:`append` each)."""
        self._paths += [path.encode("utf-8", "surrogateescape") for path in paths]
        self._labels += [label] * len(paths)
        self._checksums += [checksum] * len(paths)
        self.count += len(paths)
        if len(self._paths) >= _CHUNK:
            self._flush()

    def _flush(self) -> None:
        """Write the rows appended since the last flush, each file's in one write."""
        if not self._paths:
            return
        ends = self._end + np.cumsum(np.fromiter(map(len, self._paths), np.int64, len(self._paths)))
        self._end = int(ends[-1])
        self._files["paths.memmap"].write(b"".join(self._paths))
        self._files["path_offsets.memmap"].write(ends.astype("<i8").tobytes())
        self._files["labels.memmap"].write(np.array(self._labels, dtype="<i8").tobytes())
        self._files["checksums.memmap"].write(np.array(self._checksums, dtype="<u8").tobytes())
        self._paths, self._labels, self._checksums = [], [], []

    def close(self) -> None:
        try:
            self._flush()
        finally:
            for file in self._files.values():
                file.close()

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def file_digest(path: str | os.PathLike) -> str:
    """The xxh3-64 (hex) of a file's bytes, hashed where they are mapped: what a build records for each
    table file and ``gpuload verify`` compares.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "f"
        >>> path.write_bytes(b"")
        0
        >>> file_digest(path)
        '2d06800538d394c2'
    """
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            return f"{xxhash.xxh3_64_intdigest(b''):016x}"
        with mmap.mmap(file.fileno(), size, prot=mmap.PROT_READ) as mapped:  # hashed where it lies: no copy
            return f"{xxhash.xxh3_64_intdigest(mapped):016x}"


def map_array(folder: Path, name: str, dtype: np.dtype, count: int | None) -> np.ndarray:
    """``folder/name`` mapped read-only as a flat array of ``count`` items (``None``: as many as the file
    holds); an empty file is an empty array (mmap cannot map zero bytes).

    Raises:
        DatasetError: the file is missing, or not ``count`` items long.
    """
    itemsize = np.dtype(dtype).itemsize
    try:
        file = open(folder / name, "rb")
    except FileNotFoundError:
        raise DatasetError(f"{folder} is damaged: {name} is missing") from None
    with file:
        size = os.fstat(file.fileno()).st_size
        if count is not None and size != count * itemsize:
            raise DatasetError(
                f"{folder} is damaged: {name} has {size:,} bytes, the manifest means {count * itemsize:,} "
                f"({count} x {np.dtype(dtype).name})"
            )
        if size == 0:
            return np.zeros(0, dtype=dtype)
        mapping = mmap.mmap(file.fileno(), size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    return np.frombuffer(mapping, dtype=dtype)
