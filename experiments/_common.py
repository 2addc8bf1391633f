"""Helpers shared by the experiments: data preparation, timing, memory watching, result files."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import threading
import time
from pathlib import Path

import gpuload

ROOT = Path(__file__).resolve().parent.parent
ASSETS = Path(os.environ.get("GPULOAD_ASSETS", ROOT / "assets"))  # the CI smoke test writes elsewhere
RESULTS = ASSETS / "results"


# Where no ffmpeg runs (the GPU machine: nothing can be installed there, and imageio-ffmpeg's wheel alone is
# larger than what a call may carry), the copy at ffmpeg's -q:v 3 is made by Pillow (libjpeg) with the one
# quantisation table ffmpeg writes at that quality for all three components (read from its output, in
# Pillow's order), 4:2:0 chroma, optimised Huffman tables (as ffmpeg's default) and a restart marker per MCU
# row (as gpuload compress asks for): PSNR within half a decibel of ffmpeg's, bytes within a fifth
# (tests/test_gpu_check.py).
FFMPEG_QTABLES = {
    3: [8, 6, 7, 8, 9, 10, 10, 12, 6, 6, 8, 9, 10, 10, 12, 13, 7, 8, 9, 10, 10, 12, 12, 14, 8, 8, 9, 10, 10, 12, 13, 15,
        8, 9, 10, 10, 12, 13, 15, 18, 9, 10, 10, 12, 13, 15, 18, 21, 9, 10, 10, 12, 14, 17, 21, 25, 10, 10, 13, 14, 17,
        21, 25, 31],
}  # fmt: skip


# What the photos of this run are (set by photo_folders), for results and footers.
PHOTOS: str | None = None


def photo_folders(
    workdir: Path, count: int, size: tuple[int, int] | None = (480, 640), quality: int = 3
) -> tuple[Path, Path]:
    """An ImageFolder of ``count`` photos (:mod:`experiments._photos`: crops of ten real photographs, each
    of ``size`` (height, width), or at ImageNet-like sizes with ``None``) and its ffmpeg ``-q:v quality``
    copy, made once under ``workdir`` and reused; :data:`PHOTOS` then says what they are, and
    :func:`write_result` records it.

    The originals are made in a hidden temporary folder and renamed when complete; the copy is
    resumed (and redone where an earlier version wrote it) by ``compress_folder`` itself, which must
    compress every photo. Nothing outside those two names is ever removed. Where no ffmpeg is found,
    the copy is Pillow's with ffmpeg's quantisation table (see ``FFMPEG_QTABLES``; its folder's name says
    ``pillow``), for the qualities whose table is there; others raise.

    Raises:
        FileNotFoundError: no ffmpeg, for a quality with no Pillow match.
    """
    from ._photos import describe, make_photo_set

    global PHOTOS
    tag = f"{count}-varied" if size is None else f"{count}-{size[1]}x{size[0]}"
    originals = workdir / f"photos-{tag}"
    if not originals.exists():
        make_photo_set(originals, count, size=size)  # made under a temporary name, renamed when complete
    PHOTOS = f"{count:,} {describe(size)}, ffmpeg -q:v {quality}"
    try:
        gpuload.find_ffmpeg()
    except FileNotFoundError:
        if quality not in FFMPEG_QTABLES:
            raise
        return originals, pillow_copy(originals, workdir / f"pillow-q{quality}-{tag}", quality)
    compressed = workdir / f"q{quality}-{tag}"
    report = gpuload.compress_folder(originals, compressed, quality=quality, progress=False)  # skips what is finished
    if report.failed:  # an experiment on fewer photos than it says would mislead
        raise RuntimeError(f"compress failed on {len(report.failed)} photos, first {report.failed[0]}")
    return originals, compressed


def pillow_copy(originals: Path, copy: Path, quality: int) -> Path:
    """``originals`` re-encoded by Pillow as ffmpeg's ``-q:v quality`` quantises into ``copy`` (made in a
    hidden temporary folder, renamed when complete), once."""
    if copy.exists():
        return copy
    partial = copy.with_name(f".{copy.name}.partial")
    if partial.exists():
        shutil.rmtree(partial)
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    def encode(source: Path) -> None:
        target = partial / source.relative_to(originals)
        target.parent.mkdir(parents=True, exist_ok=True)
        with Image.open(source) as image:
            image.convert("RGB").save(
                target, qtables=[FFMPEG_QTABLES[quality]], subsampling="4:2:0", optimize=True, restart_marker_rows=1
            )

    with ThreadPoolExecutor(os.cpu_count()) as pool:  # Pillow's codecs release the GIL
        list(pool.map(encode, sorted(originals.rglob("*.jpg"))))
    os.rename(partial, copy)
    return copy


def add_device_argument(parser) -> None:
    """``--device cpu|cuda|auto`` (default ``auto``: cuda when a GPU is there), for every experiment."""
    parser.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto", help="where batches go (default: auto)"
    )


def resolve_device(name: str):
    """The ``torch.device`` of a ``--device`` value; a clear exit when cuda is asked for and missing."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: this machine has no CUDA GPU that torch can use; pass --device cpu or auto")
    return torch.device(name)


def median_spread(values: list[float]) -> dict:
    """``{"median", "min", "max", "runs"}`` of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": list(values)}


class UnreclaimableMemory:
    """Peak memory the OS cannot reclaim while a block runs: the anonymous memory of this
    process and its children plus the growth of shared memory (page cache, which the kernel can
    drop or write back, is left out). ``shared="system"`` counts the growth of the whole machine's
    shared memory (a stock loader's workers hand batches over in shared memory that several
    processes map); ``shared="tree"``, the shared pages this process and its children map, which
    other jobs on a shared machine cannot inflate.

    Example:
        with UnreclaimableMemory() as memory:
            work()
        print(memory.peak_bytes)
    """

    def __init__(self, interval: float = 0.02, shared: str = "system") -> None:
        if shared not in ("system", "tree"):
            raise ValueError(f"shared is 'system' or 'tree', got {shared!r}")
        self.interval, self.shared = interval, shared
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> UnreclaimableMemory:
        self._shmem_start = _meminfo_kib("Shmem")
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while True:
            tree = _process_tree(os.getpid())
            now = sum(_status_kib(pid, "RssAnon") for pid in tree)
            if self.shared == "tree":
                now += sum(_status_kib(pid, "RssShmem") for pid in tree)
            else:
                now += max(0, _meminfo_kib("Shmem") - self._shmem_start)
            self.peak_bytes = max(self.peak_bytes, now * 1024)
            if self._stop.wait(self.interval):
                return


def _process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as file:
                    todo += [int(child) for child in file.read().split()]
        except OSError:
            continue
    return pids


def _status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as file:
            for line in file:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _meminfo_kib(field: str) -> int:
    with open("/proc/meminfo") as file:
        for line in file:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def result_name(name: str, device="cpu") -> str:
    """The file name (no suffix) of a result and its plots: ``name`` for the CPU, ``name_cuda`` for a GPU.

    ``device`` is a ``torch.device``, ``"cpu"``, ``"cuda[:N]"`` or ``"auto"`` (cuda when a GPU is there).
    CPU results keep their plain names; a GPU run writes beside them, and the talk prefers it.

    Example:
        >>> result_name("transfer_order", "cpu"), result_name("transfer_order", "cuda:0")
        ('transfer_order', 'transfer_order_cuda')
    """
    kind = _device_kind(device)
    return name if kind == "cpu" else f"{name}_{kind}"


def _device_kind(device) -> str:
    import torch

    if str(device) == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device).type


def write_result(name: str, payload: dict) -> Path:
    """Write ``assets/results/<name>.json`` (``<name>_cuda.json`` when ``payload["device"]`` is a GPU)
    with the machine description added; returns its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{result_name(name, payload.get('device', 'cpu'))}.json"
    payload = {"experiment": name, "machine": gpuload.describe_machine(), **payload}
    if PHOTOS is not None:
        payload.setdefault("photos", PHOTOS)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def elapsed(function, *args, **kwargs) -> float:
    """Seconds that ``function(*args, **kwargs)`` takes."""
    started = time.perf_counter()
    function(*args, **kwargs)
    return time.perf_counter() - started


def read_result(name: str, device="cpu") -> dict:
    """The JSON that :func:`write_result` wrote for ``name`` on ``device`` (for ``--plot-only``)."""
    path = RESULTS / f"{result_name(name, device)}.json"
    if not path.is_file():
        raise SystemExit(f"{path} does not exist: run the experiment first (with --device {_device_kind(device)})")
    return json.loads(path.read_text())


def device_name(device) -> str:
    """``"cpu (AMD EPYC, 2 cores)"`` or ``"cuda (NVIDIA H100 80GB HBM3)"``: what produced a plot."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    machine = gpuload.describe_machine()
    return f"cpu ({machine['cpu']}, {machine['cores']} cores)"


# The talk shows plots on Slidev's slide canvas (980x552 CSS px, scaled to the screen). A figure is
# drawn at the size it is shown there, at 72 dpi, so that 1 pt of matplotlib is 1 px of the canvas, and
# saved at PIXEL_DENSITY times that for sharp text on a projector; the talk shows the PNG at its
# width / PIXEL_DENSITY. Every text is at least MIN_FONT_PX on the canvas (save_figure checks).
CANVAS = (980, 552)
PLOT_SIZE = (900, 330)  # a plot slide: its title above, a takeaway and a stand-in note below
MIN_FONT_PX = 18  # the back row: plot text of 18 px or more as shown on the slide (issue 30)
PIXEL_DENSITY = 2
FONT_SIZES = {
    "font.size": 18,
    "axes.titlesize": 19,
    "axes.labelsize": 18,
    "xtick.labelsize": 18,
    "ytick.labelsize": 18,
    "legend.fontsize": 18,
    "legend.title_fontsize": 18,
    "figure.titlesize": 20,
}
FOOTNOTE_PX = 18
EDGE_PX = 4  # the footnote's distance from the figure's edges, and the least room right of a wrapped text
FOOTNOTE_GID = "footnote"  # the footnote's texts, which layout() replaces


def result_device_name(result: dict) -> str:
    """The device that produced a result, as :func:`device_name` wrote it (for results older than that field:
    the CPU of its machine)."""
    if "device_name" in result:
        return result["device_name"]
    machine = result["machine"]
    return f"cpu ({machine['cpu']}, {machine['cores']} cores)"


def figure(rows: int = 1, columns: int = 1, *, size: tuple[int, int] = PLOT_SIZE, **kwargs):
    """A matplotlib figure of ``size`` canvas px (width, height) with fonts of at least ``MIN_FONT_PX``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width, height = size
    if not (0 < width <= CANVAS[0] and 0 < height <= CANVAS[1]):
        raise ValueError(f"a figure must fit the {CANVAS[0]}x{CANVAS[1]} slide canvas, got {width}x{height}")
    plt.rcParams.update(FONT_SIZES)
    return plt.subplots(rows, columns, figsize=(width / 72, height / 72), dpi=72, squeeze=False, **kwargs)


def small_texts(fig) -> list[str]:
    """The visible texts of ``fig`` smaller than ``MIN_FONT_PX`` on the canvas, and the figure-level
    texts (titles, footnote) that run off its edges: what the back row could not read."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    scale = fig.dpi / 72  # canvas px per pt
    problems = []
    for text in fig.findobj(Text):
        if not text.get_visible() or not text.get_text().strip():
            continue
        if text.get_fontsize() * scale < MIN_FONT_PX - 1e-6:
            problems.append(f"{text.get_text()!r} at {text.get_fontsize() * scale:.1f} px")
    edges = fig.bbox
    for text in _titles(fig):
        box = text.get_window_extent(renderer)
        if box.x0 < edges.x0 - 1 or box.x1 > edges.x1 + 1:
            problems.append(f"{text.get_text()!r} is wider than the figure")
    return problems


def _titles(fig) -> list:
    """The visible figure-level texts (titles, footnote) and panel titles of ``fig``."""
    texts = list(fig.texts) + [
        title for axis in fig.axes for title in (axis.title, axis._left_title, axis._right_title)
    ]
    return [text for text in texts if text.get_visible() and text.get_text().strip()]


def legend_right(fig, axis, title: str | None = None) -> float:
    """One legend for the whole figure, right of the panels, from ``axis``'s lines; returns the share of the
    width left to the panels (pass it to :func:`save_figure` as ``right``)."""
    handles, labels = axis.get_legend_handles_labels()
    legend = fig.legend(handles, labels, loc="center right", title=title, frameon=False)
    renderer = fig.canvas.get_renderer()
    return 1 - (legend.get_window_extent(renderer).width + 8) / fig.bbox.width


def save_figure(
    fig, name: str, result: dict, statistics: str = "medians, bars/bands: min-max", *, right: float = 1.0
) -> Path:
    """Add the machine footnote (and what the marks show) with :func:`layout`, check the text sizes, save
    ``assets/<name>.png`` (``<name>_cuda.png`` for a GPU result) and close the figure. The panels take
    the width up to ``right`` (a share of it; the rest is for a :func:`legend_right`).

    Raises:
        ValueError: a text is smaller than ``MIN_FONT_PX`` on the canvas, or a title is wider than the figure.
    """
    import matplotlib.pyplot as plt

    layout(fig, result, statistics, right=right)
    problems = small_texts(fig)
    if problems:
        plt.close(fig)
        raise ValueError(f"{name}: text the back row cannot read: " + "; ".join(problems))
    ASSETS.mkdir(parents=True, exist_ok=True)
    path = ASSETS / f"{result_name(name, result.get('device', 'cpu'))}.png"
    fig.savefig(path, dpi=72 * PIXEL_DENSITY)
    plt.close(fig)
    return path


def layout(fig, result: dict, statistics: str, *, right: float = 1.0) -> None:
    """Write the footnote at the foot of ``fig`` (the machine of ``result``, its date and ``statistics``)
    and lay the panels out above it, up to ``right`` (a share of the width).

    The footnote is wrapped to the figure's width at its commas and semicolons: one line where it fits, as
    many as it needs on a machine with a long description, a piece wider than the figure on its own cut
    short with an ellipsis. A title that runs off the figure (one naming such a machine's CPU) is wrapped at
    its spaces. Called again, it replaces the footnote it wrote.
    """
    for text in [text for text in fig.texts if text.get_gid() == FOOTNOTE_GID]:
        text.remove()
    machine = result["machine"]
    note = (
        f"{machine['cpu']}, {machine['cores']} cores, GPU: {machine['gpu'] or 'none'}"
        + (f" (CUDA {machine['cuda']})" if machine.get("cuda") else "")
        + f"; torch {machine['torch']}; {machine['date'][:10]}; {statistics}"
        + (f"; photos: {result['photos']}" if result.get("photos") else "")
    )
    footnote = fig.text(
        EDGE_PX / fig.bbox.width, EDGE_PX / fig.bbox.height, note, fontsize=FOOTNOTE_PX, color="0.35", va="bottom"
    )
    footnote.set_gid(FOOTNOTE_GID)
    _wrap(fig, footnote, r"(?<=[,;]) ", cut=True)
    bottom = (footnote.get_window_extent(fig.canvas.get_renderer()).y1 + EDGE_PX) / fig.bbox.height
    fig.tight_layout(rect=(0, bottom, right, 1), pad=0.4, w_pad=1.2)
    wrapped = False
    for text in _titles(fig):
        if text is not footnote:
            wrapped |= _wrap(fig, text, " ")
    if wrapped:  # room for the titles' new lines
        fig.tight_layout(rect=(0, bottom, right, 1), pad=0.4, w_pad=1.2)


def _wrap(fig, text, breaks: str, *, cut: bool = False) -> bool:
    """Break each line of ``text`` that runs off ``fig`` at the matches of the regex ``breaks`` (joined with a
    space where a line goes on); with ``cut``, a piece too wide on its own is cut short with an ellipsis
    (else it stays, for :func:`small_texts` to refuse). Whether it changed the text."""
    renderer = fig.canvas.get_renderer()
    original = text.get_text()

    def fits(line: str) -> bool:
        text.set_text(line)
        box = text.get_window_extent(renderer)
        return box.x0 >= 0 and box.x1 <= fig.bbox.width - EDGE_PX

    if all(fits(line) for line in original.split("\n")):
        text.set_text(original)
        return False
    lines: list[str] = []
    for line in original.split("\n"):
        current = ""
        for piece in re.split(breaks, line):
            if current and fits(f"{current} {piece}"):
                current = f"{current} {piece}"
                continue
            if current:
                lines.append(current)
            while cut and len(piece) > 1 and not fits(piece):
                piece = piece.removesuffix("…")[:-1] + "…"
            current = piece
        lines.append(current)
    text.set_text("\n".join(lines))
    return True


def plot_spread(
    axis, line: list[dict], key: str, style: str, label: str, *, scale: float = 1.0, per_image: bool = False
) -> None:
    """Plot the medians of ``row[key]`` (a :func:`median_spread`) over batch size, with the min-max band.

    ``scale`` converts units (``1e3``: seconds to ms); ``per_image`` divides by each row's batch size.
    """
    batch = [row["batch_size"] for row in line]

    def values(statistic: str) -> list[float]:
        return [row[key][statistic] * scale / (row["batch_size"] if per_image else 1) for row in line]

    axis.plot(batch, values("median"), style, label=label)
    axis.fill_between(batch, values("min"), values("max"), alpha=0.2)


def style_batch_axis(axis, title: str, ylabel: str, *, log_y: bool = True, legend_title: str | None = None) -> None:
    """Title, labels, log2 batch-size axis (and log y), grid and legend of a panel over batch size."""
    batch_ticks(axis)
    if log_y:
        axis.set_yscale("log")
    axis.set_title(title)
    axis.set_xlabel("batch size (images)")
    axis.set_ylabel(ylabel)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(title=legend_title)


def batch_ticks(axis) -> None:
    """A log2 x axis with a tick, written as a plain number, at every batch size its lines have."""
    from matplotlib.ticker import NullLocator

    lines = [line for line in axis.get_lines() if line.get_transform() == axis.transData]  # not axhline's
    batches = sorted({int(x) for line in lines for x in line.get_xdata() if x > 0})
    axis.set_xscale("log", base=2)
    axis.set_xticks(batches, [str(batch) for batch in batches])
    axis.xaxis.set_minor_locator(NullLocator())


def parse_sizes(texts: list[str]) -> list[tuple[int, int]]:
    """``["640x480"]`` (width x height, as photos are named) -> ``[(480, 640)]`` (height, width)."""
    sizes = []
    for text in texts:
        width, height = (int(part) for part in text.lower().split("x"))
        sizes.append((height, width))
    return sizes


def synchronize(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
