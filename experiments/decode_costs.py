"""Where a photo's time goes, per image on one thread: the costs behind the build's and the jpeg
loader's rates.

On the same compressed photos (640x480, ffmpeg -q:v 3, bytes in memory), median of the repeats:
- libjpeg-turbo (simplejpeg) decoding at each DCT scale M/8 (M = 8 ... 1), fast and accurate DCT:
  what decoding less saves (the entropy decoding is paid at every scale);
- the steps of a raw build after the decode: the channel-first transposition of the decoder's
  height-width-channel pixels and the write of 921.6 KB into new page-cache pages;
- the step of a jpeg training crop after the decode: torch's antialiased uint8 resize of a
  typical box (the mean RandomResizedCrop box, about 400x400) to 224x224;
- a jpeg training crop's decode (fast DCT, RandomResizedCrop(224) boxes): whole, only down to its
  box's last row, and only its box's rows (from the restart marker above the box, which
  ``gpuload compress`` writes at every MCU row), each cut by :func:`gpuload.store.jpeg.row_window`,
  its cost included.

    python -m experiments.decode_costs [--images 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import simplejpeg
import torch

import gpuload
from gpuload.store.jpeg import row_window

from ._common import median_spread, photo_folders, write_result


def per_image_ms(step: Callable[[int], object], count: int) -> float:
    started = time.perf_counter()
    for index in range(count):
        step(index)
    return (time.perf_counter() - started) / count * 1e3


def steps(blobs: list[bytes], scratch: Path) -> dict[str, Callable[[int], object]]:
    height, width = 480, 640
    found: dict[str, Callable[[int], object]] = {}
    buffer = np.empty(height * width * 3, dtype=np.uint8)
    for fast in (False, True):
        for eighths in range(8, 0, -1):
            size = {"min_height": -(-height * eighths // 8), "min_width": -(-width * eighths // 8)}
            name = f"decode_{'fast' if fast else 'accurate'}_{eighths}/8"
            found[name] = lambda i, size=size, fast=fast: simplejpeg.decode_jpeg(
                blobs[i], fastdct=fast, fastupsample=fast, buffer=buffer, **size
            )
    pixels = simplejpeg.decode_jpeg(blobs[0])
    planar = np.empty((3, height, width), dtype=np.uint8)
    found["transpose_to_channel_first"] = lambda i: np.copyto(planar, pixels.transpose(2, 0, 1))
    fd = os.open(scratch, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.ftruncate(fd, len(blobs) * planar.nbytes)
    found["write_to_new_page_cache"] = lambda i: os.pwrite(fd, planar, i * planar.nbytes)
    box = torch.from_numpy(pixels[40:440, 100:500]).permute(2, 0, 1)[None].contiguous(memory_format=torch.channels_last)
    found["resize_400_to_224"] = lambda i: torch.nn.functional.interpolate(
        box, size=(224, 224), mode="bilinear", antialias=True
    )
    shapes = torch.tensor([[height, width]]).expand(len(blobs), 2)
    boxes, _ = gpuload.RandomResizedCropDecode(224).draw(shapes, torch.arange(len(blobs)), seed=0, epoch=0)
    rows = [(int(top), min(height, math.ceil(top + box_height))) for top, _, box_height, _ in boxes.tolist()]
    fast = {"fastdct": True, "fastupsample": True, "buffer": buffer}

    def cut(i: int, first: int) -> object:
        window = row_window(blobs[i], first, rows[i][1], context=False)
        return simplejpeg.decode_jpeg(blobs[i] if window is None else window[0], strict=False, **fast)

    found["crop_decode_whole"] = lambda i: simplejpeg.decode_jpeg(blobs[i], **fast)
    found["crop_decode_to_its_last_row"] = lambda i: cut(i, 0)
    found["crop_decode_only_its_rows"] = lambda i: cut(i, rows[i][0])
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    parser.add_argument("--quick", action="store_true", help="few small images (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.repeats = 20, 1
    _, folder = photo_folders(args.workdir, args.images, (480, 640))
    blobs = [path.read_bytes() for path in sorted(folder.rglob("*.jpg"))[: args.images]]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=args.workdir) as scratch:
        found = steps(blobs, Path(scratch) / "pages.bin")
        runs: dict[str, list[float]] = {name: [] for name in found}
        for _ in range(args.repeats):
            for name, step in found.items():  # interleaved: noise falls on every step alike
                runs[name].append(per_image_ms(step, len(blobs)))
    rows = {name: median_spread(values) for name, values in runs.items()}
    for name, spread in rows.items():
        print(f"  {name:<30} {spread['median']:6.3f} ms per image")
    whole = rows["crop_decode_whole"]["median"]
    for name, what in (
        ("crop_decode_to_its_last_row", "down to its box's last row"),
        ("crop_decode_only_its_rows", "its box's rows"),
    ):
        print(f"decoding a crop only {what} saves {1 - rows[name]['median'] / whole:.0%} of its decode")
    path = write_result("decode_costs", {"images": len(blobs), "threads": 1, "quick": args.quick, "ms_per_image": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
