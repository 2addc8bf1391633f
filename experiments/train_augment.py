"""A short ResNet training run with RandomResizedCrop + flip: augmentation on the GPU against worker processes.

The same compressed photos (640x480, ffmpeg -q:v 3), the same model (ResNet-18, SGD, AMP on CUDA)
and the same augmentation (random resized crop to S x S, horizontal flip), two ways, in one run:
- ``stock``: ``torch.utils.data.DataLoader`` over ``ImageFolder`` with torchvision v2
  ``RandomResizedCrop(S, antialias=True)`` + ``RandomHorizontalFlip`` per sample in worker
  processes (``num_workers`` = cores, ``pin_memory`` on CUDA, persistent workers), batches copied
  with ``non_blocking=True``: the stock loader at its best;
- ``gpuload``: ``gpuload.DataLoader`` over the memmap of the same photos, uint8 batches on the
  device, and ``nn.Sequential(gpuload.RandomResizedCrop(S, flip=True), gpuload.Normalize, model)``.
Both normalise inside the model. For each: images/s over the timed steps (warm-up excluded, device
synchronised) and the share of the step spent waiting for the next batch: the time the training loop
is blocked in ``next()`` on the loader and the copy calls of the batch (``time.perf_counter``), over the
timed steps' time. On CUDA the loop runs in step with the GPU (the ``GradScaler`` reads its overflow flag
before each optimizer step), so the loop's wait is the GPU's.

On a machine without a GPU this is a stand-in, labelled so: S = 112, small batches, a few dozen steps.

    python -m experiments.train_augment [--device cuda] [--steps 60] [--batch-size 128]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torchvision.datasets import ImageFolder
from torchvision.models import resnet18
from torchvision.transforms import v2

import gpuload

from ._common import (
    add_device_argument,
    device_name,
    figure,
    median_spread,
    photo_folders,
    read_result,
    resolve_device,
    save_figure,
    synchronize,
    write_result,
)

WARMUP = 3


def loaders(folder: Path, dataset: gpuload.MemmapImageDataset, size: int, batch_size: int, device: torch.device):
    """name -> (loader, augmentation module put in front of the model)."""
    per_sample = v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])
    stock = torch.utils.data.DataLoader(
        ImageFolder(str(folder), transform=per_sample),
        batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=gpuload.default_workers(),
        persistent_workers=True,
        pin_memory=device.type == "cuda",
    )
    ours = gpuload.DataLoader(dataset, batch_size, shuffle=True, drop_last=True, seed=0, device=device)
    augment = gpuload.RandomResizedCrop(size, flip=True, dtype=torch.float32)
    return {"stock": (stock, nn.Identity()), "gpuload": (ours, augment)}


def train(loader, augment: nn.Module, classes: int, steps: int, device: torch.device, compile_model: bool) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(
        augment, gpuload.Normalize(gpuload.IMAGENET_MEAN, gpuload.IMAGENET_STD), resnet18(num_classes=classes)
    ).to(device)
    if compile_model:
        model = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
    batches = _endless(loader)
    for step in range(WARMUP + steps):
        if step == WARMUP:
            synchronize(device)
            started, waited = time.perf_counter(), 0.0
        asked = time.perf_counter()
        images, labels = next(batches)  # waiting for the next batch, and its copy when the loader left it to us
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if step >= WARMUP:
            waited += time.perf_counter() - asked
        with torch.autocast(device.type, dtype=torch.float16, enabled=device.type == "cuda"):
            loss = nn.functional.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    timed = time.perf_counter() - started
    return {
        "images_per_second": steps * loader.batch_size / timed,
        "steps": steps,
        "step_ms": 1e3 * timed / steps,
        "data_wait_share": waited / timed,
    }


def _endless(loader):
    """Batches from epoch after epoch, as a training loop sees them."""
    while True:
        yield from loader


def plot(result: dict) -> None:
    """Training throughput of each contender (median, min-max whiskers); the share of the step spent
    waiting for data is written in each bar."""
    rows = result["rows"]
    fig, axes = figure(1, 1)
    axis = axes[0][0]
    labels = {"stock": "DataLoader,\ncrop in workers", "gpuload": "gpuload.DataLoader,\ncrop in the model"}
    names = [labels.get(row["contender"], row["contender"]) for row in rows]
    spreads = [row["images_per_second"] for row in rows]
    rates = [spread["median"] for spread in spreads]
    whiskers = [[r - s["min"] for r, s in zip(rates, spreads)], [s["max"] - r for r, s in zip(rates, spreads)]]
    axis.barh(names, rates, xerr=whiskers, capsize=4, color=["tab:gray", "tab:green"][: len(rows)])
    for y, (row, rate) in enumerate(zip(rows, rates)):
        wait = 100 * row["data_wait_share"]["median"]
        axis.text(rate * 0.02, y - 0.12, f"{rate:,.0f} images/s", va="center", color="white", fontsize=18)
        axis.text(rate * 0.02, y + 0.18, f"waiting for data: {wait:.1f} % of the step", va="center", color="white")
    axis.invert_yaxis()
    axis.set_xlabel("training images/s")
    axis.grid(True, axis="x", alpha=0.3)
    stand_in = "CPU stand-in: " if result["device"] == "cpu" else ""
    fig.suptitle(
        f"{stand_in}ResNet-18 at {result['size']} px, batch {result['batch_size']}, crop + flip, "
        f"on {result['device_name']}"
    )
    print(f"wrote {save_figure(fig, 'train_augment', result)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_device_argument(parser)
    parser.add_argument("--size", type=int, default=None, help="crop side (default: 224 on CUDA, 112 on the CPU)")
    parser.add_argument("--batch-size", type=int, default=None, help="default: 128 on CUDA, 32 on the CPU")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default: 60 on CUDA, 20 on the CPU)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a few steps (a smoke test)")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args(argv)
    if args.plot_only:
        return plot(read_result("train_augment", args.device))
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    size = args.size or (224 if cuda else 112)
    batch_size = args.batch_size or (128 if cuda else 32)
    steps = args.steps or (60 if cuda else 20)
    image_size = (480, 640)
    if args.quick:
        size, batch_size, steps, args.repeats, args.images, image_size = 32, 8, 4, 1, 100, (120, 160)
    _, folder = photo_folders(args.workdir, args.images, image_size)
    out = folder.with_suffix(".memmap")
    if not out.exists():
        gpuload.build_memmap(folder, out, progress=False)
    dataset = gpuload.MemmapImageDataset(out)
    runs: dict[str, list[dict]] = {"stock": [], "gpuload": []}
    for repeat in range(args.repeats):
        for name, (loader, augment) in loaders(folder, dataset, size, batch_size, device).items():
            runs[name].append(train(loader, augment, len(dataset.classes), steps, device, compile_model=cuda))
            print(
                f"  repeat {repeat + 1} {name:<8} {runs[name][-1]['images_per_second']:8,.0f} images/s, "
                f"{runs[name][-1]['data_wait_share']:.0%} of the step waiting for data",
                flush=True,
            )
    rows = [
        {
            "contender": name,
            "images_per_second": median_spread([run["images_per_second"] for run in results]),
            "data_wait_share": median_spread([run["data_wait_share"] for run in results]),
            "step_ms": median_spread([run["step_ms"] for run in results]),
        }
        for name, results in runs.items()
    ]
    speedup = rows[1]["images_per_second"]["median"] / rows[0]["images_per_second"]["median"]
    print(f"gpuload = {speedup:.2f}x the stock loader with the same augmentation in workers")
    path = write_result(
        "train_augment",
        {
            "device": str(device),
            "device_name": device_name(device),
            "size": size,
            "batch_size": batch_size,
            "steps": steps,
            "images": len(dataset),
            "image_size": list(image_size),
            "quick": args.quick,
            "rows": rows,
        },
    )
    print(f"wrote {path}")
    plot(read_result("train_augment", device))


if __name__ == "__main__":
    main()
