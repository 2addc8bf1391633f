"""``gpuload demo``: the whole job on the built-in sample, printing what it does and how fast."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from .errors import UsageError
from .format.dataset import MemmapImageDataset
from .format.verify import verify_memmap
from .loading.loader import DataLoader
from .machine import default_workers, machine_line
from .sample import SAMPLE_CLASSES, make_sample_folder
from .text import byte_size, count, image_size
from .writing.build import build_memmap
from .writing.compress import compress_folder

__all__ = ["run_demo"]


def run_demo(
    workdir: str | os.PathLike | None = None,
    *,
    images: int = 500,
    size: tuple[int, int] = (480, 640),
    progress: bool = True,
) -> Path:
    """Make sample photos, compress them with ffmpeg, build the memmap, verify it and read it back.

    Args:
        workdir: where to keep the files; by default a temporary folder, removed at the end.
        images: how many sample photos to make.
        size: their ``(height, width)``.
        progress: draw the progress bars of compress and build.

    Returns:
        The dataset folder (gone when ``workdir`` is ``None``).
    """
    if images < len(SAMPLE_CLASSES):
        raise UsageError(f"images must be at least {len(SAMPLE_CLASSES)} (one per class), got {images}")
    temporary = workdir is None
    root = Path(tempfile.mkdtemp(prefix="gpuload-demo-") if temporary else workdir)
    try:
        return _steps(root, images, size, progress)
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)


def _steps(root: Path, images: int, size: tuple[int, int], progress: bool) -> Path:
    print(f"gpuload demo on {machine_line()}\nworking in {root}", flush=True)  # each step as it ends, piped too
    photos, compressed = root / "photos", root / "photos-q3"
    started = time.perf_counter()
    per_class = images // len(SAMPLE_CLASSES)
    make_sample_folder(photos, images_per_class=per_class, size=size)
    before = sum(path.stat().st_size for path in photos.rglob("*.jpg"))
    print(
        f"1/5 sample: {count(per_class * len(SAMPLE_CLASSES), 'photo')} of {image_size(*size)} in "
        f"{count(len(SAMPLE_CLASSES), 'class', 'classes')}, {byte_size(before)}, made from matplotlib's grace_hopper.jpg "
        f"in {time.perf_counter() - started:.1f} s",
        flush=True,
    )

    report = compress_folder(photos, compressed, quality=3, progress=progress)
    print(f"2/5 compress (ffmpeg -q:v 3): {report.summary()}", flush=True)

    started = time.perf_counter()
    out = build_memmap(compressed, size=size, overwrite=True, progress=progress)
    seconds = time.perf_counter() - started
    dataset = MemmapImageDataset(out)
    print(
        f"3/5 build-memmap: {count(len(dataset), 'image')}, {byte_size(dataset.data.images.numel())} of uint8 pixels "
        f"in {seconds:.2f} s ({len(dataset) / seconds:.0f} images/s) -> {out}",
        flush=True,
    )

    started = time.perf_counter()
    sources = min(8, len(dataset))
    problems = verify_memmap(out, sources=sources, progress=False)
    print(
        f"4/5 verify: {'OK' if not problems else problems} (checksums of all images, {sources} sources re-decoded) in {time.perf_counter() - started:.2f} s",
        flush=True,
    )

    loader = DataLoader(dataset, batch_size=64, shuffle=True)
    workers = default_workers()
    stock = torch.utils.data.DataLoader(  # the stock loader at its best, on the same memmap
        dataset,
        batch_size=64,
        shuffle=True,
        num_workers=workers,
        pin_memory=loader.device.type == "cuda",
        persistent_workers=True,
    )
    device = loader.device
    rates = {}
    for name, batches in (("gpuload.DataLoader", loader), (f"torch DataLoader with {workers} workers", stock)):
        for _ in batches:  # warm-up epoch: page cache, buffers, workers
            pass
        _synchronize(device)
        started = time.perf_counter()
        seen = 0
        for images, _ in batches:  # on the device, as training uses them
            seen += len(images.to(device, non_blocking=True))
        _synchronize(device)
        rates[name] = seen / (time.perf_counter() - started)
    print(
        f"5/5 read back: shuffled epochs of {seen} images in batches of 64 to {loader.device}: "
        + ", ".join(f"{name} {rate:,.0f} images/s" for name, rate in rates.items())
        + " (gpuload bench DATASET compares more)"
    )
    return out


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
