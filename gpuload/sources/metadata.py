"""Images named by a metadata table, in Hugging Face's convention: a ``file_name`` column, every other
column a field.

A folder that holds ``metadata.csv``, ``metadata.jsonl`` or ``metadata.parquet`` at its root (Hugging
Face's ``imagefolder`` layout), or a table given by its path: each row names one image by its path
relative to the table's folder (the ``file_name`` column, or the column given the role ``image``), and
every other column becomes a field of that image (see :mod:`gpuload.sources.samples` for how a
column's kind is told). A column named ``label`` (or given the role ``label``) is the class label,
class names or indices; without one, an image's class is its first folder (``cat/1.jpg``: ``cat``), as
in an ImageFolder, or, where the images lie beside the table, one class named after its folder. A
column named ``mask`` (or given the role ``mask``) names each image's segmentation mask, a PNG file
relative to the table's folder, read as the table is: a missing one is listed, and its image skipped,
by the build.

The table is read a row at a time (CSV and JSON Lines with Python's readers, Parquet in record
batches through pyarrow, ``pip install 'gpuload[parquet]'``): memory holds a few rows whatever its length.
CSV cells are text: a cell that reads as an integer, a number, a bool (``True``, ``false``) or a JSON
list (``[0.5, 2]``, ``["cat", "dog"]``) is taken as one, unless its column has the role ``text``; a
zero-padded integer label (``001``) stays a class name, as an ImageFolder's folder ``001`` is one.
"""

from __future__ import annotations

import csv
import json
import posixpath
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..errors import SourceError, UsageError
from .samples import Sample, SampleScan, ScannedIndex, Sink, Unreadable, images_column, with_defaults

__all__ = ["TABLE_NAMES", "TABLE_SUFFIXES", "find_metadata", "read_rows", "scan_metadata"]

TABLE_NAMES = ("metadata.csv", "metadata.jsonl", "metadata.parquet")
TABLE_SUFFIXES = (".csv", ".jsonl", ".parquet")
_DEFAULT_ROLES = {"file_name": "image", "label": "label", "mask": "mask"}


def find_metadata(folder: Path) -> Path | None:
    """The metadata table at the root of ``folder`` (Hugging Face's names), or ``None``.

    Raises:
        UsageError: there are several.

    Example:
        >>> import tempfile
        >>> find_metadata(Path(tempfile.mkdtemp())) is None
        True
    """
    found = [folder / name for name in TABLE_NAMES if (folder / name).is_file()]
    if len(found) > 1:
        raise UsageError(
            f"{folder} holds {' and '.join(path.name for path in found)}: one metadata table per folder; "
            "keep one of them"
        )
    return found[0] if found else None


def scan_metadata(
    table: Path,
    *,
    classes: Sequence[str] | None,
    roles: dict[str, str],
    into: Path,
    progress: bool = False,
    sink: Sink | None = None,
) -> ScannedIndex:
    """Scan the images that ``table`` names into the new folder ``into`` (see the module).

    Raises:
        SourceError: the table cannot be read, lacks its image column, or a row cannot be taken (named).

    Example:
        >>> import tempfile
        >>> from gpuload.sample import make_sample_folder
        >>> folder = make_sample_folder(Path(tempfile.mkdtemp()) / "p", images_per_class=1, size=(12, 16))
        >>> first = sorted(folder.rglob("*.jpg"))[0].relative_to(folder).as_posix()
        >>> _ = (folder / "metadata.csv").write_text(f"file_name,label,score\\n{first},kitten,0.5\\n")
        >>> index = scan_metadata(folder / "metadata.csv", classes=None, roles={}, into=folder.parent / ".scan")
        >>> index.classes, list(index.samples), index.fields[0].spec.dtype
        (['kitten'], [('background/0000.jpg', 0)], 'float32')
        >>> index.close()
    """
    roles = with_defaults(roles, _DEFAULT_ROLES)
    image_column = images_column(roles, _DEFAULT_ROLES, table)
    label_column = next((name for name, role in roles.items() if role == "label"), None)
    scan = SampleScan(
        into,
        root=table.parent,
        source=table,
        source_format="table",
        classes=classes,
        roles=roles,
        default_class=table.parent.name or "images",
        progress=progress,
        sink=sink,
    )
    with scan:  # a failure (or Ctrl-C) closes the scan's files
        by_folder: bool | None = None
        text_columns = {name for name, role in roles.items() if role in ("text", "mask", "image")}
        for where, row in read_rows(table, text_columns, name_columns={label_column} - {None}):
            if image_column not in row:
                raise SourceError(
                    table,
                    f"has no {image_column!r} column (the images' paths, relative to its folder): {where} has "
                    f"{', '.join(sorted(row)) or 'no column'}; name the image column with --column NAME=image",
                )
            name = _relative_path(row.pop(image_column), where, table, image_column)
            if label_column is not None and label_column in row:
                label = row.pop(label_column)
            else:  # as ImageFolder: the first folder of the path; images beside the table: one class
                folder = name.split("/", 1)[0] if "/" in name else None
                by_folder = (folder is not None) if by_folder is None else by_folder
                if (folder is not None) != by_folder:
                    raise SourceError(
                        table,
                        f"{where}: with no label column an image's class is its folder, and some images lie in folders "
                        "while others lie beside the table; add a label column",
                    )
                label = folder
            for column, role in roles.items():
                if role == "mask" and column in row:
                    row[column] = _mask_file(table.parent, _relative_path(row[column], where, table, column), column)
            scan.add(Sample(name=name, label=label, values=row, where=where))
        return scan.finish(describe=lambda position: f"{_row_word(table)} {position + 1}")


def _relative_path(value: object, where: str, table: Path, column: str) -> str:
    """A path a row gives, relative to the table's folder and normalised.

    Raises:
        SourceError: not a non-empty relative path inside that folder.
    """
    if not isinstance(value, str) or not value.strip():
        raise SourceError(table, f"{where}: {column!r} is {value!r}, not the path of an image; fill it")
    path = posixpath.normpath(value.replace("\\", "/"))
    if posixpath.isabs(path) or path == ".." or path.startswith("../"):
        raise SourceError(
            table,
            f"{where}: {column!r} is {value!r}, which lies outside the table's folder; paths are relative to "
            f"{table.parent}",
        )
    return path


def _mask_file(root: Path, path: str, column: str) -> bytes | Unreadable:
    """The bytes of the mask file ``root/path``, or why they cannot be read (the build skips its image)."""
    try:
        data = (root / path).read_bytes()
    except OSError as error:
        return Unreadable(f"its mask {path} ({column!r}) cannot be read ({error.strerror or error})")
    return data if data else Unreadable(f"its mask {path} ({column!r}) is empty (0 bytes)")


def _row_word(table: Path) -> str:
    return "line" if table.suffix == ".jsonl" else "row"


def read_rows(
    table: Path, text_columns: set[str] = frozenset(), name_columns: set[str] = frozenset()
) -> Iterator[tuple[str, dict]]:
    """``(where, row)`` for each row of ``table`` (``.csv``, ``.jsonl`` or ``.parquet``), a row at a time.
    CSV cells of the ``text_columns`` stay text; others are read as numbers or JSON lists where they are,
    but a zero-padded integer of the ``name_columns`` (the label's: class ``001``) stays a name.

    Raises:
        SourceError: the table is not readable as its kind says (named, with the line or what pyarrow said).
        UsageError: a Parquet table without pyarrow installed, or another suffix.
    """
    reader = {".csv": _csv_rows, ".jsonl": _jsonl_rows, ".parquet": _parquet_rows}.get(table.suffix.lower())
    if reader is None:
        raise UsageError(f"{table} is not a table gpuload reads; give a .csv, .jsonl or .parquet file")
    yield from reader(table, text_columns, name_columns)


def _csv_rows(table: Path, text_columns: set[str], name_columns: set[str]) -> Iterator[tuple[str, dict]]:
    with open(table, newline="", encoding="utf-8-sig") as file:
        try:
            rows = csv.DictReader(file)
            for number, row in enumerate(rows, 1):
                where = f"row {number}"
                if None in row or None in row.values():
                    raise SourceError(
                        table, f"{where} has {len(rows.fieldnames)} column names and another number of cells"
                    )
                cells = {
                    name: cell if name in text_columns else _cell(cell, name=name in name_columns)
                    for name, cell in row.items()
                }
                yield where, cells
        except (UnicodeDecodeError, csv.Error) as error:
            raise SourceError(table, f"is not a readable CSV file ({error}); save it as UTF-8 CSV") from None


def _cell(text: str, *, name: bool = False) -> object:
    """A CSV cell as what it reads as: an int, a float, a bool (``true``/``false``, any case, as pandas and
    Python write them), a JSON list, or its text; with ``name`` (a label), a zero-padded integer stays text:
    folders ``001``, ``002``... are class names, as an ImageFolder of them has them, not indices 1, 2...

    Example:
        >>> [_cell(text) for text in ("3", "0.5", "False", "[1, 2]", "cat", "007")]
        [3, 0.5, False, [1, 2], 'cat', 7]
        >>> _cell("007", name=True), _cell("7", name=True), _cell("0", name=True)
        ('007', 7, 0)
    """
    if name and len(text) > 1 and text.startswith("0") and text.isdigit():
        return text
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        pass
    if text.startswith("["):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _jsonl_rows(table: Path, text_columns: set[str], name_columns: set[str]) -> Iterator[tuple[str, dict]]:
    with open(table, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            where = f"line {number}"
            try:
                row = json.loads(line)
            except ValueError as error:
                raise SourceError(table, f"{where} is not valid JSON ({error}); fix the line") from None
            if not isinstance(row, dict):
                raise SourceError(table, f"{where} is not a JSON object of columns; give one object per line")
            yield where, row


def _parquet_rows(table: Path, text_columns: set[str], name_columns: set[str]) -> Iterator[tuple[str, dict]]:
    from .parquet import open_parquet

    number = 0
    for batch in open_parquet(table).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            number += 1
            yield f"row {number}", row
