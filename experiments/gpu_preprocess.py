"""Augmenting uint8 batches already on the device: per-sample crop + flip + normalise, side by side.

For each batch size, on the same uint8 batches of 640x480 photos-sized noise in channels-last memory
(the layout gpuload's loader serves), to 224x224 float normalised (float16 on CUDA, float32 on the CPU):
- ``torchvision_per_sample``: torchvision v2 ``RandomResizedCrop(224, antialias=True)``,
  ``RandomHorizontalFlip`` and ``Normalize``, sample by sample in a Python loop, then stacked: what a
  per-sample pipeline costs when it runs on the device;
- ``torchvision_same_boxes``: the same loop with v2's functional ``resized_crop``, ``horizontal_flip``
  and ``normalize`` on the boxes and flips gpuload draws (the bar: on a CPU, gpuload is not slower);
- ``torchvision_batch``: the same v2 transforms on the whole batch (one parameter set for all
  samples: not the same augmentation, for reference);
- ``kornia``: Kornia 0.9's per-sample ``RandomResizedCrop`` + ``RandomHorizontalFlip`` +
  ``Normalize`` (where it installs: ``pip install gpuload[bench]``);
- ``gpuload_eager`` and ``gpuload_compiled`` (``torch.compile``, and on CUDA ``reduce-overhead``):
  ``nn.Sequential(gpuload.RandomResizedCrop(224, flip=True), gpuload.Normalize(...))``.
Timed with ``torch.utils.benchmark.Timer`` (``blocked_autorange``, CUDA synchronised), each an
images/s median with min-max. On CUDA each rate is also given as a share of the GPU's memory
bandwidth, measured in the same run by a device-to-device copy: the bytes an augmentation must move
(read the uint8 input, write the output) at the copy's speed is the limit.

    python -m experiments.gpu_preprocess --batch-sizes 64 128 256 [--device cuda]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.benchmark import Timer
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

import gpuload
from gpuload.transforms.augment import resized_crop_params

from ._common import (
    add_device_argument,
    device_name,
    figure,
    legend_right,
    median_spread,
    plot_spread,
    read_result,
    resolve_device,
    save_figure,
    style_batch_axis,
    synchronize,
    write_result,
)

OUTPUT = 224
INPUT = (480, 640)
LABELS = {
    "torchvision_per_sample": "torchvision v2,\nper sample",
    "torchvision_same_boxes": "torchvision v2, per\nsample, same boxes",
    "torchvision_batch": "torchvision v2, one\ncrop per batch",
    "kornia": "Kornia",
    "gpuload_eager": "gpuload, eager",
    "gpuload_compiled": "gpuload,\ntorch.compile",
    "gpuload_reduce_overhead": "gpuload, reduce-\noverhead",
}


def contenders(device: torch.device, dtype: torch.dtype, quick: bool) -> dict[str, Callable[[torch.Tensor], object]]:
    """name -> a function of a uint8 batch on ``device`` that returns the augmented batch."""
    mean, std = gpuload.IMAGENET_MEAN, gpuload.IMAGENET_STD
    tv_sample = v2.Compose(
        [
            v2.RandomResizedCrop(OUTPUT, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(dtype, scale=True),
            v2.Normalize(mean, std),
        ]
    )
    augment = gpuload.RandomResizedCrop(OUTPUT, flip=True, dtype=dtype)
    ours = nn.Sequential(augment, gpuload.Normalize(mean, std)).to(device, dtype)

    def same_boxes(images: torch.Tensor) -> torch.Tensor:
        """torchvision's per-sample crop, flip and normalise of the boxes and flips gpuload draws."""
        generator = torch.Generator(device).manual_seed(0)
        boxes = resized_crop_params(len(images), *INPUT, device=device, generator=generator).int().tolist()
        flips = (torch.rand((len(images),), device=device, generator=generator) < 0.5).tolist()
        samples = []
        for image, box, flip in zip(images, boxes, flips):
            sample = F.resized_crop(image, *box, [OUTPUT, OUTPUT], antialias=True)
            sample = F.horizontal_flip(sample) if flip else sample
            samples.append(F.normalize(F.to_dtype(sample, dtype, scale=True), mean, std))
        return torch.stack(samples)

    found = {
        "torchvision_per_sample": lambda images: torch.stack([tv_sample(image) for image in images]),
        "torchvision_same_boxes": same_boxes,
        "torchvision_batch": tv_sample,
        "gpuload_eager": ours,
        "gpuload_compiled": torch.compile(ours, fullgraph=True),
    }
    if device.type == "cuda" and not quick:
        found["gpuload_reduce_overhead"] = torch.compile(ours, fullgraph=True, mode="reduce-overhead")
    try:
        import kornia.augmentation as K
    except ImportError:
        print("  kornia is not installed (pip install gpuload[bench]): left out")
    else:
        kornia = nn.Sequential(
            K.RandomResizedCrop((OUTPUT, OUTPUT)),
            K.RandomHorizontalFlip(),
            K.Normalize(torch.tensor(mean), torch.tensor(std)),
        ).to(device)
        found["kornia"] = lambda images: kornia(images.to(dtype) / 255)
    return found


def copy_limit(device: torch.device, dtype: torch.dtype, min_run_time: float) -> float:
    """Images/s if an augmentation only moved its bytes (read uint8 input, write output) at device-copy speed."""
    source = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    timer = Timer("target.copy_(source)", globals={"target": target, "source": source})
    seconds = timer.blocked_autorange(min_run_time=min_run_time).median
    bandwidth = 2 * source.numel() / seconds  # bytes read + written per second
    per_image = 3 * INPUT[0] * INPUT[1] + 3 * OUTPUT * OUTPUT * dtype.itemsize
    return bandwidth / per_image


def plot(result: dict) -> None:
    rows = result["rows"]
    fig, axes = figure(1, 1)
    axis = axes[0][0]
    for name in result["contenders"]:
        line = [row for row in rows if row["contender"] == name]
        plot_spread(axis, line, "images_per_second", "-o", LABELS.get(name, name))
    limits = [row for row in rows if row["contender"] == "limit_copy"]
    if limits:
        axis.plot([row["batch_size"] for row in limits], [row["images_per_second"]["median"] for row in limits], "k--",
                  label="limit: device memory bandwidth")  # fmt: skip
        axis.legend()
    height, width = result["input"]
    style_batch_axis(axis, "", "images/s")
    axis.get_legend().remove()
    right = legend_right(fig, axis)
    fig.suptitle(
        f"Crop + flip + normalise, {width}x{height} uint8 to {OUTPUT}x{OUTPUT} {result['dtype']}, "
        f"on {result['device_name']}"
    )
    print(f"wrote {save_figure(fig, 'gpu_preprocess', result, right=right)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_device_argument(parser)
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 128, 256])
    parser.add_argument("--min-run-time", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true", help="small batches, short runs (a smoke test)")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args(argv)
    if args.plot_only:
        return plot(read_result("gpu_preprocess", args.device))
    device = resolve_device(args.device)
    if args.quick:
        args.batch_sizes, args.min_run_time = [4, 8], 0.1
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    functions = contenders(device, dtype, args.quick)
    explanation = torch._dynamo.explain(functions["gpuload_eager"])(
        torch.zeros(2, 3, 64, 64, dtype=torch.uint8, device=device)
    )
    if explanation.graph_break_count:
        raise SystemExit(f"gpuload's augmentation has {explanation.graph_break_count} graph breaks")
    rows = []
    for batch_size in args.batch_sizes:
        images = torch.randint(0, 256, (batch_size, *INPUT, 3), dtype=torch.uint8, device=device).permute(0, 3, 1, 2)
        for name, function in functions.items():
            started = time.perf_counter()
            function(images)  # compiles for this shape, warms caches
            synchronize(device)
            first_call = time.perf_counter() - started
            timer = Timer(
                "function(images); synchronize(device)",
                globals={"function": function, "images": images, "synchronize": synchronize, "device": device},
                num_threads=torch.get_num_threads(),
            )
            measurement = timer.blocked_autorange(min_run_time=args.min_run_time)
            rates = [batch_size / seconds for seconds in measurement.times]
            rows.append(
                {"contender": name, "batch_size": batch_size, "first_call_seconds": first_call}
                | {"images_per_second": median_spread(rates)}
            )
            print(
                f"  B={batch_size:<4} {name:<24} {rows[-1]['images_per_second']['median']:10,.0f} images/s", flush=True
            )
        if device.type == "cuda":
            limit = copy_limit(device, dtype, args.min_run_time)
            rows.append(
                {"contender": "limit_copy", "batch_size": batch_size, "images_per_second": median_spread([limit])}
            )
            for row in rows:
                if row["batch_size"] == batch_size and row["contender"] != "limit_copy":
                    row["share_of_bandwidth"] = row["images_per_second"]["median"] / limit
            print(f"  B={batch_size:<4} {'limit: memory bandwidth':<24} {limit:10,.0f} images/s")
    for batch_size in args.batch_sizes:
        rates = {
            row["contender"]: row["images_per_second"]["median"] for row in rows if row["batch_size"] == batch_size
        }
        print(
            f"  B={batch_size:<4} bar: gpuload_eager = {rates['gpuload_eager'] / rates['torchvision_same_boxes']:.2f}x "
            "torchvision_same_boxes (at least 1x)"
        )
    path = write_result(
        "gpu_preprocess",
        {
            "device": str(device),
            "device_name": device_name(device),
            "dtype": str(dtype).removeprefix("torch."),
            "input": list(INPUT),
            "output": OUTPUT,
            "contenders": list(functions),
            "graph_breaks": explanation.graph_break_count,
            "quick": args.quick,
            "rows": rows,
        },
    )
    print(f"wrote {path}")
    plot(read_result("gpu_preprocess", device))


if __name__ == "__main__":
    main()
