"""Helpers shared by the experiments: data preparation, timing, memory watching, result files."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import threading
import time
from pathlib import Path

import gpuload

ROOT = Path(__file__).resolve().parent.parent
ASSETS = Path(os.environ.get("GPULOAD_ASSETS", ROOT / "assets"))  # the CI smoke test writes elsewhere
RESULTS = ASSETS / "results"


def photo_folders(workdir: Path, count: int, size: tuple[int, int] = (480, 640), quality: int = 3) -> tuple[Path, Path]:
    """An ImageFolder of ``count`` camera-like JPEG originals (PIL quality 98) and its
    ffmpeg ``-q:v quality`` copy, made once under ``workdir`` and reused.

    The originals are made in a hidden temporary folder and renamed when complete; the copy is
    resumed by ``compress_folder`` itself. Nothing outside those two names is ever removed.
    """
    classes = len(gpuload.SAMPLE_CLASSES)
    per_class = -(-count // classes)
    tag = f"{per_class * classes}-{size[0]}x{size[1]}"
    originals = workdir / f"originals-{tag}"
    compressed = workdir / f"q{quality}-{tag}"
    if not originals.exists():
        partial = workdir / f".originals-{tag}.partial"
        if partial.exists():
            shutil.rmtree(partial)  # a run of this function was killed while writing it
        gpuload.make_sample_folder(partial, images_per_class=per_class, size=size, quality=98)
        os.rename(partial, originals)
    if not (compressed / ".complete").exists():
        gpuload.compress_folder(originals, compressed, quality=quality, progress=False)
        (compressed / ".complete").touch()
    return originals, compressed


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
    process and its children plus the growth of shared memory system-wide (page cache,
    which the kernel can drop or write back, is left out).

    Example:
        with UnreclaimableMemory() as memory:
            work()
        print(memory.peak_bytes)
    """

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
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
            now = sum(_status_kib(pid, "RssAnon") for pid in _process_tree(os.getpid()))
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


def write_result(name: str, payload: dict) -> Path:
    """Write ``assets/results/<name>.json`` with the machine description added; returns its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"experiment": name, "machine": gpuload.describe_machine(), **payload}
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def elapsed(function, *args, **kwargs) -> float:
    """Seconds that ``function(*args, **kwargs)`` takes."""
    started = time.perf_counter()
    function(*args, **kwargs)
    return time.perf_counter() - started


def read_result(name: str) -> dict:
    """The JSON that :func:`write_result` wrote for ``name`` (for ``--plot-only``)."""
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"{path} does not exist: run the experiment first")
    return json.loads(path.read_text())


def device_name(device) -> str:
    """``"cpu (AMD EPYC, 2 cores)"`` or ``"cuda (NVIDIA H100 80GB HBM3)"``: what produced a plot."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    machine = gpuload.describe_machine()
    return f"cpu ({machine['cpu']}, {machine['cores']} cores)"


def figure(rows: int = 1, columns: int = 1, **kwargs):
    """A matplotlib figure at slide size (1280x720 px) with readable fonts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 13, "axes.titlesize": 14, "axes.labelsize": 13, "legend.fontsize": 11})
    return plt.subplots(rows, columns, figsize=(12.8, 7.2), dpi=100, squeeze=False, **kwargs)


def save_figure(fig, name: str, result: dict, statistics: str = "medians, bars/bands: min-max") -> Path:
    """Add the machine footnote (and what the marks show), save ``assets/<name>.png`` and close the figure."""
    import matplotlib.pyplot as plt

    machine = result["machine"]
    note = (
        f"{machine['cpu']}, {machine['cores']} cores, GPU: {machine['gpu'] or 'none'}; torch {machine['torch']}, "
        f"CUDA {machine['cuda'] or '-'}; {machine['date'][:10]}; {statistics}"
    )
    fig.text(0.01, 0.01, note, fontsize=10, color="0.35")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    ASSETS.mkdir(parents=True, exist_ok=True)
    path = ASSETS / f"{name}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


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
    axis.set_xscale("log", base=2)
    if log_y:
        axis.set_yscale("log")
    axis.set_title(title)
    axis.set_xlabel("batch size (images)")
    axis.set_ylabel(ylabel)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(title=legend_title)


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
