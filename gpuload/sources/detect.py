"""What ``build-memmap`` was given, told apart: an ImageFolder, images with a metadata table, WebDataset
tar shards or Parquet files; and the scan of each into one index of samples for the build.

- a folder with ``metadata.csv``, ``metadata.jsonl`` or ``metadata.parquet`` at its root: its images
  with the table (:mod:`gpuload.sources.metadata`);
- a ``.csv`` or ``.jsonl`` file, or a ``.parquet`` file without a column of image bytes: a table
  naming images relative to its folder;
- a ``.tar`` file (or ``.tar.gz``...), a folder of them, or a brace pattern
  (``train-{000000..000099}.tar``): WebDataset shards (:mod:`gpuload.sources.webdataset`);
- a ``.parquet`` file with a column of image bytes, or a folder of ``.parquet`` files: images in
  Parquet (:mod:`gpuload.sources.parquet`);
- any other folder: an ImageFolder (:mod:`gpuload.sources.folder`), as before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from .folder import ImageFolderIndex, scan_image_folder
from .metadata import TABLE_SUFFIXES, find_metadata, scan_metadata
from .samples import ScannedIndex, Sink
from .webdataset import TAR_SUFFIXES, is_pattern, shard_paths

__all__ = ["Source", "find_source", "scan_source"]


@dataclass(frozen=True)
class Source:
    """A source told apart.

    Attributes:
        format: ``"image_folder"``, ``"table"``, ``"webdataset"`` or ``"parquet"``.
        path: what was given, resolved (a brace pattern: its folder resolved, its name as given).
        files: the files a build reads whole (the table, the shards, the Parquet files); none for a folder.
        table: a metadata table's path.
    """

    format: str
    path: Path
    files: tuple[Path, ...] = ()
    table: Path | None = None

    @property
    def folder(self) -> Path | None:
        """The folder that was given, where one was."""
        return self.path if self.path.is_dir() else None

    def default_out(self) -> Path:
        """Where a build writes when no ``out`` is given: beside the source, ``<name>.memmap``; a file's
        name without its suffix, a pattern's without its braces."""
        if self.folder is not None:
            return self.path.with_name(f"{self.path.name}.memmap")
        name = re.sub(r"\{[^{}]*\}", "", self.path.name)
        for suffix in (*TAR_SUFFIXES, *TABLE_SUFFIXES):
            name = name.removesuffix(suffix)
        return self.path.with_name(f"{name.strip('-_.') or 'dataset'}.memmap")


def find_source(src: str | os.PathLike, columns: dict[str, str]) -> Source:
    """Tell what ``src`` is (see the module).

    Raises:
        FileNotFoundError: ``src`` does not exist (a pattern: a shard it names is missing).
        UsageError: a file of another kind, or a folder with two metadata tables.

    Example:
        >>> import tempfile
        >>> find_source(tempfile.mkdtemp(), {}).format
        'image_folder'
    """
    text = str(src)
    if is_pattern(text):
        shards = tuple(shard_paths(text))
        return Source("webdataset", _resolve(Path(text).parent) / Path(text).name, shards)
    path = _resolve(src)
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; pass an image folder, a metadata table, tar shards or Parquet files"
        )
    if path.is_dir():
        table = find_metadata(path)
        if table is not None:
            return Source("table", path, (table,), table)
        entries = [entry for entry in path.iterdir() if entry.is_file()]
        if not any(entry.is_dir() for entry in path.iterdir()):
            if any(entry.name.endswith(TAR_SUFFIXES) for entry in entries):
                return Source("webdataset", path, tuple(shard_paths(path)))
            if any(entry.suffix == ".parquet" for entry in entries):
                from .parquet import parquet_files

                return Source("parquet", path, tuple(parquet_files(path)))
        return Source("image_folder", path)
    if not path.is_file():  # read, it would block (a FIFO) or never end (a device)
        raise UsageError(
            f"{path} is not a regular file (a FIFO, a device, a socket?); pass an image folder, a metadata table, "
            "tar shards or Parquet files"
        )
    if path.name.endswith(TAR_SUFFIXES):
        return Source("webdataset", path, (path,))
    if path.suffix in (".csv", ".jsonl"):
        return Source("table", path, (path,), path)
    if path.suffix == ".parquet":
        from .parquet import image_column

        if image_column(path, columns) is not None:
            return Source("parquet", path, (path,))
        return Source("table", path, (path,), path)
    raise UsageError(
        f"{path} is a file gpuload does not read as a source; pass an image folder, a metadata table (.csv, .jsonl, "
        ".parquet), tar shards (.tar) or Parquet files of images"
    )


def scan_source(
    source: Source,
    *,
    classes: Sequence[str] | None,
    columns: dict[str, str],
    into: Path,
    progress: bool = False,
    sink: Sink | None = None,
) -> ImageFolderIndex | ScannedIndex:
    """Scan ``source`` into the new folder ``into`` (the build's own): the samples' index (``progress``: a
    progress bar of the samples of a table, tar shards or Parquet files; ``sink``: given each of their
    samples as it is staged, see :data:`gpuload.sources.samples.Sink`).

    Raises:
        UsageError: ``columns`` for an ImageFolder, whose images have no columns.
        SourceError, FileNotFoundError: see each source's scan.
    """
    if source.format == "image_folder":
        if columns:
            raise UsageError(
                f"columns name the columns of a metadata table, tar shards or Parquet files, and {source.path} is an "
                "ImageFolder (one folder per class): leave columns out, or add a metadata.csv"
            )
        if sink is not None:
            raise UsageError("an ImageFolder's scan gives no sample as it goes: its build writes after the scan")
        return scan_image_folder(source.path, classes=classes, into=into)
    if source.format == "table":
        return scan_metadata(source.table, classes=classes, roles=columns, into=into, progress=progress, sink=sink)
    if source.format == "webdataset":
        from .webdataset import scan_webdataset

        return scan_webdataset(
            source.path,
            classes=classes,
            roles=columns,
            into=into,
            shards=list(source.files),
            progress=progress,
            sink=sink,
        )
    from .parquet import scan_parquet

    return scan_parquet(
        source.path, classes=classes, roles=columns, into=into, files=list(source.files), progress=progress, sink=sink
    )


def _resolve(path: str | os.PathLike) -> Path:
    return Path(path).expanduser().resolve()
