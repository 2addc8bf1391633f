"""Per-batch preprocessing on the device, eager against ``torch.compile``: what fusion into one kernel buys.

The preprocessing of a uint8 batch ``[B, 3, H, W]``: random resized crop with per-sample parameters
and random horizontal flip (one ``affine_grid`` + ``grid_sample``, the flip folded into the affine
matrix), cast and normalisation (scale and shift as in ``gpuload.Normalize``). Eager runs one kernel
per op; ``torch.compile`` (modes ``default``, ``reduce-overhead``, ``max-autotune``) fuses them.
``torch._dynamo.explain`` must find zero graph breaks. Timed with ``torch.utils.benchmark.Timer``
(``blocked_autorange``, CUDA synchronised), printed as a ``torch.utils.benchmark.Compare`` table.

    python -m experiments.gpu_preprocess --image-sizes 640x480 --batch-sizes 32 64 128
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Compare, Timer

import gpuload

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
    synchronize,
    write_result,
)

OUTPUT = (224, 224)


def preprocess(images: torch.Tensor, area: torch.Tensor, ratio: torch.Tensor, shift: torch.Tensor, flip: torch.Tensor,
               scale_buffer: torch.Tensor, shift_buffer: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Random resized crop + flip + normalise; per-sample parameters in [0, 1) come in as tensors."""
    batch = images.shape[0]
    width = torch.sqrt(area * ratio).clamp(max=1.0)
    height = torch.sqrt(area / ratio).clamp(max=1.0)
    sign = 1.0 - 2.0 * flip
    theta = torch.zeros(batch, 2, 3, device=images.device, dtype=scale_buffer.dtype)
    theta[:, 0, 0] = width * sign
    theta[:, 1, 1] = height
    theta[:, 0, 2] = (2 * shift[:, 0] - 1) * (1 - width)
    theta[:, 1, 2] = (2 * shift[:, 1] - 1) * (1 - height)
    grid = F.affine_grid(theta, [batch, images.shape[1], *OUTPUT], align_corners=False)
    cropped = F.grid_sample(images.to(scale_buffer.dtype), grid, mode="bilinear", align_corners=False)
    return torch.addcmul(shift_buffer, cropped, scale_buffer)


def inputs(batch_size: int, size: tuple[int, int], device: torch.device, dtype: torch.dtype) -> tuple:
    generator = torch.Generator(device).manual_seed(0)
    images = torch.randint(0, 256, (batch_size, 3, *size), dtype=torch.uint8, device=device, generator=generator)
    area = 0.08 + 0.92 * torch.rand(batch_size, device=device, generator=generator, dtype=dtype)
    ratio = torch.exp((torch.rand(batch_size, device=device, generator=generator, dtype=dtype) - 0.5) * 0.575)
    shift = torch.rand(batch_size, 2, device=device, generator=generator, dtype=dtype)
    flip = (torch.rand(batch_size, device=device, generator=generator) < 0.5).to(dtype)
    normalize = gpuload.Normalize(gpuload.IMAGENET_MEAN, gpuload.IMAGENET_STD).to(device, dtype)
    return images, area, ratio, shift, flip, normalize.scale, normalize.shift


def plot(result: dict) -> None:
    rows = result["rows"]
    sizes = sorted({(row["height"], row["width"]) for row in rows})
    fig, axes = figure(1, len(sizes))
    for axis, (height, width) in zip(axes[0], sizes):
        for mode in result["modes"]:
            line = [r for r in rows if (r["height"], r["width"], r["mode"]) == (height, width, mode)]
            plot_spread(axis, line, "seconds", "-o", mode, scale=1e3)
        title = f"{width}x{height} uint8 -> {OUTPUT[1]}x{OUTPUT[0]} {result['dtype']}"
        style_batch_axis(axis, title, "time per batch (ms)", legend_title="torch.compile mode")
    fig.suptitle(f"Crop + flip + normalise on {result['device_name']}: eager against torch.compile")
    print(f"wrote {save_figure(fig, 'gpu_preprocess', result)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_device_argument(parser)
    parser.add_argument("--image-sizes", nargs="+", default=["640x480"], help="WIDTHxHEIGHT")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[32, 64, 128])
    parser.add_argument("--modes", nargs="+", default=None, help="eager and torch.compile modes")
    parser.add_argument("--min-run-time", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true", help="small sizes, eager and default only (a smoke test)")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args(argv)
    if args.plot_only:
        return plot(read_result("gpu_preprocess"))
    device = resolve_device(args.device)
    modes = args.modes or (
        ["eager", "default", "reduce-overhead", "max-autotune"] if device.type == "cuda" else ["eager", "default"]
    )
    if args.quick:
        args.image_sizes, args.batch_sizes, args.min_run_time, modes = ["160x120"], [4, 8], 0.1, ["eager", "default"]
    dtype = torch.float16 if device.type == "cuda" else torch.float32  # grid_sample in half needs CUDA
    explanation = torch._dynamo.explain(preprocess)(*inputs(2, (32, 32), device, dtype))
    if explanation.graph_break_count:
        raise SystemExit(f"preprocess has {explanation.graph_break_count} graph breaks: {explanation.break_reasons}")
    rows, measurements = [], []
    for mode in modes:
        function = preprocess
        if mode != "eager":
            function = torch.compile(preprocess, mode=mode, fullgraph=True, dynamic=False)
        for height, width in parse_sizes(args.image_sizes):
            for batch_size in args.batch_sizes:
                arguments = inputs(batch_size, (height, width), device, dtype)
                started = time.perf_counter()
                function(*arguments)  # compiles for this shape
                synchronize(device)
                first_call = time.perf_counter() - started
                timer = Timer(
                    "function(*arguments)",
                    globals={"function": function, "arguments": arguments},
                    label="crop + flip + normalise",
                    sub_label=f"{width}x{height}, B={batch_size}",
                    description=mode,
                    num_threads=torch.get_num_threads(),  # Timer's default is 1 thread
                )
                measurement = timer.blocked_autorange(min_run_time=args.min_run_time)
                measurements.append(measurement)
                rows.append(
                    {
                        "mode": mode,
                        "height": height,
                        "width": width,
                        "batch_size": batch_size,
                        "first_call_seconds": first_call,
                    }
                    | {"seconds": median_spread(measurement.times)}
                )
    compare = Compare(measurements)
    compare.print()
    path = write_result(
        "gpu_preprocess",
        {
            "device": str(device),
            "device_name": device_name(device),
            "dtype": str(dtype).removeprefix("torch."),
            "modes": modes,
            "graph_breaks": explanation.graph_break_count,
            "quick": args.quick,
            "compare_table": str(compare),
            "rows": rows,
        },
    )
    print(f"wrote {path}")
    plot(read_result("gpu_preprocess"))


if __name__ == "__main__":
    main()
