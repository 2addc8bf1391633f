"""Decode an image folder once into a memory-mapped uint8 dataset, crash-safe and in bounded memory."""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import sys
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from functools import partial
from itertools import islice
from pathlib import Path

import numpy as np
import torch
import xxhash
from PIL import Image
from tensordict import MemoryMappedTensor, TensorDict
from tqdm.auto import tqdm

from ..errors import DatasetError, DecodeError, UsageError
from ..format.fields import FIELDS_FOLDER, FieldSpec, field_path
from ..format.manifest import (
    ARRAYS,
    MANIFEST_NAME,
    TENSORDICT,
    Manifest,
    dataset_around,
    field_files,
    holds_build_files,
    index_files,
    is_build_path,
)
from ..format.table import TableWriter, file_digest
from ..machine import limit_torch_threads, resolve_workers
from ..sources.detect import Source, find_source, scan_source
from ..sources.folder import ImageFolderIndex, shown_names
from ..sources.samples import ScannedIndex, check_roles
from ..text import count, either, image_size
from . import resume as checkpoints
from .decode import Resize, check_target, decode_into, fit_mask, read_bytes, read_size
from .files import (
    OutputLock,
    byte_count,
    check_apart,
    check_not_written,
    fsync_file,
    fsync_folder,
    full_disk_says,
    no_room,
    rename_exchange,
    rename_noreplace,
    resolve,
)
from .jpeg import REENCODE_REASONS, StoredJpeg, store_jpeg
from .masks import Masks, checked_masks
from .resume import Checkpoint, recipe, scan_digest
from .writer import BlockWriter

__all__ = ["build_memmap"]

FORMATS = tuple(ARRAYS)
ORDERS = ("shuffled", "source")
SCAN = ".scan"  # the scan's table, in the build's folder until the dataset's own table is written
BLOCK_SIZE = 4 * 2**20  # a jpeg dataset's images never cross the end of a block of this size (the block cache's)


def build_memmap(
    src: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    format: str = "raw",
    size: tuple[int, int] | None = None,
    resize: Resize | None = None,
    max_side: int | None = None,
    quality: int | None = None,
    classes: Sequence[str] | None = None,
    columns: dict[str, str] | None = None,
    order: str | None = None,
    seed: int = 0,
    workers: int | None = None,
    strict: bool = False,
    overwrite: bool = False,
    sync: bool = True,
    resume: bool = True,
    progress: bool = True,
) -> Path:
    """Store the images of ``src`` (an ImageFolder, images with a metadata table, WebDataset tar shards or
    Parquet files) and what comes with them as a memory-mapped dataset at ``out``; returns ``out``.

    ``format="raw"`` decodes every image once into ``out/images.memmap`` (uint8, one size for all,
    channels-last: ``[N, H, W, 3]`` in the file, shown as ``[N, 3, H, W]`` by
    :class:`gpuload.MemmapImageDataset`): the fastest to load, as large as the pixels.
    ``format="jpeg"`` keeps each image's JPEG bytes, at its own size, in ``out/data.memmap`` with
    ``offsets.memmap`` (each image's start and end) and ``shapes.memmap`` beside: 10-20x smaller, for
    datasets larger than RAM, decoded (and cropped) when loaded. Its images lie in ``data.memmap`` in a
    seeded random order (``order="shuffled"``), none across the end of a 4 MiB block, so that the blocks
    a reader at a URL fetches together hold images of every class; the index stays in ImageFolder's
    order (``order="source"`` stores them in that order too). Both keep, in ImageFolder's order, each
    image's label, checksum and source path in flat files (``labels.memmap``, ``checksums.memmap``,
    ``paths.memmap`` and ``path_offsets.memmap``: opening maps them, nothing per image in memory), the
    ``meta.json`` of a plain tensordict ``TensorDict`` of the arrays (``tensordict.TensorDict.load_memmap(out)``
    opens it anywhere) and a ``manifest.json``, written by parallel threads in bounded memory.

    Sources (see :mod:`gpuload.sources.detect`): an ImageFolder (one folder per class, as torchvision's);
    a folder with ``metadata.csv``, ``metadata.jsonl`` or ``metadata.parquet`` at its root, or such a
    table given by its path (Hugging Face's convention: a ``file_name`` column of paths relative to the
    table's folder, every other column a field); WebDataset tar shards (a ``.tar``, a folder of them, or
    a brace pattern ``train-{000000..000099}.tar``; a plain one read by its headers, a compressed one as a
    stream); Parquet files in the layout Hugging Face ``datasets`` exports (an ``image`` column of
    ``{bytes, path}``), read in record batches. Every source goes through one scan into the build's
    folder and the same decode and write: after the scan, or, for a source of samples built in its own
    order (raw with ``size``, jpeg with ``order="source"``), as the scan goes.

    Fields (see :mod:`gpuload.format.fields`): a ``label`` column (a ``cls`` member, a Parquet
    ``label``) is the class label, by name or index; every other column a named field: numbers (int,
    float, bool, fixed-length vectors), text, multi-label (lists of class names, or indices with the role
    ``multilabel``), segmentation masks (a ``mask`` column naming PNG files, a tar's ``png`` beside its
    ``jpg``, a Parquet ``mask`` column of PNG bytes: see :mod:`gpuload.writing.masks`): a raw build fits
    each mask as its image, by nearest neighbour, into ``fields/<name>.memmap`` (uint8 ``[N, H, W]``); a
    jpeg build keeps each mask's PNG bytes. ``max_side`` refuses masks (it would scale their images).

    Crash safety: the build holds a lock beside ``out`` (a second build of the same ``out`` fails
    at once), writes into a hidden sibling folder, flushes every file and the folder to disk
    (``sync``), and only then renames it to ``out``; an existing ``out`` is swapped in one atomic
    step. After a kill or a power cut at any point, ``out`` holds either the old dataset or the
    complete new one, and the next build tidies up what was left.

    Resuming (see :mod:`gpuload.writing.resume`): every 30 seconds a build flushes what it wrote and
    notes how far it came. The next build of the same ``out`` from the same source, with the same
    options and libraries, goes on from there after a kill, a lost node or a Ctrl-C (a warning says
    so): the images written before are kept, the samples are scanned again and checked to be the same,
    and the dataset is the one an uninterrupted build writes, byte for byte. Anything else starts afresh.

    Args:
        src: an ImageFolder (one subfolder per class), a folder of images (one class), a folder with a
            metadata table or a table's path, tar shards (a file, a folder, a brace pattern), or Parquet
            files (a file or a folder).
        out: where to write; defaults to ``<src>.memmap`` beside ``src`` (a file's name without its suffix,
            a pattern's without its braces). It must not be ``src``, lie inside a source folder, or contain
            a source.
        format: ``"raw"`` (uint8 pixels) or ``"jpeg"`` (JPEG bytes).
        size: raw: ``(height, width)`` of the stored images; by default the images' common size.
        resize: raw: how images of another size are fitted: ``"crop"`` (when left out), ``"pad"`` or
            ``"stretch"`` (see :func:`gpuload.decode_image`). A jpeg build refuses it: its images keep
            their own sizes and are cropped when loaded.
        max_side: jpeg: images with a longer side are scaled down to it (and re-encoded).
        quality: jpeg: the quality of re-encoded images (see :mod:`gpuload.writing.jpeg`), 90 when left
            out. A raw build refuses it.
        classes: the class names, in label order (e.g. the training set's, for its validation set):
            a class folder (or a label's name) not in the list is an error, a listed class with no image
            is kept.
        columns: the role of a source's columns where the defaults do not say it: ``{"path": "image",
            "tags": "multilabel", "notes": "ignore"}``; roles: ``image``, ``label``, ``multilabel``,
            ``mask``, ``number``, ``text``, ``ignore`` (see :mod:`gpuload.sources.samples`).
        order: jpeg: how the images lie in ``data.memmap``: ``"shuffled"`` (when left out: a random
            order seeded by ``seed``, block-aligned) or ``"source"`` (ImageFolder's). A raw build refuses it.
        seed: the seed of the shuffled order (the same sources and seed give the same dataset).
        workers: decoding threads; defaults to the number of cores.
        strict: raise on the first file that cannot be decoded (or whose mask is missing, unreadable or of
            another size) instead of skipping it.
        overwrite: replace an existing ``out``, which must be a gpuload dataset and nothing else.
        sync: flush the data to disk before the dataset is renamed into place. Without it a
            build is faster on slow disks, but a power cut soon after it can leave images of
            zeros that ``gpuload verify`` reports, and a stopped build cannot be resumed.
        resume: go on from where a stopped build of ``out`` (the same source and options) came; false:
            start afresh, removing what it left.
        progress: show a progress bar.

    Raises:
        FileNotFoundError: ``src`` does not exist or holds no image (a pattern: a shard is missing).
        SourceError: a metadata table, shard or Parquet file whose content cannot be taken as it is (a
            row naming a file twice, a column of mixed types, an unknown class name, a truncated shard):
            named, with what to do.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        UsageError: bad arguments (``size`` or ``resize`` with ``format="jpeg"`` too), ``out``
            overlapping ``src``, ``overwrite`` of a folder that is not only a gpuload dataset, or
            (raw) images of several sizes and no ``size``.
        BusyError: another build of ``out`` is running.
        DecodeError: with ``strict``, the first file that cannot be decoded; else, no file could be.
        OSError: not enough disk space, or a write failed.

    Example:
        >>> import tempfile
        >>> from gpuload.sample import make_sample_folder
        >>> tmp = Path(tempfile.mkdtemp())
        >>> src = make_sample_folder(tmp / "photos", images_per_class=2, size=(24, 32))
        >>> out = build_memmap(src, size=(24, 32), progress=False)
        >>> out.name, sorted(p.name for p in out.iterdir())  # doctest: +NORMALIZE_WHITESPACE
        ('photos.memmap', ['checksums.memmap', 'images.memmap', 'labels.memmap', 'manifest.json', 'meta.json',
                           'path_offsets.memmap', 'paths.memmap'])
    """
    resolve(src)  # an empty path is refused
    columns = check_roles(columns)
    source = find_source(src, columns)
    out = resolve(out) if out is not None else source.default_out()
    if format not in FORMATS:
        raise UsageError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    resize = _raw_resize(format, resize)
    size = check_target(size, resize)
    if format == "jpeg" and size is not None:
        raise UsageError("size applies to format='raw'; a jpeg dataset keeps each image's size (see max_side)")
    if max_side is not None and format != "jpeg":
        raise UsageError(
            f"max_side applies only to format='jpeg' (--format jpeg), got max_side={max_side!r} with format='raw'; "
            "a raw build stores every image at one size: give that size (--size WIDTHxHEIGHT) and leave max_side out"
        )
    if max_side is not None and not _positive_int(max_side):
        raise UsageError(f"max_side must be a positive integer, got {max_side!r}")
    if quality is not None and format != "jpeg":
        raise UsageError(
            f"quality applies only to format='jpeg' (--format jpeg), got quality={quality!r} with format='raw'; "
            "a raw build stores decoded pixels: leave quality out"
        )
    quality = 90 if quality is None else quality
    if not _positive_int(quality) or quality > 100:
        raise UsageError(f"quality must be an integer from 1 to 100, got {quality!r}")
    if order is not None and format != "jpeg":
        raise UsageError(
            f"order applies only to format='jpeg' (--format jpeg), got order={order!r} with format='raw'; a raw "
            "dataset stores its images in ImageFolder's order: leave order out"
        )
    order = "shuffled" if order is None else order
    if order not in ORDERS:
        raise UsageError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise UsageError(f"seed must be an integer in [0, 2**63), got {seed!r}")
    workers = resolve_workers(workers)
    _check_apart(source, out)
    inside = dataset_around(out.parent)
    if inside is not None:  # checked before the lock, whose file would land in that dataset
        raise UsageError(f"out {out} lies inside the gpuload dataset {inside}; choose an out outside any dataset")
    if source.folder is not None:
        check_not_written(source.folder)  # a compress still filling src
    asked = recipe(
        source=source.path, source_format=source.format, format=format, size=size, resize=resize,
        max_side=max_side, quality=quality, classes=classes, columns=columns, order=order,
        seed=seed if format == "jpeg" and order == "shuffled" else None,
        strict=strict, max_image_pixels=Image.MAX_IMAGE_PIXELS or 0, versions=library_versions(),
    )  # fmt: skip
    with OutputLock(out):
        resumable = _tidy(out, asked if resume else None)
        if os.path.lexists(out):
            if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
                raise FileExistsError(  # a folder made ahead (a mount point?): neither a dataset nor ours to replace
                    f"{out} already exists as an empty folder, and a build writes its dataset as a new folder there: "
                    f"remove the empty folder (rmdir {out}), or choose an out that does not exist yet"
                )
            if not overwrite:
                raise FileExistsError(f"{out} already exists; pass overwrite=True (--overwrite) or choose another out")
            _check_replaceable(out)
        tmp, checkpoint = resumable or (out.with_name(f".{out.name}.tmp-{secrets.token_hex(4)}"), None)
        if checkpoint is None:
            with full_disk_says(
                lambda: no_room(
                    out.parent, f"to build {out}: no room for a new folder beside it", "there or write to another disk"
                )
            ):
                tmp.mkdir()
        saves = _Saves(tmp, asked, checkpoint, write=sync)
        try:
            with ThreadPoolExecutor(workers, "gpuload-decode", initializer=limit_torch_threads) as pool:
                try:
                    _build(tmp, source, out, pool, format, size, resize, max_side, quality, classes, columns,
                           order, seed, workers, strict, sync, progress, saves)  # fmt: skip
                except BaseException:
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
            _move_into_place(tmp, out, sync)
        except BaseException as error:
            if isinstance(error, (KeyboardInterrupt, SystemExit)) and (tmp / checkpoints.CHECKPOINT).is_file():
                warnings.warn(
                    f"the build of {out} was interrupted; what it wrote is kept in {tmp}: build it again (the same "
                    "source and options) to go on from there, or remove that folder",
                    stacklevel=2,
                )
            else:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


def _check_apart(source: Source, out: Path) -> None:
    """Refuse an ``out`` that overlaps the source: a folder's (is it, lies inside it, contains it), or any
    of its files (is one, or contains one).

    Raises:
        UsageError: they overlap.
    """
    if source.folder is not None:
        check_apart(source.folder, out, source_name="src", output_name="out")
        return
    for file in source.files:
        if out == file or file.is_relative_to(out):
            raise UsageError(
                f"out ({out}) {'is' if out == file else 'contains'} the source file {file}: the dataset would "
                "replace or hold your files; choose another out"
            )


def _build(
    tmp: Path,
    source: Source,
    out: Path,
    pool: ThreadPoolExecutor,
    format: str,
    size: tuple[int, int] | None,
    resize: str,
    max_side: int | None,
    quality: int,
    classes: Sequence[str] | None,
    columns: dict[str, str],
    order: str,
    seed: int,
    workers: int,
    strict: bool,
    sync: bool,
    progress: bool,
    saves: _Saves,
) -> None:
    """Write the dataset into ``tmp``: scan the source into a table there, write the images (``out`` names
    them in messages), then the index, the table, the fields and the manifest. A source of samples
    (not an ImageFolder) built in its own order (raw at a given size, or jpeg in the source's order) has
    its images written as the scan stages them (:func:`_build_streamed`). ``saves``: the checkpoints
    (none without ``sync``), and the one this build goes on from."""
    if saves.resumed is not None:
        shutil.rmtree(tmp / SCAN, ignore_errors=True)  # scanned again
    streams = source.format != "image_folder" and (size is not None if format == "raw" else order == "source")
    if streams:
        streamed = partial(_build_streamed, tmp, source, out, pool, format, size, resize, max_side, quality, classes,
                           columns, workers, strict, sync, progress, saves)  # fmt: skip
        try:
            streamed()
        except _CannotResume as why:  # found as the scan went: everything is scanned and written again
            saves.start_afresh(out, str(why))
            streamed()
        return
    with _scan_disk_full(out):
        index = scan_source(source, classes=classes, columns=columns, into=tmp / SCAN, progress=progress)
    built = partial(_build_from, tmp, index, out, pool, format, size, resize, max_side, quality, order, seed,
                    workers, strict, sync, progress, saves)  # fmt: skip
    try:
        try:
            built()
        except _CannotResume as why:  # found in the records: the images are written again, the scan kept
            saves.start_afresh(out, str(why), keep=SCAN)
            built()
    finally:
        index.close()


@contextmanager
def _scan_disk_full(out: Path) -> Iterator[None]:
    """A full disk met by the scan's own files (its table of samples, among the images of a streamed
    build) names ``out``; one the build's writers met and named already (ENOSPC, their message) passes."""
    try:
        yield
    except OSError as error:
        if error.errno != errno.ENOSPC or error.strerror != os.strerror(errno.ENOSPC):
            raise
        message = no_room(
            out.parent,
            f"to build {out}: its index of the source's samples did not fit",
            "there or write to another disk",
        )
        raise OSError(errno.ENOSPC, message) from None


def _build_from(
    tmp: Path,
    index: ImageFolderIndex | ScannedIndex,
    out: Path,
    pool: ThreadPoolExecutor,
    format: str,
    size: tuple[int, int] | None,
    resize: str,
    max_side: int | None,
    quality: int,
    order: str,
    seed: int,
    workers: int,
    strict: bool,
    sync: bool,
    progress: bool,
    saves: _Saves,
) -> None:
    unreadable: dict[int, str] = {}
    masks = [staged for staged in index.fields if staged.kind == "mask"]
    _check_max_side(index.source_path, [staged.name for staged in masks], max_side)
    saves.scan = scan_digest(tmp / SCAN)
    if saves.resumed is not None:
        if saves.resumed.scan != saves.scan:
            saves.start_afresh(out, "its source's samples are not the ones it scanned", keep=SCAN)
        elif why := _disagrees(tmp, saves.resumed, format, size, [staged.name for staged in masks], index):
            saves.start_afresh(out, why, keep=SCAN)
    resumed = saves.resumed
    if format == "raw" and size is None:
        if resumed is not None and resumed.size is not None:  # decided before the stop
            size, unreadable = (resumed.size[0], resumed.size[1]), resumed.unreadable
        else:
            size, unreadable = _common_size(index, pool, strict)
        saves.size, saves.unreadable = [*size], unreadable
    _fit_masks(index, format, size)
    expected = index.image_bytes() if format == "jpeg" and max_side is None else 0  # scaled down: unknown
    if resumed is None:  # a resumed build has part of it on disk: its files reserve the rest as they open
        _check_free_space(out.parent, index, size, max_side, expected, len(masks))
    skipped = list(index.skipped)
    skipped += [{"path": index.samples[position][0], "reason": reason} for position, reason in unreadable.items()]
    images = len(index.samples)
    if format == "raw":
        mask_names = [staged.name for staged in masks]
        kept_at_most = images - len(unreadable)
        store: _Store = _RawStore(tmp, out, pool, size, resize, workers, sync, kept_at_most, mask_names, resumed)
        store.layout(images, None, resumed is not None)
    else:
        store = _JpegStore(tmp, out, pool, max_side, quality, workers, sync, expected, resumed)
        store.layout(images, None if order == "source" else seed, resumed is not None)
    try:
        if resumed is not None:
            store.check_resumed((position for position in store.order(images) if position not in unreadable), resumed)
            saves.announce(out)
        todo = (position for position in store.order(images) if position not in unreadable)
        kept = _write(store, index, todo, images - len(unreadable), skipped, strict, progress, saves)
    except BaseException:
        store.abort()
        raise
    _complete(tmp, index, out, store, kept, skipped, sync)


def _build_streamed(
    tmp: Path,
    source: Source,
    out: Path,
    pool: ThreadPoolExecutor,
    format: str,
    size: tuple[int, int] | None,
    resize: str,
    max_side: int | None,
    quality: int,
    classes: Sequence[str] | None,
    columns: dict[str, str],
    workers: int,
    strict: bool,
    sync: bool,
    progress: bool,
    saves: _Saves,
) -> None:
    """:func:`_build` for a source of samples in its own order: each image's job starts as the scan stages
    it, so the decoders work while the scan reads on (a source's scan no longer comes before its first
    image), and its result is appended as the jobs complete, in the scan's order. The store is made at
    the first sample, whose fields are every sample's; how many come is known at the end, so the files
    grow as they come (reserved a step ahead: see :class:`gpuload.writing.writer.BlockWriter`).

    A resumed build scans every sample again and starts the jobs after those done before the stop,
    whose names and image lengths must be the ones scanned then (a running digest; else
    :class:`_SourceChanged`)."""
    skipped: list[dict] = []
    resumed = saves.resumed
    done = resumed.done if resumed is not None else 0
    digest = xxhash.xxh3_128()
    with tqdm(unit="img", desc="build-memmap", initial=done, disable=not progress, file=sys.stderr) as bar:
        jobs: _Jobs | None = None

        def sink(position: int, name: str, path: str, data: bytes | None, masks: Masks) -> None:
            nonlocal jobs
            if jobs is None:
                mask_names = [mask[0] for mask in masks]
                _check_max_side(source.path, mask_names, max_side)
                if resumed is not None and (why := _disagrees(tmp, resumed, format, size, mask_names, None)):
                    raise _CannotResume(why)
                if format == "raw":
                    store: _Store = _RawStore(tmp, out, pool, size, resize, workers, sync, None, mask_names, resumed)
                else:
                    store = _JpegStore(tmp, out, pool, max_side, quality, workers, sync, None, resumed)
                store.layout(None, None, resumed is not None)
                if resumed is not None:  # noted after the checkpoint: done again, or past the end of a source cut short
                    store.records[done:] = np.zeros((), store.record)
                    try:
                        store.check_resumed(range(done), resumed)
                    except BaseException:
                        store.abort()
                        raise
                jobs = _Jobs(store, skipped, strict, bar, saves)
            digest.update(f"{name}\0{-1 if data is None else len(data)}\n".encode("utf-8", "surrogateescape"))
            for field, mask, why in masks if format == "raw" else ():  # written with the images: the same
                digest.update(f"{field}\0{xxhash.xxh3_64_hexdigest(mask)}\0{why or ''}\n".encode())
            scanned = digest.hexdigest()
            if position < done:  # written before the stop
                if position == done - 1 and scanned != resumed.scan:
                    raise _SourceChanged(f"its source's first {count(done, 'sample')} are not the ones it scanned")
                if position == done - 1:
                    saves.announce(out)
                return
            jobs.add(position, path, data, masks, name, scanned)

        index = None
        try:
            with _scan_disk_full(out):
                index = scan_source(source, classes=classes, columns=columns, into=tmp / SCAN, sink=sink)
            if len(index.samples) < done:
                raise _SourceChanged(f"its source holds {count(len(index.samples), 'sample')}, fewer than it wrote")
            kept = jobs.finish(index.source_path)
        except BaseException:
            if jobs is not None:
                jobs.store.abort()
            if index is not None:
                index.close()
            raise
        try:
            skipped[:0] = index.skipped
            _fit_masks(index, format, size)
            _complete(tmp, index, out, jobs.store, kept, skipped, sync)
        finally:
            index.close()


def _check_max_side(source: Path, masks: list[str], max_side: int | None) -> None:
    """Refuse ``max_side`` for a source with ``masks`` (their names), which a jpeg build keeps as they came.

    Raises:
        UsageError: both.
    """
    if masks and max_side is not None:
        raise UsageError(
            f"max_side scales images down, and {source} has masks ({', '.join(masks)}), which a jpeg build keeps "
            "as they came: leave max_side out, or build raw (--size)"
        )


def _fit_masks(index: ImageFolderIndex | ScannedIndex, format: str, size: tuple[int, int] | None) -> None:
    """A raw build's mask fields are stored fitted as their images: of one ``size``."""
    for staged in index.fields if format == "raw" else ():
        if staged.kind == "mask":
            staged.spec = replace(staged.spec, shape=tuple(size))


def _complete(
    tmp: Path,
    index: ImageFolderIndex | ScannedIndex,
    out: Path,
    store: _Store,
    kept: int,
    skipped: list[dict],
    sync: bool,
) -> None:
    """Warn of classes the skipped images emptied, then :func:`_finish` the dataset (a kill from now on
    leaves nothing to resume: the checkpoint is removed first)."""
    Checkpoint.remove(tmp, sync)
    empty = _empty_classes(index, store)
    emptied = sorted(set(empty) - set(index.empty_classes))
    if emptied:
        warnings.warn(
            f"{count(len(emptied), 'class', 'classes')} {either(len(emptied), 'has', 'have')} no image left in {out}, "
            f"all of {either(len(emptied), 'its', 'their')} files skipped: "
            f"{shown_names(emptied)}; their labels are kept",
            stacklevel=4,
        )
    with full_disk_says(
        lambda: no_room(
            out.parent,
            f"to finish {out}: its images are written, and its labels, metadata and manifest did not fit",
            "there or write to another disk",
        )
    ):
        _finish(tmp, index, store, kept, empty, skipped, sync)


def _raw_resize(format: str, resize: Resize | None) -> Resize:
    """The resize mode of a raw build, ``"crop"`` when left out; a jpeg build refuses any."""
    if format == "jpeg" and resize is not None:
        raise UsageError(
            f"resize applies only to format='raw' (--format raw), got resize={resize!r} with format='jpeg'; "
            "a jpeg dataset keeps each image at its own size: leave resize out, or crop when loading "
            "(gpuload.RandomResizedCropDecode, CenterCropDecode)"
        )
    return "crop" if resize is None else resize


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _tidy(out: Path, asked: dict | None) -> tuple[Path, Checkpoint] | None:
    """Finish what a killed build of ``out`` left (we hold the lock, so no build is running):
    put back a dataset that an interrupted overwrite had moved aside, then remove temporary folders,
    but the newest with a checkpoint of the build ``asked`` (a :func:`recipe`; ``None``: none is
    resumed), returned with its checkpoint."""
    ours = re.compile(re.escape(f".{out.name}.") + r"(tmp|old)-([0-9a-f]{8}|[0-9]+)")  # tokens; 0.1 used PIDs
    stale = sorted(path for path in out.parent.iterdir() if ours.fullmatch(path.name))
    resumable = None
    if asked is not None:
        stopped = [folder for folder in stale if ".tmp-" in folder.name and _is_build_folder(folder)]
        for folder in sorted(stopped, key=lambda folder: folder.stat().st_mtime, reverse=True):  # the newest first
            checkpoint = Checkpoint.read(folder)
            if _goes_on(out, folder, checkpoint, asked):
                resumable = folder, checkpoint
                stale.remove(folder)
                break
    if not os.path.lexists(out):
        for old in stale:
            if ".old-" in old.name and _is_build_folder(old) and (old / MANIFEST_NAME).is_file():
                os.rename(old, out)
                fsync_folder(out.parent)
                warnings.warn(
                    f"restored {out} from {old.name}, left by an overwrite that was interrupted", stacklevel=3
                )
                stale.remove(old)
                break
    for folder in stale:
        if _is_build_folder(folder):
            shutil.rmtree(folder)
        else:
            warnings.warn(f"left {folder} alone: it is named like a gpuload build but holds other files", stacklevel=3)
    return resumable


def _goes_on(out: Path, folder: Path, checkpoint: Checkpoint | None, asked: dict) -> bool:
    """Whether the build ``asked`` goes on from the stopped build in ``folder`` (its ``checkpoint``:
    ``None`` where it has none, or one that cannot be read); where it had one, a warning says why not."""
    if checkpoint is None:
        why = "its checkpoint cannot be read" if (folder / checkpoints.CHECKPOINT).exists() else None
    elif checkpoint.recipe != asked:
        changed = sorted(
            "versions (of gpuload and its decoders)" if key == "versions" else key
            for key in {*asked, *checkpoint.recipe}
            if asked.get(key) != checkpoint.recipe.get(key)
        )
        why = f"asked differently: {', '.join(changed)}"
    elif not checkpoint.holds(folder):
        why = "its files are shorter than its checkpoint says (cut since it stopped)"
    else:
        return True
    if why is not None:  # killed before its first checkpoint: nothing to say
        _warn_afresh(out, folder, checkpoint.done if checkpoint is not None else None, why)
    return False


def _warn_afresh(out: Path, folder: Path, done: int | None, why: str) -> None:
    """Say that the stopped build in ``folder`` (``done`` images, where known) is not taken up, and why."""
    after = f" after {count(done, 'image')}" if done is not None else ""
    warnings.warn(f"the build of {out} stopped{after} ({folder.name}) starts afresh: {why}", stacklevel=5)


def _is_build_folder(folder: Path) -> bool:
    """Whether ``folder`` is a real folder holding nothing but names a gpuload build writes."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    return all(  # a link (to someone's file) is not a build's: never written through, nor taken up
        is_build_path(path.relative_to(folder).as_posix()) and not path.is_symlink() for path in folder.rglob("*")
    )


def _check_replaceable(out: Path) -> None:
    """Refuse to overwrite anything but a folder holding a gpuload dataset and nothing else."""
    if out.is_dir() and not (out / MANIFEST_NAME).is_file() and holds_build_files(out):
        raise UsageError(
            f"overwrite only replaces a whole gpuload dataset, and {out} has no {MANIFEST_NAME} (deleted, or its "
            "build never finished): move it away yourself or choose another out"
        )
    try:
        manifest = Manifest.read(out)
    except DatasetError as error:
        raise UsageError(
            f"overwrite only replaces a gpuload dataset, and {out} is not one ({error}); "
            f"move it away yourself or choose another out"
        ) from None
    owned = manifest.owned_paths()
    allowed = owned | {parent.as_posix() for name in owned for parent in Path(name).parents if parent != Path(".")}
    foreign = sorted(path.relative_to(out).as_posix() for path in out.rglob("*")) if out.is_dir() else []
    foreign = [name for name in foreign if name not in allowed]
    if foreign:
        raise UsageError(
            f"overwrite only replaces a folder that holds nothing but a gpuload dataset, and {out} also holds "
            f"{foreign[0]!r} ({len(foreign)} entries gpuload did not write); move them away or choose another out"
        )


def _common_size(
    index: ImageFolderIndex | ScannedIndex, pool: ThreadPoolExecutor, strict: bool
) -> tuple[tuple[int, int], dict[int, str]]:
    """The images' common ``(height, width)``, and the reason per sample position whose header is unreadable."""
    sizes: Counter[tuple[int, int]] = Counter()
    unreadable: dict[int, str] = {}
    pending: deque[tuple[int, Future]] = deque()
    positions = iter(range(len(index.samples)))

    def submit_next() -> None:
        position = next(positions, None)
        if position is not None:
            pending.append((position, pool.submit(_read_size_or_error, *index.image(position))))

    for _ in range(4 * pool._max_workers):  # headers in flight: memory bounded whatever the count
        submit_next()
    while pending:
        position, future = pending.popleft()
        size = future.result()
        if isinstance(size, DecodeError):
            if strict:
                raise size
            unreadable[position] = size.reason
        else:
            sizes[size] += 1
        submit_next()
    if not sizes:
        raise DecodeError(index.root, f"no image could be read; first problem: {next(iter(unreadable.values()))}")
    if len(sizes) > 1:
        common = ", ".join(f"{image_size(h, w)} ({count(n, 'image')})" for (h, w), n in sizes.most_common(5))
        raise UsageError(
            f"the images of {index.root} have {len(sizes)} different sizes, width x height (most common: {common}); "
            f"pass size=(height, width) (--size WIDTHxHEIGHT) and choose a resize mode (crop, pad or stretch)"
        )
    return next(iter(sizes)), unreadable


def _read_size_or_error(path: str, data: bytes | None) -> tuple[int, int] | DecodeError:
    try:
        return read_size(path, data)
    except DecodeError as error:
        return error


def _check_free_space(
    folder: Path,
    index: ImageFolderIndex | ScannedIndex,
    size: tuple[int, int] | None,
    max_side: int | None,
    jpeg_bytes: int,
    masks: int = 0,
) -> None:
    """Refuse a build that cannot fit: the pixels (raw, with the class ids of its ``masks`` fields), or
    ``jpeg_bytes``, the source files' bytes as estimated from a sample (jpeg: the re-encoded images are
    about as large; with ``max_side`` they are smaller by an unknown amount, and nothing is checked); and
    a few dozen bytes of index per image."""
    count = len(index.samples)
    if size is not None:
        needed = count * ((3 + masks) * size[0] * size[1] + 48)
        what = f"{count:,} images of {image_size(*size)}x3 bytes"
        what += f", each with {masks} mask{'s' if masks > 1 else ''} of {image_size(*size)} bytes" if masks else ""
        advice = "choose a smaller size (--size) or another out"
    elif max_side is None:
        needed, what = jpeg_bytes + 48 * count, f"the JPEG bytes of {count} images (estimated)"
        advice = "build with --max-side, or choose another out"
    else:
        return
    free = shutil.disk_usage(folder if folder.exists() else folder.parent).free
    if needed > free:
        raise OSError(
            errno.ENOSPC,
            f"the dataset needs {byte_count(needed)} ({what}) but {folder} has {byte_count(free)} free; {advice}",
        )


class _Store:
    """How one storage writes the images of a build: a job per image in the thread pool, then what the
    job made is appended to the dataset's files, in the order :meth:`order` gives."""

    arrays: tuple[str, ...]

    records: np.memmap

    def layout(self, count: int | None, seed: int | None, resumed: bool = False) -> None:
        """Note what is written of each of ``count`` sample positions (``None``: not known yet; the file
        grows) in a file of the build's own (not memory), and write them in a random order seeded by
        ``seed`` (``None``: ImageFolder's). ``resumed``: the file is a stopped build's, kept."""
        self.seed = seed
        if resumed:
            shape = None if count is None else (max(1, count),)  # as long as it had grown
            self.records = np.memmap(self.tmp / ".records", dtype=self.record, mode="r+", shape=shape)
        else:
            self.records = np.memmap(self.tmp / ".records", dtype=self.record, mode="w+", shape=(max(1, count or 0),))
        if seed is not None:
            self.shuffled = np.memmap(self.tmp / ".order", dtype="<i8", mode="w+", shape=(count,))
            self.shuffled[:] = np.arange(count, dtype=np.int64)
            # in place, in the mapped file; as a plain ndarray (numpy shuffles a subclass element by element)
            np.random.default_rng(seed).shuffle(self.shuffled.view(np.ndarray))

    def order(self, count: int) -> Iterable[int]:
        """The sample positions in the order the images are written."""
        if self.seed is None:
            return range(count)
        return (
            position for first in range(0, count, _CHUNK) for position in self.shuffled[first : first + _CHUNK].tolist()
        )

    def note(self, position: int, record: tuple) -> None:
        """Record what was written of the sample at ``position`` (the file doubled when it is beyond it)."""
        if position >= len(self.records):
            size = max(position + 1, 2 * len(self.records))
            self.records.flush()
            self.records = None
            os.truncate(self.tmp / ".records", size * self.record.itemsize)  # the new rows read as zeros
            self.records = np.memmap(self.tmp / ".records", dtype=self.record, mode="r+", shape=(size,))
        self.records[position] = record

    def check_resumed(self, order: Iterable[int], resumed: Checkpoint) -> None:
        """Check that the records of the images a stopped build had done (the first of the positions in
        ``order``) count the images its checkpoint ``resumed`` counts, and (a jpeg build) end where its
        data file does.

        Raises:
            _CannotResume: they do not.
        """
        kept = end = flags = 0
        done = islice(order, resumed.done)
        while positions := list(islice(done, _CHUNK)):
            positions = np.asarray(positions, dtype=np.int64)
            records = self.records[positions[positions < len(self.records)]]  # beyond: skipped (the file grows)
            kept += int(np.count_nonzero(records["kept"]))
            flags |= int(np.bitwise_or.reduce(records["kept"], initial=0))  # 0 or 1 each: any other is damage
            if "end" in self.record.names:
                end = max(end, int(records["end"][records["kept"] != 0].max(initial=0)))
        if (
            kept != resumed.kept
            or flags > 1
            or ("end" in self.record.names and end != resumed.written.get("data.memmap"))
        ):
            raise _CannotResume("its checkpoint does not match the records of the images it wrote")

    def forget(self, position: int) -> None:
        """Record that nothing is written of the sample at ``position`` (a stopped build may have written it)."""
        if position < len(self.records):  # beyond, the file grows with zeros
            self.records[position] = np.zeros((), self.record)

    def sync(self) -> None:
        """Flush what was written, and the records of it, to disk."""
        for writer in self.writers:
            writer.sync()
        self.records.flush()

    def kept(self, first: int, last: int) -> np.ndarray:
        """The positions in ``[first, last)`` whose images were written."""
        return first + np.flatnonzero(self.records["kept"][first:last])

    def checksums(self, positions: np.ndarray) -> np.ndarray:
        """The checksums (uint64) of the samples at ``positions``, once appended."""
        return self.records["checksum"][positions]

    def discard(self) -> None:
        """Remove what the store noted of each sample while writing (once the table is written)."""
        self.records = self.shuffled = None
        for name in (".records", ".order"):
            (self.tmp / name).unlink(missing_ok=True)

    def abort(self) -> None:
        """Close the files of a build that failed (its folder is removed): their descriptors, and the disk
        space reserved for them, are not held until the process ends."""
        for writer in self.writers:
            writer.close()
        self.records = self.shuffled = None

    def submit(self, path: str, data: bytes | None, masks: Masks) -> Future:
        """Start the job of one image: the file ``path``, or its bytes ``data`` (``path`` then names it), with
        its ``masks``."""
        raise NotImplementedError

    def append(self, position: int, result) -> int:
        """Write what the job for the sample at ``position`` made; returns its checksum."""
        raise NotImplementedError

    def release(self, future: Future) -> None:
        """The job's result was written or skipped."""

    def close(self, kept: Sequence[int]) -> dict[str, torch.Tensor]:
        """Finish the files (``kept``: the positions of the samples kept, in ImageFolder's order); returns
        the arrays (memory-mapped), for the tensordict metadata."""
        raise NotImplementedError

    def manifest_fields(self) -> dict:
        raise NotImplementedError


class _RawStore(_Store):
    """uint8 pixels at one size, channels-last (``[N, H, W, 3]``), each decoded into one of a fixed
    window of reused buffers, then appended to the file, in ImageFolder's order; each mask field's
    class ids fitted alike (``[N, H, W]``) beside them, into ``fields/<name>.memmap``."""

    arrays = TENSORDICT["raw"]
    record = np.dtype([("checksum", "<u8"), ("kept", "u1")])

    def __init__(
        self,
        tmp: Path,
        out: Path,
        pool: ThreadPoolExecutor,
        size: tuple[int, int],
        resize: str,
        workers: int,
        sync: bool,
        count: int | None,
        masks: list[str],
        resumed: Checkpoint | None = None,
    ) -> None:
        self.tmp, self.pool, self.size, self.resize = tmp, pool, size, resize
        files = ["images.memmap", *(field_path(name) for name in masks)]
        if resumed is not None and list(resumed.written) != files:  # a source scanned as it is written
            raise _SourceChanged("its samples' masks are not the ones it wrote")
        written = resumed.written if resumed is not None else {}
        self.window = 2 * workers + 2  # decoded images in flight: bounds memory
        # an image's buffer (channels-last) and one per mask field
        self.free = [
            [np.empty((*size, 3), np.uint8), *(np.empty(size, np.uint8) for _ in masks)] for _ in range(self.window)
        ]
        self.busy: dict[Future, list[np.ndarray]] = {}
        self.writers: list[BlockWriter] = []
        try:  # a writer that fails (a full disk) closes those made before it
            self.writers.append(
                BlockWriter(
                    tmp / "images.memmap",
                    None if count is None else count * 3 * size[0] * size[1],
                    write_behind=sync,
                    name=out / "images.memmap",
                    resume_at=written.get("images.memmap"),
                )
            )
            if masks:
                (tmp / FIELDS_FOLDER).mkdir(exist_ok=resumed is not None)
            for name in masks:
                self.writers.append(
                    BlockWriter(
                        tmp / field_path(name),
                        None if count is None else count * size[0] * size[1],
                        write_behind=sync,
                        name=out / field_path(name),
                        resume_at=written.get(field_path(name)),
                    )
                )
        except BaseException:
            for writer in self.writers:
                writer.close()
            raise

    def submit(self, path: str, data: bytes | None, masks: Masks) -> Future:
        buffers = self.free.pop()
        future = self.pool.submit(_decode_raw, path, data, self.resize, buffers, masks)
        self.busy[future] = buffers
        return future

    def append(self, position: int, checksum: int) -> int:
        self.note(position, (checksum, 1))
        return checksum

    def release(self, future: Future) -> None:
        buffers = self.busy.pop(future)
        if future.exception() is None:
            for writer, buffer in zip(self.writers, buffers):
                writer.write(buffer)
        self.free.append(buffers)

    def close(self, kept: int) -> dict[str, torch.Tensor]:
        for writer in self.writers:
            writer.close()
        return {
            "images": MemoryMappedTensor.from_filename(self.tmp / "images.memmap", torch.uint8, (kept, *self.size, 3))
        }

    def manifest_fields(self) -> dict:
        return {"image_shape": [3, *self.size], "resize": self.resize, "layout": "channels_last", "order": {}}


def _decode_raw(path: str, data: bytes | None, resize: str, buffers: list[np.ndarray], masks: Masks) -> int:
    image, *fitted = buffers
    if masks and data is None:  # read once: its pixels, then its size beside its masks' (not a second open)
        data = read_bytes(path)
    decode_into(path, image, resize, data)
    for ids, out in zip(checked_masks(path, read_size(path, data), masks) if masks else (), fitted):
        fit_mask(ids, out, resize)
    return xxhash.xxh3_64_intdigest(image)


def _store_jpeg(path: str, data: bytes | None, masks: Masks, max_side: int | None, quality: int) -> StoredJpeg:
    stored = store_jpeg(path, max_side=max_side, quality=quality, data=data)
    checked_masks(path, stored.shape, masks)  # kept as they came (max_side is refused with masks)
    return stored


class _JpegStore(_Store):
    """Each image's JPEG bytes, appended to one data file in the order :meth:`layout` chose (shuffled:
    none across the end of a block), with what was written recorded by sample position (a file of the
    build's own, not memory), from which :meth:`close` writes the index in ImageFolder's order."""

    arrays = TENSORDICT["jpeg"]
    record = np.dtype([("start", "<i8"), ("end", "<i8"), ("shape", "<i4", 2), ("checksum", "<u8"), ("kept", "u1")])

    def __init__(
        self,
        tmp: Path,
        out: Path,
        pool: ThreadPoolExecutor,
        max_side: int | None,
        quality: int,
        workers: int,
        sync: bool,
        expected_bytes: int | None,
        resumed: Checkpoint | None = None,
    ) -> None:
        self.tmp, self.pool, self.max_side, self.quality = tmp, pool, max_side, quality
        self.window = 4 * workers + 4  # small results: more in flight hides the slow re-encodes
        self.writer = BlockWriter(
            tmp / "data.memmap",
            expected_bytes,
            write_behind=sync,
            name=out / "data.memmap",
            resume_at=resumed.written["data.memmap"] if resumed is not None else None,
        )
        self.writers = [self.writer]
        self.reencoded = dict.fromkeys(REENCODE_REASONS, 0) | (resumed.reencoded if resumed is not None else {})

    def submit(self, path: str, data: bytes | None, masks: Masks) -> Future:
        return self.pool.submit(_store_jpeg, path, data, masks, self.max_side, self.quality)

    def append(self, position: int, stored: StoredJpeg) -> int:
        start, length = self.writer.written, len(stored.data)
        if self.seed is not None and length <= BLOCK_SIZE and start // BLOCK_SIZE != (start + length - 1) // BLOCK_SIZE:
            self.writer.skip(BLOCK_SIZE - start % BLOCK_SIZE)  # to the next block
            start = self.writer.written
        self.writer.write(np.frombuffer(stored.data, np.uint8))
        self.note(position, (start, self.writer.written, stored.shape, stored.checksum, 1))
        if stored.reencoded is not None:
            self.reencoded[stored.reencoded] += 1
        return stored.checksum

    def close(self, kept: int) -> dict[str, torch.Tensor]:
        self.writer.close()
        with open(self.tmp / "offsets.memmap", "xb") as offsets, open(self.tmp / "shapes.memmap", "xb") as shapes:
            for first in range(0, len(self.records), _CHUNK):
                records = self.records[first : first + _CHUNK]
                records = records[records["kept"] == 1]
                offsets.write(np.stack([records["start"], records["end"]], axis=1).astype("<i8").tobytes())
                shapes.write(records["shape"].astype("<i4").tobytes())
        count = kept
        return {
            "data": MemoryMappedTensor.from_filename(self.tmp / "data.memmap", torch.uint8, (self.writer.written,)),
            "offsets": MemoryMappedTensor.from_filename(self.tmp / "offsets.memmap", torch.int64, (count, 2)),
            "shapes": MemoryMappedTensor.from_filename(self.tmp / "shapes.memmap", torch.int32, (count, 2)),
        }

    def manifest_fields(self) -> dict:
        reencoded = {reason: count for reason, count in self.reencoded.items() if count}
        return {
            "image_shape": None,
            "resize": None,
            "jpeg": {"quality": self.quality, "max_side": self.max_side, "reencoded": reencoded},
            "order": {} if self.seed is None else {"shuffled": self.seed, "block_size": BLOCK_SIZE},
        }


_CHUNK = 1 << 16  # samples handled at once where a build goes over all of them


def _write(
    store: _Store,
    index: ImageFolderIndex | ScannedIndex,
    order: Iterable[int],
    total: int,
    skipped: list[dict],
    strict: bool,
    progress: bool,
    saves: _Saves,
) -> int:
    """Run the store's jobs for the samples at positions ``order`` (``total`` of them; a resumed build's
    from the first not done) and append their results in that order (:class:`_Jobs`); returns how many
    were kept."""
    done = saves.resumed.done if saves.resumed is not None else 0
    with tqdm(total=total, initial=done, unit="img", desc="build-memmap", disable=not progress, file=sys.stderr) as bar:
        jobs = _Jobs(store, skipped, strict, bar, saves, describe=lambda position: index.samples[position][0])
        for position in islice(order, done, None):
            masks = index.masks(position) if isinstance(index, ScannedIndex) else []
            jobs.add(position, *index.image(position), masks)
        return jobs.finish(index.source_path)


class _Jobs:
    """The store's jobs, at most its window in flight, each result appended (or its image skipped and
    listed in ``skipped``, unless ``strict``) in the order the jobs were added; a checkpoint saved when
    due (``saves``), a resumed build's counts taken from its checkpoint.

    Args:
        describe: names the image at a position, for the list of skipped images (when the job was not
            given its name).
    """

    def __init__(
        self,
        store: _Store,
        skipped: list[dict],
        strict: bool,
        bar: tqdm,
        saves: _Saves,
        describe: Callable[[int], str] | None = None,
    ) -> None:
        self.store, self.skipped, self.strict, self.bar, self.describe = store, skipped, strict, bar, describe
        self.pending: deque[tuple[int, str | None, Future, str | None]] = deque()
        self.saves, self.listed = saves, len(skipped)  # the jobs' skipped images come after those listed
        resumed = saves.resumed
        self.done, self.kept = (resumed.done, resumed.kept) if resumed is not None else (0, 0)
        self.scanned = saves.scan
        if resumed is not None:
            skipped.extend(resumed.skipped)

    def add(
        self,
        position: int,
        path: str,
        data: bytes | None,
        masks: Masks,
        name: str | None = None,
        scanned: str | None = None,
    ) -> None:
        """Start the job of the sample at ``position`` (see :meth:`_Store.submit`), once the window has room
        (``scanned``: the digest of the samples scanned up to it, for a build that writes as it scans)."""
        if len(self.pending) >= self.store.window:
            self._complete()
        self.pending.append((position, name, self.store.submit(path, data, masks), scanned))

    def finish(self, source: Path) -> int:
        """Complete every job; returns how many images were kept.

        Raises:
            DecodeError: none could be decoded (``source`` named).
        """
        while self.pending:
            self._complete()
        if not self.kept:
            first = self.skipped[0]["reason"] if self.skipped else "none was given"
            raise DecodeError(source, f"no image could be decoded; first problem: {first}")
        return self.kept

    def _complete(self) -> None:
        position, name, future, scanned = self.pending.popleft()
        try:
            result = future.result()
        except DecodeError as error:
            if self.strict:
                raise
            name = name if name is not None else self.describe(position)
            self.skipped.append({"path": name, "reason": error.reason})
            self.bar.set_postfix(skipped=len(self.skipped), refresh=False)
            self.store.forget(position)
        else:
            self.store.append(position, result)
            self.kept += 1
        self.store.release(future)
        self.bar.update()
        self.done += 1
        self.scanned = scanned if scanned is not None else self.scanned
        if self.saves.due():
            self.saves.save(self.store, self.done, self.kept, self.skipped[self.listed :], self.scanned)


class _CannotResume(Exception):
    """A stopped build cannot be taken up: it starts afresh (why: the message)."""


class _SourceChanged(_CannotResume):
    """A resumed build's source does not hold the samples the stopped build scanned (why: the message)."""


def _disagrees(
    tmp: Path,
    resumed: Checkpoint,
    format: str,
    size: tuple[int, int] | None,
    masks: list[str],
    index: ImageFolderIndex | ScannedIndex | None,
) -> str | None:
    """Why the checkpoint ``resumed`` does not match the files of the stopped build in ``tmp`` (a damaged
    disk, someone's edit), or ``None``: a raw build's files hold its images and ``masks`` at ``size`` (or
    the size it decided), each (which files: the store says); a jpeg build's file is its data, its
    re-encoded images of known reasons; the records are of each of the ``index``'s samples (``None``:
    not scanned yet, of those kept at least: they grow as images are kept), and the images it had done,
    and those it could not read, are among them."""
    record = (_RawStore if format == "raw" else _JpegStore).record
    if index is not None and resumed.done > len(index.samples):
        return f"its checkpoint counts more images done than the {len(index.samples)} there are"
    if format == "raw" and (size or resumed.size) is not None:
        height, width = size or resumed.size
        each = {"images.memmap": 3 * height * width, **{field_path(name): height * width for name in masks}}
        if any(written != resumed.kept * each[path] for path, written in resumed.written.items() if path in each):
            return "its checkpoint counts other bytes than its images and masks hold"
    if format == "jpeg" and list(resumed.written) != ["data.memmap"]:
        return "its checkpoint counts other files than data.memmap"
    if format == "jpeg" and not set(resumed.reencoded) <= set(REENCODE_REASONS):
        return "its checkpoint counts images re-encoded for unknown reasons"
    if index is not None and any(position >= len(index.samples) for position in resumed.unreadable):
        return "its checkpoint names unreadable images beyond the samples"
    try:
        found = os.lstat(tmp / ".records").st_size
    except OSError:
        return "its .records is missing"
    rows = max(1, len(index.samples) if index is not None else resumed.kept)
    if (
        found % record.itemsize
        or found < rows * record.itemsize
        or (index is not None and found != rows * record.itemsize)
    ):
        return "its .records is not of the images it counts"
    return None


class _Saves:
    """A build's checkpoints (see :mod:`gpuload.writing.resume`): the one it goes on from (``resumed``),
    and, where it flushes its files (``write``: ``sync``), a new one every
    :data:`~gpuload.writing.resume.CHECKPOINT_SECONDS`, once what it counts is on disk.

    Attributes:
        scan: the digest of the source's samples, once scanned (a build that scans first).
        size, unreadable: a raw build's image size, once decided from the images, and the images whose
            header could not be read then.
    """

    def __init__(self, tmp: Path, asked: dict, resumed: Checkpoint | None, write: bool) -> None:
        self.tmp, self.asked, self.resumed, self.write = tmp, asked, resumed, write
        self.scan = ""
        self.size: list[int] | None = None
        self.unreadable: dict[int, str] = {}
        self.next = time.monotonic() + checkpoints.CHECKPOINT_SECONDS

    def due(self) -> bool:
        return self.write and time.monotonic() >= self.next

    def save(self, store: _Store, done: int, kept: int, skipped: list[dict], scanned: str) -> None:
        """Flush the store's files and the folders' entries (the build's, beside ``out``, and its ``fields``),
        then replace the checkpoint: ``done`` jobs complete, ``kept`` images written."""
        store.sync()
        for folder in (self.tmp.parent, self.tmp / FIELDS_FOLDER):
            if folder.is_dir():
                fsync_folder(folder)
        checkpoint = Checkpoint(
            recipe=self.asked,
            scan=scanned,
            done=done,
            kept=kept,
            written={writer.path.relative_to(self.tmp).as_posix(): writer.written for writer in store.writers},
            skipped=skipped,
            reencoded={reason: n for reason, n in getattr(store, "reencoded", {}).items() if n},
            size=self.size,
            unreadable=self.unreadable,
        )
        with full_disk_says(
            lambda: no_room(
                self.tmp,
                f"to write the checkpoint {self.tmp / checkpoints.CHECKPOINT}",
                "there or write to another disk",
            )
        ):
            checkpoint.write(self.tmp)
        self.next = time.monotonic() + checkpoints.CHECKPOINT_SECONDS

    def announce(self, out: Path) -> None:
        """Say that the build goes on from its checkpoint (its source's samples found the same)."""
        warnings.warn(
            f"resuming the build of {out} after the {count(self.resumed.done, 'image')} it had done when it stopped",
            stacklevel=2,
        )

    def start_afresh(self, out: Path, why: str, keep: str | None = None) -> None:
        """Start afresh (warning ``why``): remove what the stopped build wrote, all but ``keep``, its
        checkpoint first (a kill in between leaves a folder that the next build removes)."""
        _warn_afresh(out, self.tmp, self.resumed.done, why)
        self.resumed = None
        Checkpoint.remove(self.tmp, self.write)
        for entry in self.tmp.iterdir():
            if entry.name == keep:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def _finish(
    tmp: Path,
    index: ImageFolderIndex | ScannedIndex,
    store: _Store,
    kept: int,
    empty: list[str],
    skipped: list[dict],
    sync: bool,
) -> None:
    """Write the index and the table (in the source's order), the fields, the tensordict metadata and the
    manifest, read-only, flushed to disk with the folder; remove the scan's folder."""
    arrays = store.close(kept)
    scanned = index.samples.table
    with TableWriter(tmp) as table:
        for first in range(0, len(index.samples), _CHUNK):
            kept_here = store.kept(first, first + _CHUNK)
            labels, checksums = scanned.labels[kept_here].tolist(), store.checksums(kept_here).tolist()
            for position, label, checksum in zip(kept_here.tolist(), labels, checksums):
                table.append(scanned.path(position), label, checksum)
    specs = [staged.spec for staged in index.fields]
    if specs:
        (tmp / FIELDS_FOLDER).mkdir(exist_ok=True)  # a raw build's masks are written there already
    for staged in index.fields:
        if not (staged.spec.kind == "mask" and staged.spec.fixed):
            staged.write(tmp, (store.kept(first, first + _CHUNK) for first in range(0, len(index.samples), _CHUNK)))
    store.discard()
    index.close()
    for staged in (tmp / SCAN).iterdir():  # the scan's own folder, flat
        staged.unlink()
    os.rmdir(tmp / SCAN)
    arrays["labels"] = MemoryMappedTensor.from_filename(tmp / "labels.memmap", torch.int64, (kept,))
    arrays["checksums"] = MemoryMappedTensor.from_filename(tmp / "checksums.memmap", torch.int64, (kept,))
    storage = "raw" if "images" in store.arrays else "jpeg"
    fixed = {
        spec.name: MemoryMappedTensor.from_filename(
            tmp / field_path(spec.name), _stored_dtype(spec), (kept, *spec.shape)
        )
        for spec in specs
        if spec.fixed
    }
    if fixed:  # plain tensordict opens them: TensorDict.load_memmap(out)["fields", name]
        arrays[FIELDS_FOLDER] = TensorDict(fixed, batch_size=[kept])
    batch = [kept] if "images" in arrays else []  # jpeg arrays have no common first dimension
    TensorDict(arrays, batch_size=batch).memmap_(prefix=tmp, copy_existing=False, existsok=True)
    del arrays, fixed
    names = (*(f"{name}.memmap" for name in ARRAYS[storage]), "meta.json", *field_files(specs))
    files = {name: (tmp / name).stat().st_size for name in names}
    Manifest(
        source=str(index.root),
        classes=index.classes,
        count=kept,
        table={name: file_digest(tmp / name) for name in index_files(storage, specs)},
        skipped=sorted(skipped, key=lambda entry: entry["path"]),
        versions=library_versions(),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        storage=storage,
        max_image_pixels=Image.MAX_IMAGE_PIXELS or 0,
        empty_classes=empty,
        files=files,
        fields=[spec.to_json() for spec in specs],
        source_format=index.source_format,
        **store.manifest_fields(),
    ).write(tmp)
    for name in (*files, MANIFEST_NAME):
        (tmp / name).chmod(0o444)
        if sync:
            fsync_file(tmp / name)
    if sync:
        fsync_folder(tmp)


def _stored_dtype(spec: FieldSpec) -> torch.dtype:
    """How a number's file stores it, for tensordict (a bool as uint8: one byte, 0 or 1)."""
    return torch.uint8 if spec.dtype == "bool" else spec.torch_dtype


def _empty_classes(index: ImageFolderIndex | ScannedIndex, store: _Store) -> list[str]:
    """The classes with no image among the samples the store kept, sorted."""
    counts = np.zeros(len(index.classes), dtype=np.int64)
    labels = index.samples.table.labels
    for first in range(0, len(labels), _CHUNK):
        counts += np.bincount(labels[store.kept(first, first + _CHUNK)], minlength=len(index.classes))
    return sorted(name for label, name in enumerate(index.classes) if not counts[label])


def library_versions() -> dict[str, str]:
    """The versions of gpuload and of the libraries that decode, resize and encode, as a build records them."""
    from importlib.metadata import version

    import PIL
    import simplejpeg
    import tensordict

    return {
        "gpuload": version("gpuload"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "tensordict": tensordict.__version__,
        "pillow": PIL.__version__,
        "simplejpeg": simplejpeg.__version__,
    }


def _move_into_place(tmp: Path, out: Path, sync: bool) -> None:
    """Rename the finished ``tmp`` to ``out``; an existing ``out`` is swapped atomically and then removed.

    Where the filesystem cannot swap, the old dataset is renamed aside first and put back if the
    second rename fails; after a kill between the two renames, the next build puts it back.
    """
    if not os.path.lexists(out):
        rename_noreplace(tmp, out)
        old = None
    elif rename_exchange(tmp, out):
        old = tmp  # the old dataset now lies at the temporary name
    else:
        old = out.with_name(f".{out.name}.old-{secrets.token_hex(4)}")
        os.rename(out, old)
        try:
            rename_noreplace(tmp, out)
        except BaseException:
            os.rename(old, out)
            raise
    if sync:
        fsync_folder(out.parent)
    if old is not None:
        try:
            shutil.rmtree(old)
        except OSError as error:  # the new dataset is in place: that is the build's result
            warnings.warn(
                f"{out} holds the new dataset; the old one, moved to {old}, could not be removed "
                f"({error.strerror or error}: {error.filename}); remove it yourself, or the next build of {out} will",
                stacklevel=3,
            )
