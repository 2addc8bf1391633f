"""How much does ffmpeg ``-q:v`` shrink photos, what does it cost in pixels, and how much faster do they load?

The same photos (crops of ten real photographs saved as a camera would, Pillow quality 92) are re-encoded with ``gpuload.compress_folder``
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
    result_device_name,
    save_figure,
    synchronize,
    write_result,
)
from ._photos import SOURCES, make_photo_set


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


def short_name(row: dict) -> str:
    """``"original"`` or ``"q3"``: a tick label that fits under a bar."""
    return "original" if row["quality"] is None else f"q{row['quality']}"


def plot(result: dict) -> None:
    rows = result["rows"]
    fig, axes = figure(1, 2)
    names = [short_name(row) for row in rows]
    sizes = [row["mean_file_bytes"] / 1e3 for row in rows]
    rates = [row["images_per_second"]["median"] for row in rows]
    errors = [
        [row["images_per_second"]["median"] - row["images_per_second"]["min"] for row in rows],
        [row["images_per_second"]["max"] - row["images_per_second"]["median"] for row in rows],
    ]
    left, right = axes[0]
    left.bar(names, sizes, color="tab:blue")
    for index, row in enumerate(rows):
        label = f"{sizes[index]:.0f}" + (f"\n{row['psnr_db']:.0f} dB" if row["psnr_db"] else " KB")
        left.text(index, sizes[index], label, ha="center", va="bottom", fontsize=18)
    left.set_ylim(0, 1.15 * max(sizes))
    left.set_ylabel("mean file size (KB)")
    left.set_title("file size (KB), PSNR against the original")
    right.bar(names, rates, yerr=errors, color="tab:green", capsize=4)
    right.set_ylabel("images/s")
    right.set_title(f"ImageFolder + DataLoader, {result['workers']} workers")
    for axis in (left, right):
        axis.set_xlabel("ffmpeg -q:v (original: Pillow quality 92)")
        axis.grid(True, axis="y", alpha=0.3)
    height, width = result["image_size"]
    fig.suptitle(
        f"{result['images']} photos of {width}x{height}, batches of {result['batch_size']} to "
        f"{result_device_name(result)}"
    )
    print(f"wrote {save_figure(fig, 'jpeg_quality', result)}")

    crops = _shown_crops(result)
    fig, axes = figure(1, len(crops), size=(900, 300))
    for axis, crop in zip(axes[0], crops):
        axis.imshow(Image.open(ASSETS / crop["path"]), interpolation="nearest")
        axis.set_title(_crop_title(crop, result))
        axis.axis("off")
    side = crops[0].get("side", 96)
    where = f" of {crops[0]['source']}" if "source" in crops[0] else ""
    fig.suptitle(f"The same {side}x{side} pixels{where}, enlarged (pixels only, no timing)")
    print(f"wrote {save_figure(fig, 'jpeg_quality_crops', result, statistics='one photo')}")


def _shown_crops(result: dict) -> list[dict]:
    """The crops large enough to see on a slide: the original, ``-q:v 3`` (the default) and the two
    lowest qualities (the largest q), four at most."""
    crops = result["crops"]
    quality = {id(crop): _crop_quality(crop) for crop in crops}
    original = [crop for crop in crops if quality[id(crop)] is None]
    default = [crop for crop in crops if quality[id(crop)] == 3]
    worst = sorted((c for c in crops if quality[id(c)] not in (None, 3)), key=lambda c: quality[id(c)])[-2:]
    return (original + default + worst)[:4]


def _crop_quality(crop: dict) -> int | None:
    title = crop["title"]
    return int(title.rsplit(" ", 1)[1]) if title.startswith("ffmpeg -q:v ") else None


def _crop_title(crop: dict, result: dict) -> str:
    """``"original, 192 KB"`` or ``"q3, 47 KB, 37.9 dB"``: what each crop costs on disk."""
    quality = _crop_quality(crop)
    row = next((row for row in result["rows"] if row["quality"] == quality), None)
    name = "original" if quality is None else f"-q:v {quality}"
    if row is None:
        return name
    size = f"{row['mean_file_bytes'] / 1e3:.0f} KB"
    return f"{name}: {size}" + ("" if row["psnr_db"] is None else f", {row['psnr_db']:.1f} dB")


CROP_SIDE = 64  # photo pixels per crop: enlarged on the slide, JPEG's 8x8 blocks show


def detailed_box(image: Image.Image, side: int) -> tuple[float, tuple[int, int, int, int]]:
    """The ``side`` x ``side`` window of ``image`` with the most detail (mean absolute gradient), and that score."""
    gray = np.asarray(image.convert("L"), dtype=np.float64)
    energy = np.abs(np.diff(gray, axis=0))[:, :-1] + np.abs(np.diff(gray, axis=1))[:-1, :]
    table = np.pad(energy.cumsum(0).cumsum(1), ((1, 0), (1, 0)))
    sums = table[side:, side:] - table[:-side, side:] - table[side:, :-side] + table[:-side, :-side]
    top, left = np.unravel_index(np.argmax(sums), sums.shape)
    return float(sums[top, left]) / side**2, (int(left), int(top), int(left) + side, int(top) + side)


def cut_crops(workdir: Path, size: tuple[int, int], qualities: list[int]) -> list[dict]:
    """The most detailed crop of the sample photos (the first of each class, as in the measured folders),
    as the original and at each ffmpeg ``-q:v``; written to ``assets/jpeg_quality_crops/``."""
    tag = f"{size[1]}x{size[0]}"
    originals = workdir / f"crop-photos-{tag}"
    if not originals.exists():
        make_photo_set(originals, len(SOURCES), size=size)  # one crop of each photograph
    scored = []
    for path in sorted(originals.rglob("*.jpg")):
        with Image.open(path) as image:
            scored.append((*detailed_box(image, min(CROP_SIDE, *size)), path.relative_to(originals)))
    _, box, chosen = max(scored)
    sources = [("original (PIL q92)", originals)]
    for quality in qualities:
        folder = workdir / f"crop-q{quality}-{tag}"
        gpuload.compress_folder(originals, folder, quality=quality, progress=False)
        sources.append((f"ffmpeg -q:v {quality}", folder))
    crops_dir = ASSETS / "jpeg_quality_crops"
    crops_dir.mkdir(parents=True, exist_ok=True)
    crops = []
    for index, (title, folder) in enumerate(sources):
        path = crops_dir / f"{index}.png"
        with Image.open(folder / chosen) as image:
            image.convert("RGB").crop(box).save(path)
        crops.append(
            {"title": title, "path": path.relative_to(ASSETS).as_posix()}
            | {"source": chosen.as_posix(), "box": list(box), "side": box[2] - box[0]}
        )
    return crops


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qualities", nargs="+", type=int, default=[2, 3, 5, 10, 20])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    parser.add_argument("--quick", action="store_true", help="few small images (a smoke test)")
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument(
        "--crops-only", action="store_true", help="cut the crop figure again; keep the last measurements"
    )
    add_device_argument(parser)
    args = parser.parse_args(argv)
    if args.plot_only:
        return plot(read_result("jpeg_quality", args.device))
    if args.crops_only:
        result = read_result("jpeg_quality", args.device)
        height, width = result["image_size"]
        qualities = [row["quality"] for row in result["rows"] if row["quality"] is not None]
        write_result("jpeg_quality", result | {"crops": cut_crops(args.workdir, (height, width), qualities)})
        return plot(read_result("jpeg_quality", args.device))
    device = resolve_device(args.device)
    size = (480, 640)
    if args.quick:
        args.qualities, args.images, args.batch_size, args.repeats, size = [3, 20], 40, 8, 2, (120, 160)
    originals, _ = photo_folders(args.workdir, args.images, size)
    files = sorted(path.relative_to(originals) for path in originals.rglob("*.jpg"))
    rows = [{"name": "original (PIL q92)", "quality": None, "folder": originals}]
    for quality in args.qualities:
        _, folder = photo_folders(args.workdir, args.images, size, quality=quality)
        rows.append({"name": f"ffmpeg -q:v {quality}", "quality": quality, "folder": folder})
    for row in rows:
        folder = row.pop("folder")
        row["mean_file_bytes"] = statistics.mean((folder / path).stat().st_size for path in files)
        row["psnr_db"] = (
            None if row["quality"] is None else psnr([originals / p for p in files], [folder / p for p in files])
        )
        row["images_per_second"] = folder_rate(folder, args.batch_size, args.repeats, device)
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
    crops = cut_crops(args.workdir, size, args.qualities)
    path = write_result("jpeg_quality", {**result, "crops": crops})
    print(f"wrote {path}")
    plot(read_result("jpeg_quality", device))


if __name__ == "__main__":
    main()
