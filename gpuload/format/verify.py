"""Check a built dataset against what was recorded when it was built."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Literal

import numpy as np
import xxhash
from PIL import Image
from tqdm.auto import tqdm

from ..errors import DatasetError, DecodeError, UsageError
from ..writing.decode import decode_image, read_bytes
from ..writing.jpeg import frame_size, store_jpeg
from .dataset import MemmapImageDataset, decode_jpeg_bytes, storage_order
from .fields import FIELDS_FOLDER
from .manifest import MANIFEST_NAME, holds_build_files
from .table import file_digest

__all__ = ["describe_memmap", "verify_memmap"]


def describe_memmap(path: str | os.PathLike) -> dict:
    """What a dataset holds: count, shape, classes with their counts, bytes on disk, provenance.

    Raises:
        DatasetError: not a readable gpuload dataset.
    """
    dataset = MemmapImageDataset(path)
    size = sum(file.stat().st_size for file in dataset.path.rglob("*") if file.is_file())
    return dataset.manifest.describe(str(dataset.path), size, dataset.table.labels)


# What each index file holds, for a damaged one's message.
_HOLDS = {
    "labels.memmap": "each image's label",
    "checksums.memmap": "each image's checksum",
    "paths.memmap": "each image's source path",
    "path_offsets.memmap": "where each source path lies",
    "offsets.memmap": "where each image lies in data.memmap",
    "shapes.memmap": "each image's size",
}


def _holds(name: str) -> str:
    """What the index file ``name`` holds, for a damaged one's message."""
    if name in _HOLDS:
        return _HOLDS[name]
    field, _, what = name.removeprefix(f"{FIELDS_FOLDER}/").removesuffix(".memmap").partition(".")
    return f"where each value of the field {field!r} lies" if what else f"each image's value of the field {field!r}"


def verify_memmap(
    path: str | os.PathLike, *, sources: int | Literal["all"] = 0, seed: int = 0, progress: bool = True
) -> list[str]:
    """Check a dataset; returns the problems found, an empty list when it is intact.

    Checks that the manifest is valid and unedited (the digest of every field that gives the
    data its meaning), that the files match it (sizes, dtypes, shapes), that every label is in
    range and equals the recorded one, and that every image has the checksum recorded at build
    time: a power cut that lost pixels (zeros) or a flipped bit on disk shows up here. With
    ``sources``, also takes that many randomly chosen source images again (``"all"``: every one)
    the way the build did and compares: a raw image's pixels exactly, a jpeg image's stored bytes
    exactly, the pixels of a source that no longer gives those bytes within a small tolerance. The
    sources are decoded with the build's pixel limit where its manifest records it (else with
    ``PIL.Image.MAX_IMAGE_PIXELS`` as it is).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        UsageError: ``path`` holds no dataset at all (a file, a folder with neither a manifest nor
            a labels file), or bad ``sources``. A dataset too damaged to open is a problem instead.

    Example:
        >>> import tempfile
        >>> from gpuload import build_memmap, make_sample_folder
        >>> src = make_sample_folder(Path(tempfile.mkdtemp()) / "photos", images_per_class=1, size=(12, 16))
        >>> verify_memmap(build_memmap(src, progress=False), sources="all", progress=False)
        []
    """
    if sources != "all" and (not isinstance(sources, int) or isinstance(sources, bool) or sources < 0):
        raise UsageError(f"sources must be a number of images to re-decode or 'all', got {sources!r}")
    path = Path(path)
    _check_holds_a_dataset(path)
    try:
        dataset = MemmapImageDataset(path)
    except DatasetError as error:
        return [str(error)]
    manifest = dataset.manifest
    if sources and manifest.source_format in ("webdataset", "parquet"):
        raise UsageError(
            f"{path} was built from {manifest.source_format} files, whose images verify does not read again one by "
            "one; leave out sources (the images' checksums are checked without them)"
        )
    problems = [
        f"manifest.json: the field {name!r} was changed after the build (its digest differs); rebuild the dataset"
        for name in manifest.edited_fields()
    ]
    problems += [
        f"{name} differs from what was built (its digest differs): {_holds(name)} is damaged; rebuild the dataset"
        for name, digest in manifest.table.items()
        if file_digest(dataset.path / name) != digest
    ]
    bad, resized = [], []
    for index in tqdm(range(len(dataset)), desc="checksums", unit="img", disable=not progress, file=sys.stderr):
        stored = _stored_bytes(dataset, index)
        if xxhash.xxh3_64_intdigest(stored) != dataset.table.checksums[index]:
            bad.append(index)
        elif dataset.storage == "jpeg" and frame_size(stored) != tuple(dataset.data.shapes[index].tolist()):
            resized.append(index)
    if bad:
        shown = ", ".join(f"{index} ({dataset.table.path(index)})" for index in bad[:5])
        problems.append(f"{len(bad)} images do not match their build checksum: {shown}")
    if resized:
        shown = ", ".join(f"{index} ({dataset.table.path(index)})" for index in resized[:5])
        problems.append(f"{len(resized)} images differ from their size in shapes.memmap: {shown}")
    if sources:
        from ..writing.decode import pixel_limit

        count = len(dataset) if sources == "all" else sources
        recorded = manifest.max_image_pixels  # the build's pixel limit: its sources decoded within it
        with pixel_limit(Image.MAX_IMAGE_PIXELS if recorded is None else recorded or None):
            problems += _compare_sources(dataset, count, seed, skip=set(bad) | set(resized))
    return problems


def _check_holds_a_dataset(path: Path) -> None:
    """Refuse a path with no gpuload dataset at all: verify reports the problems of a dataset."""
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; pass the folder that build-memmap wrote")
    if not path.is_dir():
        raise UsageError(f"{path} is not a folder; pass the folder that build-memmap wrote")
    if not holds_build_files(path):
        raise UsageError(
            f"{path} is not a gpuload dataset: it holds none of the files build-memmap writes "
            f"({MANIFEST_NAME}, labels.memmap...); pass the folder that build-memmap wrote"
        )


def _stored_bytes(dataset: MemmapImageDataset, index: int):
    """What the build checksummed for image ``index``: its pixels (raw) or its JPEG bytes."""
    if dataset.storage == "raw":
        return storage_order(dataset.data.images)[0][index].numpy()  # the bytes as they lie in the file
    return dataset._jpegs.read(int(dataset.data.starts[index]), int(dataset.data.lengths[index]))


def _compare_sources(dataset: MemmapImageDataset, count: int, seed: int, skip: set[int]) -> list[str]:
    """Compare ``count`` random sources with what the build stored (see :func:`_compare_raw` and
    :func:`_compare_jpeg`). Images in ``skip`` were already found damaged."""
    manifest = dataset.manifest
    root = Path(manifest.source)
    compare = _compare_jpeg if dataset.storage == "jpeg" else _compare_raw
    problems = []
    for index in sorted(random.Random(seed).sample(range(len(dataset)), min(count, len(dataset)))):
        if index in skip:
            continue
        path = root / dataset.table.path(index)
        try:
            problem = compare(dataset, index, path)
        except DecodeError as error:
            problem = f"source of image {index} cannot be decoded: {error}"
        if problem is not None:
            problems.append(problem)
    return problems


def _compare_raw(dataset: MemmapImageDataset, index: int, path: Path) -> str | None:
    """Decode the source again: the stored pixels exactly (a raw build of gpuload 0.1, whose
    resampler differed: within :data:`_TOLERANCE`)."""
    stored = dataset.image_and_label(index)[0].numpy()
    decoded = decode_image(path, stored.shape[1:], dataset.manifest.resize).numpy()
    if np.array_equal(stored, decoded):
        return None
    difference = np.abs(stored.astype(np.int16) - decoded)
    if dataset.manifest.format_version > 1:
        return f"image {index} differs from its source {path} (largest pixel difference {difference.max()})"
    return _beyond_tolerance(index, path, float(difference.mean()))


def _compare_jpeg(dataset: MemmapImageDataset, index: int, path: Path) -> str | None:
    """Store the source again as the build did: an unchanged source gives the recorded bytes, kept
    as they were or re-encoded (deterministic, at the recorded quality and max side).

    Only where they differ are pixels compared, within :data:`_TOLERANCE` of the new re-encode (a
    library version that re-encodes differently) or of the source's own decode. The source's decode
    alone is no fair reference for a re-encoded image: on a tiny one, 4:2:0 chroma over a few
    pixels and the 8x8 blocks lose more than the tolerance, even at quality 100.
    """
    recorded, data = int(dataset.table.checksums[index]), read_bytes(path)  # read once
    if xxhash.xxh3_64_intdigest(data) == recorded:
        return None  # stored as it was, and unchanged
    settings = dataset.manifest.jpeg
    again = store_jpeg(path, max_side=settings["max_side"], quality=settings["quality"], data=data)
    if again.checksum == recorded:
        return None
    stored = dataset.image_and_label(index)[0].numpy().astype(np.int16)
    references = [decode_image(path, stored.shape[1:], "stretch", data=data).numpy()]
    if again.shape == stored.shape[1:]:
        references.append(decode_jpeg_bytes(again.data, lambda: str(path)).transpose(2, 0, 1))
    return _beyond_tolerance(index, path, min(float(np.abs(stored - pixels).mean()) for pixels in references))


def _beyond_tolerance(index: int, path: Path, difference: float) -> str | None:
    if difference <= _TOLERANCE:
        return None
    return f"image {index} differs from its source {path} (mean pixel difference {difference:.1f})"


_TOLERANCE = 10.0  # mean absolute difference (0..255) allowed for another encoder's or resampler's rounding;
# a different or edited photo is far more (30 to 60 between unrelated photos)
