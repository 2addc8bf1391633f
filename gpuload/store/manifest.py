"""The ``manifest.json`` of a built dataset: what it holds, where it came from, what was skipped."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST_NAME", "DatasetError", "Manifest"]

FORMAT = "gpuload.memmap"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


class DatasetError(ValueError):
    """A folder that is not a complete, consistent gpuload dataset."""


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

    def write(self, folder: str | os.PathLike) -> Path:
        """Write ``manifest.json`` into ``folder``, flushed to disk; returns its path."""
        path = Path(folder) / MANIFEST_NAME
        with open(path, "w", encoding="utf-8") as file:
            json.dump(asdict(self), file, separators=(",", ":"))
            file.flush()
            os.fsync(file.fileno())
        return path

    @classmethod
    def read(cls, folder: str | os.PathLike) -> Manifest:
        """Read and check the ``manifest.json`` of ``folder``.

        Raises:
            DatasetError: no manifest (not a dataset, or an unfinished build), unreadable
                JSON, a foreign format, a newer format version, or fields that disagree.
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
        if raw.get("format_version") != FORMAT_VERSION:
            raise DatasetError(
                f"{path} has format version {raw.get('format_version')!r}; this gpuload reads version "
                f"{FORMAT_VERSION}: upgrade gpuload or rebuild the dataset"
            )
        try:
            manifest = cls(**raw)
        except TypeError as error:
            raise DatasetError(f"{path} has missing or unknown fields ({error}); rebuild the dataset") from None
        manifest._check(path)
        return manifest

    def _check(self, path: Path) -> None:
        problems = []
        if len(self.image_shape) != 3 or self.image_shape[0] != 3 or min(self.image_shape) < 1:
            problems.append(f"image_shape {self.image_shape} is not [3, height, width]")
        if len(self.checksums) != len(self.samples):
            problems.append(f"{len(self.checksums)} checksums for {len(self.samples)} samples")
        if not self.classes:
            problems.append("no classes")
        if any(not (0 <= label < len(self.classes)) for _, label in self.samples):
            problems.append(f"a sample label is outside 0..{len(self.classes) - 1}")
        if problems:
            raise DatasetError(f"{path} is inconsistent: {'; '.join(problems)}")
