"""Loading shuffled batches onto a device: ImageFolder, the talk's tensorclass recipe, and ``gpuload.DataLoader``.

For each device, image size and batch size, on the same compressed photos (ffmpeg -q:v 3):

- ``image_folder``: ``ImageFolder`` + ``torch.utils.data.DataLoader``, PIL decode and ``PILToTensor``
  in worker processes (all cores), batches moved to the device;
- ``talk_recipe``: the memmap dataset + stock ``DataLoader`` with ``gpuload.Collate(device)``;
- ``gpuload``: ``gpuload.DataLoader(device=...)``.

Page cache warm (one untimed epoch per contender), images/s as the median (min-max) of timed
epochs, device synchronised at the end of each epoch, contenders in the same run.

    python -m experiments.memmap_vs_folder --image-sizes 384x384 640x480 --batch-sizes 16 64 256
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torchvision.datasets import ImageFolder
from torchvision.transforms import PILToTensor

import gpuload

from ._common import (
    add_device_argument,
    device_name,
    figure,
    layout,
    legend_right,
    median_spread,
    parse_sizes,
    photo_folders,
    read_result,
    resolve_device,
    save_figure,
    synchronize,
    write_result,
)

CONTENDERS = ("image_folder", "talk_recipe", "gpuload")


def loaders(folder: Path, dataset: gpuload.MemmapImageDataset, batch_size: int, device: torch.device) -> dict:
    workers = gpuload.default_workers()
    folder_dataset = ImageFolder(str(folder), transform=PILToTensor())
    return {
        "image_folder": torch.utils.data.DataLoader(
            folder_dataset,
            batch_size,
            shuffle=True,
            drop_last=True,
            num_workers=workers,
            persistent_workers=True,
            pin_memory=device.type == "cuda",
        ),
        "talk_recipe": torch.utils.data.DataLoader(
            dataset, batch_size, shuffle=True, drop_last=True, collate_fn=gpuload.Collate(device)
        ),
        "gpuload": gpuload.DataLoader(dataset, batch_size, shuffle=True, drop_last=True, device=device),
    }


def epoch_rate(loader, device: torch.device) -> float:
    synchronize(device)
    started = time.perf_counter()
    images = 0
    for batch, labels in loader:
        batch, labels = batch.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        images += len(batch)
    synchronize(device)
    return images / (time.perf_counter() - started)


def plot(result: dict) -> None:
    """One panel, one log axis: a group of bars per device, image size and batch size, one bar per
    contender (median, min-max whiskers, the rate written on it)."""
    rows = result["rows"]
    labels = {
        "image_folder": "ImageFolder +\nDataLoader (JPEGs)",
        "talk_recipe": "DataLoader +\nCollate (memmap)",
        "gpuload": "gpuload.DataLoader\n(memmap)",
    }
    devices = sorted({row["device"] for row in rows})
    groups = sorted({(row["device"], row["height"] * row["width"], row["height"], row["width"], row["batch_size"])
                     for row in rows})  # fmt: skip
    by = {(r["device"], r["height"], r["width"], r["batch_size"], r["contender"]): r for r in rows}
    fig, axes = figure(1, 1)
    axis = axes[0][0]
    width = 0.8 / len(CONTENDERS)
    positions = np.arange(len(groups))
    for offset, (contender, colour) in enumerate(zip(CONTENDERS, ("tab:gray", "tab:orange", "tab:green"))):
        spreads = [by[d, h, w, b, contender]["images_per_second"] for d, _, h, w, b in groups]
        medians = np.array([spread["median"] for spread in spreads])
        whiskers = [medians - [s["min"] for s in spreads], [s["max"] for s in spreads] - medians]
        x = positions + (offset - (len(CONTENDERS) - 1) / 2) * width
        axis.bar(x, medians, width, yerr=whiskers, capsize=3, color=colour, label=labels[contender])
        for x_bar, value, spread in zip(x, medians, spreads):  # upright, above the whisker: bars are narrow
            axis.text(x_bar, spread["max"], f" {value:,.0f}", ha="center", va="bottom", fontsize=18, rotation=90)
    names = [f"{w}x{h}\nbatch {b}" + (f"\n{d}" if len(devices) > 1 else "") for d, _, h, w, b in groups]
    axis.set_xticks(positions, names)
    axis.set_yscale("log")
    axis.set_ylabel("images/s (log scale)")
    axis.grid(True, axis="y", which="major", alpha=0.3)
    right = legend_right(fig, axis)
    names = " and ".join(result["device_names"][device] for device in devices)
    axis.set_title(f"Shuffled batches of {result['images']} photos (page cache warm) to {names}", loc="left")
    epochs = "/".join(map(str, sorted({len(row["images_per_second"]["runs"]) for row in rows})))
    statistics = f"bars: medians of {epochs} timed epochs, whiskers: min-max"
    _fit_texts(fig, axis, result, statistics, right)
    print(f"wrote {save_figure(fig, 'memmap_vs_folder', result, statistics=statistics, right=right)}")


def _fit_texts(fig, axis, result: dict, statistics: str, right: float) -> None:
    """Raise the top of ``axis``'s log y axis until the texts on it (the rates) end inside it, in the
    layout that :func:`save_figure` gives the figure (its footnote below, panels up to ``right``)."""
    renderer = fig.canvas.get_renderer()
    for _ in range(20):
        layout(fig, result, statistics, right=right)
        box = axis.get_window_extent(renderer)
        over = max(text.get_window_extent(renderer).y1 for text in axis.texts) - box.y1
        if over <= -6:
            return
        bottom, top = axis.get_ylim()
        decades = (over + 8) / box.height * (np.log10(top) - np.log10(bottom))  # in the current scale
        axis.set_ylim(bottom, top * 10**decades)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_device_argument(parser)
    parser.add_argument("--image-sizes", nargs="+", default=["384x384", "640x480"], help="WIDTHxHEIGHT")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[16, 64, 256])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    parser.add_argument("--quick", action="store_true", help="few small images (a smoke test)")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args(argv)
    if args.plot_only:
        return plot(read_result("memmap_vs_folder", args.device))
    if args.quick:
        args.image_sizes, args.batch_sizes, args.images, args.epochs = ["160x120"], [8, 32], 200, 2
    device = resolve_device(args.device)
    rows = []
    for size in parse_sizes(args.image_sizes):
        _, folder = photo_folders(args.workdir, args.images, size)
        out = folder.with_suffix(".memmap")
        if not out.exists():
            gpuload.build_memmap(folder, out, progress=False)
        dataset = gpuload.MemmapImageDataset(out)
        for batch_size in args.batch_sizes:
            for contender, loader in loaders(folder, dataset, batch_size, device).items():
                epoch_rate(loader, device)  # warm-up
                rates = [epoch_rate(loader, device) for _ in range(args.epochs)]
                spread = median_spread(rates)
                rows.append(
                    {"device": str(device), "height": size[0], "width": size[1], "batch_size": batch_size}
                    | {"contender": contender, "images_per_second": spread}
                )
                print(
                    f"  {device} {size[1]}x{size[0]} B={batch_size:<4} {contender:<13} {spread['median']:9.0f} images/s"
                )
    names = {str(device): device_name(device)}
    path = write_result(
        "memmap_vs_folder",
        {"device": str(device), "images": len(dataset), "device_names": names, "quick": args.quick, "rows": rows},
    )
    print(f"wrote {path}")
    plot(read_result("memmap_vs_folder", device))


if __name__ == "__main__":
    main()
