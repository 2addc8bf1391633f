"""Images held in Parquet files, in the layout Hugging Face ``datasets`` exports.

A ``.parquet`` file, or a folder of them (read in the order of their names): an ``image`` column of
``{bytes, path}`` structs (``datasets.Image``; or plain binary), a ``label`` column (class indices, whose
names come from the ``ClassLabel`` the file's ``huggingface`` metadata records, or class names), and
any other column a field (see :mod:`gpuload.sources.samples`; a ``mask`` column, ``{bytes, path}`` or
binary as the images, holds segmentation masks as PNG bytes). Roles given by name override those
defaults (``--column picture=image``). Each file is read in record batches of 64 rows through pyarrow
(``pip install 'gpuload[parquet]'``): memory holds one batch whatever the file's size; a batch's image
bytes go to the scan's own file in the build's folder in one write, from Arrow's buffer (no Python
object per image).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import SourceError, UsageError
from .samples import Sample, SampleScan, ScannedIndex, Sink, images_column, with_defaults

__all__ = ["open_parquet", "parquet_files", "scan_parquet"]

_DEFAULT_ROLES = {"image": "image", "label": "label", "mask": "mask"}
_BATCH = 64  # rows read at once: a batch of images in memory


def open_parquet(path: Path):
    """``pyarrow.parquet.ParquetFile`` of ``path``.

    Raises:
        UsageError: pyarrow is not installed.
        SourceError: the file is not a readable Parquet file (truncated, damaged, something else).
    """
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(
            f"{path} is a Parquet file, which gpuload reads with pyarrow: pip install 'gpuload[parquet]'"
        ) from None
    import pyarrow

    try:
        return pq.ParquetFile(path)
    except (pyarrow.ArrowException, OSError) as error:
        raise SourceError(
            path, f"is not a readable Parquet file ({error}): truncated or damaged? download it again"
        ) from None


def parquet_files(src: Path) -> list[Path]:
    """The Parquet files of ``src``: itself, or those of the folder, sorted by name.

    Raises:
        FileNotFoundError: a folder with none.
    """
    if src.is_file():
        return [src]
    files = sorted(path for path in src.iterdir() if path.suffix == ".parquet" and path.is_file())
    if not files:
        raise FileNotFoundError(f"{src} holds no .parquet file")
    return files


def image_column(path: Path, roles: dict[str, str]) -> str | None:
    """The column of ``path`` that holds images (binary, or ``{bytes, path}`` structs), or ``None``:
    a Parquet file without one is a metadata table naming image files."""
    import pyarrow as pa

    schema = open_parquet(path).schema_arrow
    named = next((name for name, role in roles.items() if role == "image"), "image")
    if named not in schema.names:
        return None
    kind = schema.field(named).type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return named
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        return named
    return None


def scan_parquet(
    src: Path,
    *,
    classes: Sequence[str] | None,
    roles: dict[str, str],
    into: Path,
    files: list[Path] | None = None,
    progress: bool = False,
    sink: Sink | None = None,
) -> ScannedIndex:
    """Scan the images of the Parquet file or folder ``src`` into the new folder ``into`` (see the module).

    Raises:
        SourceError: a file is not readable, or a row cannot be taken (named, with what to do).
        UsageError: pyarrow is not installed.
    """
    import pyarrow

    files = files or parquet_files(src)
    roles = with_defaults(roles, _DEFAULT_ROLES)
    image = images_column(roles, _DEFAULT_ROLES, src)
    label = next((name for name, role in roles.items() if role == "label"), None)
    given = classes if classes is not None else _class_names(open_parquet(files[0]), label)
    root = src if src.is_dir() else src.parent
    scan = SampleScan(
        into,
        root=root,
        source=src,
        source_format="parquet",
        classes=given,
        roles=roles,
        default_class=src.stem if src.is_file() else src.name,
        progress=progress,
        sink=sink,
    )
    with scan:  # a failure (or Ctrl-C) closes the scan's files
        for path in files:
            parquet = open_parquet(path)
            if image not in parquet.schema_arrow.names:
                raise SourceError(
                    path,
                    f"has no {image!r} column of images (its columns: {', '.join(parquet.schema_arrow.names)}); name the "
                    "image column with --column NAME=image",
                )
            row, batches, named = 0, parquet.iter_batches(batch_size=_BATCH), path.relative_to(root).as_posix()
            others = [name for name in parquet.schema_arrow.names if name != image]
            while True:
                try:  # only the file's reading: an OSError of the scan's own disk stays what it is
                    batch = next(batches, None)
                    if batch is None:
                        break
                    data, starts, lengths = _image_bytes(batch.column(image))
                    rows = pyarrow.RecordBatch.from_arrays([batch.column(name) for name in others], names=others)
                    rows = rows.to_pylist() if others else [{} for _ in range(batch.num_rows)]
                except (pyarrow.ArrowException, OSError) as error:
                    raise SourceError(
                        path, f"cannot be read past row {row} ({error}): truncated or damaged? download it again"
                    ) from None
                images = scan.images(data, starts.tolist(), lengths.tolist())
                for at, (values, image_bytes, length) in enumerate(zip(rows, images, lengths.tolist())):
                    where = f"row {row} of {path}"
                    if length <= 0:
                        _no_image(batch.column(image)[at], where, path, image)
                    sample = Sample(
                        name=f"{named}/{row}",
                        image=image_bytes,
                        label=values.pop(label, None) if label is not None else None,
                        values=values,
                        where=where,
                    )
                    scan.add(sample)
                    row += 1
        return scan.finish(describe=lambda position: f"sample {position}")


def _image_bytes(column) -> tuple[memoryview, np.ndarray, np.ndarray]:
    """The image bytes of a batch's image column (``{bytes, path}`` structs, or plain binary) as Arrow
    holds them, one after the other: the buffer, and each row's start in it and length (``0``: none, or
    not binary)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = pc.struct_field(column, "bytes") if pa.types.is_struct(column.type) else column
    if pa.types.is_fixed_size_binary(values.type):  # images of one byte length: offsets made for them
        values = values.cast(pa.binary())
    if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):  # all None: null
        return memoryview(b""), np.zeros(len(values), np.int64), np.zeros(len(values), np.int64)
    lengths = pc.binary_length(values).fill_null(0).to_numpy().astype(np.int64)
    wide = pa.types.is_large_binary(values.type)
    _, offsets, data = values.buffers()
    offsets = np.frombuffer(offsets, np.int64 if wide else np.int32)[values.offset : values.offset + len(values) + 1]
    first, last = int(offsets[0]), int(offsets[-1])
    view = memoryview(data)[first:last] if data is not None else memoryview(b"")
    return view, offsets[:-1].astype(np.int64) - first, lengths


def _no_image(value: object, where: str, path: Path, column: str) -> None:
    """Refuse an image cell that holds no bytes (a struct of a path only names a file elsewhere).

    Raises:
        SourceError: always.
    """
    value = value.as_py()
    if isinstance(value, dict):
        value = value.get("bytes")
    raise SourceError(
        path,
        f"{where}: {column!r} holds no image bytes ({'empty' if value is None else type(value).__name__}); "
        "export the dataset with the images embedded (datasets' to_parquet embeds them)",
    )


def _class_names(parquet, label: str | None) -> list[str] | None:
    """The class names that a Hugging Face export records for its label column (a ``ClassLabel``), or ``None``."""
    metadata = parquet.schema_arrow.metadata or {}
    try:
        features = json.loads(metadata[b"huggingface"])["info"]["features"]
        names = features[label]["names"]
    except (KeyError, TypeError, ValueError):
        return None
    return list(names) if isinstance(names, list) and all(isinstance(name, str) for name in names) else None
