"""JPEG decoders side by side: which libjpeg-turbo wrapper decodes real photos fastest, in threads?

The same compressed photos (640x480, ffmpeg -q:v 3), their bytes already in memory, each decoded to
RGB uint8 by every candidate that installs, with 1 thread and with all cores (a thread pool; all of
them release the GIL), interleaved, median of the repeats (min-max kept):
Pillow (``open``/``convert("RGB")``), ``torchvision.io.decode_jpeg``, TorchCodec's ``decode_jpeg``,
simplejpeg (accurate DCT, the pixels of a full decode; fast DCT + fast upsampling; and at 1/2 scale
in the DCT domain), OpenCV's ``imdecode`` and SPDL's ``load_image`` (FFmpeg).

    python -m experiments.decoders --images 600 --repeats 3
"""

from __future__ import annotations

import argparse
import io
import tempfile
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import gpuload

from ._common import elapsed, figure, median_spread, photo_folders, read_result, save_figure, write_result


def candidates() -> dict[str, Callable[[bytes], object]]:
    """name -> a function of a JPEG's bytes returning RGB pixels, for every decoder that imports."""
    from PIL import Image

    found: dict[str, Callable[[bytes], object]] = {
        "pillow": lambda data: np.asarray(Image.open(io.BytesIO(data)).convert("RGB")),
    }
    try:
        import torch
        from torchvision.io import decode_jpeg

        found["torchvision"] = lambda data: decode_jpeg(torch.frombuffer(data, dtype=torch.uint8))
    except ImportError:
        pass
    try:
        import torch
        from torchcodec.decoders import decode_jpeg as torchcodec_decode

        found["torchcodec"] = lambda data: torchcodec_decode(torch.frombuffer(data, dtype=torch.uint8))
    except (ImportError, RuntimeError, OSError):
        pass
    import simplejpeg

    found["simplejpeg"] = lambda data: simplejpeg.decode_jpeg(data)
    found["simplejpeg_fast"] = lambda data: simplejpeg.decode_jpeg(data, fastdct=True, fastupsample=True)
    found["simplejpeg_half_scale"] = _half_scale
    try:
        import cv2

        found["opencv"] = lambda data: cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB)
    except (ImportError, AttributeError):
        pass
    try:
        import spdl.io

        found["spdl"] = lambda data: spdl.io.to_numpy(spdl.io.load_image(data))  # default filter: RGB24
    except (ImportError, AttributeError, OSError):
        pass
    return found


def _half_scale(data: bytes) -> object:
    """simplejpeg at 1/2 scale: the smallest scale that keeps at least half of each side (``min_factor``
    alone does not scale: without a minimum size simplejpeg keeps the full one)."""
    import simplejpeg

    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    return simplejpeg.decode_jpeg(data, min_height=-(-height // 2), min_width=-(-width // 2))


def rate(decode: Callable[[bytes], object], blobs: list[bytes], threads: int) -> float:
    if threads == 1:
        return len(blobs) / elapsed(lambda: [decode(blob) for blob in blobs])
    with ThreadPoolExecutor(threads) as pool:
        return len(blobs) / elapsed(lambda: list(pool.map(decode, blobs)))


def plot(result: dict) -> None:
    rows = result["rows"]
    fig, axes = figure(1, 1)
    axis = axes[0][0]
    names = list(dict.fromkeys(row["decoder"] for row in rows))
    counts = sorted({row["threads"] for row in rows})
    width = 0.8 / len(counts)
    for offset, threads in enumerate(counts):
        values = [next(r for r in rows if r["decoder"] == n and r["threads"] == threads) for n in names]
        positions = np.arange(len(names)) + offset * width
        spreads = [v["images_per_second"] for v in values]
        medians = np.array([spread["median"] for spread in spreads])
        highs = np.array([spread["max"] for spread in spreads])
        whiskers = [medians - [spread["min"] for spread in spreads], highs - medians]  # min-max of the repeats
        label = f"{threads} thread{'s' * (threads > 1)}"
        axis.bar(positions, medians, width, yerr=whiskers, capsize=3, label=label)
        for x, value, high in zip(positions, medians, highs):  # the median, written above its whisker
            axis.text(x, high, f" {value:,.0f}", ha="center", va="bottom", fontsize=18, rotation=90)
    ticks = [name.replace("simplejpeg_", "simplejpeg\n").replace("_", " ") for name in names]
    axis.set_xticks(np.arange(len(names)) + width * (len(counts) - 1) / 2, ticks)
    axis.set_ylim(0, 1.3 * axis.get_ylim()[1])
    axis.set_ylabel("images/s (RGB uint8)")
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend()
    height, width_px = result["image_size"]
    machine = result["machine"]
    fig.suptitle(
        f"Decoding {result['images']} photos of {width_px}x{height} from memory, "
        f"on cpu ({machine['cpu']}, {machine['cores']} cores)"
    )
    repeats = {len(row["images_per_second"]["runs"]) for row in rows}
    statistics = f"bars: medians of {'/'.join(map(str, sorted(repeats)))} repeats, whiskers: min-max"
    print(f"wrote {save_figure(fig, 'decoders', result, statistics=statistics)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    parser.add_argument("--quick", action="store_true", help="few small images (a smoke test)")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args(argv)
    if args.plot_only:
        return plot(read_result("decoders"))
    size = (480, 640)
    if args.quick:
        args.images, args.repeats, size = 40, 1, (120, 160)
    _, folder = photo_folders(args.workdir, args.images, size)
    blobs = [path.read_bytes() for path in sorted(folder.rglob("*.jpg"))][: args.images]
    decoders = candidates()
    cores = gpuload.default_workers()
    runs: dict[tuple[str, int], list[float]] = {(name, t): [] for name in decoders for t in sorted({1, cores})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchvision 0.29 deprecates its decoders
        for decode in decoders.values():
            decode(blobs[0])  # imports, thread pools
        for repeat in range(args.repeats):  # interleaved: a slow moment of the machine hits every decoder
            for (name, threads), values in runs.items():
                values.append(rate(decoders[name], blobs, threads))
            print(
                f"  repeat {repeat + 1}: " + ", ".join(f"{n}/{t} {v[-1]:.0f}" for (n, t), v in runs.items()), flush=True
            )
    rows = [
        {"decoder": name, "threads": threads, "images_per_second": median_spread(values)}
        for (name, threads), values in runs.items()
    ]
    for row in rows:
        print(f"  {row['decoder']:<22} {row['threads']} threads {row['images_per_second']['median']:8,.0f} images/s")
    path = write_result(
        "decoders",
        {
            "images": len(blobs),
            "image_size": list(size),
            "mean_file_bytes": sum(map(len, blobs)) / len(blobs),
            "cpu": gpuload.machine_line(),
            "quick": args.quick,
            "rows": rows,
        },
    )
    print(f"wrote {path}")
    plot(read_result("decoders"))


if __name__ == "__main__":
    main()
