"""ResNet-18 AMP training steps fed cuda-first, half-first, or through ``gpuload.Normalize`` in the model.

For each image size and batch size, the same sample photos (a gpuload memmap) train a ResNet-18 with
``torch.autocast`` + ``GradScaler`` and SGD, three ways:

- ``cuda_first``: host uint8 batch -> ``.to(device)`` -> ``.half()`` -> normalise -> model;
- ``half_first``: host uint8 batch -> ``.half()`` -> ``.to(device)`` -> normalise -> model;
- ``normalize_in_model``: ``gpuload.DataLoader`` delivers uint8 on the device, and
  ``nn.Sequential(gpuload.Normalize(mean, std), resnet18())`` casts and normalises.

``torch.profiler`` runs with a schedule (wait, warmup, active) and ``record_function`` ranges around
data, transfer, cast, forward, backward and optimizer; the Chrome trace of the largest
configuration and each variant's key-averages table are kept. Step time is wall time with the
device synchronised, median (min-max) over the timed steps, warm-up steps excluded.

    python -m experiments.train_order --image-sizes 384x384 640x480 --batch-sizes 16 32 64
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torchvision.models import resnet18

import gpuload

from ._common import (
    ASSETS,
    add_device_argument,
    device_name,
    figure,
    median_spread,
    parse_sizes,
    photo_folders,
    read_result,
    resolve_device,
    result_name,
    save_figure,
    write_result,
)
from .trace_figure import plot_trace

VARIANTS = ("cuda_first", "half_first", "normalize_in_model")
TRACE = "traces/{run}_{variant}.json.gz"  # under assets/; Perfetto opens .gz
WAIT, WARMUP, ACTIVE = 1, 2, 5


def _dataset(workdir: Path, size: tuple[int, int], count: int) -> gpuload.MemmapImageDataset:
    _, compressed = photo_folders(workdir, count, size)
    out = compressed.with_suffix(".memmap")
    if not out.exists():
        gpuload.build_memmap(compressed, out, progress=False)
    return gpuload.MemmapImageDataset(out)


class StepClock:
    """A training step's seconds. On CUDA, events on the current stream, waited for at the end: only
    the step's own work is waited for, not the loader's side streams preparing the next batch (which
    ``torch.cuda.synchronize`` would drain, serialising what the loader overlaps)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.started = time.perf_counter()

    def stop(self) -> float:
        if not self.cuda:
            return time.perf_counter() - self.started
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        return self.start.elapsed_time(end) / 1e3


def run_variant(variant: str, dataset, batch_size: int, device: torch.device, trace: Path | None) -> dict:
    torch.manual_seed(0)
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    normalize = gpuload.Normalize(gpuload.IMAGENET_MEAN, gpuload.IMAGENET_STD).to(device)
    model = resnet18(num_classes=len(dataset.classes))
    if variant == "normalize_in_model":
        model = nn.Sequential(normalize, model)
    else:
        normalize = normalize.half()  # the talk's recipe normalises the half batch outside the model
    model = model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
    loader_device = device if variant == "normalize_in_model" else "cpu"
    loader = gpuload.DataLoader(dataset, batch_size, shuffle=True, drop_last=True, seed=0, device=loader_device)
    steps_needed = WAIT + WARMUP + ACTIVE
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    recorded = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE)  # skip, warm up, then record
    step_seconds = []
    with profile(activities=activities, schedule=recorded) as profiler:
        step = 0
        while step < steps_needed:
            iterator = iter(loader)
            while step < steps_needed:
                clock = StepClock(device)
                with record_function("data"):
                    batch = next(iterator, None)
                if batch is None:
                    break
                images, labels = batch
                if variant == "cuda_first":
                    with record_function("transfer"):
                        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
                    with record_function("cast"):
                        images = normalize(images.half())
                elif variant == "half_first":
                    with record_function("cast"):
                        images = images.half()
                    with record_function("transfer"):
                        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
                    with record_function("cast"):
                        images = normalize(images)
                with torch.autocast(device.type, dtype=amp_dtype):
                    with record_function("forward"):
                        loss = nn.functional.cross_entropy(model(images), labels)
                with record_function("backward"):
                    scaler.scale(loss).backward()
                with record_function("optimizer"):
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad(set_to_none=True)
                seconds = clock.stop()
                if step >= WAIT + WARMUP:
                    step_seconds.append(seconds)
                profiler.step()
                step += 1
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(trace))
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    averages = profiler.key_averages()
    ranges = {
        name: next((event.cpu_time_total / ACTIVE / 1e3 for event in averages if event.key == name), None)
        for name in ("data", "transfer", "cast", "forward", "backward", "optimizer")
    }
    return {
        "step_seconds": median_spread(step_seconds),
        "range_ms_per_step": ranges,
        "key_averages": averages.table(sort_by=sort, row_limit=15),
    }


def plot(result: dict) -> None:
    """Each variant's step time over the copy-then-cast step time, per configuration, with the min-max of
    the timed steps (the noise); the share of a step spent feeding the model is written under each
    configuration (the most that the order of copy and cast can change). Then the trace figure."""
    from matplotlib.ticker import StrMethodFormatter

    rows = result["rows"]
    kind = result["device"].split(":")[0]
    labels = {
        "cuda_first": f"x.to({kind}).half()",
        "half_first": f"x.half().to({kind})",
        "normalize_in_model": "Normalize in the model",
    }
    configurations = sorted({(r["height"] * r["width"], r["height"], r["width"], r["batch_size"]) for r in rows})
    step = {(r["height"], r["width"], r["batch_size"], r["variant"]): r for r in rows}

    def feeding(h: int, w: int, b: int) -> float:
        """The largest share of a step, over the variants, in the data, transfer and cast ranges."""
        return max(
            sum(step[h, w, b, v]["range_ms_per_step"][name] or 0 for name in ("data", "transfer", "cast"))
            / (1e3 * step[h, w, b, v]["step_seconds"]["median"])
            for v in VARIANTS
        )

    names = [f"{w}x{h}\nbatch {b}\nfeeding\n{100 * feeding(h, w, b):.1f} %" for _, h, w, b in configurations]
    fig, axes = figure(1, 1)
    axis = axes[0][0]
    positions = np.arange(len(configurations))
    width = 0.8 / len(VARIANTS)
    for offset, (variant, marker) in enumerate(zip(VARIANTS, "os^")):
        x = positions + (offset - (len(VARIANTS) - 1) / 2) * width
        reference = [step[h, w, b, "cuda_first"]["step_seconds"]["median"] for _, h, w, b in configurations]
        spreads = [step[h, w, b, variant]["step_seconds"] for _, h, w, b in configurations]
        medians = np.array([s["median"] / r for s, r in zip(spreads, reference)])
        low = medians - np.array([s["min"] / r for s, r in zip(spreads, reference)])
        high = np.array([s["max"] / r for s, r in zip(spreads, reference)]) - medians
        axis.errorbar(x, medians, yerr=[low, high], fmt=marker, capsize=4, label=labels[variant])
    axis.axhline(1.0, color="0.3", linestyle=":", linewidth=1.5)
    axis.set_ylabel(f"step time /\n{labels['cuda_first']}")
    # two decimals whatever the tick step: labels as wide when the layout is made as when it is drawn
    axis.yaxis.set_major_formatter(StrMethodFormatter("{x:.2f}"))
    axis.set_xticks(positions, names)
    axis.grid(True, axis="y", alpha=0.3)
    # the legend in one row above the panel, not right of it: the panel keeps the width its labels need
    legend = axis.legend(loc="lower left", bbox_to_anchor=(0, 1), ncols=len(VARIANTS), frameon=False, borderaxespad=0)
    pad = legend.get_window_extent(fig.canvas.get_renderer()).height + 4
    axis.set_title(f"ResNet-18 training steps fed three ways, on {result['device_name']}", loc="left", pad=pad)
    statistics = "medians, bars: min-max of the timed steps"
    print(f"wrote {save_figure(fig, 'train_order', result, statistics=statistics)}")
    trace = ASSETS / TRACE.format(run=result_name("train_order", result["device"]), variant="cuda_first")
    if trace.is_file():
        last = rows[-1]  # the traced configuration is the last one run
        caption = (
            f"{labels['cuda_first']}, {last['width']}x{last['height']}, batch {last['batch_size']}, "
            f"{result['device_name']}"
        )
        print(f"wrote {plot_trace(trace, 'train_order_trace', result, caption)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_device_argument(parser)
    parser.add_argument("--image-sizes", nargs="+", default=["384x384", "640x480"], help="WIDTHxHEIGHT")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[16, 32, 64])
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    parser.add_argument("--quick", action="store_true", help="small sizes, few steps (a smoke test)")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args(argv)
    if args.plot_only:
        return plot(read_result("train_order", args.device))
    if args.quick:
        args.image_sizes, args.batch_sizes = ["64x48"], [2, 4]
    device = resolve_device(args.device)
    sizes = parse_sizes(args.image_sizes)
    rows = []
    for size in sizes:
        dataset = _dataset(args.workdir, size, max(args.batch_sizes) * (WAIT + WARMUP + ACTIVE))
        for batch_size in args.batch_sizes:
            for variant in VARIANTS:
                largest = size == sizes[-1] and batch_size == args.batch_sizes[-1]
                run = result_name("train_order", device)
                trace = ASSETS / TRACE.format(run=run, variant=variant) if largest else None
                row = run_variant(variant, dataset, batch_size, device, trace)
                rows.append({"height": size[0], "width": size[1], "batch_size": batch_size, "variant": variant, **row})
                print(
                    f"  {size[1]}x{size[0]} B={batch_size:<3} {variant:<20} {row['step_seconds']['median'] * 1e3:8.1f} ms/step"
                )
    path = write_result(
        "train_order", {"device": str(device), "device_name": device_name(device), "quick": args.quick, "rows": rows}
    )
    print(f"wrote {path}")
    plot(read_result("train_order", device))


if __name__ == "__main__":
    main()
