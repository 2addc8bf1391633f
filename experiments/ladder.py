"""The ladder, one chart: what each step from the stock loader to gpuload wins, drawn from a committed
``memmap_vs_folder`` result (whole 640x480 images, page cache warm), nothing measured here.

Rungs, left to right: the stock ``DataLoader(ImageFolder)`` on the JPEGs; the photos decoded once, the
same memmap through the stock ``DataLoader`` with a ``Collate`` (each batch collated in a worker and
handed over through shared memory); ``gpuload.DataLoader``'s threads (on a GPU, with its reused pinned
buffers and side-stream copy). One bar per batch size; above each rung, what it wins over the one before.

    python -m experiments.ladder [--device cpu|cuda]    # assets/ladder.png (ladder_cuda.png)
"""

from __future__ import annotations

import argparse

import numpy as np

from ._common import figure, legend_right, read_result, save_figure
from .numbers import times

__all__ = ["RUNGS", "plot", "rates"]

RUNGS = {
    "image_folder": "stock loader,\nJPEGs",
    "talk_recipe": "decoded once:\nstock loader\n+ Collate",
    "gpuload": "gpuload's\nthreads",
}
SIZE = (480, 640)  # (height, width) of the rungs' images


def rates(result: dict) -> dict[int, list[float]]:
    """Median images/s of each rung, by batch size, at ``SIZE``.

    Example:
        >>> row = lambda name, rate: {"height": 480, "width": 640, "batch_size": 16, "contender": name,
        ...                           "images_per_second": {"median": rate}}
        >>> rates({"rows": [row("image_folder", 1.0), row("talk_recipe", 20.0), row("gpuload", 30.0)]})
        {16: [1.0, 20.0, 30.0]}
    """
    by = {
        (row["batch_size"], row["contender"]): row["images_per_second"]["median"]
        for row in result["rows"]
        if (row["height"], row["width"]) == SIZE
    }
    batches = sorted({batch for batch, _ in by})
    return {batch: [by[batch, rung] for rung in RUNGS] for batch in batches}


def plot(result: dict) -> None:
    """Bars per rung and batch size (log scale), each bar's rate on it and, above each rung, its gain."""
    found = rates(result)
    fig, axes = figure(1, 1, size=(900, 330))
    axis = axes[0][0]
    width = 0.8 / len(found)
    positions = np.arange(len(RUNGS))
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:purple")
    for offset, ((batch, values), colour) in enumerate(zip(found.items(), colours)):
        x = positions + (offset - (len(found) - 1) / 2) * width
        axis.bar(x, values, width, color=colour, label=f"batch {batch}")
        for x_bar, value in zip(x, values):
            axis.text(x_bar, value, f"{value:,.0f}", ha="center", va="bottom", rotation=90)
    top = max(max(values) for values in found.values())
    for rung in range(1, len(RUNGS)):
        gains = [values[rung] / values[rung - 1] for values in found.values()]
        axis.text(rung - 0.5, top * 150, f"{times(min(gains))}-{times(max(gains))}", ha="center", va="center")
    axis.set_yscale("log")
    bottom = axis.get_ylim()[0]
    axis.set_yticks([10.0**power for power in range(int(np.floor(np.log10(bottom))), int(np.ceil(np.log10(top))) + 1)])
    axis.set_ylim(bottom, top * 400)  # room for the gains, above the ticks of the rates
    axis.set_xticks(positions, list(RUNGS.values()))
    axis.set_ylabel("images/s (log)")
    axis.grid(True, axis="y", alpha=0.3)
    right = legend_right(fig, axis)
    device = result["device_names"][result["device"]] if "device_names" in result else result["device"]
    axis.set_title(f"Whole {SIZE[1]}x{SIZE[0]} batches to {device}, page cache warm", loc="left")
    print(f"wrote {save_figure(fig, 'ladder', result, statistics='medians', right=right)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    plot(read_result("memmap_vs_folder", args.device))


if __name__ == "__main__":
    main()
