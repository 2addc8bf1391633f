"""Decode an image folder once into a memory-mapped uint8 dataset, crash-safe and in bounded memory."""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import xxhash
from tensordict import MemoryMappedTensor
from tqdm.auto import tqdm

from .dataset import ImageData
from .decode import DecodeError, Resize, check_target, copy_chw, load_rgb, read_size
from ..machine import default_workers
from .manifest import Manifest
from .scan import ImageFolderIndex, scan_image_folder
from .writer import BlockWriter

__all__ = ["build_memmap"]


def build_memmap(
    src: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    size: tuple[int, int] | None = None,
    resize: Resize = "crop",
    workers: int | None = None,
    strict: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Decode the ImageFolder ``src`` into a memory-mapped dataset at ``out``; returns ``out``.

    The images are decoded in parallel threads with Pillow and streamed, in
    ImageFolder's order, into ``out/_tensordict/images.memmap`` (uint8
    ``[N, 3, H, W]``) beside ``labels.memmap`` (int64 ``[N]``), the ``meta.json`` files
    of an :class:`ImageData` tensorclass (``tensordict.TensorDict.load_memmap(out)``
    opens it) and a ``manifest.json``. Memory stays bounded by a few images per
    thread whatever the number of images. The build happens in a hidden sibling
    folder renamed to ``out`` at the end, so an interrupted build leaves nothing at ``out``.

    Args:
        src: an ImageFolder (one subfolder per class), or a folder of images (one class).
        out: where to write; defaults to ``<src>.memmap`` beside ``src``.
        size: ``(height, width)`` of the stored images; by default the images' common size.
        resize: how images of another size are fitted: ``"crop"``, ``"pad"`` or ``"stretch"``
            (see :func:`gpuload.store.decode.load_rgb`).
        workers: decoding threads; defaults to the number of cores.
        strict: raise on the first file that cannot be decoded instead of skipping it.
        overwrite: replace an existing ``out``.
        progress: show a progress bar.

    Raises:
        FileNotFoundError: ``src`` does not exist or holds no image.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        ValueError: bad arguments, images of several sizes and no ``size``, or no decodable image.
        DecodeError: with ``strict``, the first file that cannot be decoded.
        OSError: not enough disk space, or a write failed.

    Example:
        >>> import tempfile
        >>> from gpuload.sample import make_sample_folder
        >>> tmp = Path(tempfile.mkdtemp())
        >>> src = make_sample_folder(tmp / "photos", images_per_class=2, size=(24, 32))
        >>> out = build_memmap(src, size=(24, 32), progress=False)
        >>> out.name, sorted(p.name for p in out.iterdir())
        ('photos.memmap', ['_tensordict', 'manifest.json', 'meta.json'])
    """
    src = Path(src).expanduser().absolute()
    out = Path(out).expanduser().absolute() if out is not None else src.with_name(f"{src.name}.memmap")
    size = check_target(size, resize)
    workers = default_workers() if workers is None else workers
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if out.is_relative_to(src):
        raise ValueError(f"out ({out}) must not be inside src ({src}): a later scan would read it as a class")
    if os.path.lexists(out) and not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=True (--overwrite) or choose another out")

    index = scan_image_folder(src)
    unreadable: dict[int, str] = {}
    with ThreadPoolExecutor(workers, thread_name_prefix="gpuload-decode") as pool:
        if size is None:
            size, unreadable = _common_size(index, pool, strict)
        _check_free_space(out.parent, len(index.samples), size)
        _remove_stale_builds(out)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            (tmp / "_tensordict").mkdir(parents=True)
            skipped = [
                {"path": index.samples[position][0], "reason": reason} for position, reason in unreadable.items()
            ]
            todo = [position for position in range(len(index.samples)) if position not in unreadable]
            kept, checksums = _write_images(tmp, index, todo, size, resize, pool, workers, skipped, strict, progress)
            _finish(tmp, src, index, size, resize, kept, checksums, skipped)
            _move_into_place(tmp, out)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


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
        raise ValueError(f"no image in {index.root} could be read; first problem: {next(iter(unreadable.values()))}")
    if len(sizes) > 1:
        common = ", ".join(f"{h}x{w} ({n} images)" for (h, w), n in sizes.most_common(5))
        raise ValueError(
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
    copy_chw(load_rgb(path, size, resize), buffer)
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
        BlockWriter(tmp / "_tensordict" / "images.memmap", len(todo) * image_bytes) as writer,
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
            raise ValueError(f"no image in {index.root} could be decoded; first problem: {skipped[0]['reason']}")
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
) -> None:
    """Write labels, the tensorclass metadata and the manifest; make the files read-only."""
    folder = tmp / "_tensordict"
    labels = np.array([index.samples[position][1] for position in kept], dtype=np.int64)
    with open(folder / "labels.memmap", "wb") as file:
        file.write(labels.tobytes())
        file.flush()
        os.fsync(file.fileno())
    count = len(kept)
    images = MemoryMappedTensor.from_filename(folder / "images.memmap", torch.uint8, (count, 3, *size))
    labels_mm = MemoryMappedTensor.from_filename(folder / "labels.memmap", torch.int64, (count,))
    ImageData(images=images, labels=labels_mm, batch_size=[count]).memmap_(
        prefix=tmp, copy_existing=False, existsok=True
    )
    del images, labels_mm
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
    ).write(tmp)
    for file in folder.iterdir():
        file.chmod(0o444)


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    import PIL
    import tensordict

    return {
        "gpuload": version("gpuload"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "tensordict": tensordict.__version__,
        "pillow": PIL.__version__,
    }


def _move_into_place(tmp: Path, out: Path) -> None:
    if os.path.lexists(out):
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()
    else:
        os.replace(tmp, out)
    _fsync_folder(out.parent)


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # folders cannot be opened on some systems
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale_builds(out: Path) -> None:
    """Remove the temporary folders of builds of ``out`` whose process is gone."""
    for stale in out.parent.glob(f".{out.name}.tmp-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
