"""Where to crop? Shuffled training batches with RandomResizedCrop(224) + flip, raw or jpeg, warm and cold.

The same compressed photos (640x480, ffmpeg -q:v 3), side by side in one run, each contender a full
shuffled epoch of batches on ``--device`` (median of the repeats, min-max kept). Every contender
but ``raw``, ``jpeg_full`` and ``jpeg_full_fast`` serves 224x224 crops drawn from torchvision's
``RandomResizedCrop`` distribution, flipped half the time (like for like):
- ``stock``: ``torch.utils.data.DataLoader`` over ``ImageFolder`` decoding with torchvision's
  ``decode_jpeg``, v2 ``RandomResizedCrop(224, antialias=True)`` + ``RandomHorizontalFlip`` per
  sample, ``num_workers`` = cores, ``pin_memory`` on CUDA, persistent workers: the stock loader at
  its best;
- ``spdl``: SPDL 0.8 (where it installs) decoding and cropping each image with FFmpeg filters in a
  thread pool of as many threads as cores;
- ``jpeg_crop``: a jpeg dataset, ``gpuload.DataLoader(decode=RandomResizedCropDecode(224))``
  (fast DCT; ``jpeg_crop_exact``: accurate DCT); ``jpeg_gpu_decode`` on CUDA (nvJPEG);
- ``raw_crop_host``: a raw dataset, ``decode=RandomResizedCropDecode(224)``: the loader's threads
  read each box's rows from the memmap and resize them (torch's antialiased uint8 resize);
- ``raw_crop_device``: a raw dataset, whole 640x480 batches to ``--device``, then
  ``transform=gpuload.RandomResizedCrop(224, flip=True)`` there (on a CPU device: a per-sample resize);
- ``raw``: the raw batches alone, whole 640x480 images (no crop: the store's own limit);
- ``jpeg_full``: the jpeg dataset decoded whole (640x480, no crop), what FFCV's jpg mode does
  (``jpeg_full_fast``: with libjpeg-turbo's fast DCT and fast upsampling; FFCV uses the fast DCT only).
Cold: before every epoch the contender's files are evicted from the page cache
(``posix_fadvise(POSIX_FADV_DONTNEED)``, gpuload's loaders made afresh so that nothing maps them),
so every byte comes from the disk. Warm: each contender's one loader serves every epoch, as in training.
The contenders take turns within each repeat (interleaved), so machine noise falls on all alike.
Also reported: MB/s read from the store, and each store's size on disk. And, for the jpeg store's
random reads, one ``pread`` per image against a mapping with ``MADV_RANDOM``, warm and cold. And, in
each warm repeat, the decoder alone: simplejpeg decoding the stored bytes (already in memory) in as
many threads as cores, accurate, fast DCT (FFCV's setting) and fast DCT + upsampling. FFCV does not
install with pip (it builds against a system OpenCV), so it is compared through that decoder: the
issue's run measured FFCV at 1,749 images/s where simplejpeg's accurate decode made 1,903 (quoted,
not measured here).

    python -m experiments.jpeg_store [--device cuda] [--images 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

import gpuload

from ._common import (
    add_device_argument,
    device_name,
    figure,
    median_spread,
    photo_folders,
    read_result,
    resolve_device,
    save_figure,
    synchronize,
    write_result,
)

SIZE = 224
# Quoted, not measured here: FFCV's jpg mode (fast DCT) and simplejpeg's accurate decode of the same
# 640x480 photos in 2 threads, in one run on this machine kind (issue 13's table): FFCV at 0.92 of
# that decoder. The like-for-like comparison is gpuload's accurate whole decode against it.
FFCV_QUOTED = {"ffcv": 1749, "simplejpeg_accurate": 1903}
DECODER_MODES = {
    "accurate": {},
    "fast_dct": {"fastdct": True},
    "fast_dct_upsample": {"fastdct": True, "fastupsample": True},
}


def evict(paths: list[Path]) -> float:
    """Drop the files' clean pages from the page cache (a page still mapped stays); returns the share
    of their bytes still resident afterwards (0 when the eviction worked)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    sizes = [path.stat().st_size for path in paths]
    return sum(resident_bytes(path) for path in paths) / max(1, sum(sizes))


def resident_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache, from ``mincore(2)`` on a fresh read-only mapping."""
    import ctypes

    size = path.stat().st_size
    if size == 0:
        return 0
    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                             ctypes.c_int, ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            pages = ctypes.create_string_buffer((size + page - 1) // page)
            if libc.mincore(ctypes.c_void_p(address), size, pages) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            return sum(byte & 1 for byte in pages.raw) * page
        finally:
            libc.munmap(ctypes.c_void_p(address), size)
    finally:
        os.close(fd)


class _TorchvisionJpeg:
    """ImageFolder's loader: the file's bytes decoded by torchvision's decode_jpeg (picklable)."""

    def __call__(self, path: str) -> torch.Tensor:
        import warnings

        from torchvision.io import decode_jpeg, read_file

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchvision 0.29 deprecates its decoders
            return decode_jpeg(read_file(path))


class Reused:
    """One loader for every epoch (the stock loader's persistent workers, SPDL's thread pool), made
    when first asked for and kept until ``close``."""

    def __init__(self, make) -> None:
        self.make, self.loader = make, None

    def __call__(self):
        if self.loader is None:
            self.loader = self.make()
        return self.loader

    def close(self) -> None:
        if hasattr(self.loader, "close"):
            self.loader.close()
        self.loader = None
        gc.collect()  # the stock loader's persistent iterator shuts its workers down when collected


def stock_loader(folder: Path, batch_size: int, device: torch.device):
    transform = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip()])
    dataset = ImageFolder(str(folder), loader=_TorchvisionJpeg(), transform=transform)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=gpuload.default_workers(),
        persistent_workers=True,
        pin_memory=device.type == "cuda",
    )


class SpdlLoader:
    """SPDL's FFmpeg decoding with a random crop + scale filter per image, in a thread pool (one
    batch at a time: SPDL's own pipeline, which overlaps batches, is not used)."""

    def __init__(self, folder: Path, batch_size: int, device: torch.device, image_size: tuple[int, int]) -> None:
        import spdl.io

        self.spdl, self.device, self.batch_size, self.image_size = spdl.io, device, batch_size, image_size
        self.files = sorted(folder.rglob("*.jpg"))
        self.pool = ThreadPoolExecutor(gpuload.default_workers())
        self.rng = np.random.default_rng(0)

    def close(self) -> None:
        self.pool.shutdown()

    def _load(self, item: tuple[Path, tuple[int, int, int, int], bool]) -> np.ndarray:
        path, (top, left, height, width), flip = item
        filters = f"crop={width}:{height}:{left}:{top},scale={SIZE}:{SIZE}" + (",hflip" if flip else "")
        return self.spdl.to_numpy(self.spdl.load_image(str(path), filter_desc=filters + ",format=rgb24"))

    def __iter__(self):
        order = self.rng.permutation(len(self.files))
        probe = torch.empty(1, *self.image_size)
        for start in range(0, len(order) - self.batch_size + 1, self.batch_size):
            items = [
                (
                    self.files[i],
                    v2.RandomResizedCrop.get_params(probe, [0.08, 1.0], [3 / 4, 4 / 3]),
                    self.rng.random() < 0.5,
                )
                for i in order[start : start + self.batch_size]
            ]
            batch = torch.from_numpy(np.stack(list(self.pool.map(self._load, items)))).permute(0, 3, 1, 2)
            yield batch.to(self.device, non_blocking=True), None


def contenders(
    folder: Path, raw: Path, jpeg: Path, batch_size: int, device: torch.device, image_size: tuple[int, int]
) -> dict:
    """name -> (a function making the loader of one epoch, the files it reads)."""
    sources = sorted(folder.rglob("*.jpg"))
    raw_files = [raw / "images.memmap"]
    jpeg_files = [jpeg / "data.memmap"]

    def ours(path: Path, **options):
        return lambda: gpuload.DataLoader(
            gpuload.MemmapImageDataset(path), batch_size, shuffle=True, drop_last=True, device=device, **options
        )

    found = {
        "stock": (Reused(lambda: stock_loader(folder, batch_size, device)), sources),
        "jpeg_crop": (ours(jpeg, decode=gpuload.RandomResizedCropDecode(SIZE)), jpeg_files),
        "jpeg_crop_exact": (ours(jpeg, decode=gpuload.RandomResizedCropDecode(SIZE, fast=False)), jpeg_files),
        "raw_crop_host": (ours(raw, decode=gpuload.RandomResizedCropDecode(SIZE)), raw_files),
        "raw_crop_device": (ours(raw, transform=gpuload.RandomResizedCrop(SIZE, flip=True)), raw_files),
        "raw": (ours(raw), raw_files),
        "jpeg_full": (ours(jpeg, decode=gpuload.CenterCropDecode(image_size, ratio=1.0)), jpeg_files),
        "jpeg_full_fast": (ours(jpeg, decode=gpuload.CenterCropDecode(image_size, ratio=1.0, fast=True)), jpeg_files),
    }
    if device.type == "cuda":
        found["jpeg_gpu_decode"] = (ours(jpeg, decode=gpuload.RandomResizedCropDecode(SIZE, gpu=True)), jpeg_files)
    try:
        import spdl.io  # noqa: F401
    except ImportError:
        print("  spdl is not installed (pip install gpuload[bench]): left out")
    except RuntimeError as error:  # installed, but the FFmpeg libraries it loads are missing
        print(f"  spdl does not load ({str(error)[:120]}...; Debian: apt-get install ffmpeg): left out")
    else:
        found["spdl"] = (Reused(lambda: SpdlLoader(folder, batch_size, device, image_size)), sources)
    return found


def epoch(make_loader, device: torch.device) -> tuple[float, int]:
    """Seconds and images of one epoch of the loader ``make_loader()`` gives."""
    loader = make_loader()
    synchronize(device)
    started = time.perf_counter()
    images = 0
    for batch, _ in loader:
        images += len(batch)
    synchronize(device)
    return time.perf_counter() - started, images


def decoder_rates(blobs: list[bytes], workers: int) -> dict[str, float]:
    """Images/s of simplejpeg alone decoding ``blobs`` (in memory) in ``workers`` threads, per mode."""
    import simplejpeg

    rates = {}
    with ThreadPoolExecutor(workers) as pool:
        for mode, options in DECODER_MODES.items():
            started = time.perf_counter()
            for _ in pool.map(partial(simplejpeg.decode_jpeg, **options), blobs):
                pass
            rates[mode] = len(blobs) / (time.perf_counter() - started)
    return rates


def read_rates(jpeg: Path, repeats: int) -> dict:
    """Every stored JPEG read once in a random order: one pread each against a MADV_RANDOM mapping."""
    dataset = gpuload.MemmapImageDataset(jpeg)
    starts, lengths = dataset.data.starts.tolist(), dataset.data.lengths.tolist()
    order = np.random.default_rng(0).permutation(len(dataset)).tolist()
    path = jpeg / "data.memmap"

    def with_pread() -> None:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for index in order:
            os.pread(fd, lengths[index], starts[index])
        os.close(fd)

    def with_mmap() -> None:
        with open(path, "rb") as file:
            mapping = mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ)
        mapping.madvise(mmap.MADV_RANDOM)
        for index in order:
            bytes(mapping[starts[index] : starts[index] + lengths[index]])
        mapping.close()

    rates: dict[str, list[float]] = {}
    for _ in range(repeats):
        for cache in ("warm", "cold"):
            for name, read in (("pread", with_pread), ("mmap_random", with_mmap)):
                if cache == "cold":
                    evict([path])
                started = time.perf_counter()
                read()
                rates.setdefault(f"{name}_{cache}", []).append(len(order) / (time.perf_counter() - started))
    return {name: median_spread(values) for name, values in rates.items()}


# What each contender does, for the plot and the README (every one crops to 224 and flips, but the
# whole-image references below the line).
LABELS = {
    "raw_crop_host": "raw, crop in the loader's threads",
    "raw_crop_device": "raw, whole batch, RandomResizedCrop on the device",
    "jpeg_crop": "jpeg, crop at decode (fast DCT)",
    "jpeg_crop_exact": "jpeg, crop at decode (accurate DCT)",
    "jpeg_gpu_decode": "jpeg, nvJPEG decode + crop on the GPU",
    "stock": "stock DataLoader(ImageFolder), workers",
    "spdl": "SPDL 0.8, FFmpeg crop + scale",
    "raw": "raw, whole 640x480 batches (no crop)",
    "jpeg_full": "jpeg, whole 640x480 decode (no crop)",
    "jpeg_full_fast": "jpeg, whole decode, fast DCT (no crop)",
}
WHOLE = ("raw", "jpeg_full", "jpeg_full_fast")  # not cropped: references, not contenders


def plot(result: dict) -> None:
    """Horizontal bars of the cropping contenders, warm and cold page cache, min-max whiskers."""
    rows = result["rows"]
    names = [name for name in LABELS if name not in WHOLE and any(row["contender"] == name for row in rows)]
    names.sort(key=lambda name: _row(rows, name, "warm")["images_per_second"]["median"])
    fig, axes = figure(1, 1, size=(900, 400))
    axis = axes[0][0]
    for offset, (cache, colour) in enumerate((("warm", "tab:blue"), ("cold", "tab:orange"))):
        spreads = [_row(rows, name, cache)["images_per_second"] for name in names]
        positions = np.arange(len(names)) + (0.5 - offset) * 0.4
        medians = [spread["median"] for spread in spreads]
        whiskers = [[m - s["min"] for m, s in zip(medians, spreads)], [s["max"] - m for m, s in zip(medians, spreads)]]
        axis.barh(positions, medians, 0.4, xerr=whiskers, color=colour, label=f"page cache {cache}", capsize=3)
        for y, value, stats in zip(positions, medians, spreads):
            axis.text(stats["max"], y, f"  {value:,.0f}", va="center", fontsize=18)  # right of the whisker
    axis.set_yticks(np.arange(len(names)), [LABELS[name] for name in names])
    axis.set_xlim(0, 1.25 * axis.get_xlim()[1])
    axis.set_xlabel("images/s (224x224 crops + flip)")
    axis.grid(True, axis="x", alpha=0.3)
    axis.legend(loc="lower right")
    whole = _row(rows, "raw", "warm")["images_per_second"]["median"]
    sizes = result["bytes_on_disk"]
    fig.suptitle(
        f"{result['images']} photos 640x480, batch {result['batch_size']}, on {result['device_name']}\n"
        f"on disk: raw {sizes['raw'] / 1e6:,.0f} MB, jpeg {sizes['jpeg'] / 1e6:,.0f} MB; "
        f"raw whole batches (no crop): {whole:,.0f}/s warm"
    )
    print(f"wrote {save_figure(fig, 'jpeg_store', result)}")


def _row(rows: list[dict], name: str, cache: str) -> dict:
    return next(row for row in rows if (row["contender"], row["cache"]) == (name, cache))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_device_argument(parser)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    parser.add_argument("--quick", action="store_true", help="few small images (a smoke test)")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args(argv)
    if args.plot_only:
        return plot(read_result("jpeg_store", args.device))
    device = resolve_device(args.device)
    size = (480, 640)
    if args.quick:
        args.images, args.batch_size, args.repeats, size = 100, 8, 1, (120, 160)
    _, folder = photo_folders(args.workdir, args.images, size)
    raw, jpeg = folder.with_suffix(".memmap"), folder.with_suffix(".jpeg")
    for out, store in ((raw, "raw"), (jpeg, "jpeg")):
        if not out.exists():
            gpuload.build_memmap(folder, out, format=store, progress=False)
    bytes_on_disk = {
        "source": sum(path.stat().st_size for path in folder.rglob("*.jpg")),
        "raw": sum(gpuload.MemmapImageDataset(raw).manifest.files.values()),
        "jpeg": sum(gpuload.MemmapImageDataset(jpeg).manifest.files.values()),
    }
    found = contenders(folder, raw, jpeg, args.batch_size, device, size)
    # Warm: each contender's one loader serves every epoch, as in training (workers, buffers and
    # mappings kept). Cold: gpuload's loaders made afresh each epoch, so that no mapping keeps the
    # evicted pages (the stock loader and SPDL map nothing). The contenders take turns within each
    # repeat, so that the shared machine's slow moments fall on all of them alike.
    warm = {name: make if isinstance(make, Reused) else Reused(make) for name, (make, _) in found.items()}
    for loader in warm.values():
        epoch(loader, device)  # warm-up: workers, pinned buffers, page cache
    dataset = gpuload.MemmapImageDataset(jpeg)
    blobs = [dataset.read_jpeg(index) for index in range(len(dataset))]
    del dataset  # its mapping would keep data.memmap's pages in the cache through the cold epochs
    decoder: dict[str, list[float]] = {}
    rates: dict[tuple[str, str], list[float]] = {}
    left_resident: list[float] = []  # after each cold eviction: must be ~0, or the epoch was not cold
    for cache in ("warm", "cold"):
        if cache == "cold":  # every warm loader closed first: contenders share files, and a mapping
            for name, (make_loader, _) in found.items():  # keeps the pages it maps in the cache
                if warm[name] is not make_loader:
                    warm[name].close()
            gc.collect()
        for repeat in range(args.repeats):
            for name, (make_loader, files) in found.items():
                if cache == "cold":
                    left_resident.append(evict(files))
                seconds, images = epoch(warm[name] if cache == "warm" else make_loader, device)
                rates.setdefault((name, cache), []).append(images / seconds)
            if cache == "warm":
                for mode, rate in decoder_rates(blobs, gpuload.default_workers()).items():
                    decoder.setdefault(mode, []).append(rate)
            print(f"  {cache} repeat {repeat + 1}: " + ", ".join(
                f"{name} {rates[name, cache][-1]:,.0f}" for name in found), flush=True)  # fmt: skip
    for loader in warm.values():
        loader.close()
    print(
        f"  after each cold eviction, at most {max(left_resident, default=0):.1%} of the files stayed in the page cache"
    )
    rows = []
    for (name, cache), values in rates.items():
        read_bytes = sum(path.stat().st_size for path in found[name][1])
        megabytes = [rate * read_bytes / args.images / 1e6 for rate in values]
        rows.append(
            {"contender": name, "cache": cache, "images_per_second": median_spread(values)}
            | {"megabytes_per_second": median_spread(megabytes)}
        )
        print(f"  {name:<16} {cache}  {rows[-1]['images_per_second']['median']:8,.0f} images/s")
    reads = read_rates(jpeg, args.repeats)
    for name, spread in reads.items():
        print(f"  read {name:<18} {spread['median']:10,.0f} images/s")
    decoder_spread = {mode: median_spread(values) for mode, values in decoder.items()}
    for mode, spread in decoder_spread.items():
        print(f"  simplejpeg alone, {mode:<18} {spread['median']:8,.0f} images/s")

    def warm_rate(name: str) -> float:
        return _row(rows, name, "warm")["images_per_second"]["median"]

    stock, ours = warm_rate("stock"), warm_rate("jpeg_crop")
    print(f"jpeg_crop = {ours / stock:.2f}x the stock loader with the same transform and workers (warm)")
    host, jpeg_crop = warm_rate("raw_crop_host"), warm_rate("jpeg_crop")
    print(
        f"bar: raw_crop_host = {host / jpeg_crop:.2f}x jpeg_crop (at least 3x), "
        f"{host / warm_rate('raw_crop_device'):.2f}x raw_crop_device, {host / stock:.2f}x stock (warm)"
    )
    accurate = decoder_spread["accurate"]["median"]
    ffcv_share = FFCV_QUOTED["ffcv"] / FFCV_QUOTED["simplejpeg_accurate"]
    for name in ("jpeg_full", "jpeg_full_fast"):
        print(
            f"{name} = {warm_rate(name) / accurate:.2f} of simplejpeg's accurate decode in this run "
            f"(FFCV, fast DCT: {ffcv_share:.2f} in a quoted run; at that share it would make {ffcv_share * accurate:,.0f} images/s here)"
        )
    print("bytes on disk: " + ", ".join(f"{k} {v / 1e6:,.1f} MB" for k, v in bytes_on_disk.items()))
    path = write_result(
        "jpeg_store",
        {
            "device": str(device),
            "device_name": device_name(device),
            "images": args.images,
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "workers": gpuload.default_workers(),
            "bytes_on_disk": bytes_on_disk,
            "cold_resident_after_evict": max(left_resident, default=0.0),
            "reads": reads,
            "decoder_alone": decoder_spread,
            "ffcv_quoted_not_measured": FFCV_QUOTED,
            "quick": args.quick,
            "rows": rows,
        },
    )
    print(f"wrote {path}")
    plot(read_result("jpeg_store", device))


if __name__ == "__main__":
    main()
