"""Where a photo's time goes, per image on one thread: the costs behind the build's and the jpeg
loader's rates.

On the same compressed photos (640x480, ffmpeg -q:v 3, bytes in memory), median of the repeats:
- libjpeg-turbo (simplejpeg) decoding at each DCT scale M/8 (M = 8 ... 1), fast and accurate DCT:
  what decoding less saves (the entropy decoding is paid at every scale);
- the steps of a raw build after the decode: the channel-first transposition of the decoder's
  height-width-channel pixels (numpy's, and OpenCV's ``cv2.split`` where it is installed) and the
  write of 921.6 KB into new page-cache pages;
- the step of a jpeg training crop after the decode: torch's antialiased uint8 resize of a
  typical box (the mean RandomResizedCrop box, about 400x400) to 224x224;
- a jpeg training crop's decode (fast DCT, RandomResizedCrop(224) boxes): whole, only down to its
  box's last row, and only its box's rows (from the restart marker above the box, which
  ``gpuload compress`` writes at every MCU row), each cut by :func:`gpuload.writing.jpeg.row_window`,
  its cost included;
- where libjpeg-turbo's ``jpegtran`` is on ``PATH`` (Debian: ``apt-get install libjpeg-turbo-progs``;
  we found no package on PyPI that ships it), what gpuload could gain from a restart marker at
  every MCU (``jpegtran -restart 1B``, a lossless rewrite that ffmpeg cannot do): the photos' size
  and whole decode with those markers,
  and a crop's decode of only its box's MCUs (rows and columns: the entropy decoding of the other
  MCUs skipped), with and without the cost of cutting the copy (:func:`mcu_window`, a prototype
  here, checked against the whole decode's pixels).

    python -m experiments.decode_costs [--images 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import simplejpeg
import torch

import gpuload
from gpuload.writing.jpeg import _frame_and_scan, _size_at, row_window

from ._common import figure, median_spread, photo_folders, read_result, save_figure, write_result


def per_image_ms(step: Callable[[int], object], count: int) -> float:
    started = time.perf_counter()
    for index in range(count):
        step(index)
    return (time.perf_counter() - started) / count * 1e3


def steps(blobs: list[bytes], restarted: list[bytes] | None, scratch: Path) -> dict[str, Callable[[int], object]]:
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
    try:
        import cv2
    except ImportError:
        print("  opencv is not installed (pip install gpuload[bench]): its channel split left out")
    else:  # OpenCV's compiled deinterleave, into the same planes
        found["transpose_to_channel_first_opencv"] = lambda i: cv2.split(pixels, list(planar))
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
    if restarted is not None:
        spans = [
            (int(top), min(height, math.ceil(top + h)), int(left), min(width, math.ceil(left + w)))
            for top, left, h, w in boxes.tolist()
        ]
        edges = [(0, height, 0, width), (height - 1, height, width - 1, width), (0, 1, width // 3, width // 2)]
        for data, span in zip(restarted, spans):  # each photo's edges and its box, before they are timed
            check_mcu_window(data, [*edges, span])
        copies = [mcu_window(restarted[i], *spans[i])[0] for i in range(len(blobs))]
        found["mcu_restarts_decode_whole"] = lambda i: simplejpeg.decode_jpeg(restarted[i], **fast)
        found["mcu_restarts_cut_the_window"] = lambda i: mcu_window(restarted[i], *spans[i])
        found["mcu_restarts_decode_only_its_mcus"] = lambda i: simplejpeg.decode_jpeg(copies[i], **fast)
    return found


def with_mcu_restarts(blobs: list[bytes]) -> list[bytes] | None:
    """The photos rewritten losslessly with a restart marker at every MCU (``jpegtran -restart 1B``),
    or ``None`` without ``jpegtran``."""
    jpegtran = shutil.which("jpegtran")
    if jpegtran is None:
        print("  jpegtran is not on PATH (apt-get install libjpeg-turbo-progs): MCU windows left out")
        return None
    run = partial(subprocess.run, [jpegtran, "-restart", "1B"], capture_output=True, check=True)
    return [run(input=blob).stdout for blob in blobs]


def mcu_window(data: bytes, top: int, bottom: int, left: int, right: int) -> tuple[bytes, int, int]:
    """A copy of a JPEG with a restart marker at every MCU (4:2:0, 16x16 MCUs) holding only the MCUs
    of rows ``top:bottom`` and columns ``left:right``: each MCU row's intervals from the box's first
    column to its last, one byte slice, the markers renumbered in order. Returns the copy and the
    image row and column of its first pixel."""
    header = _frame_and_scan(data)
    if header is None:
        raise ValueError("mcu_window needs a sequential JPEG with one scan")
    frame, interval, scan = header
    height, width = _size_at(data, frame)
    if interval != 1 or data[frame + 9] != 3 or data[frame + 11 : frame + 18 : 3] != b"\x22\x11\x11":  # 4:2:0
        raise ValueError("mcu_window needs a 4:2:0 JPEG with a restart marker at every MCU")
    if not (0 <= top < bottom <= height and 0 <= left < right <= width):
        raise ValueError(f"the box {top}:{bottom}, {left}:{right} is not inside the {height}x{width} image")
    per_row, first_row, end_row = -(-width // 16), top // 16, -(-bottom // 16)
    first_column, end_column = left // 16, -(-right // 16)
    array = np.frombuffer(data, np.uint8)
    fill = np.flatnonzero(array[scan:-1] == 0xFF) + scan
    markers = fill[(array[fill + 1] & 0xF8) == 0xD0]  # the marker after interval k (one MCU)
    starts = np.insert(markers + 2, 0, scan)
    ends = np.append(markers, data.rfind(b"\xff\xd9"))
    mcu_rows = np.arange(first_row, end_row) * per_row
    view = memoryview(data)
    head = b"".join(
        [
            data[: frame + 5],
            min(height - first_row * 16, (end_row - first_row) * 16).to_bytes(2, "big"),
            min(width - first_column * 16, (end_column - first_column) * 16).to_bytes(2, "big"),
            data[frame + 9 : scan],
        ]
    )
    body = [
        view[start : end + 2]  # with the marker after the row's last interval (the last becomes EOI)
        for start, end in zip(starts[mcu_rows + first_column].tolist(), ends[mcu_rows + end_column - 1].tolist())
    ]
    copy = bytearray(head + b"".join(body))
    copy[-2:] = b"\xff\xd9"
    copied = np.frombuffer(copy, np.uint8)
    found = np.flatnonzero(copied[len(head) : -3] == 0xFF) + len(head)
    found = found[(copied[found + 1] & 0xF8) == 0xD0]
    copied[found + 1] = 0xD0 + np.arange(len(found)) % 8
    return bytes(copy), first_row * 16, first_column * 16


def check_mcu_window(data: bytes, boxes: list[tuple[int, int, int, int]]) -> None:
    """Each box (``top, bottom, left, right``) of an MCU window decodes, strictly (a restart marker
    out of sequence is an error), to the whole decode's pixels (fast upsampling reads no
    neighbouring MCU)."""
    fast = {"fastdct": True, "fastupsample": True}
    whole = simplejpeg.decode_jpeg(data, **fast)
    for top, bottom, left, right in boxes:
        copy, row, column = mcu_window(data, top, bottom, left, right)
        part = simplejpeg.decode_jpeg(copy, **fast)
        box = part[top - row : bottom - row, left - column : right - column]
        if part.shape[0] - (top - row) < bottom - top or not np.array_equal(box, whole[top:bottom, left:right]):
            raise AssertionError(f"mcu_window's box {top}:{bottom}, {left}:{right} differs from the whole decode")


# The bars of the figure: (label, the steps whose medians add up to it, colour); a bar whose steps were
# not measured (no jpegtran on PATH) is left out.
BARS = (
    ("whole decode, accurate DCT", ("decode_accurate_8/8",), "tab:gray"),
    ("whole decode, fast DCT", ("decode_fast_8/8",), "tab:gray"),
    ("whole decode at 1/2 scale", ("decode_fast_4/8",), "tab:gray"),
    ("a crop: whole decode", ("crop_decode_whole",), "tab:blue"),
    ("a crop: down to its last row", ("crop_decode_to_its_last_row",), "tab:blue"),
    ("a crop: only its rows (gpuload)", ("crop_decode_only_its_rows",), "tab:green"),
    ("a crop: only its MCUs (jpegtran)", ("mcu_restarts_decode_only_its_mcus", "mcu_restarts_cut_the_window"),
     "tab:purple"),
    ("then: resize its box to 224x224", ("resize_400_to_224",), "tab:orange"),
)  # fmt: skip


def plot(result: dict) -> None:
    """Horizontal bars: milliseconds per photo on one thread for the whole decodes, a training crop's
    decodes and its resize (medians, min-max whiskers for the one-step bars)."""
    steps = result["ms_per_image"]
    bars = [(label, names, colour) for label, names, colour in BARS if all(name in steps for name in names)]
    fig, axes = figure(1, 1, size=(900, 360))
    axis = axes[0][0]
    for y, (_, names, colour) in enumerate(bars):
        median = sum(steps[name]["median"] for name in names)
        whisker = None
        if len(names) == 1:
            spread = steps[names[0]]
            whisker = [[median - spread["min"]], [spread["max"] - median]]
        axis.barh(y, median, xerr=whisker, capsize=3, color=colour)
        axis.text(median, y, f"  {median:.2f} ms", va="center")
    axis.set_yticks(range(len(bars)), [label for label, _, _ in bars])
    axis.invert_yaxis()
    axis.set_xlim(0, 1.25 * axis.get_xlim()[1])
    axis.set_xlabel("ms per photo, one thread")
    axis.grid(True, axis="x", alpha=0.3)
    machine = result["machine"]
    axis.set_title(
        f"{result['images']} photos 640x480 (-q:v 3), libjpeg-turbo, on cpu ({machine['cpu']}, "
        f"{machine['cores']} cores)",
        loc="right",
    )
    print(f"wrote {save_figure(fig, 'decode_costs', result)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    parser.add_argument("--quick", action="store_true", help="few small images (a smoke test)")
    parser.add_argument("--plot-only", action="store_true", help="re-plot the last results")
    args = parser.parse_args(argv)
    if args.plot_only:
        return plot(read_result("decode_costs"))
    if args.quick:
        args.images, args.repeats = 20, 1
    _, folder = photo_folders(args.workdir, args.images, (480, 640))
    blobs = [path.read_bytes() for path in sorted(folder.rglob("*.jpg"))[: args.images]]
    torch.set_num_threads(1)
    restarted = with_mcu_restarts(blobs)
    with tempfile.TemporaryDirectory(dir=args.workdir) as scratch:
        found = steps(blobs, restarted, Path(scratch) / "pages.bin")
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
    sizes = {"photos": sum(map(len, blobs))}
    if restarted is not None:
        sizes["with_mcu_restarts"] = sum(map(len, restarted))
        print(
            f"a restart marker at every MCU: the photos {sizes['with_mcu_restarts'] / sizes['photos'] - 1:+.1%} in bytes"
        )
        mcus = rows["mcu_restarts_decode_only_its_mcus"]["median"] + rows["mcu_restarts_cut_the_window"]["median"]
        print(
            f"decoding a crop only its box's MCUs (cut included): {mcus:.3f} ms against {rows['crop_decode_only_its_rows']['median']:.3f} "
            f"for only its rows ({1 - mcus / rows['crop_decode_only_its_rows']['median']:.0%} less)"
        )
    result = {"images": len(blobs), "threads": 1, "quick": args.quick, "bytes": sizes, "ms_per_image": rows}
    path = write_result("decode_costs", result)
    print(f"wrote {path}")
    plot(read_result("decode_costs"))


if __name__ == "__main__":
    main()
