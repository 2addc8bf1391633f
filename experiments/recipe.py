"""torchvision's reference training transform, two ways: per image in worker processes, or gpuload's recipe.

The transform of torchvision's classification reference (its ResNet-50 "new recipe"): RandomResizedCrop
224 (bilinear, antialiased) and a horizontal flip, TrivialAugmentWide (bilinear), ToDtype + Normalize,
RandomErasing (p=0.1), and MixUp 0.2 or CutMix 1.0 per batch. The same photos (real photographs at
ImageNet-like sizes, stored as JPEG: :mod:`experiments._photos`), in one run:
- ``stock``: ``torch.utils.data.DataLoader`` over ``ImageFolder`` with the reference's v2 transforms per
  image (Pillow backend, as the reference's default) and MixUp/CutMix in its ``collate_fn``, in
  ``num_workers`` = cores worker processes (persistent; ``pin_memory`` on CUDA): the stock loader at its best;
- ``gpuload``: a jpeg dataset of the same files, ``gpuload.Recipe.torchvision(crop="loader")``: the crop
  and flip at decode time in the loader's threads, then the rest batched on the device (here: the CPU).
For each: images/s over whole epochs (a warm-up epoch first) and the CPU time the loading took, in
core-seconds per 1,000 images: user + system time of this process and its workers (``/proc``), which is
what a GPU node's cores must supply. Nothing trains: both produce the model's float input and soft targets.
On the CPU the recipe's batched ops run with one intra-op thread (``torch.set_num_threads(1)``), as torch
runs each worker process of the stock loader: more threads make them no faster here and spin in OpenMP.

    python -m experiments.recipe [--images 600] [--batch-size 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from torchvision.datasets import ImageFolder
from torchvision.transforms import InterpolationMode, v2

import gpuload

from ._common import (
    _process_tree,
    add_device_argument,
    device_name,
    figure,
    median_spread,
    read_result,
    resolve_device,
    save_figure,
    synchronize,
    write_result,
)
from ._photos import CAMERA_QUALITY, make_photo_set

SIZE = 224


def stock_loader(folder: Path, classes: int, batch_size: int, device: torch.device) -> torch.utils.data.DataLoader:
    """torchvision's reference ``ClassificationPresetTrain`` and its MixUp/CutMix collate, in workers."""
    bilinear = InterpolationMode.BILINEAR
    transform = v2.Compose(
        [
            v2.RandomResizedCrop(SIZE, interpolation=bilinear, antialias=True),
            v2.RandomHorizontalFlip(0.5),
            v2.TrivialAugmentWide(interpolation=bilinear),
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(gpuload.IMAGENET_MEAN, gpuload.IMAGENET_STD),
            v2.RandomErasing(0.1),
            v2.ToPureTensor(),
        ]
    )
    return torch.utils.data.DataLoader(
        ImageFolder(str(folder), transform=transform),
        batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=gpuload.default_workers(),
        persistent_workers=True,
        pin_memory=device.type == "cuda",
        collate_fn=_MixCollate(classes),
    )


class _MixCollate:
    """The reference's collate: ``default_collate``, then MixUp 0.2 or CutMix 1.0 (a picklable class)."""

    def __init__(self, classes: int) -> None:
        self.mix = v2.RandomChoice(
            [v2.MixUp(alpha=0.2, num_classes=classes), v2.CutMix(alpha=1.0, num_classes=classes)]
        )

    def __call__(self, batch):
        return self.mix(*torch.utils.data.default_collate(batch))


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and every process below it (the loader's workers), so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in _process_tree(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
        except (OSError, IndexError):
            continue
    return total / ticks


def epoch(batches, device: torch.device, step=None) -> int:
    """Run one epoch of ``batches`` to the model's input; returns the images it produced."""
    count = 0
    for images, labels in batches:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if step is not None:
            images, labels = step(images, labels)
        count += len(images)
    synchronize(device)
    return count


def measure(name: str, loader, device: torch.device, step, repeats: int) -> dict:
    epoch(loader, device, step)  # warm-up: workers started, files in the page cache
    rates, costs = [], []
    for repeat in range(repeats):
        cpu, started = cpu_seconds(), time.perf_counter()
        images = epoch(loader, device, step)
        seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
        rates.append(images / seconds)
        costs.append(1000 * cpu / images)
        print(f"  {name:<8} repeat {repeat + 1}: {rates[-1]:7,.0f} images/s, {costs[-1]:6.1f} core-s / 1,000 images")
    return {"contender": name, "images_per_second": median_spread(rates), "core_seconds_per_1000": median_spread(costs)}


def plot(result: dict) -> None:
    """images/s and core-seconds per 1,000 images of each contender (medians, min-max whiskers)."""
    rows = result["rows"]
    fig, axes = figure(1, 2)
    labels = {
        "stock": "DataLoader,\nv2 per image\nin workers",
        "gpuload": "gpuload Recipe,\ncrop in threads,\nrest batched",
    }
    names = [labels.get(row["contender"], row["contender"]) for row in rows]
    for axis, key, title in (
        (axes[0][0], "images_per_second", "images/s (higher is better)"),
        (axes[0][1], "core_seconds_per_1000", "core-seconds per 1,000 images (lower is better)"),
    ):
        spreads = [row[key] for row in rows]
        medians = [spread["median"] for spread in spreads]
        whiskers = [[m - s["min"] for m, s in zip(medians, spreads)], [s["max"] - m for m, s in zip(medians, spreads)]]
        axis.barh(names, medians, xerr=whiskers, capsize=4, color=["tab:gray", "tab:green"][: len(rows)])
        for y, value in enumerate(medians):
            axis.text(value * 0.03, y, f"{value:,.0f}" if value >= 100 else f"{value:.1f}", va="center", color="white")
        axis.invert_yaxis()
        axis.set_title(title)
        axis.grid(True, axis="x", alpha=0.3)
    axes[0][1].set_yticks([])
    where = "on the CPU (not measured on a GPU)" if result["device"] == "cpu" else f"on {result['device']}"
    fig.suptitle(
        f"torchvision's reference training transform, batch {result['batch_size']}, {where}: {result['device_name']}"
    )
    print(f"wrote {save_figure(fig, 'recipe', result, 'medians of the timed epochs, whiskers: min-max')}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_device_argument(parser)
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    parser.add_argument("--quick", action="store_true", help="a few photos, one repeat (a smoke test)")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args(argv)
    if args.plot_only:
        return plot(read_result("recipe", args.device))
    device = resolve_device(args.device)
    if args.quick:
        args.images, args.batch_size, args.repeats = 40, 8, 1
    originals = args.workdir / f"photos-{args.images}-varied"  # the JPEGs as photographed: no re-encode
    if not originals.exists():
        make_photo_set(originals, args.images)  # made under a temporary name, renamed when complete
    store = args.workdir / f"{originals.name}.jpeg"
    if not store.exists():
        gpuload.build_memmap(originals, store, format="jpeg", progress=False)
    dataset = gpuload.MemmapImageDataset(store)
    classes = len(dataset.classes)
    torch.manual_seed(0)
    recipe = gpuload.Recipe.torchvision(classes, crop="loader", label_smoothing=0.0).to(device)
    ours = recipe.loader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True, seed=0, device=device)
    stock = measure("stock", stock_loader(originals, classes, args.batch_size, device), device, None, args.repeats)
    threads = torch.get_num_threads()
    if device.type == "cpu":  # one intra-op thread for the batched ops, as torch gives each stock worker
        torch.set_num_threads(1)
    rows = [stock, measure("gpuload", ours, device, recipe, args.repeats)]
    torch.set_num_threads(threads)
    stock, gpu = (row["images_per_second"]["median"] for row in rows)
    print(f"gpuload: {gpu / stock:.2f}x the stock loader's images/s")
    path = write_result(
        "recipe",
        {
            "device": str(device),
            "device_name": device_name(device),
            "batch_size": args.batch_size,
            "images": len(dataset),
            "workers": gpuload.default_workers(),
            "photos": f"{len(dataset):,} crops of real photographs at ImageNet-like sizes (experiments._photos), "
            f"JPEG quality {CAMERA_QUALITY} as made",
            "recipe_torch_threads": 1 if device.type == "cpu" else threads,
            "quick": args.quick,
            "rows": rows,
        },
    )
    print(f"wrote {path}")
    plot(read_result("recipe", device))


if __name__ == "__main__":
    main()
