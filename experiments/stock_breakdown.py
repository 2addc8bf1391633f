"""Where the stock loader's time goes, per image on one thread: the steps a ``DataLoader(ImageFolder)``
worker does for every photo of every epoch, timed one by one.

On compressed photos (``photo_folders``: 640x480, ffmpeg -q:v 3), what the tuned stock recipe of
``experiments/jpeg_store.py`` does, medians of the repeats, in milliseconds per image:

- read: the file's bytes (``torchvision.io.read_file``), page cache warm;
- decode: ``torchvision.io.decode_jpeg``, the whole photo;
- crop: ``v2.RandomResizedCrop(224)`` and ``v2.RandomHorizontalFlip()`` on the decoded tensor;
- collate: ``default_collate`` of a batch of 64 (image, label) pairs, divided by 64;
- hand-over: the collated batch moved into shared memory (``share_memory_``), which is how a worker
  passes it to the main process (one copy per batch; no per-sample pickling), divided by 64.

The pinned copy to a GPU is not measured here (no GPU): ``transfer_order_cuda.json`` has it.

    python -m experiments.stock_breakdown [--images 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import default_collate
from torchvision.io import decode_jpeg, read_file
from torchvision.transforms import v2

from ._common import figure, median_spread, photo_folders, read_result, save_figure, write_result

__all__ = ["BATCH", "STEPS", "main", "measure", "plot"]

BATCH = 64
# The steps in the order a worker does them, with the label the plot and the talk give them.
STEPS = {
    "read": "read the file",
    "decode": "decode the JPEG",
    "crop": "crop, resize, flip",
    "collate": "collate the batch",
    "hand_over": "to shared memory",
}


def measure(paths: list[Path], repeats: int) -> dict[str, dict]:
    """Milliseconds per image of each of :data:`STEPS` over ``paths``: ``{step: median_spread}``.

    Example:
        >>> sorted(measure([], 1)) == sorted(STEPS)
        True
    """
    augment = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])
    runs: dict[str, list[float]] = {name: [] for name in STEPS}
    if not paths:
        return {name: median_spread([0.0]) for name in STEPS}
    for _ in range(repeats):
        started = time.perf_counter()
        blobs = [read_file(str(path)) for path in paths]
        runs["read"].append(time.perf_counter() - started)
        started = time.perf_counter()
        images = [decode_jpeg(blob) for blob in blobs]
        runs["decode"].append(time.perf_counter() - started)
        started = time.perf_counter()
        crops = [augment(image) for image in images]
        runs["crop"].append(time.perf_counter() - started)
        samples = [(crop, index % 10) for index, crop in enumerate(crops)]
        batches = [samples[start : start + BATCH] for start in range(0, len(samples) - BATCH + 1, BATCH)]
        started = time.perf_counter()
        collated = [default_collate(batch) for batch in batches]
        runs["collate"].append((time.perf_counter() - started) * len(samples) / (len(batches) * BATCH))
        started = time.perf_counter()
        for images_batch, labels in collated:
            images_batch.share_memory_()
            labels.share_memory_()
        runs["hand_over"].append((time.perf_counter() - started) * len(samples) / (len(batches) * BATCH))
    return {name: median_spread([1e3 * seconds / len(paths) for seconds in values]) for name, values in runs.items()}


def plot(result: dict) -> None:
    """One horizontal stacked bar of the steps, and one bar per step (medians, min-max whiskers)."""
    steps = result["ms_per_image"]
    fig, axes = figure(1, 1, size=(900, 330))
    axis = axes[0][0]
    colours = ("tab:gray", "tab:red", "tab:orange", "tab:blue", "tab:purple")
    total = sum(steps[name]["median"] for name in STEPS)
    for y, (name, colour) in enumerate(zip(STEPS, colours)):
        spread = steps[name]
        median = spread["median"]
        axis.barh(y, median, xerr=[[median - spread["min"]], [spread["max"] - median]], capsize=3, color=colour)
        axis.text(spread["max"], y, f"  {median:.2f} ms ({median / total:.0%})", va="center")
    axis.set_yticks(range(len(STEPS)), list(STEPS.values()))
    axis.invert_yaxis()
    axis.set_xlim(0, 1.45 * axis.get_xlim()[1])
    axis.set_xlabel("ms per image, one thread")
    axis.grid(True, axis="x", alpha=0.3)
    axis.set_title(f"The stock recipe, step by step: {total:.2f} ms an image, every epoch", loc="left")
    print(f"wrote {save_figure(fig, 'stock_breakdown', result)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=320)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    parser.add_argument("--quick", action="store_true", help="few small images (a smoke test)")
    parser.add_argument("--plot-only", action="store_true", help="re-plot the last results")
    args = parser.parse_args(argv)
    if args.plot_only:
        return plot(read_result("stock_breakdown"))
    if args.quick:
        args.images, args.repeats = BATCH, 1
    _, folder = photo_folders(args.workdir, args.images, (480, 640))
    paths = sorted(folder.rglob("*.jpg"))[: args.images]
    torch.set_num_threads(1)
    rows = measure(paths, args.repeats)
    for name, spread in rows.items():
        print(f"  {STEPS[name]:<22} {spread['median']:6.3f} ms per image")
    write_result(
        "stock_breakdown",
        {"images": len(paths), "image_size": [480, 640], "batch_size": BATCH, "threads": 1,
         "repeats": args.repeats, "quick": args.quick, "ms_per_image": rows},
    )  # fmt: skip
    plot(read_result("stock_breakdown"))


if __name__ == "__main__":
    main()
