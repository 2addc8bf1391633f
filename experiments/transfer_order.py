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
    device_name,
    figure,
    median_spread,
    parse_sizes,
    plot_spread,
    read_result,
    resolve_device,
    save_figure,
    style_batch_axis,
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
    rows = result["rows"]
    sizes = sorted({(row["height"], row["width"]) for row in rows})
    fig, axes = figure(1, len(sizes), sharey=False)
    for axis, (height, width) in zip(axes[0], sizes):
        for memory in ("pageable", "pinned"):
            for order, style in (("cuda_first", "-o"), ("half_first", "--s")):
                line = [
                    r
                    for r in rows
                    if (r["height"], r["width"], r["memory"], r["order"]) == (height, width, memory, order)
                ]
                if not line:
                    continue
                label = f"{'x.cuda().half()' if order == 'cuda_first' else 'x.half().cuda()'}, {memory}"
                plot_spread(axis, line, "seconds", style, label, scale=1e3)
        style_batch_axis(axis, f"{width}x{height}", "time per batch (ms)")
    fig.suptitle(f"Transfer then cast, or cast then transfer? uint8 batches on {result['device_name']}")
    print(f"wrote {save_figure(fig, 'transfer_order', result)}")


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
        return plot(read_result("transfer_order"))
    if args.quick:
        args.image_sizes, args.batch_sizes, args.min_run_time = ["64x48", "128x96"], [2, 4, 8], 0.05
    device = resolve_device(args.device)
    rows = measure(device, parse_sizes(args.image_sizes), args.batch_sizes, args.min_run_time)
    path = write_result(
        "transfer_order", {"device": str(device), "device_name": device_name(device), "quick": args.quick, "rows": rows}
    )
    print(f"wrote {path}")
    plot(read_result("transfer_order"))


if __name__ == "__main__":
    main()
