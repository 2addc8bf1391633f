"""One scan for every source but the ImageFolder: samples written into the build's folder as they come.

A source (a metadata table, WebDataset tar shards, Parquet files) gives :class:`Sample` after sample:
a name, the image (a file under the source's root, or its bytes), a label (a class index or name, or
none) and named values. :class:`SampleScan` writes them into a folder of the build's own (``.scan``)
as they come, so memory holds a few thousand rows whatever the count:

- the table of names and labels (:class:`gpuload.format.table.TableWriter`; labels given by name are
  numbered as they first come, and renumbered in the classes' sorted order at the end);
- where each image given as bytes lies (``image_refs``): in a file of the source, read there by range
  when the build decodes it (an uncompressed tar's member: :class:`Stored`), or copied one after the
  other into ``blobs`` (a compressed tar's, a Parquet file's); a scan with a sink (a build that writes as
  the scan goes) hands each image on instead, and keeps none;
- each named value, staged by kind (numbers as float64 rows, text, multi-label lists and masks' bytes
  flat with offsets), the kind decided by the first value or by the role given;
- a hash of each name (``names``), to find two samples naming one image.

:meth:`SampleScan.finish` checks what only the whole shows (a name twice, labels of one kind), decides
the classes, and gives a :class:`ScannedIndex`: what the build reads each image from, by position, and
the fields it writes for the samples it kept.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xxhash
from tqdm.auto import tqdm

from ..errors import SourceError, UsageError
from ..format.fields import NAME, NUMBER_DTYPES, RESERVED, FieldSpec, field_path
from ..format.table import SampleTable, TableWriter, map_array
from .folder import ScannedSamples, estimated_bytes

__all__ = [
    "ROLES",
    "Mask",
    "Sample",
    "SampleScan",
    "ScannedIndex",
    "Sink",
    "StagedField",
    "Stored",
    "Unreadable",
    "check_roles",
    "images_column",
    "with_defaults",
]

# What a source's column (a table's, a tar's member or JSON key, a Parquet column) can be taken as.
ROLES = ("image", "label", "multilabel", "mask", "number", "text", "ignore")
_CHUNK = 4096  # rows kept in memory between writes
_OPEN_FILES = 8  # the source's files whose images are read kept open at once (the last read)

# What a build that writes as the scan goes does with each sample, as it is staged:
# ``sink(position, name, path, data, masks)``: its image's file (``data``: its bytes, where the source
# holds them) and its masks, as :meth:`ScannedIndex.image` and :meth:`ScannedIndex.masks` give them.
Sink = Callable[[int, str, str, "bytes | None", "list[tuple[str, bytes, str | None]]"], None]
_EXACT_INT = 2**53  # integers staged as float64 are exact up to here


class Mask(bytes):
    """The bytes of a segmentation mask where the source tells it by its kind (a tar's ``png`` beside its ``jpg``)."""


@dataclass(frozen=True)
class Stored:
    """An image's bytes where they lie, whole and uncompressed, in a file of the source (a member of an
    uncompressed tar): the scan notes where, and the build reads them there."""

    file: Path
    offset: int
    size: int


@dataclass(frozen=True)
class Unreadable:
    """A mask the source could not read (a file that is missing): its sample is skipped and listed by the
    build, as an image that cannot be decoded (or stops a ``strict`` build)."""

    reason: str


@dataclass
class Sample:
    """One image of a source and what comes with it.

    Attributes:
        name: the image's path relative to the source's root, as the dataset records it (a file's, or
            a name such as ``"train-000000.tar/000123.jpg"``).
        image: its bytes, or where they lie (:class:`Stored`); ``None``: the file at ``root/name``.
        label: a class index (int) or name (str); ``None`` where the source gives none.
        values: named values: numbers, lists, text.
        where: where it comes from, for messages: ``"row 3 of /data/metadata.csv"``.
    """

    name: str
    image: bytes | Stored | None = None
    label: int | str | None = None
    values: dict[str, object] = field(default_factory=dict)
    where: str = ""


def check_roles(columns: dict[str, str] | None) -> dict[str, str]:
    """``columns`` (a column's name to its role, see :data:`ROLES`) checked, ``{}`` when ``None``.

    Raises:
        UsageError: not a dict of names to roles, or more than one image or label column.

    Example:
        >>> check_roles({"path": "image", "tags": "multilabel"})
        {'path': 'image', 'tags': 'multilabel'}
    """
    if columns is None:
        return {}
    if not isinstance(columns, dict) or not all(isinstance(name, str) and name for name in columns):
        raise UsageError(f"columns must map column names to roles ({', '.join(ROLES)}), got {columns!r}")
    for name, role in columns.items():
        if role not in ROLES:
            raise UsageError(f"column {name!r} has role {role!r}; a role is one of {', '.join(ROLES)}")
    for role in ("image", "label"):
        named = [name for name, given in columns.items() if given == role]
        if len(named) > 1:
            raise UsageError(f"columns name {len(named)} {role} columns ({', '.join(named)}); name one")
    return dict(columns)


def with_defaults(given: dict[str, str], defaults: dict[str, str]) -> dict[str, str]:
    """The roles ``given`` over a source's ``defaults`` (column name to role): a default is dropped where
    its column was given a role, or another column was given its role.

    Example:
        >>> with_defaults({"path": "image"}, {"file_name": "image", "label": "label"})
        {'label': 'label', 'path': 'image'}
    """
    kept = {name: role for name, role in defaults.items() if role not in given.values() and name not in given}
    return {**kept, **given}


def images_column(roles: dict[str, str], defaults: dict[str, str], source: str | os.PathLike) -> str:
    """The column of ``roles`` (a source's, its ``defaults`` applied) that holds the images.

    Raises:
        SourceError: none does: the default image column was given another role, and no column the image role.

    Example:
        >>> images_column({"path": "image", "label": "label"}, {"file_name": "image"}, "metadata.csv")
        'path'
    """
    found = next((name for name, role in roles.items() if role == "image"), None)
    if found is None:
        default = next(name for name, role in defaults.items() if role == "image")
        raise SourceError(
            source,
            f"no column holds the images: {default!r} is given the role {roles.get(default)!r}; give the images' "
            "column the role image (--column NAME=image; columns={NAME: 'image'} in Python)",
        )
    return found


class _Appender:
    """Rows of one dtype appended to a new file, written 4,096 at a time."""

    def __init__(self, path: Path, dtype: str) -> None:
        self.file, self.dtype, self.rows, self.count = open(path, "xb"), dtype, [], 0

    def append(self, row) -> None:
        self.rows.append(row)
        self.count += 1
        if len(self.rows) == _CHUNK:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.file.write(np.asarray(self.rows, dtype=self.dtype).tobytes())
            self.rows = []

    def close(self) -> None:
        self.flush()
        self.file.close()


class _Bytes:
    """Byte strings appended to a new file one after the other, with their ``[N + 1]`` offsets."""

    def __init__(self, path: Path, offsets: Path) -> None:
        self.file, self.offsets, self.end = open(path, "xb"), _Appender(offsets, "<i8"), 0
        self.offsets.append(0)

    def append(self, data: bytes) -> None:
        self.file.write(data)
        self.end += len(data)
        self.offsets.append(self.end)

    def close(self) -> None:
        self.file.close()
        self.offsets.close()


class StagedField:
    """One named value of every sample, staged in the scan's folder by kind, then written into the
    dataset for the samples the build kept (:meth:`write`).

    The kind is the role given, or the first value's: a number or a list of numbers (``number``), a
    ``str`` (``text``), a list of ``str`` (``multilabel``), a :class:`Mask` (``mask``). Every later value
    must be of that kind (and a vector of the same length); numbers are staged as float64 and stored as
    int64 where every value was an int, bool where every one was a bool, else float32. A mask's bytes are
    staged as they come (an :class:`Unreadable` one as none, with its reason), checked and written by the
    build.
    """

    def __init__(self, folder: Path, name: str, kind: str, source: Path) -> None:
        self.folder, self.name, self.kind, self.source = folder, name, kind, source
        self.count, self.shape = 0, None
        self.types: set[str] = set()  # a number's: "bool", "int", "float"
        self.vocabulary: dict[str | int, int] = {}  # multilabel: a class (name or index) -> its number as staged
        if kind == "number":
            self._rows = _Appender(folder / f"{name}.number", "<f8")
        elif kind in ("text", "mask"):
            self._text = _Bytes(folder / f"{name}.{kind}", folder / f"{name}.offsets")
            self.unreadable: dict[int, str] = {}  # mask: the position of each unreadable one -> why
        else:
            self._indices = _Appender(folder / f"{name}.indices", "<i4")
            self._offsets = _Appender(folder / f"{name}.offsets", "<i8")
            self._offsets.append(0)
            self._end = 0
        self.spec: FieldSpec | None = None

    def add(self, value: object, where: str) -> None:
        """Stage one sample's value (``where`` names it in errors).

        Raises:
            SourceError: a missing or NaN value, or one of another kind or length than the field's.
        """
        if value is None or (isinstance(value, float) and math.isnan(value)):
            self._refuse(where, "is empty" if value is None else "is NaN", "fill it, or leave the row out")
        if self.kind == "number":
            self._add_number(value, where)
        elif self.kind == "text":
            if not isinstance(value, str):
                self._mixed(where, value, "text")
            self._text.append(value.encode())
        elif self.kind == "mask":
            self._add_mask(value, where)
        else:
            self._add_classes(value, where)
        self.count += 1

    def _add_number(self, value: object, where: str) -> None:
        if value == "":
            self._refuse(where, "is empty", "fill it")
        items = value if isinstance(value, (list, tuple)) else None
        shape = (len(items),) if items is not None else ()
        if self.shape is None:
            if shape == (0,):
                self._refuse(where, "is an empty list", "give the field a value of fixed length")
            self.shape = shape
        elif shape != self.shape:
            expected = "a number" if not self.shape else f"a list of {self.shape[0]} numbers"
            got = "a number" if not shape else f"a list of {shape[0]}"
            self._refuse(where, f"holds {got} where the field holds {expected}", "give every row the same length")
        for item in items if items is not None else (value,):
            if isinstance(item, bool):
                self.types.add("bool")
            elif isinstance(item, int):
                if abs(item) >= _EXACT_INT:
                    self._refuse(where, f"holds {item}", "give integers within +-2**53, or floats")
                self.types.add("int")
            elif isinstance(item, float):
                if not math.isfinite(item):
                    self._refuse(where, f"holds {item}", "give finite numbers")
                self.types.add("float")
            else:
                self._mixed(where, value, "number")
        if "bool" in self.types and len(self.types) > 1:
            self._mixed(where, value, "number")
        self._rows.append([float(item) for item in items] if items is not None else [float(value)])

    def _add_mask(self, value: object, where: str) -> None:
        named = f"its mask ({self.name!r})"
        if isinstance(value, dict):  # a Parquet {bytes, path} struct, as an image's
            if value.get("path"):
                named = f"its mask {value['path']} ({self.name!r})"
            if value.get("bytes") is None and value.get("path"):
                value = Unreadable(f"{named} holds no bytes, only a path; store each mask's PNG bytes in the column")
            else:
                value = value.get("bytes")
        if isinstance(value, (bytes, bytearray)) and not value:  # a mask that cannot be read, as an empty file
            value = Unreadable(f"{named} is empty (0 bytes)")
        if isinstance(value, Unreadable):
            self.unreadable[self.count] = value.reason
            value = b""
        elif not isinstance(value, (bytes, bytearray)) or not value:
            self._mixed(where, value, "mask (an image's bytes)")
        self.last = (bytes(value), self.unreadable.get(self.count))
        self._text.append(self.last[0])

    def mask(self, position: int) -> tuple[bytes, str | None]:
        """The staged bytes of the mask of sample ``position``, and why it could not be read (else ``None``)."""
        offsets = self._staged("offsets", np.int64)
        data = self._staged("mask", np.uint8)[int(offsets[position]) : int(offsets[position + 1])]
        return data.tobytes(), self.unreadable.get(position)

    def _add_classes(self, value: object, where: str) -> None:
        if not isinstance(value, (list, tuple)):
            self._mixed(where, value, "multilabel (a list of class names or indices)")
        for item in value:
            if isinstance(item, bool) or not isinstance(item, (int, str)) or item == "":
                self._mixed(where, value, "multilabel (a list of class names or indices)")
            if isinstance(item, int) and item < 0:
                self._refuse(where, f"holds the class index {item}", "give indices from 0")
        kinds = {type(item) for item in value} | {type(key) for key in list(self.vocabulary)[:1]}
        if len(kinds) > 1:
            self._mixed(where, value, "multilabel of one kind (class names, or indices)")
        numbers = sorted({self.vocabulary.setdefault(item, len(self.vocabulary)) for item in value})
        for number in numbers:
            self._indices.append(number)
        self._end += len(numbers)
        self._offsets.append(self._end)

    def _mixed(self, where: str, value: object, kind: str) -> None:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        self._refuse(
            where,
            f"holds {shown} where the column holds {self.kind}s (a column of mixed types)",
            f"make the column one type, or say what it is (--column {self.name}=ROLE) or leave it out "
            f"(--column {self.name}=ignore)",
        )

    def _refuse(self, where: str, what: str, advice: str) -> None:
        raise SourceError(self.source, f"{where}: {self.name!r} {what}; {advice}")

    def close_files(self) -> None:
        """Close the staging files (alone: the scan failed)."""
        if self.kind == "number":
            self._rows.close()
        elif self.kind in ("text", "mask"):
            self._text.close()
        else:
            self._indices.close()
            self._offsets.close()

    def close(self) -> None:
        """Finish staging and decide the field's spec."""
        self.close_files()
        if self.kind == "number":
            dtype = "bool" if self.types == {"bool"} else "int64" if self.types == {"int"} else "float32"
            self.spec = FieldSpec(self.name, "number", dtype, self.shape)
        elif self.kind in ("text", "mask"):
            self.spec = FieldSpec(self.name, self.kind, "str" if self.kind == "text" else "uint8", ())
        else:
            names = sorted(self.vocabulary, key=lambda item: (isinstance(item, str), item))
            if not names:
                raise SourceError(
                    self.source, f"{self.name!r} holds no class in any row; leave it out (--column {self.name}=ignore)"
                )
            if isinstance(names[0], int):  # indices: classes 0 to the largest, named by their numbers
                classes = [str(index) for index in range(names[-1] + 1)]
                renumber = {staged: int(item) for item, staged in self.vocabulary.items()}
            else:
                classes = names
                renumber = {staged: names.index(item) for item, staged in self.vocabulary.items()}
            self.renumber = np.array([renumber[staged] for staged in range(len(renumber))], dtype=np.int32)
            self.spec = FieldSpec(self.name, "multilabel", "float32", (len(classes),), tuple(classes))

    def _staged(self, what: str, dtype) -> np.ndarray:
        cache = self.__dict__.setdefault("_mapped", {})
        if what not in cache:
            cache[what] = map_array(self.folder, f"{self.name}.{what}", dtype, None)
        return cache[what]

    def write(self, out: Path, chunks: Iterable[np.ndarray]) -> None:
        """Write the field's files into the dataset folder ``out`` for the kept positions, given in chunks
        in dataset order (a mask as the bytes it came as: a jpeg dataset's)."""
        spec = self.spec
        if spec.kind == "number":
            rows = self._staged("number", np.float64).reshape(-1, max(1, math.prod(self.shape)))
            with open(out / field_path(spec.name), "xb") as file:
                for positions in chunks:
                    file.write(rows[positions].astype(NUMBER_DTYPES[spec.dtype]).tobytes())
            return
        data, ragged = (spec.kind, np.uint8) if spec.kind in ("text", "mask") else ("indices", np.int32)
        values, offsets = self._staged(data, ragged), self._staged("offsets", np.int64)
        with (
            open(out / field_path(spec.name), "xb") as file,
            open(out / field_path(spec.name, "offsets"), "xb") as ends,
        ):
            end = 0
            ends.write(np.int64(0).tobytes())
            for positions in chunks:
                starts, stops = offsets[positions], offsets[positions + 1]
                parts = [values[start:stop] for start, stop in zip(starts.tolist(), stops.tolist())]
                joined = np.concatenate(parts) if parts else np.zeros(0, ragged)
                if spec.kind == "multilabel":
                    joined = self.renumber[joined]
                file.write(joined.tobytes())
                ends.write((end + np.cumsum(stops - starts)).astype("<i8").tobytes())
                end += int((stops - starts).sum())


class _Blobs:
    """Where each image given as bytes lies, as ``(file, start, end)``: file ``0`` is the scan's own, into
    which bytes given in memory are copied one after the other; ``1`` on, the source's files that
    :class:`Stored` images lie in, read there. Read back by range."""

    def __init__(self, path: Path) -> None:
        self.files, self.size = [path], 0
        self.numbers: dict[Path, int] = {path: 0}
        self.file = open(path, "xb")
        self.fds: dict[int, int] = {}  # file number -> its descriptor: the last few read, oldest first

    def append(self, data: bytes | Stored) -> tuple[int, int, int]:
        if isinstance(data, Stored):  # the source's file, or bytes already copied into the scan's (copy)
            number = self.numbers.setdefault(data.file, len(self.files))
            if number == len(self.files):
                self.files.append(data.file)
            return number, data.offset, data.offset + data.size
        start = self.size
        self.copy(data)
        return 0, start, self.size

    def copy(self, data) -> Path:
        """Copy ``data`` (a buffer) into the scan's own file, at :attr:`size` before the call; returns the
        file, for the :class:`Stored` images that lie in it."""
        self.file.write(data)
        self.size += len(data)
        return self.files[0]

    def close(self) -> None:
        self.file.close()

    def read(self, number: int, start: int, length: int) -> bytes:
        if number == 0 and not self.file.closed:
            self.file.flush()  # read while the scan runs: what it copied, on disk
        fd = self.fds.pop(number, None)
        if fd is None:
            if len(self.fds) >= _OPEN_FILES:  # one per shard would run out (1,024 on most machines)
                os.close(self.fds.pop(next(iter(self.fds))))
            fd = os.open(self.files[number], os.O_RDONLY | os.O_CLOEXEC)
        self.fds[number] = fd  # the most recent last
        data = os.pread(fd, length, start)
        if len(data) != length:  # the source's file was cut since the scan
            raise SourceError(self.files[number], f"ends before byte {start + length:,}, where the scan found an image")
        return data

    def bytes_of(self, stored: Stored) -> bytes:
        """The bytes of a :class:`Stored` image, read where they lie."""
        number, start, end = self.append(stored)
        return self.read(number, start, end - start)

    def release(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


class SampleScan:
    """Writes a source's samples into ``into`` (a new folder) as they come; :meth:`finish` gives the index.

    Args:
        into: the folder to make (the build's ``.scan``).
        root: the source's root: a sample without bytes is the file ``root/name``.
        source: the source, for messages.
        source_format: ``"table"``, ``"webdataset"`` or ``"parquet"``.
        classes: the class names, in label order, when given (a label's name must be one of them).
        roles: each column's role where given (see :data:`ROLES`).
        default_class: the one class of a source whose samples have no label.
        progress: show a progress bar of the samples scanned.
        sink: given each sample as it is staged (see :data:`Sink`), for a build that writes as the scan goes.
    """

    def __init__(
        self,
        into: Path,
        *,
        root: Path,
        source: Path,
        source_format: str,
        classes: Sequence[str] | None,
        roles: dict[str, str],
        default_class: str,
        progress: bool = False,
        sink: Sink | None = None,
    ) -> None:
        self.folder, self.root, self.source, self.source_format = Path(into), root, source, source_format
        self.sink = sink
        self.folder.mkdir()
        self.given = list(classes) if classes is not None else None
        self.roles, self.default_class = roles, default_class
        self.table = TableWriter(self.folder)
        self.blobs = _Blobs(self.folder / "blobs")
        self.image_refs: _Appender | None = None
        self.bytes_given = False  # the first sample's image came as bytes (every one's must)
        self.hashes = _Appender(self.folder / "names", "<u8")
        self.fields: dict[str, StagedField] = {}
        self.columns: list[str] | None = None  # the first sample's: every sample has these
        self.labelled: bool | None = None
        self.names: dict[str | int, int] = {}  # a label's name (or index) -> its number as staged
        self.first_where = ""
        self.skipped: list[dict] = []
        self.bar = tqdm(unit="sample", desc=f"scan {source.name}", disable=not progress, file=sys.stderr)

    def __enter__(self) -> SampleScan:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is not None:  # the scan failed (or was interrupted): its files, and the source's, are closed now
            self.bar.close()
            self.blobs.release()
            for staging in (self.table, self.hashes, self.image_refs, self.blobs):
                if staging is not None:
                    staging.close()
            for staged in self.fields.values():
                staged.close_files()

    def images(self, data, starts: list[int], lengths: list[int]) -> list[bytes | Stored]:
        """The images cut from ``data`` (a buffer: their bytes one after the other) at ``starts``, each
        ``lengths`` long: for the build that writes after the scan, copied into the scan's own file in
        one write (:class:`Stored` there); for a build that writes as the scan goes, each image's bytes."""
        if self.sink is not None:
            return [bytes(data[start : start + length]) for start, length in zip(starts, lengths)]
        offset, file = self.blobs.size, self.blobs.copy(data)
        return [Stored(file, offset + start, length) for start, length in zip(starts, lengths)]

    def read(self, stored: Stored) -> bytes:
        """The bytes of a :class:`Stored` image (a tar's mask beside its image), through the files the scan
        keeps open (not one open each)."""
        return self.blobs.bytes_of(stored)

    def skip(self, name: str, reason: str) -> None:
        """List a sample the source cannot give (no image in a tar's sample) as the build lists a file it
        could not decode."""
        self.skipped.append({"path": name, "reason": reason})

    def add(self, sample: Sample) -> None:
        """Stage one sample.

        Raises:
            SourceError: what the sample holds cannot be taken (named, with what to do).
        """
        position = self.table.count
        if position == 0:
            self.first_where = sample.where
            given = sample.image is not None and self.sink is None  # kept for the build (a sink's are handed on)
            self.image_refs = _Appender(self.folder / "image_refs", "<i8") if given else None
            self.bytes_given = sample.image is not None
        if (sample.image is None) == self.bytes_given:
            raise SourceError(self.source, f"{sample.where}: holds its image as a file where others hold bytes")
        label = self._label(sample)
        self._values(sample)
        if self.sink is None and sample.image is not None:
            self.image_refs.append(self.blobs.append(sample.image))
        self.hashes.append(xxhash.xxh3_64_intdigest(sample.name.encode("utf-8", "surrogateescape")))
        self.table.append(sample.name, label, 0)
        self.bar.update()
        if self.sink is not None:  # the image handed on, not kept
            data = self.read(sample.image) if isinstance(sample.image, Stored) else sample.image
            masks = [(staged.name, *staged.last) for staged in self.fields.values() if staged.kind == "mask"]
            self.sink(position, sample.name, os.path.join(self.root, sample.name), data, masks)

    def _label(self, sample: Sample) -> int:
        label = sample.label
        if self.labelled is None:
            self.labelled = label is not None
        if (label is not None) != self.labelled:
            has, lacks = (sample.where, self.first_where) if label is not None else (self.first_where, sample.where)
            raise SourceError(
                self.source, f"{lacks} has no label while {has} has one; give every sample a label, or none"
            )
        if label is None:
            return 0
        if isinstance(label, float) and label.is_integer():
            label = int(label)  # a Parquet or JSON column of whole floats
        if isinstance(label, bool) or not isinstance(label, (int, str)) or label == "":
            shown = "an empty label" if label == "" or (isinstance(label, float) and math.isnan(label)) else repr(label)
            raise SourceError(
                self.source, f"{sample.where}: the label is {shown}; give a class name or index (or drop the row)"
            )
        if self.names and type(next(iter(self.names))) is not type(label):
            raise SourceError(
                self.source,
                f"{sample.where}: the label {label!r} is a {type(label).__name__} where labels so far were "
                f"{type(next(iter(self.names))).__name__}s (a column of mixed types); give class names or indices, not both",
            )
        if isinstance(label, int) and label < 0:
            raise SourceError(self.source, f"{sample.where}: the label is {label}; class indices start at 0")
        if self.given is not None:
            if isinstance(label, str) and label not in self._given_index:
                raise SourceError(
                    self.source,
                    f"{sample.where}: unknown class name {label!r}; the classes given are "
                    f"{', '.join(self.given[:5])}{' ...' if len(self.given) > 5 else ''}: fix the label or the classes",
                )
            if isinstance(label, int) and label >= len(self.given):
                raise SourceError(
                    self.source,
                    f"{sample.where}: the label {label} is not an index of the {len(self.given)} classes given",
                )
        return self.names.setdefault(label, len(self.names))

    @property
    def _given_index(self) -> dict[str, int]:
        if "_index" not in self.__dict__:
            self.__dict__["_index"] = {name: index for index, name in enumerate(self.given)}
        return self.__dict__["_index"]

    def _values(self, sample: Sample) -> None:
        values = {name: value for name, value in sample.values.items() if self.roles.get(name) != "ignore"}
        if self.columns is None:
            self.columns = list(values)
            for name, value in values.items():
                self.fields[name] = StagedField(
                    self.folder, _field_name(name, self.source), self._kind(name, value, sample.where), self.source
                )
        if list(values) != self.columns:
            missing = [name for name in self.columns if name not in values]
            extra = [name for name in values if name not in self.columns]
            what = f"has no {missing[0]!r}" if missing else f"has {extra[0]!r}, which {self.first_where} has not"
            raise SourceError(
                self.source,
                f"{sample.where} {what}; every sample must have the same fields (or leave one out: "
                f"--column {(missing or extra)[0]}=ignore)",
            )
        for name, value in values.items():
            self.fields[name].add(value, sample.where)

    def _kind(self, name: str, value: object, where: str) -> str:
        role = self.roles.get(name)
        if role in ("number", "text", "multilabel", "mask"):
            return role
        if role is None and isinstance(value, Mask):
            return "mask"
        if role is not None:  # image or label columns are the source's own
            raise UsageError(f"column {name!r} cannot have the role {role!r} here")
        if isinstance(value, (bool, int, float)):
            return "number"
        if isinstance(value, str):
            return "text"
        if isinstance(value, (list, tuple)) and value and all(isinstance(item, str) for item in value):
            return "multilabel"
        if isinstance(value, (list, tuple)) and value and all(isinstance(item, (int, float)) for item in value):
            return "number"
        what = {bytes: "bytes", dict: "an object", list: "an empty list", tuple: "an empty list"}.get(type(value))
        what = what or ("nothing" if value is None else type(value).__name__)
        raise SourceError(
            self.source,
            f"{where}: {name!r} holds {what}, whose kind cannot be told; say what it is (--column "
            f"{name}=number, text or multilabel) or leave it out (--column {name}=ignore)",
        )

    def finish(self, *, describe: Callable[[int], str] | None = None) -> ScannedIndex:
        """Close the staging files; check that no two samples name one image and that there is one;
        decide the classes (names sorted, as ImageFolder sorts its folders; indices: 0 to the largest;
        or the ones given) and renumber the labels.

        Raises:
            SourceError: no sample, or two samples of one name (``describe(position)`` names each).
        """
        count = self.table.count
        self.bar.close()
        self.table.close()
        self.hashes.close()
        if self.image_refs is not None:
            self.image_refs.close()
        self.blobs.close()
        if not count:
            raise SourceError(self.source, "holds no sample; check the source (and its image column)")
        self._check_unique(count, describe or (lambda position: f"sample {position}"))
        classes = self._classes()
        for staged in self.fields.values():
            staged.close()
        table = SampleTable.open(self.folder, count)
        used = np.zeros(len(classes), dtype=bool)
        used[np.unique(table.labels)] = True
        empty = sorted(name for name, has in zip(classes, used.tolist()) if not has)
        refs = map_array(self.folder, "image_refs", np.int64, 3 * count).reshape(count, 3) if self.image_refs else None
        return ScannedIndex(
            root=self.root,
            source_path=self.source,
            source_format=self.source_format,
            classes=classes,
            samples=ScannedSamples(table),
            empty_classes=empty if self.given is not None else [],
            fields=list(self.fields.values()),
            blobs=self.blobs,
            image_refs=refs,
            skipped=self.skipped,
        )

    def _check_unique(self, count: int, describe: Callable[[int], str]) -> None:
        same = self._same_name(count)  # its maps of the scan's files closed: the error's frames do not hold them
        if same is not None:
            first, second, name = same
            raise SourceError(
                self.source, f"{describe(first)} and {describe(second)} both name {name}; keep one of them"
            )

    def _same_name(self, count: int) -> tuple[int, int, str] | None:
        """The first two samples of one name (positions, and the name), or ``None``."""
        hashes = map_array(self.folder, "names", np.uint64, count)
        order = np.argsort(hashes, kind="stable")
        ordered = hashes[order]
        same = np.flatnonzero(ordered[1:] == ordered[:-1])
        if not same.size:
            return None
        table = SampleTable.open(self.folder, count)
        for at in same.tolist():
            first, second = int(order[at]), int(order[at + 1])
            if table.path(first) == table.path(second):
                return first, second, table.path(first)
        return None

    def _classes(self) -> list[str]:
        """The class names, and the labels file renumbered to them (in place, a chunk at a time)."""
        if not self.labelled:
            classes = [self.default_class] if self.given is None else self.given
            if self.given is not None and self.default_class not in self.given:
                raise SourceError(
                    self.source,
                    f"its samples have no label, so they are one class named {self.default_class!r}, which is not "
                    "in the classes given; give the samples labels",
                )
            renumber = np.array([classes.index(self.default_class)], dtype=np.int64)
        else:
            seen = list(self.names)  # in the order staged
            if self.given is not None:
                classes = self.given
                numbers = [self._given_index[item] if isinstance(item, str) else item for item in seen]
            elif isinstance(seen[0], int):
                classes = [str(index) for index in range(max(seen) + 1)]
                numbers = seen
            else:
                classes = sorted(seen)
                at = {name: index for index, name in enumerate(classes)}
                numbers = [at[name] for name in seen]
            renumber = np.array(numbers, dtype=np.int64)
        labels = np.memmap(self.folder / "labels.memmap", dtype="<i8", mode="r+")
        for first in range(0, len(labels), 1 << 16):
            labels[first : first + (1 << 16)] = renumber[labels[first : first + (1 << 16)]]
        labels.flush()
        del labels
        return list(classes)


def _field_name(name: str, source: Path) -> str:
    """A column's name as a field's: a name of letters, digits and ``_``, not one a sample already uses.

    Raises:
        SourceError: it is not.
    """
    if not NAME.fullmatch(name) or name in RESERVED:
        raise SourceError(
            source,
            f"the column {name!r} cannot be a field's name (letters, digits and _, not starting with a digit, "
            f"not {', '.join(sorted(RESERVED))}); rename it, or leave it out (--column {name}=ignore)",
        )
    return name


@dataclass
class ScannedIndex:
    """A scanned source: its classes, its samples (name and label, by position) and its staged fields.

    Attributes:
        root: a sample held as a file is ``root/name``.
        source_path: what was scanned (a table, a tar pattern, a Parquet file or folder).
        source_format: ``"table"``, ``"webdataset"`` or ``"parquet"``.
        classes: the class names; a label is an index into them.
        samples: ``(name, label)`` per sample, in the source's order.
        empty_classes: the given classes no sample has.
        fields: the named values, staged.
        skipped: ``{"path", "reason"}`` of each sample the source could not give.
    """

    root: Path
    source_path: Path
    source_format: str
    classes: list[str]
    samples: ScannedSamples
    empty_classes: list[str]
    fields: list[StagedField]
    blobs: _Blobs
    image_refs: np.ndarray | None
    skipped: list[dict] = field(default_factory=list)
    repeats: list = field(default_factory=list)

    def masks(self, position: int) -> list[tuple[str, bytes, str | None]]:
        """Sample ``position``'s masks: ``(field name, bytes, why unreadable or None)`` for each mask field."""
        return [(staged.name, *staged.mask(position)) for staged in self.fields if staged.kind == "mask"]

    def image(self, position: int) -> tuple[str, bytes | None]:
        """Sample ``position``'s image: ``(path, None)`` for a file, ``(name, its bytes)``."""
        if self.image_refs is None:
            return os.path.join(self.root, self.samples.table.path(position)), None
        number, start, end = self.image_refs[position].tolist()
        return str(self.root / self.samples.table.path(position)), self.blobs.read(number, start, end - start)

    def image_bytes(self) -> int:
        """The images' bytes: those staged, or estimated from a sample of the files (:func:`estimated_bytes`)."""
        if self.image_refs is not None:
            return int((self.image_refs[:, 2] - self.image_refs[:, 1]).sum())
        return estimated_bytes(lambda position: self.image(position)[0], len(self.samples))

    def close(self) -> None:
        self.blobs.release()
