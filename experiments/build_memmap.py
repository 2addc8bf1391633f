"""How fast does ``gpuload.build_memmap`` turn a folder of JPEGs into a memmap, and in how much memory?

Side by side in one run, for each dataset size N (page cache warm for the sources):
- the decode limit: simplejpeg (libjpeg-turbo, the decoder gpuload uses) decoding the same files
  into memory on all cores, writing nothing (and Pillow and torchvision's ``decode_jpeg`` the same
  way, for reference);
- the disk's limit: the same bytes a raw build writes (N x 640x480x3), from one buffer, through
  the build's writer (preallocated, write-behind) and flushed to disk (``fsync``), decoding nothing;
- ``gpuload.build_memmap``, and the same with ``sync=False``: the difference is what flushing the
  dataset to disk before renaming it into place costs;
- the talk's recipe (tensordict's ImageNet tutorial): ``DataLoader(ImageFolder, PILToTensor)``
  with 2 workers filling a tensorclass of ``MemoryMappedTensor.empty`` fields, memmapped to disk.
Rates are images per second (median of the repeats, min-max kept); memory is the peak that the
OS cannot reclaim (anonymous + shared, not page cache). Before each contender the disk catches up
(``os.sync``), so that no contender pays for the writes of the one before it.

    python -m experiments.build_memmap --counts 2000 8000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tensordict import MemoryMappedTensor, tensorclass
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from torchvision.transforms import PILToTensor

import gpuload
from gpuload.writing.files import fsync_file
from gpuload.writing.writer import BlockWriter

from ._common import UnreclaimableMemory, elapsed, median_spread, photo_folders, write_result


@tensorclass
class TutorialImageData:
    images: torch.Tensor
    targets: torch.Tensor


def talk_recipe(src: Path, out: Path, workers: int = 2) -> None:
    """The tensorclass build of tensordict's ImageNet tutorial, written to ``out``."""
    dataset = ImageFolder(str(src), transform=PILToTensor())
    shape = dataset[0][0].shape
    data = TutorialImageData(
        images=MemoryMappedTensor.empty((len(dataset), *shape), dtype=torch.uint8),
        targets=MemoryMappedTensor.empty((len(dataset),), dtype=torch.int64),
        batch_size=[len(dataset)],
    )
    data.memmap_(prefix=out)
    position = 0
    for images, targets in DataLoader(dataset, batch_size=64, num_workers=workers):
        count = images.shape[0]
        data[position : position + count] = TutorialImageData(images=images, targets=targets, batch_size=[count])
        position += count


def pillow_limit(files: list[Path], workers: int) -> None:
    def decode(path: Path) -> np.ndarray:
        with Image.open(path) as image:
            return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))

    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(decode, files):
            pass


def simplejpeg_limit(files: list[Path], workers: int) -> None:
    import simplejpeg

    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(lambda path: simplejpeg.decode_jpeg(path.read_bytes()), files):
            pass


def decode_jpeg_limit(files: list[Path], workers: int) -> None:
    from torchvision.io import decode_jpeg, read_file

    with warnings.catch_warnings(), ThreadPoolExecutor(workers) as pool:
        warnings.simplefilter("ignore")  # torchvision 0.29 deprecates its decoders
        for _ in pool.map(lambda path: decode_jpeg(read_file(str(path))).contiguous(), files):
            pass


def write_limit(count: int, path: Path, image_bytes: int = 480 * 640 * 3) -> None:
    """What a synced raw build of ``count`` images writes, and nothing else: the disk's share of its time."""
    block = np.zeros(image_bytes, np.uint8)
    with BlockWriter(path, count * image_bytes, write_behind=True) as writer:
        for _ in range(count):
            writer.write(block)
        fsync_file(path)
    path.unlink()


def measure(count: int, repeats: int, workdir: Path) -> dict:
    _, src = photo_folders(workdir, count)
    files = sorted(src.rglob("*.jpg"))
    for path in files:  # warm the page cache
        path.read_bytes()
    workers = gpuload.default_workers()
    out = workdir / "out.memmap"
    limits = {
        "simplejpeg_limit": lambda: simplejpeg_limit(files, workers),
        "pillow_limit": lambda: pillow_limit(files, workers),
        "decode_jpeg_limit": lambda: decode_jpeg_limit(files, workers),
        "write_limit": lambda: write_limit(len(files), workdir / "write-limit.bin"),
    }
    builds = {
        "gpuload": lambda: gpuload.build_memmap(src, out, size=(480, 640), progress=False),
        "gpuload_no_sync": lambda: gpuload.build_memmap(src, out, size=(480, 640), sync=False, progress=False),
        "talk_recipe": lambda: talk_recipe(src, out),
    }
    runs: dict[str, list[float]] = {name: [] for name in (*limits, *builds)}
    memory: dict[str, list[int]] = {name: [] for name in builds}
    for repeat in range(repeats):
        for name, limit in limits.items():
            os.sync()
            runs[name].append(len(files) / elapsed(limit))
        order = list(builds) if repeat % 2 == 0 else list(reversed(builds))
        for name in order:
            shutil.rmtree(out, ignore_errors=True)
            os.sync()
            with UnreclaimableMemory() as watch:
                seconds = elapsed(builds[name])
            runs[name].append(len(files) / seconds)
            memory[name].append(watch.peak_bytes)
            shutil.rmtree(out, ignore_errors=True)
        print(
            f"  N={len(files)} repeat {repeat + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in runs.items()),
            flush=True,
        )
    return {
        "images": len(files),
        "mean_file_bytes": sum(path.stat().st_size for path in files) / len(files),
        "workers": workers,
        "images_per_second": {name: median_spread(values) for name, values in runs.items()},
        "peak_unreclaimable_bytes": {name: max(values) for name, values in memory.items()},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[2000, 8000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"machine: {gpuload.machine_line()}")
    results = [measure(count, args.repeats, args.workdir) for count in args.counts]
    print(f"\n{'N':>6} {'contender':<18} {'images/s':>9} {'min-max':>11} {'peak unreclaimable':>19}")
    for result in results:
        rates = result["images_per_second"]
        for name, rate in rates.items():
            peak = result["peak_unreclaimable_bytes"].get(name)
            peak_text = f"{peak / 2**20:,.0f} MiB" if peak is not None else ""
            print(
                f"{result['images']:>6} {name:<18} {rate['median']:>9.0f} {rate['min']:>5.0f}-{rate['max']:<5.0f} {peak_text:>19}"
            )
        ours, unsynced = rates["gpuload"]["median"], rates["gpuload_no_sync"]["median"]
        decoder, disk = rates["simplejpeg_limit"]["median"], rates["write_limit"]["median"]
        print(
            f"{'':>6} gpuload = {ours / rates['talk_recipe']['median']:.2f}x the talk's recipe, "
            f"{ours / decoder:.0%} of the simplejpeg decode limit (bar: 85%), {unsynced / decoder:.0%} without "
            f"the flush; flushing to disk costs {result['images'] / ours - result['images'] / unsynced:+.2f} s "
            f"({ours / unsynced - 1:+.0%} rate); the disk alone takes synced raw images at {disk:,.0f}/s"
        )
    if len(results) > 1:
        first, last = results[0], results[-1]
        ratio = last["images_per_second"]["gpuload"]["median"] / first["images_per_second"]["gpuload"]["median"]
        print(f"gpuload rate at N={last['images']} is {ratio:.0%} of its rate at N={first['images']}")
    path = write_result("build_memmap", {"results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
