"""How much does ffmpeg ``-q:v`` shrink photos, what does it cost in pixels, and how much faster do they load?

The same camera-like originals (Pillow quality 98) are re-encoded with ``gpuload.compress_folder``
for each ``q``. For each folder: mean file size, PSNR against the decoded originals, and the
throughput of ``ImageFolder`` + ``torch.utils.data.DataLoader`` (PIL decode, ``PILToTensor``, all
cores as worker processes, shuffled, page cache warm, one untimed epoch first, median of repeats).
A figure puts a crop of the original beside the same crop at each q.

    python -m experiments.jpeg_quality --qualities 2 3 5 10 20 --images 2000
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.transforms import PILToTensor

import gpuload

from ._common import (
    ASSETS,
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


def psnr(originals: list[Path], copies: list[Path]) -> float:
    """Peak signal-to-noise ratio (dB) over all pixels of the pairs."""
    squared, count = 0.0, 0
    for original, copy in zip(originals, copies):
        a = np.asarray(Image.open(original).convert("RGB"), dtype=np.float64)
        b = np.asarray(Image.open(copy).convert("RGB"), dtype=np.float64)
        squared += float(((a - b) ** 2).sum())
        count += a.size
    return 10 * np.log10(255**2 / (squared / count))


def folder_rate(folder: Path, batch_size: int, repeats: int, device: torch.device) -> dict:
    """Shuffled epochs of the stock loader at its best (all cores, pinned memory on CUDA), batches on ``device``."""
    dataset = ImageFolder(str(folder), transform=PILToTensor())
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size,
        shuffle=True,
        num_workers=gpuload.default_workers(),
        persistent_workers=True,
        pin_memory=device.type == "cuda",
    )
    rates = []
    for epoch in range(repeats + 1):
        started = time.perf_counter()
        images = sum(len(batch.to(device, non_blocking=True)) for batch, _ in loader)
        synchronize(device)
        if epoch:  # the first epoch warms the page cache and starts the workers
            rates.append(images / (time.perf_counter() - started))
    return median_spread(rates)


def plot(result: dict) -> None:
    rows = result["rows"]
    fig, axes = figure(1, 2)
    names = [row["name"] for row in rows]
    sizes = [row["mean_file_bytes"] / 1e3 for row in rows]
    rates = [row["images_per_second"]["median"] for row in rows]
    errors = [
        [row["images_per_second"]["median"] - row["images_per_second"]["min"] for row in rows],
        [row["images_per_second"]["max"] - row["images_per_second"]["median"] for row in rows],
    ]
    left, right = axes[0]
    left.bar(names, sizes, color="tab:blue")
    for index, row in enumerate(rows):
        label = f"{sizes[index]:.0f} KB" + (f"\n{row['psnr_db']:.1f} dB" if row["psnr_db"] else "")
        left.text(index, sizes[index], label, ha="center", va="bottom", fontsize=11)
    left.set_ylabel("mean file size (KB)")
    left.set_title("File size and PSNR against the originals")
    right.bar(names, rates, yerr=errors, color="tab:green", capsize=4)
    right.set_ylabel("images/s")
    right.set_title(f"ImageFolder + DataLoader, {result['workers']} workers, batch {result['batch_size']}")
    for axis in (left, right):
        axis.set_xlabel("encoding")
        axis.grid(True, axis="y", alpha=0.3)
    height, width = result["image_size"]
    fig.suptitle(
        f"ffmpeg -q:v: {result['images']} photos of {width}x{height}, loaded to {result.get('device_name', 'the CPU')}"
    )
    print(f"wrote {save_figure(fig, 'jpeg_quality', result)}")

    crops = result["crops"]
    fig, axes = figure(1, len(crops))
    for axis, crop in zip(axes[0], crops):
        axis.imshow(Image.open(ASSETS / crop["path"]), interpolation="nearest")
        axis.set_title(crop["title"])
        axis.axis("off")
    fig.suptitle("The same 96x96-pixel crop, enlarged: the original and its ffmpeg re-encodings")
    print(f"wrote {save_figure(fig, 'jpeg_quality_crops', result)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qualities", nargs="+", type=int, default=[2, 3, 5, 10, 20])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    parser.add_argument("--quick", action="store_true", help="few small images (a smoke test)")
    parser.add_argument("--plot-only", action="store_true")
    add_device_argument(parser)
    args = parser.parse_args(argv)
    if args.plot_only:
        return plot(read_result("jpeg_quality"))
    device = resolve_device(args.device)
    size = (480, 640)
    if args.quick:
        args.qualities, args.images, args.batch_size, args.repeats, size = [3, 20], 40, 8, 2, (120, 160)
    originals, _ = photo_folders(args.workdir, args.images, size)
    files = sorted(path.relative_to(originals) for path in originals.rglob("*.jpg"))
    rows = [{"name": "original (PIL q98)", "quality": None, "folder": originals}]
    for quality in args.qualities:
        _, folder = photo_folders(args.workdir, args.images, size, quality=quality)
        rows.append({"name": f"ffmpeg -q:v {quality}", "quality": quality, "folder": folder})
    top = max(0, min(size[0] // 4, size[0] - 96))
    crop_box = (size[1] // 2 - 48, top, size[1] // 2 + 48, top + 96)
    crops_dir = ASSETS / "jpeg_quality_crops"
    crops_dir.mkdir(parents=True, exist_ok=True)
    crops = []
    for row in rows:
        folder = row.pop("folder")
        row["mean_file_bytes"] = statistics.mean((folder / path).stat().st_size for path in files)
        row["psnr_db"] = (
            None if row["quality"] is None else psnr([originals / p for p in files], [folder / p for p in files])
        )
        row["images_per_second"] = folder_rate(folder, args.batch_size, args.repeats, device)
        crop = Image.open(folder / files[0]).convert("RGB").crop(crop_box)
        crop_path = crops_dir / f"{len(crops)}.png"
        crop.save(crop_path)
        crops.append({"title": row["name"], "path": crop_path.relative_to(ASSETS).as_posix()})
        print(
            f"  {row['name']:<20} {row['mean_file_bytes'] / 1e3:7.1f} KB  {row['images_per_second']['median']:7.0f} images/s"
        )
    result = {
        "images": len(files),
        "image_size": list(size),
        "batch_size": args.batch_size,
        "workers": gpuload.default_workers(),
        "device": str(device),
        "device_name": device_name(device),
        "quick": args.quick,
        "rows": rows,
    }
    path = write_result("jpeg_quality", {**result, "crops": crops})
    print(f"wrote {path}")
    plot(read_result("jpeg_quality"))


if __name__ == "__main__":
    main()
