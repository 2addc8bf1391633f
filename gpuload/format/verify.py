"""Check a built dataset against what was recorded when it was built."""

from __future__ import annotations

import json
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
from ..text import count, either
from ..writing.decode import decode_image, read_bytes
from ..writing.jpeg import frame_size, store_jpeg
from .dataset import MemmapImageDataset, decode_jpeg_bytes, storage_order
from .fields import FIELDS_FOLDER
from .manifest import MANIFEST_NAME, holds_build_files
from .table import file_digest

__all__ = ["Verification", "describe_memmap", "verify_memmap"]


class Verification(list):
    """The problems that a verify found, one line each (an empty list: none), and in ``checked`` what it
    checked, in words for a person."""

    def __init__(self, problems: list[str] = (), checked: str = "") -> None:
        super().__init__(problems)
        self.checked = checked


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
    path: str | os.PathLike,
    *,
    sources: int | Literal["all"] = 0,
    seed: int = 0,
    progress: bool = True,
    source_folder: str | os.PathLike | None = None,
) -> Verification:
    """Check a dataset; returns the problems found, an empty list when it is intact (a
    :class:`Verification`, whose ``checked`` says what was checked).

    Checks that the manifest is valid and unedited (the digest of every field that gives the
    data its meaning), that the files match it (sizes, dtypes, shapes), that every label is in
    range and equals the recorded one, and that every image has the checksum recorded at build
    time: a power cut that lost pixels (zeros) or a flipped bit on disk shows up here. With
    ``sources``, also takes that many randomly chosen source images again (``"all"``: every one)
    the way the build did, and compares, a raw dataset and a jpeg one alike: a source matches when
    it gives exactly what the build stored (a raw image's pixels; a jpeg image's bytes, kept as
    they were or re-encoded). Where the decoding libraries differ from the build's (gpuload, torch,
    Pillow, simplejpeg; a raw dataset of format version 1), whose rounding may differ, a source
    also matches when its pixels are within a small tolerance of the stored ones. A source that
    does not match is a problem naming its mean and largest pixel difference. The sources are
    decoded with the build's pixel limit where its manifest records it (else with
    ``PIL.Image.MAX_IMAGE_PIXELS`` as it is), from ``source_folder`` when they moved since the
    build (the manifest's ``source`` otherwise).

    Raises:
        FileNotFoundError: ``path`` does not exist, or with ``sources``, the folder of the sources
            (``source_folder``, or the one the build recorded) does not.
        UsageError: ``path`` holds no dataset at all (a file, a folder with neither a manifest nor
            a labels file), or bad ``sources``, or ``source_folder`` without ``sources``. A dataset
            too damaged to open is a problem instead.

    Example:
        >>> import tempfile
        >>> from gpuload import build_memmap, make_sample_folder
        >>> src = make_sample_folder(Path(tempfile.mkdtemp()) / "photos", images_per_class=1, size=(12, 16))
        >>> verify_memmap(build_memmap(src, progress=False), sources="all", progress=False)
        []
    """
    if sources != "all" and (not isinstance(sources, int) or isinstance(sources, bool) or sources < 0):
        raise UsageError(f"sources must be a number of images to re-decode or 'all', got {sources!r}")
    if source_folder is not None and not sources:
        raise UsageError(
            f"source_folder ({source_folder}) says where the sources are for comparing them; pass sources too "
            "(--sources [N] with --source-folder)"
        )
    path = Path(path)
    _check_holds_a_dataset(path)
    try:
        dataset = MemmapImageDataset(path)
    except DatasetError as error:
        return Verification([str(error)], "the manifest and the files it lists, as far as they open")
    manifest = dataset.manifest
    if sources and manifest.source_format in ("webdataset", "parquet"):
        raise UsageError(
            f"{path} was built from {manifest.source_format} files, whose images verify does not read again one by "
            "one; leave out sources (the images' checksums are checked without them)"
        )
    root = None
    if sources:
        root = Path(manifest.source if source_folder is None else source_folder)
        if not root.is_dir():
            where = "the folder given for its sources" if source_folder is not None else "the folder it was built from"
            raise FileNotFoundError(
                f"{root}, {where}, is not a folder (moved or deleted?); pass the folder where the sources are now "
                "(--source-folder DIR, source_folder= in Python), or leave --sources out"
            )
    if root is not None and len(dataset):
        _check_holds_sources(dataset, root, path)
    problems = [
        f"manifest.json: the field {name!r} was changed after the build (its digest differs); rebuild the dataset"
        for name in manifest.edited_fields()
    ]
    problems += [
        f"{name} differs from what was built (its digest differs): {_holds(name)} is damaged; rebuild the dataset"
        for name, digest in manifest.table.items()
        if file_digest(dataset.path / name) != digest
    ]
    problems += _tensordict_meta_problems(dataset)
    bad, resized = [], []
    for index in tqdm(range(len(dataset)), desc="checksums", unit="img", disable=not progress, file=sys.stderr):
        stored = _stored_bytes(dataset, index)
        if xxhash.xxh3_64_intdigest(stored) != dataset.table.checksums[index]:
            bad.append(index)
        elif dataset.storage == "jpeg" and frame_size(stored) != tuple(dataset.data.shapes[index].tolist()):
            resized.append(index)
    if bad:
        shown = ", ".join(f"{index} ({dataset.table.path(index)})" for index in bad[:5])
        problems.append(
            f"{count(len(bad), 'image')} {either(len(bad), 'does not match its', 'do not match their')} build checksum: {shown}"
        )
    if resized:
        shown = ", ".join(f"{index} ({dataset.table.path(index)})" for index in resized[:5])
        problems.append(
            f"{count(len(resized), 'image')} {either(len(resized), 'differs from its', 'differ from their')} size in shapes.memmap: {shown}"
        )
    checked = [
        f"the manifest and the {count(len(manifest.files), 'file')} it lists (digests, sizes)",
        f"{count(len(dataset), 'label')}",
        f"{count(len(dataset), 'image')} against {either(len(dataset), 'its', 'their')} build checksum"
        + (" and recorded size" if dataset.storage == "jpeg" else ""),
    ]
    if sources:
        from ..writing.decode import pixel_limit

        compared = min(len(dataset), len(dataset) if sources == "all" else sources)
        exact = _decoded_alike(manifest)
        recorded = manifest.max_image_pixels  # the build's pixel limit: its sources decoded within it
        with pixel_limit(Image.MAX_IMAGE_PIXELS if recorded is None else recorded or None):
            problems += _compare_sources(dataset, compared, seed, set(bad) | set(resized), root, exact)
        checked.append(
            f"{compared:,} of {count(len(dataset), 'source')} in {root} taken again "
            + (
                "and compared exactly"
                if exact
                else f"and compared within a mean pixel difference of {_TOLERANCE:g}, as the decoding libraries differ from the build's"
            )
        )
    return Verification(problems, ", ".join(checked))


def _tensordict_meta_problems(dataset: MemmapImageDataset) -> list[str]:
    """``fields/meta.json``, through which plain tensordict opens the numbers and a raw dataset's masks
    (``TensorDict.load_memmap``), must parse and give each such field's shape and dtype: gpuload never reads it."""
    fixed = [spec for spec in dataset.manifest.field_specs if spec.fixed]
    if not fixed:
        return []
    import torch  # here, as the dataset's own imports

    name = f"{FIELDS_FOLDER}/meta.json"
    try:
        recorded = json.loads((dataset.path / name).read_text())
        for spec in fixed:
            entry = recorded[spec.name]
            stored = torch.from_numpy(np.empty(0, dtype=spec.stored_dtype)).dtype  # a bool as uint8
            expected = ([len(dataset), *spec.shape], str(stored))
            if (entry["shape"], entry["dtype"]) != expected:
                raise ValueError(
                    f"{spec.name!r} is {entry['shape']} {entry['dtype']}, expected {expected[0]} {expected[1]}"
                )
    except (OSError, ValueError, KeyError, TypeError) as error:
        reason = f"{type(error).__name__}: {error}" if not isinstance(error, ValueError) else str(error)
        return [f"{name} is damaged ({reason[:200]}): plain tensordict cannot open the fields; rebuild the dataset"]
    return []


def _decoded_alike(manifest) -> bool:
    """Whether sources are decoded now as the build decoded them: the same gpuload, torch, Pillow and
    simplejpeg (another version may round differently), and a format that stores today's pixels."""
    from ..writing.build import library_versions

    now = library_versions()
    same = all(manifest.versions.get(name) == now[name] for name in ("gpuload", "torch", "pillow", "simplejpeg"))
    return same and manifest.format_version > 1


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


def _check_holds_sources(dataset: MemmapImageDataset, root: Path, path: Path, looks: int = 20) -> None:
    """A folder where none of ``looks`` sources spread over the dataset are is the wrong folder (a class folder,
    another dataset's): one error, not one problem per image. A folder that lost some of them passes here."""
    indices = sorted({index * (len(dataset) - 1) // max(1, looks - 1) for index in range(looks)})
    if not any((root / dataset.table.path(index)).exists() for index in indices):
        raise FileNotFoundError(
            f"none of the sources of {path} are in {root} (first looked for: {root / dataset.table.path(indices[0])}; "
            f"{count(len(indices), 'source')} looked for): pass the folder the dataset was built from, the one that "
            "holds its class folders (--source-folder DIR, source_folder= in Python)"
        )


def _stored_bytes(dataset: MemmapImageDataset, index: int):
    """What the build checksummed for image ``index``: its pixels (raw) or its JPEG bytes."""
    if dataset.storage == "raw":
        return storage_order(dataset.data.images)[0][index].numpy()  # the bytes as they lie in the file
    return dataset._jpegs.read(int(dataset.data.starts[index]), int(dataset.data.lengths[index]))


def _compare_sources(
    dataset: MemmapImageDataset, number: int, seed: int, skip: set[int], root: Path, exact: bool
) -> list[str]:
    """Compare ``number`` random sources under ``root`` with what the build stored, exactly or (not
    ``exact``) within :data:`_TOLERANCE` (see :func:`_compare_raw` and :func:`_compare_jpeg`). Images
    in ``skip`` were already found damaged."""
    compare = _compare_jpeg if dataset.storage == "jpeg" else _compare_raw
    problems = []
    for index in sorted(random.Random(seed).sample(range(len(dataset)), min(number, len(dataset)))):
        if index in skip:
            continue
        path = root / dataset.table.path(index)
        try:
            differences = compare(dataset, index, path)
        except DecodeError as error:
            problems.append(f"source of image {index} cannot be decoded: {error}")
            continue
        if differences is not None and (exact or differences.mean() > _TOLERANCE):
            problems.append(
                f"image {index} differs from its source {path} (mean pixel difference {differences.mean():.1f}, "
                f"largest {differences.max()})"
            )
    return problems


def _compare_raw(dataset: MemmapImageDataset, index: int, path: Path) -> np.ndarray | None:
    """Decode the source again as the build did: ``None`` where it gives the stored pixels, else the
    absolute differences."""
    stored = dataset.image_and_label(index)[0].numpy()
    decoded = decode_image(path, stored.shape[1:], dataset.manifest.resize).numpy()
    if np.array_equal(stored, decoded):
        return None
    return np.abs(stored.astype(np.int16) - decoded)


def _compare_jpeg(dataset: MemmapImageDataset, index: int, path: Path) -> np.ndarray | None:
    """Store the source again as the build did: ``None`` where an unchanged source gives the recorded
    bytes, kept as they were or re-encoded (deterministic, at the recorded quality and max side).

    Else the absolute differences of the stored pixels from the closer of two references: the new
    re-encode (which another library version rounds differently) and the source's own decode. The
    source's decode alone is no fair reference for a re-encoded image: on a tiny one, 4:2:0 chroma
    over a few pixels and the 8x8 blocks lose more than the tolerance, even at quality 100.
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
    return min((np.abs(stored - pixels) for pixels in references), key=lambda difference: float(difference.mean()))


_TOLERANCE = 10.0  # mean absolute difference (0..255) allowed for another encoder's or resampler's rounding;
# a different or edited photo is far more (30 to 60 between unrelated photos)
