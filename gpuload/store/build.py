"""Decode an image folder once into a memory-mapped uint8 dataset, crash-safe and in bounded memory."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import sys
import warnings
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import xxhash
from tensordict import MemoryMappedTensor, TensorDict
from tqdm.auto import tqdm

from ..errors import DatasetError, DecodeError, UsageError
from ..machine import default_workers
from .decode import Resize, check_target, decode_into, read_size
from .files import OutputLock, check_apart, fsync_file, fsync_folder, rename_exchange, rename_noreplace, resolve
from .manifest import MANIFEST_NAME, Manifest
from .scan import ImageFolderIndex, scan_image_folder
from .writer import BlockWriter

__all__ = ["build_memmap"]

# Every name a build folder of any format version holds: what a stale temporary folder may contain.
_BUILD_PATHS = {
    MANIFEST_NAME,
    "meta.json",
    "images.memmap",
    "labels.memmap",
    "_tensordict",
    "_tensordict/meta.json",
    "_tensordict/images.memmap",
    "_tensordict/labels.memmap",
}


def build_memmap(
    src: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    size: tuple[int, int] | None = None,
    resize: Resize = "crop",
    workers: int | None = None,
    strict: bool = False,
    overwrite: bool = False,
    sync: bool = True,
    progress: bool = True,
) -> Path:
    """Decode the ImageFolder ``src`` into a memory-mapped dataset at ``out``; returns ``out``.

    The images are decoded in parallel threads and streamed, in ImageFolder's order, into
    ``out/images.memmap`` (uint8 ``[N, 3, H, W]``) beside ``labels.memmap`` (int64 ``[N]``), the
    ``meta.json`` of a plain tensordict ``TensorDict`` (so ``tensordict.TensorDict.load_memmap(out)``
    opens it anywhere) and a ``manifest.json``. Memory stays bounded by a few images per thread
    whatever the number of images.

    Crash safety: the build holds a lock beside ``out`` (a second build of the same ``out`` fails
    at once), writes into a hidden sibling folder, flushes every file and the folder to disk
    (``sync``), and only then renames it to ``out``; an existing ``out`` is swapped in one atomic
    step. After a kill or a power cut at any point, ``out`` holds either the old dataset or the
    complete new one, and the next build tidies up what was left.

    Args:
        src: an ImageFolder (one subfolder per class), or a folder of images (one class).
        out: where to write; defaults to ``<src>.memmap`` beside ``src``. It must not be ``src``,
            lie inside it, or contain it.
        size: ``(height, width)`` of the stored images; by default the images' common size.
        resize: how images of another size are fitted: ``"crop"``, ``"pad"`` or ``"stretch"``
            (see :func:`gpuload.decode_image`).
        workers: decoding threads; defaults to the number of cores.
        strict: raise on the first file that cannot be decoded instead of skipping it.
        overwrite: replace an existing ``out``, which must be a gpuload dataset and nothing else.
        sync: flush the data to disk before the dataset is renamed into place. Without it a
            build is faster on slow disks, but a power cut soon after it can leave images of
            zeros that ``gpuload verify`` reports.
        progress: show a progress bar.

    Raises:
        FileNotFoundError: ``src`` does not exist or holds no image.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        UsageError: bad arguments, ``out`` overlapping ``src``, ``overwrite`` of a folder that
            is not only a gpuload dataset, or images of several sizes and no ``size``.
        BusyError: another build of ``out`` is running.
        DecodeError: with ``strict``, the first file that cannot be decoded; else, no file could be.
        OSError: not enough disk space, or a write failed.

    Example:
        >>> import tempfile
        >>> from gpuload.sample import make_sample_folder
        >>> tmp = Path(tempfile.mkdtemp())
        >>> src = make_sample_folder(tmp / "photos", images_per_class=2, size=(24, 32))
        >>> out = build_memmap(src, size=(24, 32), progress=False)
        >>> out.name, sorted(p.name for p in out.iterdir())
        ('photos.memmap', ['images.memmap', 'labels.memmap', 'manifest.json', 'meta.json'])
    """
    src = resolve(src)
    out = resolve(out) if out is not None else src.with_name(f"{src.name}.memmap")
    size = check_target(size, resize)
    workers = default_workers() if workers is None else workers
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise UsageError(f"workers must be a positive integer, got {workers!r}")
    check_apart(src, out, source_name="src", output_name="out")
    with OutputLock(out):
        _tidy(out)
        if os.path.lexists(out):
            if not overwrite:
                raise FileExistsError(f"{out} already exists; pass overwrite=True (--overwrite) or choose another out")
            _check_replaceable(out)
        index = scan_image_folder(src)
        unreadable: dict[int, str] = {}
        with ThreadPoolExecutor(workers, thread_name_prefix="gpuload-decode") as pool:
            if size is None:
                size, unreadable = _common_size(index, pool, strict)
            _check_free_space(out.parent, len(index.samples), size)
            tmp = out.with_name(f".{out.name}.tmp-{secrets.token_hex(4)}")
            tmp.mkdir()
            try:
                skipped = [
                    {"path": index.samples[position][0], "reason": reason} for position, reason in unreadable.items()
                ]
                todo = [position for position in range(len(index.samples)) if position not in unreadable]
                kept, checksums = _write_images(
                    tmp, index, todo, size, resize, pool, workers, skipped, strict, progress, sync
                )
                _finish(tmp, src, index, size, resize, kept, checksums, skipped, sync)
                _move_into_place(tmp, out, sync)
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    return out


def _tidy(out: Path) -> None:
    """Finish what a killed build of ``out`` left (we hold the lock, so no build is running):
    put back a dataset that an interrupted overwrite had moved aside, then remove temporary folders."""
    prefix = glob.escape(f".{out.name}.")
    stale = sorted(out.parent.glob(f"{prefix}tmp-*")) + sorted(out.parent.glob(f"{prefix}old-*"))
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


def _is_build_folder(folder: Path) -> bool:
    """Whether ``folder`` is a real folder holding nothing but names a gpuload build writes."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*")} <= _BUILD_PATHS


def _check_replaceable(out: Path) -> None:
    """Refuse to overwrite anything but a folder holding a gpuload dataset and nothing else."""
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
    index: ImageFolderIndex, pool: ThreadPoolExecutor, strict: bool
) -> tuple[tuple[int, int], dict[int, str]]:
    """The images' common ``(height, width)``, and the reason per sample position whose header is unreadable."""
    sizes: Counter[tuple[int, int]] = Counter()
    unreadable: dict[int, str] = {}
    paths = [index.root / path for path, _ in index.samples]
    for position, size in enumerate(pool.map(_read_size_or_error, paths)):
        if isinstance(size, DecodeError):
            if strict:
                raise size
            unreadable[position] = size.reason
        else:
            sizes[size] += 1
    if not sizes:
        raise DecodeError(index.root, f"no image could be read; first problem: {next(iter(unreadable.values()))}")
    if len(sizes) > 1:
        common = ", ".join(f"{h}x{w} ({n} images)" for (h, w), n in sizes.most_common(5))
        raise UsageError(
            f"the images of {index.root} have {len(sizes)} different sizes (most common: {common}); "
            f"pass size=(height, width) (--size HxW) and choose a resize mode (crop, pad or stretch)"
        )
    return next(iter(sizes)), unreadable


def _read_size_or_error(path: Path) -> tuple[int, int] | DecodeError:
    try:
        return read_size(path)
    except DecodeError as error:
        return error


def _check_free_space(folder: Path, count: int, size: tuple[int, int]) -> None:
    needed = count * (3 * size[0] * size[1] + 8)
    free = shutil.disk_usage(folder if folder.exists() else folder.parent).free
    if needed > free:
        raise OSError(
            f"the dataset needs {needed / 1e9:.2f} GB ({count} images of 3x{size[0]}x{size[1]} bytes) "
            f"but {folder} has {free / 1e9:.2f} GB free; choose a smaller size or another out"
        )


def _decode_into(path: Path, size: tuple[int, int], resize: str, buffer: np.ndarray) -> int:
    decode_into(path, buffer, resize)
    return xxhash.xxh3_64_intdigest(buffer)


def _write_images(
    tmp: Path,
    index: ImageFolderIndex,
    todo: list[int],
    size: tuple[int, int],
    resize: str,
    pool: ThreadPoolExecutor,
    workers: int,
    skipped: list[dict],
    strict: bool,
    progress: bool,
    sync: bool,
) -> tuple[list[int], list[str]]:
    """Decode the samples at positions ``todo`` in parallel and write them in order;
    returns the positions of the samples kept and their checksums."""
    image_bytes = 3 * size[0] * size[1]
    window = 2 * workers + 2  # decoded images in flight: bounds memory
    free_buffers = [np.empty((3, *size), np.uint8) for _ in range(window)]
    pending: deque = deque()
    positions = iter(todo)
    kept: list[int] = []
    checksums: list[str] = []

    def submit_next() -> None:
        position = next(positions, None)
        if position is not None:
            buffer = free_buffers.pop()
            path = index.root / index.samples[position][0]
            pending.append((position, buffer, pool.submit(_decode_into, path, size, resize, buffer)))

    with (
        BlockWriter(tmp / "images.memmap", len(todo) * image_bytes, write_behind=sync) as writer,
        tqdm(total=len(todo), unit="img", desc="build-memmap", disable=not progress, file=sys.stderr) as bar,
    ):
        for _ in range(window):
            submit_next()
        while pending:
            position, buffer, future = pending.popleft()
            try:
                checksum = future.result()
            except DecodeError as error:
                if strict:
                    raise
                skipped.append({"path": index.samples[position][0], "reason": error.reason})
                bar.set_postfix(skipped=len(skipped), refresh=False)
            else:
                writer.write(buffer)
                kept.append(position)
                checksums.append(f"{checksum:016x}")
            free_buffers.append(buffer)
            submit_next()
            bar.update()
        if not kept:
            raise DecodeError(index.root, f"no image could be decoded; first problem: {skipped[0]['reason']}")
    return kept, checksums


def _finish(
    tmp: Path,
    src: Path,
    index: ImageFolderIndex,
    size: tuple[int, int],
    resize: str,
    kept: list[int],
    checksums: list[str],
    skipped: list[dict],
    sync: bool,
) -> None:
    """Write labels, the tensordict metadata and the manifest, read-only, flushed to disk with the folder."""
    labels = np.array([index.samples[position][1] for position in kept], dtype=np.int64)
    with open(tmp / "labels.memmap", "xb") as file:
        file.write(labels.tobytes())
    count = len(kept)
    images_mm = MemoryMappedTensor.from_filename(tmp / "images.memmap", torch.uint8, (count, 3, *size))
    labels_mm = MemoryMappedTensor.from_filename(tmp / "labels.memmap", torch.int64, (count,))
    TensorDict(images=images_mm, labels=labels_mm, batch_size=[count]).memmap_(
        prefix=tmp, copy_existing=False, existsok=True
    )
    del images_mm, labels_mm
    files = {name: (tmp / name).stat().st_size for name in ("images.memmap", "labels.memmap", "meta.json")}
    Manifest(
        source=str(src),
        classes=index.classes,
        samples=[list(index.samples[position]) for position in kept],
        checksums=checksums,
        image_shape=[3, *size],
        resize=resize,
        skipped=sorted(skipped, key=lambda entry: entry["path"]),
        versions=_versions(),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        files=files,
    ).write(tmp)
    for name in (*files, MANIFEST_NAME):
        (tmp / name).chmod(0o444)
        if sync:
            fsync_file(tmp / name)
    if sync:
        fsync_folder(tmp)


def _versions() -> dict[str, str]:
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
        shutil.rmtree(old)
