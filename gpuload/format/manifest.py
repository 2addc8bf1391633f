"""The ``manifest.json`` of a built dataset: what it holds, where it came from, what was skipped.

It is the dataset's table of contents: a folder is a gpuload dataset when it has a valid manifest
and nothing but the files that manifest lists. Every field that gives the data its meaning (the
classes, each sample's path and label, the shape, the checksums, the files) has a digest recorded
at build time, so ``gpuload verify`` tells an edited or damaged manifest from an intact one.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from ..errors import DatasetError
from .fields import FIELDS_FOLDER, FieldSpec

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "ARRAYS",
    "BUILD_FILES",
    "BUILD_PATHS",
    "DIGESTED",
    "FORMAT",
    "FORMAT_VERSION",
    "LAYOUTS",
    "MANIFEST_NAME",
    "RESIZE_MODES",
    "SOURCE_FORMATS",
    "TENSORDICT",
    "DatasetError",
    "Manifest",
    "dataset_around",
    "field_files",
    "holds_build_files",
    "index_files",
    "is_build_path",
]

FORMAT = "gpuload.memmap"
FORMAT_VERSION = 4
MANIFEST_NAME = "manifest.json"
RESIZE_MODES: tuple[str, ...] = ("crop", "pad", "stretch")
# How a raw dataset's images.memmap orders each image's bytes: version 3 writes channels-last
# [N, H, W, 3] (what decoders produce and convolutions on tensor cores read); versions 1 and 2 wrote
# channel-first [N, 3, H, W]. Either way the dataset shows images as [N, 3, H, W].
LAYOUTS = ("channels_last", "channels_first")
# What a dataset was built from (format version 4): an ImageFolder, an image folder or list of images
# with a metadata table, WebDataset tar shards, or Parquet files holding the images' bytes.
SOURCE_FORMATS = ("image_folder", "table", "webdataset", "parquet")
# The fields that give the arrays their meaning: their digests are checked by ``verify``. Version 4
# keeps each image's path, label and checksum in flat files (gpuload.format.table), whose digests are
# the field ``table``; versions 1 to 3 kept them in ``samples`` and ``checksums`` (version 2 had no
# ``layout``: its raw images are channel-first).
DIGESTED = ("storage", "classes", "count", "image_shape", "resize", "jpeg", "files", "layout", "table")
_DIGESTED_V3 = ("storage", "classes", "samples", "checksums", "image_shape", "resize", "jpeg", "files", "layout")
_DIGESTED_V2 = _DIGESTED_V3[:-1]
# The array files of each storage (``<name>.memmap``) besides meta.json, a plain tensordict TensorDict of
# those in ``TENSORDICT`` (the paths, of varying lengths, are gpuload's own).
ARRAYS = {
    "raw": ("images", "labels", "checksums", "paths", "path_offsets"),
    "jpeg": ("data", "offsets", "shapes", "labels", "checksums", "paths", "path_offsets"),
}
TENSORDICT = {
    storage: tuple(name for name in names if not name.startswith("path")) for storage, names in ARRAYS.items()
}
_ARRAYS_V3 = {"raw": ("images", "labels"), "jpeg": ("data", "offsets", "shapes", "labels")}
# Version 4: the files of a value per image (its path, label and checksum; a jpeg image's place and
# size), whose digests are the field ``table``: a reader at a URL checks its cached copies against them.
INDEX_FILES = {
    "raw": ("labels.memmap", "checksums.memmap", "paths.memmap", "path_offsets.memmap"),
    "jpeg": ("labels.memmap", "checksums.memmap", "paths.memmap", "path_offsets.memmap", "offsets.memmap",
             "shapes.memmap"),
}  # fmt: skip
# Version 1 (gpuload 0.1.0) kept the arrays in _tensordict/ beside two tensordict meta.json files.
_V1_FILES = ("meta.json", "_tensordict/meta.json", "_tensordict/images.memmap", "_tensordict/labels.memmap")
# The manifest or an array a build writes (both formats, and version 1's _tensordict/): a folder
# holding one is a dataset, maybe damaged; one holding none is not (a meta.json alone may be anyone's).
BUILD_FILES = (
    MANIFEST_NAME,
    "_tensordict",
    *sorted({f"{name}.memmap" for names in ARRAYS.values() for name in names}),
)
# Every name a build folder of any format version holds: what a stale temporary folder may contain
# (what a build of format version 4 keeps while writing, removed at its end: ``.records`` of each image,
# ``.order`` of a shuffled order, and its scan's table in ``.scan``).
BUILD_PATHS = frozenset(
    {*BUILD_FILES, *_V1_FILES, ".records", ".order", ".scan", FIELDS_FOLDER, f"{FIELDS_FOLDER}/meta.json"}
    | {".resume.json", ".resume.json.partial"}  # a build's checkpoint: gpuload.writing.resume
    | {f".scan/{name}" for name in ("labels.memmap", "checksums.memmap", "paths.memmap", "path_offsets.memmap")}
)
# And the files of a field, in the dataset (fields/<name>[.offsets|.checksums].memmap) and as the scan
# stages them (.scan/<name>.<what>: gpuload.sources.samples).
_FIELD_PATH = re.compile(
    rf"{FIELDS_FOLDER}/[A-Za-z_][A-Za-z0-9_]*(\.offsets)?\.memmap"
    r"|\.scan/(blobs|image_refs|names|[A-Za-z_][A-Za-z0-9_]*\.(number|text|offsets|indices|mask))"
)


def is_build_path(relative: str) -> bool:
    """Whether a build of format version 4 writes ``relative`` (a POSIX path inside its folder): what a
    stale temporary folder of a build may hold.

    Example:
        >>> is_build_path("fields/caption.offsets.memmap"), is_build_path("notes.txt")
        (True, False)
    """
    return relative in BUILD_PATHS or _FIELD_PATH.fullmatch(relative) is not None


def field_files(specs: list[FieldSpec]) -> list[str]:
    """The files of the fields ``specs`` in a dataset, ``fields/meta.json`` among them where one has a
    fixed shape (plain tensordict's metadata of the numbers and a raw dataset's masks).

    Example:
        >>> field_files([FieldSpec("age", "number", "int64", ())])
        ['fields/age.memmap', 'fields/meta.json']
    """
    files = [name for spec in specs for name in spec.files()]
    return files + ([f"{FIELDS_FOLDER}/meta.json"] if any(spec.fixed for spec in specs) else [])


def index_files(storage: str, specs: list[FieldSpec]) -> list[str]:
    """The files of a value per image, each digested in the manifest's ``table`` (version 4) and read whole
    at a URL (but a mask's data, read by range): the table's, a jpeg dataset's index, and every field's.

    Example:
        >>> index_files("raw", [FieldSpec("age", "number", "int64", ())])[-1]
        'fields/age.memmap'
    """
    return [*INDEX_FILES[storage], *(name for spec in specs for name in spec.files())]


def holds_build_files(folder: Path) -> bool:
    """Whether ``folder`` holds the manifest or an array a build writes: a dataset, maybe damaged.

    Example:
        >>> import tempfile
        >>> holds_build_files(Path(tempfile.mkdtemp()))
        False
    """
    return any((folder / name).exists() for name in BUILD_FILES)


def dataset_around(path: Path) -> Path | None:
    """The folder among ``path`` and its parents that holds a dataset (see :func:`holds_build_files`),
    or ``None``: an output there would write into a dataset.

    Example:
        >>> import tempfile
        >>> dataset_around(Path(tempfile.mkdtemp()) / "new") is None
        True
    """
    for folder in (path, *path.parents):
        if folder.is_dir() and holds_build_files(folder):
            return folder
    return None


_HEX16 = re.compile(r"[0-9a-f]{16}")


@dataclass
class Manifest:
    """Everything about a built dataset that its arrays do not say.

    Attributes:
        source: the folder the images came from, absolute.
        classes: class names; a label is an index into this list.
        count: the number of images (format version 4; before, the length of ``samples``).
        samples: versions 1 to 3: ``[path relative to source, label]`` per image, in dataset order
            (version 4 keeps them in the table files, see :mod:`gpuload.format.table`); ``None`` in version 4.
        checksums: versions 1 to 3: xxh3-64 (hex) of each image's stored bytes (pixels, or JPEG
            bytes), in dataset order; ``None`` in version 4.
        table: version 4: the xxh3-64 (hex) of the bytes of each file of a value per image
            (:data:`INDEX_FILES`: the table's ``labels``, ``checksums``, ``paths`` and ``path_offsets``;
            jpeg: ``offsets`` and ``shapes`` too), written at build time.
        order: version 4, jpeg: how the images lie in ``data.memmap``: ``{"shuffled": seed,
            "block_size": bytes}`` (a seeded random order, no image across a block's end: a window of
            blocks holds images of every class) or ``{}`` (dataset order); the index is in dataset order either way.
        image_shape: ``[3, height, width]`` of every image (raw), ``None`` (jpeg: each image its own size).
        layout: raw: how ``images.memmap`` orders each image's bytes, ``"channels_last"``
            (``[N, H, W, 3]``, written since format version 3) or ``"channels_first"`` (``[N, 3, H, W]``,
            versions 1 and 2, whose manifests have no such field); ``None`` for jpeg.
        resize: how images of another size were fitted (``crop``, ``pad`` or ``stretch``; raw only).
        skipped: ``{"path": ..., "reason": ...}`` per source file that could not be decoded.
        versions: gpuload and library versions of the build.
        created: build time, ISO 8601.
        storage: how the images are stored: ``"raw"`` (uint8 pixels) or ``"jpeg"`` (JPEG bytes).
        jpeg: for ``"jpeg"``: ``{"quality": ..., "max_side": ..., "reencoded": {reason: count}}``,
            how the images that could not be stored as they were were re-encoded.
        max_image_pixels: the pixel limit the sources were decoded with (``PIL.Image.MAX_IMAGE_PIXELS``,
            0: none), which ``verify`` decodes them with again; ``None``: not recorded (built before
            gpuload recorded it).
        empty_classes: classes that have no image (listed with none, or all their files skipped);
            their labels are kept.
        files: the dataset's files besides ``manifest.json``, relative path to size in bytes.
        digests: xxh3-64 (hex) of each field in :data:`DIGESTED`, as written at build time (and of
            ``fields`` where there are any).
        fields: version 4: the dataset's named fields beside images and labels, each
            ``{"name", "kind", "dtype", "shape"}`` (see :class:`gpuload.format.fields.FieldSpec`); their files
            lie in ``fields/`` and are listed in ``files`` and in ``table``.
        source_format: version 4: what it was built from, one of :data:`SOURCE_FORMATS`.
    """

    source: str
    classes: list[str]
    image_shape: list[int] | None
    resize: str | None
    samples: list[list] | None = None
    checksums: list[str] | None = None
    count: int | None = None
    table: dict = field(default_factory=dict)
    order: dict = field(default_factory=dict)
    skipped: list[dict] = field(default_factory=list)
    versions: dict = field(default_factory=dict)
    created: str = ""
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    checksum: str = "xxh3_64"
    storage: str = "raw"
    jpeg: dict = field(default_factory=dict)
    max_image_pixels: int | None = None
    empty_classes: list[str] = field(default_factory=list)
    files: dict = field(default_factory=dict)
    digests: dict = field(default_factory=dict)
    layout: str | None = None
    fields: list = field(default_factory=list)
    source_format: str = "image_folder"

    def __post_init__(self) -> None:
        if self.format_version < 3 and self.storage == "raw":
            self.layout = "channels_first"  # what versions 1 and 2 wrote, and did not record

    def __len__(self) -> int:
        """The number of images."""
        return self.count if self.format_version >= 4 else len(self.samples)

    @property
    def arrays(self) -> tuple[str, ...]:
        """The array files of this dataset's storage and format version (``<name>.memmap``)."""
        return (ARRAYS if self.format_version >= 4 else _ARRAYS_V3)[self.storage]

    @property
    def array_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of each array of a raw dataset as stored in its file."""
        count = len(self)
        channels, height, width = self.image_shape
        stored = (height, width, channels) if self.layout == "channels_last" else (channels, height, width)
        return {"images": (count, *stored), "labels": (count,)}

    @property
    def field_specs(self) -> list[FieldSpec]:
        """The dataset's fields (format version 4; none before)."""
        return [FieldSpec.from_json(entry) for entry in self.fields]

    def field_files(self) -> list[str]:
        """The files of its fields (see :func:`field_files`)."""
        return field_files(self.field_specs)

    def index_files(self) -> list[str]:
        """The files of a value per image, digested (see :func:`index_files`)."""
        return index_files(self.storage, self.field_specs)

    def array_path(self, name: str) -> str:
        """Where the array ``name`` (see :data:`ARRAYS`) lies, relative to the dataset folder."""
        return f"_tensordict/{name}.memmap" if self.format_version == 1 else f"{name}.memmap"

    def describe(self, path: str, bytes_on_disk: int, labels: np.ndarray) -> dict:
        """What the dataset at ``path`` holds, as ``gpuload info`` shows it: count, shape, classes
        with their counts (from its ``labels``), bytes on disk, provenance."""
        import numpy as np  # not at import: the command line's --help imports this module

        counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(self.classes))
        return {
            "path": path,
            "storage": self.storage,
            "images": len(self),
            "image_shape": list(self.image_shape) if self.image_shape else None,
            "classes": {name: int(counts[position]) for position, name in enumerate(self.classes)},
            "bytes_on_disk": bytes_on_disk,
            "source": self.source,
            "resize": self.resize,
            "skipped": len(self.skipped),
            "jpeg": self.jpeg,
            "empty_classes": self.empty_classes,
            "fields": self.fields,
            "source_format": self.source_format,
            "created": self.created,
            "versions": self.versions,
        }

    def check_labels(self, labels: np.ndarray, where: str, advice: str) -> None:
        """The labels file must say what was built: a damaged label would train on a wrong class
        without any error (8 bytes per image, checked at every open: against the manifest's labels in
        versions 1 to 3, against the build's digest of the file in version 4).

        Raises:
            DatasetError: a label differs (the first named, in versions 1 to 3), naming ``where``,
                then ``advice``.
        """
        import numpy as np  # not at import: the command line's --help imports this module
        import xxhash

        if self.format_version >= 4:
            if f"{xxhash.xxh3_64_intdigest(np.ascontiguousarray(labels)):016x}" != self.table.get("labels.memmap"):
                raise DatasetError(f"{where} is damaged: labels.memmap differs from what was built; {advice}")
            if labels.size and not (0 <= int(labels.min()) and int(labels.max()) < len(self.classes)):
                raise DatasetError(
                    f"{where} is damaged: a label in labels.memmap is outside 0..{len(self.classes) - 1}"
                )
            return
        recorded = np.fromiter((label for _, label in self.samples), dtype=np.int64, count=len(self.samples))
        differ = np.flatnonzero(labels != recorded)
        if differ.size:
            first = int(differ[0])
            raise DatasetError(
                f"{where} is damaged: {differ.size} labels in labels.memmap differ from the manifest (first at "
                f"index {first}: {int(labels[first])} where the manifest says {int(recorded[first])}); {advice}"
            )

    def owned_paths(self) -> set[str]:
        """The relative paths of every file that belongs to the dataset, ``manifest.json`` included."""
        return {MANIFEST_NAME, *(_V1_FILES if self.format_version == 1 else self.files)}

    def edited_fields(self) -> list[str]:
        """The digested fields whose content no longer matches its build-time digest (none for version 1)."""
        if self.format_version == 1:
            return []
        return [
            name
            for name, digest in _digests(self._fields(), self.format_version, "fields" in self.digests).items()
            if self.digests.get(name) != digest
        ]

    def write(self, folder: str | os.PathLike) -> Path:
        """Write a new ``manifest.json`` into ``folder`` with the digests of its fields; returns its path."""
        fields = self._fields()
        self.digests = fields["digests"] = _digests(fields, self.format_version, bool(self.fields))
        path = Path(folder) / MANIFEST_NAME
        with open(path, "x", encoding="utf-8") as file:
            json.dump(fields, file, separators=(",", ":"))
        return path

    def _fields(self) -> dict:
        """The fields by name as written, sharing their values (``asdict`` would deep-copy a million
        samples); only those of its format version (see :func:`_version_fields`)."""
        names = _version_fields(self.format_version)
        return {name: getattr(self, name) for name in self.__dataclass_fields__ if name in names}

    @classmethod
    def read(cls, folder: str | os.PathLike) -> Manifest:
        """Read and check the ``manifest.json`` of ``folder``.

        Raises:
            DatasetError: a path that does not exist or is not a folder, no manifest (not a
                dataset; or a damaged one, where the arrays a build writes are there), unreadable JSON,
                a foreign format, a newer format version, a field of the wrong type (named), or
                fields that disagree with each other.
        """
        folder = Path(folder)
        path = folder / MANIFEST_NAME
        if not folder.exists():
            raise DatasetError(f"{folder} does not exist; pass the folder that build-memmap wrote")
        if not folder.is_dir():
            raise DatasetError(f"{folder} is not a folder; pass the folder that build-memmap wrote")
        if not path.is_file():
            if holds_build_files(folder):
                raise DatasetError(
                    f"{folder}: {MANIFEST_NAME} is missing but files a build writes are there (the manifest was "
                    "deleted, or the build never finished); if it is a gpuload dataset, delete it and build it again "
                    "(--overwrite replaces only whole datasets)"
                )
            hint = " (an unfinished build)" if ".tmp-" in folder.name else ""
            raise DatasetError(f"{folder} is not a gpuload dataset{hint}: it has no {MANIFEST_NAME}")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise DatasetError(f"{path} is not valid JSON ({error}); rebuild the dataset") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise DatasetError(f"{path} is not a gpuload manifest (format is not {FORMAT!r})")
        if raw.get("format_version") not in _REQUIRED:
            raise DatasetError(
                f"{path} has format version {raw.get('format_version')!r}; this gpuload reads versions 1 to "
                f"{FORMAT_VERSION}: upgrade gpuload or rebuild the dataset"
            )
        expected = _version_fields(raw["format_version"])
        missing = sorted(name for name in expected - set(raw) if name in _REQUIRED[raw["format_version"]])
        unknown = sorted(set(raw) - expected)
        if missing or unknown:
            raise DatasetError(f"{path} has missing fields {missing} or unknown fields {unknown}; rebuild the dataset")
        for name, value in raw.items():
            check, expectation = _FIELD_TYPES[name]
            if not check(value):
                shown = json.dumps(value)
                shown = shown if len(shown) <= 60 else shown[:57] + "..."
                raise DatasetError(
                    f"{path}: field {name!r} must be {expectation}, got {shown}; the manifest was edited or "
                    f"damaged: rebuild the dataset"
                )
        manifest = cls(**raw)
        manifest._check(path)
        return manifest

    def _check(self, path: Path) -> None:
        problems = []
        if self.format_version < 4 and len(self.checksums) != len(self.samples):
            problems.append(f"{len(self.checksums)} checksums for {len(self.samples)} samples")
        if self.format_version < 4 and any(not (0 <= label < len(self.classes)) for _, label in self.samples):
            problems.append(f"a sample label is outside 0..{len(self.classes) - 1}")
        names = [entry["name"] for entry in self.fields]
        if len(set(names)) != len(names):
            problems.append("a field name appears twice")
        if self.format_version >= 4 and set(self.table) != set(self.index_files()):
            problems.append(f"table lists {sorted(self.table)}, not the files {', '.join(self.index_files())}")
        if len(set(self.classes)) != len(self.classes):
            problems.append("a class name appears twice")
        arrays = {"meta.json", *(self.array_path(name) for name in self.arrays), *self.field_files()}
        if self.format_version > 1 and set(self.files) != arrays:
            problems.append(f"files lists {sorted(self.files)}, not {sorted(arrays)}")
        if (self.storage == "raw") != (self.image_shape is not None and self.resize is not None):
            problems.append(f"a {self.storage} dataset with image_shape {self.image_shape} and resize {self.resize!r}")
        if (self.storage == "raw") != (self.layout in LAYOUTS):
            problems.append(f"a {self.storage} dataset with layout {self.layout!r}")
        if self.storage == "jpeg" and set(self.jpeg) != {"quality", "max_side", "reencoded"}:
            problems.append(f"jpeg is {self.jpeg}, not quality, max_side and reencoded")
        plane = [] if self.image_shape is None else list(self.image_shape[1:])
        for spec in self.field_specs:  # a mask is its image's size: raw, stored at it; jpeg, a PNG each
            if spec.kind == "mask" and list(spec.shape) != plane:
                problems.append(f"the mask {spec.name!r} has shape {list(spec.shape)} in a {self.storage} dataset")
        if problems:
            raise DatasetError(f"{path} is inconsistent: {'; '.join(problems)}; rebuild the dataset")


def _digests(fields: dict, version: int, with_fields: bool = False) -> dict[str, str]:
    """The digest of each field that gives the data its meaning (``with_fields``: the named fields too,
    digested where a dataset has any, so that a manifest of version 4 written before them checks the same)."""
    names = DIGESTED if version >= 4 else _DIGESTED_V3 if version == 3 else _DIGESTED_V2
    names = (*names, "fields") if with_fields and version >= 4 else names
    return {
        name: f"{xxhash.xxh3_64_intdigest(json.dumps(fields[name], separators=(',', ':')).encode()):016x}"
        for name in names
    }


def _version_fields(version: int) -> set[str]:
    """The fields a manifest of format ``version`` holds: no ``layout`` before version 3; ``samples``
    and ``checksums`` before version 4, ``count``, ``table``, ``order``, ``fields`` and ``source_format``
    from it (the last two may be left out: none, and an ImageFolder)."""
    names = set(Manifest.__dataclass_fields__)
    if version < 3:
        names.discard("layout")
    if version < 4:
        return names - {"count", "table", "order", "fields", "source_format"}
    return names - {"samples", "checksums"}


def _is_int(value, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _list_of(check: Callable[[object], bool], *, empty: bool = True) -> Callable[[object], bool]:
    return lambda value: isinstance(value, list) and (empty or bool(value)) and all(check(item) for item in value)


def _str_dict(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: (
        isinstance(value, dict) and all(isinstance(key, str) and check(item) for key, item in value.items())
    )


def _is_str(value) -> bool:
    return isinstance(value, str)


def _is_field(value) -> bool:
    try:
        FieldSpec.from_json(value)
    except ValueError:
        return False
    return True


def _is_jpeg_settings(value) -> bool:
    if not isinstance(value, dict) or not value:
        return isinstance(value, dict)
    max_side = value.get("max_side")
    return (
        _is_int(value.get("quality"), 1)
        and (max_side is None or _is_int(max_side, 1))
        and _str_dict(_is_int)(value.get("reencoded"))
    )


_FIELD_TYPES: dict[str, tuple[Callable[[object], bool], str]] = {
    "format": (_is_str, "a string"),
    "format_version": (_is_int, "an integer"),
    "checksum": (lambda value: value == "xxh3_64", '"xxh3_64"'),
    "storage": (lambda value: value in ARRAYS, '"raw" or "jpeg"'),
    "source": (_is_str, "a string (the source folder)"),
    "classes": (
        _list_of(lambda name: isinstance(name, str) and name != "", empty=False),
        "a non-empty list of class names",
    ),
    "samples": (
        _list_of(
            lambda item: isinstance(item, list) and len(item) == 2 and _is_str(item[0]) and _is_int(item[1]),
            empty=False,
        ),
        "a non-empty list of [path, label] pairs",
    ),
    "checksums": (
        _list_of(lambda item: isinstance(item, str) and _HEX16.fullmatch(item) is not None),
        "a list of 16-digit hex strings",
    ),
    "image_shape": (
        lambda value: (
            value is None
            or (
                isinstance(value, list)
                and len(value) == 3
                and value[0] == 3
                and all(_is_int(side, 1) for side in value)
            )
        ),
        "[3, height, width] with positive integers (null for jpeg)",
    ),
    "resize": (
        lambda value: value is None or value in RESIZE_MODES,
        f"one of {', '.join(RESIZE_MODES)} (null for jpeg)",
    ),
    "jpeg": (_is_jpeg_settings, 'an object {"quality", "max_side", "reencoded"} (empty for raw)'),
    "max_image_pixels": (lambda value: value is None or _is_int(value), "a number of pixels (0: no limit)"),
    "empty_classes": (_list_of(_is_str), "a list of class names"),
    "skipped": (
        _list_of(
            lambda item: isinstance(item, dict) and set(item) == {"path", "reason"} and all(map(_is_str, item.values()))
        ),
        'a list of {"path": ..., "reason": ...}',
    ),
    "versions": (_str_dict(_is_str), "an object of library versions"),
    "created": (_is_str, "a date"),
    "files": (_str_dict(_is_int), "an object of file sizes"),
    "digests": (
        _str_dict(lambda item: isinstance(item, str) and _HEX16.fullmatch(item) is not None),
        "an object of digests",
    ),
    "layout": (lambda value: value is None or value in LAYOUTS, f"one of {', '.join(LAYOUTS)} (null for jpeg)"),
    "count": (lambda value: _is_int(value, 1), "a positive number of images"),
    "fields": (_list_of(_is_field), 'a list of {"name", "kind", "dtype", "shape"}'),
    "source_format": (lambda value: value in SOURCE_FORMATS, f"one of {', '.join(SOURCE_FORMATS)}"),
    "table": (
        _str_dict(lambda item: isinstance(item, str) and _HEX16.fullmatch(item) is not None),
        "an object of the table files' digests",
    ),
    "order": (
        lambda value: (
            isinstance(value, dict)
            and (
                not value
                or (
                    set(value) == {"shuffled", "block_size"}
                    and _is_int(value["shuffled"])
                    and _is_int(value["block_size"], 1)
                )
            )
        ),
        'an object {"shuffled": seed, "block_size": bytes}, or {}',
    ),  # fmt: skip
}
_ALWAYS = {"format", "format_version", "source", "classes", "image_shape", "resize"}
_REQUIRED = {
    1: _ALWAYS | {"samples", "checksums"},
    2: _ALWAYS | {"samples", "checksums", "checksum", "storage", "files", "digests"},
    3: _ALWAYS | {"samples", "checksums", "checksum", "storage", "files", "digests", "layout"},
    FORMAT_VERSION: _ALWAYS | {"count", "table", "order", "checksum", "storage", "files", "digests", "layout"},
}
