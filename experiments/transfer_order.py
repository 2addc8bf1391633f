"""cuda-first (``x.to(device).half()``) against half-first (``x.half().to(device)``) for uint8 batches.

For each image size and batch size, a uint8 batch ``[B, 3, H, W]`` in host memory (pageable, and
pinned where CUDA is there) is sent to the device and cast to float16 in both orders, timed with
``torch.utils.benchmark.Timer.blocked_autorange`` (which synchronises CUDA). Half-first moves 2 bytes
per value over the bus instead of 1 and casts on the CPU. On a machine without a GPU, the
"transfer" is ``x.to("cpu", copy=True)``: a copy into new host memory, which stands in for it.

    python -m experiments.transfer_order --image-sizes 384x384 640x480 1280x960 --batch-sizes 8 16 32 64
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.benchmark import Timer

from ._common import (
    add_device_argument,
    batch_ticks,
    device_name,
    figure,
    legend_right,
    median_spread,
    parse_sizes,
    read_result,
    resolve_device,
    save_figure,
    write_result,
)

ORDERS = {
    "cuda_first": "x.to(device, non_blocking=pinned, copy=True).half()",
    "half_first": "x.half().to(device, non_blocking=pinned, copy=True)",
}


def measure(
    device: torch.device, sizes: list[tuple[int, int]], batch_sizes: list[int], min_run_time: float
) -> list[dict]:
    memories = ["pageable", "pinned"] if device.type == "cuda" else ["pageable"]
    rows = []
    for height, width in sizes:
        for batch_size in batch_sizes:
            for memory in memories:
                x = torch.randint(0, 256, (batch_size, 3, height, width), dtype=torch.uint8)
                if memory == "pinned":
                    x = x.pin_memory()
                for order, statement in ORDERS.items():
                    timer = Timer(
                        statement,
                        globals={"x": x, "device": device, "pinned": memory == "pinned"},
                        num_threads=torch.get_num_threads(),
                    )
                    measurement = timer.blocked_autorange(min_run_time=min_run_time)
                    rows.append(
                        {
                            "height": height,
                            "width": width,
                            "batch_size": batch_size,
                            "memory": memory,
                            "order": order,
                            "seconds": median_spread(measurement.times),
                        }
                    )
                    print(
                        f"  {width}x{height} B={batch_size:<3} {memory:<8} {order:<10} {measurement.median * 1e3:8.2f} ms"
                    )
    return rows


def plot(result: dict) -> None:
    """One panel: the time of cast-then-copy over the time of copy-then-cast, per batch size, one line per
    image size (and memory): above 1, casting first is slower."""
    rows = result["rows"]
    kind = result["device"].split(":")[0]
    fig, axes = figure()
    axis = axes[0][0]
    timed = {(r["height"], r["width"], r["memory"], r["batch_size"], r["order"]): r["seconds"] for r in rows}
    memories = sorted({row["memory"] for row in rows})
    styles = iter(["-o", "--s", "-.^", ":D", "-v", "--P"])
    for height, width in sorted({(row["height"], row["width"]) for row in rows}):
        for memory in memories:
            batches = sorted(b for h, w, m, b, o in timed if (h, w, m, o) == (height, width, memory, "cuda_first"))
            if not batches:
                continue
            first = [timed[height, width, memory, batch, "cuda_first"] for batch in batches]
            half = [timed[height, width, memory, batch, "half_first"] for batch in batches]
            label = f"{width}x{height}" + (f", {memory}" if len(memories) > 1 else "")
            axis.plot(batches, [h["median"] / c["median"] for h, c in zip(half, first)], next(styles), label=label)
            low = [h["min"] / c["max"] for h, c in zip(half, first)]
            axis.fill_between(batches, low, [h["max"] / c["min"] for h, c in zip(half, first)], alpha=0.15)
    axis.axhline(1.0, color="0.3", linestyle=":", linewidth=1.5)
    axis.text(0.01, 0.97, "above 1: casting first is slower", transform=axis.transAxes, va="top")
    if kind == "cpu":
        axis.text(0.01, 0.86, ".to(cpu): a copy into new host memory, standing in for the bus",
                  transform=axis.transAxes, va="top", color="0.35")  # fmt: skip
    batch_ticks(axis)
    axis.set_xlabel("batch size (images)")
    axis.set_ylabel("time ratio")
    axis.set_ylim(0, 1.35 * axis.get_ylim()[1])  # room for the notes above the lines
    axis.grid(True, which="both", alpha=0.3)
    right = legend_right(fig, axis, title="uint8 batch")
    axis.set_title(f"x.half().to({kind}) time over x.to({kind}).half() time, on {result['device_name']}", loc="left")
    statistics = "median ratios, bands: min-max"
    print(f"wrote {save_figure(fig, 'transfer_order', result, statistics=statistics, right=right)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_device_argument(parser)
    parser.add_argument("--image-sizes", nargs="+", default=["384x384", "640x480", "1280x960"], help="WIDTHxHEIGHT")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[8, 16, 32, 64])
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds per blocked_autorange")
    parser.add_argument("--quick", action="store_true", help="small sizes, short runs (a smoke test)")
    parser.add_argument("--plot-only", action="store_true", help="re-plot the last results")
    args = parser.parse_args(argv)
    if args.plot_only:
        return plot(read_result("transfer_order", args.device))
    if args.quick:
        args.image_sizes, args.batch_sizes, args.min_run_time = ["64x48", "128x96"], [2, 4, 8], 0.05
    device = resolve_device(args.device)
    rows = measure(device, parse_sizes(args.image_sizes), args.batch_sizes, args.min_run_time)
    path = write_result(
        "transfer_order", {"device": str(device), "device_name": device_name(device), "quick": args.quick, "rows": rows}
    )
    print(f"wrote {path}")
    plot(read_result("transfer_order", device))


if __name__ == "__main__":
    main()
