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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import xxhash

from ..errors import DatasetError

__all__ = ["DIGESTED", "FORMAT", "FORMAT_VERSION", "MANIFEST_NAME", "RESIZE_MODES", "DatasetError", "Manifest"]

FORMAT = "gpuload.memmap"
FORMAT_VERSION = 2
MANIFEST_NAME = "manifest.json"
RESIZE_MODES: tuple[str, ...] = ("crop", "pad", "stretch")
# The fields that give the arrays their meaning: their digests are checked by ``verify``.
DIGESTED = ("storage", "classes", "samples", "checksums", "image_shape", "resize", "files")
# Version 1 (gpuload 0.1.0) kept the arrays in _tensordict/ beside two tensordict meta.json files.
_V1_FILES = ("meta.json", "_tensordict/meta.json", "_tensordict/images.memmap", "_tensordict/labels.memmap")
_HEX16 = re.compile(r"[0-9a-f]{16}")


@dataclass
class Manifest:
    """Everything about a built dataset that its arrays do not say.

    Attributes:
        source: the folder the images came from, absolute.
        classes: class names; a label is an index into this list.
        samples: ``[path relative to source, label]`` per image, in dataset order.
        checksums: xxh3-64 of each image's bytes (hex), in dataset order.
        image_shape: ``[3, height, width]``.
        resize: how images of another size were fitted (``crop``, ``pad`` or ``stretch``).
        skipped: ``{"path": ..., "reason": ...}`` per source file that could not be decoded.
        versions: gpuload and library versions of the build.
        created: build time, ISO 8601.
        storage: how the images are stored: ``"raw"`` (uint8 pixels).
        files: the dataset's files besides ``manifest.json``, relative path to size in bytes.
        digests: xxh3-64 (hex) of each field in :data:`DIGESTED`, as written at build time.
    """

    source: str
    classes: list[str]
    samples: list[list]
    checksums: list[str]
    image_shape: list[int]
    resize: str
    skipped: list[dict] = field(default_factory=list)
    versions: dict = field(default_factory=dict)
    created: str = ""
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    checksum: str = "xxh3_64"
    storage: str = "raw"
    files: dict = field(default_factory=dict)
    digests: dict = field(default_factory=dict)

    def array_path(self, name: str) -> str:
        """Where the array ``name`` (``images`` or ``labels``) lies, relative to the dataset folder."""
        return f"_tensordict/{name}.memmap" if self.format_version == 1 else f"{name}.memmap"

    def owned_paths(self) -> set[str]:
        """The relative paths of every file that belongs to the dataset, ``manifest.json`` included."""
        return {MANIFEST_NAME, *(_V1_FILES if self.format_version == 1 else self.files)}

    def edited_fields(self) -> list[str]:
        """The digested fields whose content no longer matches its build-time digest (none for version 1)."""
        return [
            name for name, digest in _digests(self).items() if name in self.digests and self.digests[name] != digest
        ]

    def write(self, folder: str | os.PathLike) -> Path:
        """Write a new ``manifest.json`` into ``folder`` with the digests of its fields; returns its path."""
        self.digests = _digests(self)
        path = Path(folder) / MANIFEST_NAME
        with open(path, "x", encoding="utf-8") as file:
            json.dump(asdict(self), file, separators=(",", ":"))
        return path

    @classmethod
    def read(cls, folder: str | os.PathLike) -> Manifest:
        """Read and check the ``manifest.json`` of ``folder``.

        Raises:
            DatasetError: no manifest (not a dataset, or an unfinished build), unreadable JSON,
                a foreign format, a newer format version, a field of the wrong type (named), or
                fields that disagree with each other.
        """
        folder = Path(folder)
        path = folder / MANIFEST_NAME
        if not folder.is_dir():
            raise DatasetError(f"{folder} is not a folder; pass the folder that build-memmap wrote")
        if not path.is_file():
            hint = " (an unfinished build)" if ".tmp-" in folder.name else ""
            raise DatasetError(f"{folder} is not a gpuload dataset{hint}: it has no {MANIFEST_NAME}")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise DatasetError(f"{path} is not valid JSON ({error}); rebuild the dataset") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise DatasetError(f"{path} is not a gpuload manifest (format is not {FORMAT!r})")
        if raw.get("format_version") not in (1, FORMAT_VERSION):
            raise DatasetError(
                f"{path} has format version {raw.get('format_version')!r}; this gpuload reads versions 1 and "
                f"{FORMAT_VERSION}: upgrade gpuload or rebuild the dataset"
            )
        expected = set(cls.__dataclass_fields__)
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
        if len(self.checksums) != len(self.samples):
            problems.append(f"{len(self.checksums)} checksums for {len(self.samples)} samples")
        if any(not (0 <= label < len(self.classes)) for _, label in self.samples):
            problems.append(f"a sample label is outside 0..{len(self.classes) - 1}")
        if len(set(self.classes)) != len(self.classes):
            problems.append("a class name appears twice")
        if self.format_version > 1 and set(self.files) != {
            "meta.json",
            self.array_path("images"),
            self.array_path("labels"),
        }:
            problems.append(f"files lists {sorted(self.files)}, not meta.json and the two arrays")
        if problems:
            raise DatasetError(f"{path} is inconsistent: {'; '.join(problems)}; rebuild the dataset")


def _digests(manifest: Manifest) -> dict[str, str]:
    fields = asdict(manifest)
    return {
        name: f"{xxhash.xxh3_64_intdigest(json.dumps(fields[name], separators=(',', ':')).encode()):016x}"
        for name in DIGESTED
    }


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


_FIELD_TYPES: dict[str, tuple[Callable[[object], bool], str]] = {
    "format": (_is_str, "a string"),
    "format_version": (_is_int, "an integer"),
    "checksum": (lambda value: value == "xxh3_64", '"xxh3_64"'),
    "storage": (lambda value: value == "raw", '"raw"'),
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
            isinstance(value, list) and len(value) == 3 and value[0] == 3 and all(_is_int(side, 1) for side in value)
        ),
        "[3, height, width] with positive integers",
    ),
    "resize": (lambda value: value in RESIZE_MODES, f"one of {', '.join(RESIZE_MODES)}"),
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
}
_ALWAYS = {"format", "format_version", "source", "classes", "samples", "checksums", "image_shape", "resize"}
_REQUIRED = {1: _ALWAYS, FORMAT_VERSION: _ALWAYS | {"checksum", "storage", "files", "digests"}}
