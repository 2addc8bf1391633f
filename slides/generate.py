"""The talk (``slides/slides.md``) from its template and what the experiments measured:
``python -m slides.generate [--check | --pdf]``, run in the repository (``--pdf`` also exports
the built talk to ``slides/how-to-efficiently-send-images-to-gpu.pdf``).

The template (``slides/template.md``) holds the story, the layout and the speaker notes; every
number, table, plot and code excerpt on the slides is a ``${name}`` placeholder filled here from
``assets/results/*.json``, ``assets/*.png`` and the project's source files. Same inputs, same Markdown.

One loader measurement feeds every slide that quotes a loader's rate: ``experiments/jpeg_store.py``
(``jpeg_store.json``), its contenders named as its ``LABELS`` name them (the README's names too). Each
other number comes from the one experiment that measures it. A result the talk reads that is missing,
or that lacks a contender or a field a slide reads, is an error naming the file and the command that
makes it: the talk is never generated from part of a run.

Every committed result comes from a CPU. The GPU measurements still owed are listed on one slide,
with the one command that makes them; a GPU result (``<name>_cuda.json``, ``bench_cuda.json``) that
arrives is marked there as measured.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from string import Template

from experiments.jpeg_store import LABELS, SIZE
from experiments.numbers import count as _count
from experiments.numbers import per_repeat as _per_repeat
from experiments.numbers import times as _times
from gpuload.machine import machine_line

from .quoted import GPU_TRAINING
from .snippets import Snippet

__all__ = ["MAX_SLIDES", "PLOT_DENSITY", "SNIPPETS", "main", "plot_size", "render_slides", "write_slides"]

TEMPLATE = Path("slides/template.md")
DECK = Path("slides/slides.md")
RESULTS = Path("assets/results")
PLOTS = Path("assets")
README = Path("README.md")
PLOT_DENSITY = 2  # PNG pixels per slide-canvas pixel: experiments/_common.py PIXEL_DENSITY
MAX_SLIDES = 18  # main slides: the rest follow the "Backup" divider
BACKUP = "Backup"  # the divider's title
TALK_MINUTES = 25  # the slot: the main slides' times in the notes add up to it
QR = Path("assets/talk_qr.svg")  # the repository's address as a QR code, written by write_qr
PDF = Path("slides/how-to-efficiently-send-images-to-gpu.pdf")  # the built talk, committed for reading
PDF_SOURCES = PDF.with_name(PDF.name + ".sources")  # the digest of what it was built from
STYLE = Path("slides/style.css")
GPU_CHECK = "python -m experiments.gpu_check run"
WAITING = 0.05  # the share of a step in getting the batch to the model above which the step waits for data

# The command that makes each result the talk reads, for the error that says it is missing.
HOW_TO_MEASURE = {
    "jpeg_store": "python -m experiments.jpeg_store",
    "build_memmap": "python -m experiments.build_memmap --counts 2000 --repeats 3",
    "jpeg_quality": "python -m experiments.jpeg_quality",
    "decode_costs": "python -m experiments.decode_costs",
    "decoders": "python -m experiments.decoders --repeats 5",
    "transfer_order": "python -m experiments.transfer_order",
    "train_order": "python -m experiments.train_order",
    "train_augment": "python -m experiments.train_augment",
    "gpu_preprocess": "python -m experiments.gpu_preprocess",
    "stock_breakdown": "python -m experiments.stock_breakdown --repeats 5",
    "memmap_vs_folder": "python -m experiments.memmap_vs_folder",
}

# The GPU measurements still owed, on the one slide that lists them: (the result a GPU run writes, what it adds).
GPU_OWED = (
    ("gpu_check_cuda", "the CUDA tests, each step of the stream protocol removed in turn"),
    ("bench_cuda", "`gpuload bench --device cuda`: the copy limit, the loader's share of it"),
    ("jpeg_store_cuda", "the loader on the GPU: crops on the device, nvJPEG"),
    ("transfer_order_cuda", "copy-then-cast against cast-then-copy over the bus"),
    ("train_order_cuda", "a training step's trace, fed three ways"),
    ("train_augment_cuda", "training with the crop in workers or in the model"),
    ("gpu_preprocess_cuda", "the batched crop against torchvision and Kornia"),
)  # fmt: skip

SNIPPETS = {
    "code_gather": Snippet(
        "gpuload/loading/pipeline.py",
        "_PinnedSlot.fill",
        start="with torch.cuda.device(self.device)",
        end="self.event.record(stream)",
        comments=False,
        steps=(("non_blocking",), ("Event(", ".record(")),
    ),
    "code_consume": Snippet(
        "gpuload/loading/pipeline.py",
        "EpochIterator.__next__",
        start="stream = torch.cuda.current_stream",
        end="self._pipeline.release(slot)",
        comments=False,
        steps=(("_stream_waits",), ("_record_on",), ("release",)),
    ),
    "code_normalize": Snippet(
        "gpuload/transforms/normalize.py", "Normalize.forward", comments=False, steps=(("torch.addcmul",),)
    ),
}

# How gpuload compares with its peers, feature by feature, when the README has no such table: read from
# each project's own docs and code (PEER_SOURCES). Qualitative on purpose (no speeds), and fair: where
# others win, the table says so, and the prior art of a uint8 batch normalised on the GPU is credited.
PEERS = (
    ["", "GPU decode", "s3://", "uint8, normalised on the GPU"],
    ["gpuload", "nvJPEG, one run", "yes", "in the model"],
    ["DALI", "nvJPEG, NVIDIA's", "yes", "in its pipeline"],
    ["FFCV", "no", "no", "`NormalizeImage`"],
    ["timm, apex", "no", "no", "`PrefetchLoader`"],
    ["WebDataset, LitData", "no", "yes", "no"],
)
PEER_NAMES = ("DALI", "FFCV", "timm")
PEER_SOURCES = (
    ("DALI", "https://docs.nvidia.com/deeplearning/dali/user-guide/docs/"),
    ("FFCV", "https://docs.ffcv.io"),
    ("timm", "https://github.com/huggingface/pytorch-image-models/blob/main/timm/data/loader.py"),
    ("apex", "https://github.com/NVIDIA/apex/blob/master/examples/imagenet/main_amp.py"),
)


def render_slides(root: str | os.PathLike = ".") -> str:
    """The deck's Markdown: ``slides/template.md`` under ``root`` with every placeholder filled.

    Raises:
        FileNotFoundError: ``root`` is not the gpuload repository (no template).
        ValueError: the template names a placeholder nobody fills, or leaves one unused; a result the
            talk reads is missing, is not valid JSON, or lacks what its slides read.
        SnippetError: a snippet's symbol or text is no longer in the source.

    Example:
        >>> deck = render_slides(Path(__file__).resolve().parent.parent)
        >>> deck.startswith("---") and "${" not in deck
        True
    """
    root = Path(root)
    template_path = root / TEMPLATE
    if not template_path.is_file():
        raise FileNotFoundError(f"no {TEMPLATE} under {root.resolve()}: run this in the gpuload repository")
    text = template_path.read_text()
    template = Template(text)
    results = Results(root / RESULTS)
    values = {name: snippet.markdown(root) for name, snippet in SNIPPETS.items()}
    for section, reads in SECTIONS:
        try:
            values.update(section(results, root))
        except (KeyError, IndexError, TypeError, ZeroDivisionError) as error:
            if not reads:  # a section that reads no result fields of its own: the error is a bug here
                raise
            files = ", ".join(f"assets/results/{name}.json" for name in reads)
            commands = " and ".join(f"`{HOW_TO_MEASURE[name]}`" for name in reads)
            raise ValueError(
                f"{files} lacks what the {section.__name__.strip('_')} slides read "
                f"({type(error).__name__}: {error}): rerun {commands}"
            ) from None
    values |= _about(text, root)  # after the results: a missing result is the first thing to say
    wanted, given = set(template.get_identifiers()), set(values)
    if wanted - given:
        raise ValueError(f"{TEMPLATE} names placeholders nothing fills: {sorted(wanted - given)}")
    if given - wanted:
        raise ValueError(f"{TEMPLATE} does not use: {sorted(given - wanted)}")
    return template.substitute(values)


def write_slides(root: str | os.PathLike = ".", *, check: bool = False) -> bool:
    """Write ``slides/slides.md`` (or, with ``check``, only compare); returns whether it was out of date."""
    deck = Path(root) / DECK
    text = render_slides(root)
    stale = not deck.is_file() or deck.read_text() != text
    if stale and not check:
        temporary = deck.with_name(f".{deck.name}.tmp-{os.getpid()}")
        temporary.write_text(text)
        os.replace(temporary, deck)
    return stale


def talk_digest(root: str | os.PathLike = ".") -> str:
    """SHA-256 over what the built talk shows: the deck, its style and every image it loads.

    Example:
        >>> len(talk_digest(Path(__file__).resolve().parent.parent))
        64
    """
    root = Path(root)
    deck = (root / DECK).read_text()
    digest = hashlib.sha256()
    paths = [DECK, STYLE] + [PLOTS / name for name in sorted(set(re.findall(r'src="/([^"]+)"', deck)))]
    for path in paths:
        digest.update(str(path).encode() + b"\0" + (root / path).read_bytes())
    return digest.hexdigest()


def export_pdf(root: str | os.PathLike = ".") -> Path:
    """Export the deck with Slidev and Chromium (``npm run export:pdf``) to ``PDF``, and record in
    ``PDF_SOURCES`` the :func:`talk_digest` it was built from, so a test sees when it is stale.

    Raises:
        OSError: npm or ``slides/node_modules`` is missing, or the export failed.
    """
    root = Path(root)
    slides = root / "slides"
    if shutil.which("npm") is None or not (slides / "node_modules").is_dir():
        raise OSError(
            "the PDF needs npm and slides/node_modules: run `cd slides && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci` first"
        )
    digest = talk_digest(root)
    done = subprocess.run(["npm", "run", "--silent", "export:pdf"], cwd=slides, capture_output=True, text=True)
    exported = slides / "export" / PDF.name
    if done.returncode != 0 or not exported.is_file():
        last = (done.stderr.strip().splitlines() or ["no message"])[-1][:300]
        raise OSError(
            f"npm run export:pdf in {slides} failed (exit {done.returncode}): {last}; run it there to see all"
        )
    os.replace(exported, root / PDF)
    temporary = (root / PDF_SOURCES).with_name(f".{PDF_SOURCES.name}.tmp-{os.getpid()}")
    temporary.write_text(digest + "\n")
    os.replace(temporary, root / PDF_SOURCES)
    return root / PDF


def plot_size(path: Path) -> tuple[int, int]:
    """The size (width, height) a plot PNG is shown at on the slide canvas: its pixels / ``PLOT_DENSITY``."""
    with open(path, "rb") as file:
        header = file.read(24)
    if header[:8] != b"\x89PNG\r\n\x1a\n" or header[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    width, height = struct.unpack(">II", header[16:24])
    return round(width / PLOT_DENSITY), round(height / PLOT_DENSITY)


class Results:
    """The JSON results under ``assets/results``, by name (``jpeg_store`` for ``jpeg_store.json``)."""

    def __init__(self, folder: Path) -> None:
        self.found: dict[str, dict] = {}
        for path in sorted(folder.glob("*.json")):
            try:
                self.found[path.stem] = json.loads(path.read_text())
            except json.JSONDecodeError as error:
                raise ValueError(f"{path} is not valid JSON: {error}") from None

    def __getitem__(self, name: str) -> dict:
        """The result ``name``; a ValueError saying which command makes it when it is missing."""
        if name not in self.found:
            raise ValueError(
                f"the talk reads assets/results/{name}.json, which is missing: run `{HOW_TO_MEASURE[name]}`, "
                "then `python -m slides.generate`"
            )
        return self.found[name]

    def gpu(self, name: str) -> dict | None:
        """A GPU run's result (``bench_cuda``, ``<name>_cuda``), or None."""
        return self.found.get(name)

    def used(self) -> list[tuple[str, dict]]:
        """The CPU results the talk reads, by name."""
        return [(name, self[name]) for name in HOW_TO_MEASURE]


class Store:
    """``jpeg_store.json``: the one loader measurement, rates by contender (``LABELS``' names) and page cache."""

    def __init__(self, result: dict) -> None:
        self.result = result
        self.rows = {(row["contender"], row["cache"]): row for row in result["rows"]}

    def row(self, contender: str, cache: str = "warm") -> dict:
        if contender not in LABELS:
            raise ValueError(f"experiments/jpeg_store.py has no contender {contender!r} (LABELS names {list(LABELS)})")
        if (contender, cache) not in self.rows:
            raise ValueError(
                f"assets/results/jpeg_store.json has no {contender!r} row ({cache} page cache): the run is older "
                f"than the talk; rerun `{HOW_TO_MEASURE['jpeg_store']}`, then `python -m slides.generate`"
            )
        return self.rows[contender, cache]

    def rate(self, contender: str, cache: str = "warm") -> float:
        """Images/s, the median of the repeats."""
        return self.row(contender, cache)["images_per_second"]["median"]

    def megabytes(self, contender: str, cache: str = "warm") -> float:
        """MB/s read from the store, the median of the repeats."""
        return self.row(contender, cache)["megabytes_per_second"]["median"]

    def on_disk(self, contender: str) -> float:
        """Bytes of what ``contender`` reads: the raw or the jpeg store, or the photos' folder."""
        sizes = self.result["bytes_on_disk"]
        return sizes["raw" if contender.startswith("raw") else "jpeg" if contender.startswith("jpeg") else "source"]


# --- formatting -------------------------------------------------------------------------------


def _percent(share: float) -> str:
    percent = 100 * share
    if percent == 0:
        return "0 %"
    if percent < 0.01:
        return "under 0.01 %"
    return f"{percent:.2f} %" if percent < 0.1 else f"{percent:.1f} %" if percent < 10 else f"{percent:.0f} %"


def _ms(milliseconds: float) -> str:
    return f"{milliseconds:.2f} ms" if milliseconds < 10 else f"{milliseconds:,.0f} ms"


def _bytes(size: float) -> str:
    """``921.6 KB``, ``98 MB``, ``1.8 GB``, ``922 GB``, ``1.2 TB`` (decimal units)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= scale:
            value = size / scale
            return f"{value:,.1f} {unit}" if value < 10 else f"{value:,.0f} {unit}"
    return f"{size:.0f} B"


def _mib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:,.0f} MiB"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _compared(value: float, reference: float) -> str:
    """How ``value`` compares with ``reference``, for a sentence: "as fast as", "faster than", "slower than"."""
    if abs(value / reference - 1) < 0.1:
        return "about as fast as"
    return "faster than" if value > reference else "slower than"


def _takeaway(text: str) -> str:
    return f'<div class="gl-takeaway">\n\n{text}\n\n</div>'


def _source(result: dict, stem: str) -> str:
    """The small line under a table: the JSON file, its date and the machine (a plot names its own)."""
    return (
        f'<p class="gl-source">{stem}.json · {result["machine"]["date"][:10]} · {machine_line(result["machine"])}</p>'
    )


def _plot(root: Path, stem: str, alt: str) -> str:
    """The plot ``assets/<stem>.png`` at the size it was drawn (an error naming its command if missing)."""
    path = root / PLOTS / f"{stem}.png"
    if not path.is_file():
        raise ValueError(f"the talk shows assets/{stem}.png, which is missing: `python -m experiments.run` draws it")
    width, height = plot_size(path)
    return f'<img class="plot" src="/{stem}.png" width="{width}" height="{height}" alt="{alt}"/>'


def _cores(result: dict) -> int:
    return result["machine"]["cores"]


def _headmatter(template: str) -> dict[str, str]:
    """The template's headmatter fields that are one ``key: value`` line."""
    block = template.split("---", 2)[1]
    return dict(re.findall(r"^(\w+): (.+)$", block, flags=re.MULTILINE))


def _about(template: str, root: Path) -> dict[str, str]:
    """Who gives the talk (the template's ``speaker``) and where the code lives: the README's GitHub
    address of gpuload if it gives one, else the template's ``repository``, else "this repository"."""
    headmatter = _headmatter(template)
    speaker = headmatter.get("speaker")
    if not speaker:
        raise ValueError(f"{TEMPLATE}'s headmatter has no `speaker:` (who gives the talk)")
    readme = (root / README).read_text() if (root / README).is_file() else ""
    address = re.search(r"https://github\.com/[\w.-]+/gpuload\b", readme)
    repository = address.group(0) if address else headmatter.get("repository", "this repository")
    layout = (
        f"{repository}: `gpuload/` the library · `experiments/` every number in this talk · "
        "`slides/` this talk, generated from them"
    )
    if not layout.startswith("http"):
        layout = layout[0].upper() + layout[1:]
    layout = f'<div class="gl-byline">\n\n{layout}\n\n</div>'
    is_url = repository.startswith("https://")
    install = "`pip install -e .` in a clone" + (f", or `pip install git+{repository}`" if is_url else "")
    qr = ""
    if is_url:
        if not (root / QR).is_file():
            raise ValueError(f"the talk shows {QR}, which is missing: `python -m slides.generate` writes it (segno)")
        size = re.search(r'width="(\d+)"', (root / QR).read_text()).group(1)
        qr = f'<img class="gl-qr" src="/{QR.name}" width="{size}" height="{size}" alt="QR code: {repository}"/>'
    return {
        "speaker": speaker,
        "repository": repository,
        "repository_layout": layout,
        "install_line": f"Install: {install} (not on PyPI).",
        "qr_code": qr,
    }


def write_qr(root: str | os.PathLike = ".") -> Path | None:
    """Write ``QR`` (an SVG QR code of the talk's repository address, made offline with segno) when the
    address is a URL; returns its path, or None (no URL, or segno not installed: the committed file stays).

    Example:
        >>> import tempfile
        >>> write_qr(tempfile.mkdtemp()) is None  # not the repository: nothing written
        True
    """
    root = Path(root)
    if not (root / TEMPLATE).is_file():
        return None  # not the repository: render_slides says so
    headmatter = _headmatter((root / TEMPLATE).read_text())
    readme = (root / README).read_text() if (root / README).is_file() else ""
    address = re.search(r"https://github\.com/[\w.-]+/gpuload\b", readme)
    repository = address.group(0) if address else headmatter.get("repository", "")
    if not repository.startswith("https://"):
        return None
    try:
        import segno
    except ImportError:
        return None
    path = root / QR
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    segno.make(repository, error="m").save(temporary, kind="svg", scale=6, border=2, xmldecl=False)
    os.replace(temporary, path)
    return path


# --- sections, in the order of the talk ----------------------------------------------------------
# Each returns the placeholders of its slides, from the results it names in SECTIONS.

Section = Callable[[Results, Path], dict[str, str]]


def _title(results: Results, root: Path) -> dict[str, str]:
    used = results.used()
    machines = sorted({machine_line(result["machine"]) for _, result in used})
    dates = sorted(result["machine"]["date"][:10] for _, result in used)
    gpus = [name for name, _ in GPU_OWED if results.gpu(name)]
    gpu = "GPU results on the slide that lists them." if gpus else "No GPU run yet."
    return {
        "title_machine": f"Measured on {'; '.join(machines)}, {dates[0]} to {dates[-1]}. {gpu}",
        "title_notes": (
            f"the CPU numbers in this talk were measured on {'; '.join(machines)}: a small CPU machine. "
            + (
                "The GPU numbers come from one lease of a GPU machine, named wherever they are quoted, and "
                "listed on one slide near the end."
                if gpus
                else "No GPU has run the experiments yet: every GPU claim is a design."
            )
        ),
    }


def _problem(results: Results, root: Path) -> dict[str, str]:
    store = Store(results["jpeg_store"])
    return {
        "problem_teaser": (
            f"Same photos, same random crop, same {_cores(store.result)} CPU cores: the stock `DataLoader` serves "
            f"**{_count(store.rate('stock'))}** images/s, gpuload **{_count(store.rate('raw_crop_host'))}** "
            "from photos it decoded once (page cache warm)."
        ),
        "problem_notes": (
            "Those two numbers are the headline: one run of experiments/jpeg_store.py, on "
            f"{machine_line(store.result['machine'])}. We come back to them after the fixes."
        ),
    }


def _trace(results: Results, root: Path) -> dict[str, str]:
    result = results["train_order"]
    last = result["rows"][-1]  # train_order traces its last configuration, copy-then-cast
    traced = next(
        row
        for row in result["rows"]
        if row["variant"] == "cuda_first" and (row["height"], row["width"], row["batch_size"]) == (
            last["height"], last["width"], last["batch_size"])
    )  # fmt: skip
    ranges = traced["range_ms_per_step"]
    feeding = sum(ranges[name] or 0 for name in ("data", "transfer", "cast"))
    step = 1e3 * traced["step_seconds"]["median"]
    shares = [
        sum(row["range_ms_per_step"][name] or 0 for name in ("data", "transfer", "cast"))
        / (1e3 * row["step_seconds"]["median"])
        for row in result["rows"]
    ]
    return {
        "trace_plot": _plot(root, "train_order_trace", "one profiler step drawn from the Chrome trace"),
        "trace_takeaway": _takeaway(
            f"The median step on this CPU, {_ms(step)}, spends {_ms(feeding)} ({_percent(feeding / step)}) getting "
            "its batch into the model (the plot draws one step of the trace): "
            + (
                "compute-bound, the loader is not its problem. Measure before you optimise."
                if feeding / step < WAITING
                else "it waits for data. That is what the rest of this talk fixes."
            )
        ),
        "trace_notes": (
            f"Ranges per step: data {_ms(ranges['data'] or 0)}, transfer {_ms(ranges['transfer'] or 0)}, cast "
            f"{_ms(ranges['cast'] or 0)}, forward {_ms(ranges['forward'])}, backward {_ms(ranges['backward'])}. "
            f"Over the {len(result['rows'])} configurations of the experiment, feeding was "
            f"{_percent(min(shares))} to {_percent(max(shares))} of a step."
        ),
    }


def _quality(results: Results, root: Path) -> dict[str, str]:
    result = results["jpeg_quality"]
    original = next(row for row in result["rows"] if row["quality"] is None)
    default = next(row for row in result["rows"] if row["quality"] == 3)
    worst = max((row for row in result["rows"] if row["quality"] is not None), key=lambda row: row["quality"])
    speed = default["images_per_second"]["median"] / original["images_per_second"]["median"]
    return {
        "quality_plot": _plot(root, "jpeg_quality_crops", "the same crop of a photo at each ffmpeg quality"),
        "quality_takeaway": _takeaway(
            f"`gpuload compress` at `-q:v 3`: {_bytes(original['mean_file_bytes'])} to "
            f"{_bytes(default['mean_file_bytes'])} a photo, "
            f"{_times(original['mean_file_bytes'] / default['mean_file_bytes'])} smaller, at "
            f"{default['psnr_db']:.1f} dB PSNR; the blocks show at `-q:v {worst['quality']}`."
        ),
        "quality_notes": (
            f"{result['images']} photos of {result['image_size'][1]}x{result['image_size'][0]}, originals saved by "
            f"Pillow at quality 98. Smaller files load only {_times(speed)} faster with ImageFolder "
            f"({_count(default['images_per_second']['median'])} against "
            f"{_count(original['images_per_second']['median'])} images/s): once the files are in the page cache, "
            "decoding, not reading, is the cost. The win is bytes: disk, page cache, network."
        ),
    }


def _formats(results: Results, root: Path) -> dict[str, str]:
    store = Store(results["jpeg_store"])
    images = store.result["images"]
    raw, jpeg = (store.result["bytes_on_disk"][name] / images for name in ("raw", "jpeg"))
    memory = store.result["machine"]["memory_gib"] * 2**30
    rows = [
        ["stores", "uint8 pixels, one size", "the JPEG bytes, each at its own size"],
        ["a photo here", _bytes(raw), _bytes(jpeg)],
        ["a million photos", _bytes(1e6 * raw), _bytes(1e6 * jpeg)],
        [f"this machine's {store.result['machine']['memory_gib']:.1f} GiB of RAM hold", _count(memory / raw),
         _count(memory / jpeg)],
        ["crop", "in the loader's threads, or on the GPU", "while decoding, in the loader's threads"],
    ]  # fmt: skip
    return {
        "formats_table": _table(["", "raw", "jpeg"], rows) + "\n\n" + _source(store.result, "jpeg_store"),
        "formats_takeaway": _takeaway(
            f"raw is {_times(raw / jpeg)} the bytes of jpeg: raw while the dataset fits in the page cache, "
            "jpeg when it does not."
        ),
        "formats_notes": (
            f"Per photo of 640x480 after `-q:v 3`: raw {_bytes(raw)}, jpeg {_bytes(jpeg)}. A million such photos "
            f"are {_bytes(1e6 * raw)} raw: an ImageNet-sized training set does not fit in RAM raw, and the jpeg "
            "format is the answer."
        ),
    }


def _build(results: Results, root: Path) -> dict[str, str]:
    build = results["build_memmap"]
    run = build["results"][0]
    rate = {name: spread["median"] for name, spread in run["images_per_second"].items()}
    memory = run["peak_unreclaimable_bytes"]
    rows = [
        [
            f"decode alone: libjpeg-turbo, {run['workers']} threads, writes nothing",
            _count(rate["simplejpeg_limit"]),
            "-",
        ]
    ]
    if "write_limit" in rate:
        rows.append(["write alone: the disk, flushed", _count(rate["write_limit"]), "-"])
    rows += [
        ["`gpuload build-memmap` (flushed to disk)", f"**{_count(rate['gpuload'])}**", _mib(memory["gpuload"])],
        ["`gpuload build-memmap --no-sync`", _count(rate["gpuload_no_sync"]), _mib(memory["gpuload_no_sync"])],
        ["the tensordict tutorial's recipe", _count(rate["talk_recipe"]), _mib(memory["talk_recipe"])],
    ]  # fmt: skip
    header = [f"building {_count(run['images'])} photos", "images/s", "memory held"]
    return {
        "build_table": _table(header, rows) + "\n\n" + _source(build, "build_memmap"),
        "build_takeaway": _takeaway(
            f"{_times(rate['gpuload'] / rate['talk_recipe'])} the tutorial recipe's rate in "
            f"{_percent(memory['gpuload'] / memory['talk_recipe'])} of its memory; "
            f"{_percent(rate['gpuload'] / rate['simplejpeg_limit'])} of the decoder's own rate."
        ),
        "build_notes": (
            "Memory held is the peak of the memory the OS cannot reclaim (anonymous pages) while building, "
            f"sampled. Flushing every file to disk costs {_percent(1 - rate['gpuload'] / rate['gpuload_no_sync'])} "
            "of the rate here. The tutorial recipe is tensordict's: a DataLoader over ImageFolder with worker "
            "processes, filling a tensorclass memmap. The build reaches "
            f"{_percent(rate['gpuload'] / rate['simplejpeg_limit'])} of the decoder's rate, short of what it could: "
            "say so if asked."
        ),
    }


def _cache(results: Results, root: Path) -> dict[str, str]:
    store = Store(results["jpeg_store"])
    shown = ("raw", "raw_crop_host", "jpeg_crop", "stock")
    rows = [
        [LABELS[name], _bytes(store.on_disk(name)), _count(store.rate(name)), _count(store.rate(name, "cold"))]
        for name in shown
    ]
    reads = store.result["reads"]
    return {
        "cache_table": _table(["contender", "on disk", "warm, images/s", "cold, images/s"], rows)
        + "\n\n"
        + _source(store.result, "jpeg_store"),
        "cache_takeaway": _takeaway(
            f"Cold, raw reads at the disk's {_bytes(1e6 * store.megabytes('raw', 'cold'))}/s; the jpeg store, "
            f"{_times(store.on_disk('raw') / store.on_disk('jpeg_crop'))} smaller, then crops "
            f"{_compared(store.rate('jpeg_crop', 'cold'), store.rate('raw_crop_host', 'cold'))} raw does "
            f"({_count(store.rate('jpeg_crop', 'cold'))} against {_count(store.rate('raw_crop_host', 'cold'))} "
            "images/s)."
        ),
        "cache_notes": (
            f"{store.result['images']} photos, batches of {store.result['batch_size']}, {store.result['workers']} "
            "threads or workers each. The jpeg store reads each image with one pread: cold, "
            f"{_count(reads['pread_cold']['median'])} images/s, against {_count(reads['mmap_random_cold']['median'])} "
            "through a random-access mapping."
        ),
    }


def _gather(results: Results, root: Path) -> dict[str, str]:
    store = Store(results["jpeg_store"])
    return {
        "gather_takeaway": _takeaway(
            f"Whole 640x480 batches from the raw store: **{_count(store.rate('raw'))}** images/s "
            f"({_bytes(1e6 * store.megabytes('raw'))}/s) on {_cores(store.result)} cores, page cache warm."
        ),
        "gather_notes": (
            f"That rate is the raw store with no crop ({LABELS['raw']}), from the same run as the headline. "
            "The next slides add the copy to the GPU and the crop."
        ),
    }


def _overlap(results: Results, root: Path) -> dict[str, str]:
    bench = results.gpu("bench_cuda")
    rates = bench["results"] if bench else {}
    if "limit_h2d" in rates and "gpuload" in rates:
        share = rates["gpuload"]["images_per_second"] / rates["limit_h2d"]["images_per_second"]
        takeaway = (
            f"On {bench['machine']['gpu']}: the loader reaches {_percent(share)} of the pinned host-to-device "
            "copy limit (`gpuload bench --device cuda`)."
        )
    else:
        takeaway = "Not measured on a GPU yet: this is the design, and the CUDA tests that check it await a GPU too."
    return {
        "overlap_takeaway": _takeaway(takeaway),
        "overlap_notes": (
            "What a GPU run measures here: gpuload bench --device cuda times pinned copies of one batch-sized buffer "
            "back to back (the bus's limit) and the share of it the loader reaches."
        ),
    }


def _ring(results: Results, root: Path) -> dict[str, str]:
    """What the GPU lease's CUDA tests said of the ring (``gpu_check_cuda``), or that no GPU ran them."""
    check = results.gpu("gpu_check_cuda")
    tests = next((step for step in (check or {}).get("steps", ()) if step.get("step") == "tests"), None)
    if tests is None:
        return {
            "ring_gpu": _takeaway("Not measured on a GPU."),
            "ring_notes": "No GPU has run the CUDA tests yet.",
        }
    failed = re.findall(r"^FAILED (\S+)", tests.get("output_tail", ""), flags=re.MULTILINE)
    overlap = "; every overlap test passed" if not any("overlap" in name for name in failed) else ""
    return {
        "ring_gpu": _takeaway(
            f"On {check['machine']['gpu']} (one lease), the CUDA tests{_tests_outcome(check)}{overlap}."
        ),
        "ring_notes": (
            "Failed on the lease: " + ", ".join(name.split("::")[-1] for name in failed) + "."
            if failed
            else "Every CUDA test passed on the lease."
        ),
    }


def _bytes_over_the_bus(results: Results, root: Path) -> dict[str, str]:
    transfer = results.gpu("transfer_order_cuda") or results["transfer_order"]  # the bus, where it was measured
    rows = transfer["rows"]
    largest = max(rows, key=lambda row: (row["height"] * row["width"], row["batch_size"]))
    # the batch the rest of the talk loads (640x480, 64) when this run has it, else its largest
    example = next((row for row in rows if (row["height"], row["width"], row["batch_size"]) == (480, 640, 64)), largest)
    pixels = example["batch_size"] * 3 * example["height"] * example["width"]
    pairs: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        key = (row["height"], row["width"], row["batch_size"], row["memory"])
        pairs.setdefault(key, {})[row["order"]] = row
    ratios = [
        pair["half_first"]["seconds"]["median"] / pair["cuda_first"]["seconds"]["median"] for pair in pairs.values()
    ]
    on_cpu = transfer["device"].startswith("cpu")
    where = (
        "on this CPU, a copy into new host memory standing in for the bus: not measured on a GPU"
        if on_cpu
        else f"on {transfer['machine']['gpu']} (one lease)"
    )
    return {
        "bytes_plot": _plot(
            root, "transfer_order" + ("" if on_cpu else "_cuda"), "cast-then-copy time over copy-then-cast time"
        ),
        "bytes_takeaway": _takeaway(
            f"A batch of {example['batch_size']} at {example['width']}x{example['height']}: "
            f"{_bytes(pixels)} as uint8, {_bytes(2 * pixels)} as float16, {_bytes(4 * pixels)} as float32. "
            f"Casting first was slower in {sum(ratio > 1 for ratio in ratios)} of {len(ratios)} configurations "
            f"{where}."
        ),
        "bytes_notes": (
            f"Cast-then-copy took {min(ratios):.1f}x to {max(ratios):.1f}x the time of copy-then-cast, "
            f"{_times(max(ratios))} at most; largest batch measured: {largest['batch_size']} of "
            f"{largest['width']}x{largest['height']}. "
            + (
                "Not measured over a real bus: no GPU run yet. The order matters more there, where the copy is "
                "the slow part."
                if on_cpu
                else ""
            )
        ),
    }  # fmt: skip


def _normalize(results: Results, root: Path) -> dict[str, str]:
    train = results.gpu("train_order_cuda") or results["train_order"]
    where = "on this CPU" if train["device"].startswith("cpu") else f"on {train['machine']['gpu']} (one lease)"
    steps: dict[tuple, dict[str, float]] = {}
    for row in train["rows"]:
        key = (row["height"], row["width"], row["batch_size"])
        steps.setdefault(key, {})[row["variant"]] = row["step_seconds"]["median"]
    ratios = [variants["normalize_in_model"] / variants["cuda_first"] for variants in steps.values()]
    return {
        "normalize_notes": (
            f"In training {where} (train_order, {len(ratios)} configurations), Normalize inside the model took "
            f"{min(ratios):.2f}x to {max(ratios):.2f}x the step time of casting outside it"
            + (": within the noise. " if min(ratios) <= 1 <= max(ratios) else ". ")
            + "The point is where preprocessing lives, not speed."
        ),
    }


def _crop(results: Results, root: Path) -> dict[str, str]:
    costs = results["decode_costs"]["ms_per_image"]
    store = Store(results["jpeg_store"])
    gpu = results.gpu("jpeg_store_cuda")

    def ms(name: str) -> float:
        return costs[name]["median"]

    mcu = (
        f"With a restart marker at every MCU (libjpeg-turbo's jpegtran, which no PyPI package ships), a crop "
        f"would decode only its box's MCUs: {_ms(ms('mcu_restarts_decode_only_its_mcus') + ms('mcu_restarts_cut_the_window'))}"
        " with the cut, a packaging decision left for later. "
        if "mcu_restarts_decode_only_its_mcus" in costs
        else ""
    )
    return {
        "crop_plot": _plot(root, "decode_costs", "milliseconds per photo for whole decodes and a crop's decodes"),
        "crop_takeaway": _takeaway(
            f"Decode only the box's rows: {_ms(ms('crop_decode_only_its_rows'))}, not "
            f"{_ms(ms('crop_decode_whole'))}. "
            + (
                f"On {gpu['machine']['gpu']}, crops after the copy: {_count(Store(gpu).rate('raw_crop_device'))}/s, "
                f"in threads {_count(Store(gpu).rate('raw_crop_host'))}."
                if gpu is not None
                else "On a GPU, crop after the copy (not measured on a GPU)."
            )
        ),
        "crop_notes": (
            f"{mcu}A raw dataset crops the same way: with decode=RandomResizedCropDecode({SIZE}) the loader's threads "
            f"read only the box's rows of the memmap and resize them, so only {SIZE}x{SIZE} crosses the bus: "
            f"{_count(store.rate('raw_crop_host'))} images/s here, against "
            f"{_count(store.rate('raw_crop_device'))} for whole batches cropped after the copy, a GPU's job done "
            "on this CPU."
        ),
    }  # fmt: skip


def _cores_per_gpu(results: Results, root: Path) -> dict[str, str]:
    """Images per core-second of each path (a loader's rate over the cores it ran on) against what one
    GPU trains per second (``GPU_TRAINING``, quoted): the cores each path needs to keep one GPU busy."""
    store = Store(results["jpeg_store"])
    cores = _cores(store.result)
    gpu_rate = GPU_TRAINING["images_per_second"]
    on_gpu = results.gpu("jpeg_store_cuda")
    paths = (
        ("stock", "stock `DataLoader`, tuned"),
        ("jpeg_crop_exact", "same JPEG bytes, gpuload"),
        ("raw_crop_host", "raw store, crop in threads"),
        ("raw", "raw store, crop on the GPU"),
    )
    rows, needed, there = [], {}, {}
    for name, label in paths:
        per_core = store.rate(name) / cores
        needed[name] = gpu_rate / per_core
        rows.append([label, _count(per_core), f"**{needed[name]:.1f}**"])
        if on_gpu is not None:
            there[name] = gpu_rate / (Store(on_gpu).rate(name) / _cores(on_gpu))
    elsewhere = (
        f" On the {on_gpu['machine']['gpu']} machine's {_cores(on_gpu)} cores (one lease): "
        f"{there['stock']:.1f} and {there['raw']:.1f}."
        if on_gpu is not None
        else ""
    )
    short_url = GPU_TRAINING["url"].split("://", 1)[1].split("/tree/")[0]
    return {
        "cores_table": _table(["path", "images/s a core", "cores a GPU needs"], rows),
        "cores_source": (
            f'<p class="gl-source">One GPU: {_count(gpu_rate)} images/s, {GPU_TRAINING["model"]}, '
            f"{GPU_TRAINING['precision']}, {GPU_TRAINING['gpu']}: quoted, not measured ({short_url}, "
            f"{GPU_TRAINING['published']}). Rates: jpeg_store.json, warm, over {cores} cores.</p>"
        ),
        "cores_takeaway": _takeaway(
            f"One GPU needs {needed['stock']:.1f} cores of the stock loader, {needed['raw']:.1f} of the raw "
            f"store.{elsewhere}"
        ),
        "cores_notes": (
            "A GPU node is bought with a fixed number of cores per GPU, so count cores, not images per second. "
            f"Each loader's rate on this {cores}-core machine, divided by its cores, is what one core delivers; "
            f"NVIDIA's published figure for one GPU training ResNet-50 with mixed precision is {_count(gpu_rate)} "
            f"images/s, quoted, not measured by us: {GPU_TRAINING['publisher']}, {GPU_TRAINING['url']}. Newer "
            "GPUs train faster and need more cores still. "
            + (
                "On the GPU machine's CPU, per core, the same paths needed: "
                + ", ".join(f"{label} {there[name]:.1f}" for name, label in paths)
                + " cores: cores do not scale perfectly, so read the table as a floor."
                if on_gpu is not None
                else ""
            )
        ),
    }


def _breakdown(results: Results, root: Path) -> dict[str, str]:
    result = results["stock_breakdown"]
    steps = {name: spread["median"] for name, spread in result["ms_per_image"].items()}
    total = sum(steps.values())
    store = Store(results["jpeg_store"])
    return {
        "breakdown_plot": _plot(root, "stock_breakdown", "milliseconds per image of each step of the stock recipe"),
        "breakdown_takeaway": _takeaway(
            f"Decoding is {_percent(steps['decode'] / total)} of a photo's time, the crop "
            f"{_percent(steps['crop'] / total)}; reading, collating and the hand-over together "
            f"{_percent((steps['read'] + steps['collate'] + steps['hand_over']) / total)}. Decode once."
        ),
        "breakdown_notes": (
            f"experiments/stock_breakdown.py times, on one thread, what a stock worker does for each of "
            f"{result['images']} photos of 640x480: read the file (page cache warm), decode_jpeg, "
            f"RandomResizedCrop and flip, then default_collate of a batch of {result['batch_size']} and the "
            "batch moved into shared memory. That last step is how a worker hands a batch to the main process: "
            "the worker collates, and the batch crosses once through shared memory; samples are not pickled "
            f"one by one. Medians of {result['repeats']} repeats on a shared {_cores(result)}-core machine: the "
            f"whiskers show its noise. In the loader, {store.result['workers']} workers made "
            f"{_count(store.rate('stock'))} images/s. The copy to the GPU is not in this plot: no GPU here."
        ),
    }


def _ladder(results: Results, root: Path) -> dict[str, str]:
    """The ladder, from memmap_vs_folder: the stock loader on JPEGs, the same memmap through the stock
    loader with ``Collate``, gpuload's threads (and, on the GPU machine, the pinned ring)."""
    result = results["memmap_vs_folder"]
    rate = {
        (row["height"], row["width"], row["batch_size"], row["contender"]): row["images_per_second"]["median"]
        for row in result["rows"]
    }
    batches = sorted({key[2] for key in rate})
    small, large = batches[0], batches[-1]

    def at(contender: str, batch: int, table: dict = rate) -> float:
        return table[480, 640, batch, contender]

    text = (
        f"640x480: decoding once takes the stock loader from {_count(at('image_folder', small))} to "
        f"{_count(at('talk_recipe', small))} images/s (batch {small}); gpuload's threads then match it at batch "
        f"{small} ({_count(at('gpuload', small))}) and keep going at {large} "
        f"({_count(at('gpuload', large))} against {_count(at('talk_recipe', large))})."
    )
    notes = ""
    gpu = results.gpu("memmap_vs_folder_cuda")
    gpu_slide = {
        "ladder_gpu_plot": "",
        "ladder_gpu_takeaway": _takeaway("The ladder to a GPU: not measured on a GPU."),
    }
    if gpu is not None:
        there = {
            (row["height"], row["width"], row["batch_size"], row["contender"]): row["images_per_second"]["median"]
            for row in gpu["rows"]
        }
        notes = (
            f"The last rung, reused pinned buffers and a side-stream copy, shows only with a GPU: on "
            f"{gpu['machine']['gpu']} (one lease), batch {small}: stock on JPEGs {_count(at('image_folder', small, there))}, "
            f"stock loader with Collate and pin_memory {_count(at('talk_recipe', small, there))}, gpuload "
            f"{_count(at('gpuload', small, there))} images/s to the GPU. "
        )
        gains = [at("gpuload", batch, there) / at("talk_recipe", batch, there) for batch in batches]
        gpu_slide = {
            "ladder_gpu_plot": _plot(root, "ladder_cuda", "the ladder's rungs to the GPU"),
            "ladder_gpu_takeaway": _takeaway(
                f"To {gpu['machine']['gpu']}'s memory, gpuload's pinned ring is {_times(min(gains))} to "
                f"{_times(max(gains))} the stock loader with `Collate` and `pin_memory` on the same memmap."
            ),
        }
    return gpu_slide | {
        "ladder_plot": _plot(root, "ladder", "images/s of the stock loader, the stock loader on a memmap, gpuload"),
        "ladder_takeaway": _takeaway(text),
        "ladder_notes": (
            "The ladder, one rung at a time, whole images, no crop, page cache warm; the bars are batch sizes and "
            "the figures above the gaps what each rung wins. Left: the stock loader on the JPEGs. Middle: the same "
            "photos decoded once, the memmap through the stock DataLoader with a Collate (the tensordict "
            "recipe): at small batches it is as fast as gpuload. At large batches it collapses: every batch is "
            "collated in a worker and crosses shared memory. Right: gpuload's threads gather a batch with one "
            "index_select. "
            + notes
            + "Which rung wins what: decoding once wins the most; threads win at large batches; the pinned ring "
            "wins on the GPU machine."
        ),
    }


def _headline(results: Results, root: Path) -> dict[str, str]:
    store = Store(results["jpeg_store"])
    ours, stock, jpeg, exact = (store.rate(name) for name in ("raw_crop_host", "stock", "jpeg_crop", "jpeg_crop_exact"))
    result = store.result
    sizes = result["bytes_on_disk"]
    cold = store.rate("raw_crop_host", "cold") / store.rate("stock", "cold")
    repeats = (
        f"over its {result['repeats']} repeats, {_per_repeat(store.row('raw_crop_host')['images_per_second'], store.row('stock')['images_per_second'])}"
        if result.get("repeats", 1) > 1
        else "one run"
    )
    gpu = results.gpu("jpeg_store_cuda")
    gpu_line = ""
    if gpu is not None:
        on_gpu = Store(gpu)
        gpu_line = (
            f" On {gpu['machine']['gpu']}'s machine ({_cores(gpu)} cores, one lease) the same pair was "
            f"{_times(on_gpu.rate('raw_crop_host') / on_gpu.rate('stock'))}: there the crop belongs on the GPU "
            f"({_times(on_gpu.rate('raw_crop_device') / on_gpu.rate('stock'))})."
        )
    return {
        "headline_ratio": _times(ours / stock),
        "headline_text": (
            f"**{_count(ours)}** against **{_count(stock)}** images/s, a CPU loader's rate on {_cores(result)} cores: "
            f"crops from photos decoded once (the raw store, {_times(sizes['raw'] / sizes['jpeg'])} the JPEG bytes, "
            "in RAM, page cache warm) against the stock `DataLoader(ImageFolder)` decoding every epoch.\n\n"
            f"Cold cache: **{_times(cold)}**. Run to run: {repeats}. Same JPEG bytes, exact decode: "
            f"{_times(exact / stock)}, decoding only the box's rows at a reduced DCT scale."
        ),
        "headline_notes": (
            "Not the same work, and the slide says so: gpuload decoded the photos once, at build time, "
            f"into {_bytes(sizes['raw'])} on disk against {_bytes(sizes['jpeg'])} of JPEGs, and the stock "
            "loader decodes every photo every epoch. On the same JPEG bytes, the jpeg store with the exact decode "
            f"is {_times(exact / stock)} the stock loader, because it decodes only the box's rows at a reduced "
            f"DCT scale; with the fast DCT, {_count(jpeg)} images/s, {_times(jpeg / stock)}. "
            f"The stock loader is tuned: {result['workers']} workers (the cores), persistent, decode_jpeg and v2 "
            f"transforms. {result['images']} photos of 640x480, batches of {result['batch_size']}, on "
            f"{machine_line(result['machine'])}.{gpu_line}"
        ),
    }


def _crib(results: Results, root: Path) -> dict[str, str]:
    """The Q&A crib in the backup's notes: the questions a room asks, answered from the results."""
    store = Store(results["jpeg_store"])
    result = store.result
    sizes = result["bytes_on_disk"]
    breakdown = results["stock_breakdown"]
    measured = [stem for stem, _ in GPU_OWED if results.gpu(stem) is not None]
    gpu = results.gpu(measured[0])["machine"]["gpu"] if measured else None
    on_gpu = results.gpu("jpeg_store_cuda")
    answers = [
        (
            "Is the headline fair?",
            f"It compares pre-decoded pixels ({_bytes(sizes['raw'])}, {_times(sizes['raw'] / sizes['jpeg'])} the "
            f"JPEG bytes, in RAM) with decoding every epoch, on a CPU, page cache warm: "
            f"{_times(store.rate('raw_crop_host') / store.rate('stock'))}; cold "
            f"{_times(store.rate('raw_crop_host', 'cold') / store.rate('stock', 'cold'))}. On the same JPEG bytes "
            f"{_times(store.rate('jpeg_crop_exact') / store.rate('stock'))}, by decoding only the box's rows at a "
            "reduced DCT scale.",
        ),
        (
            "Only two cores?",
            f"Yes, a {_cores(result)}-core machine, so the talk counts images per core-second; "
            + (
                f"on the {_cores(on_gpu)}-core GPU machine the stock loader's crops made "
                f"{_count(Store(on_gpu).rate('stock'))} images/s, gpuload's host crops "
                f"{_count(Store(on_gpu).rate('raw_crop_host'))}: no gain there without the GPU crop."
                if on_gpu is not None
                else "no larger CPU was measured."
            ),
        ),
        (
            "The photos?",
            f"The breakdown: {breakdown.get('photos', 'not recorded')}. The loader runs (jpeg_store.json): "
            + result.get(
                "photos",
                "not recorded in that result, a run from before the real-photo set (crops of one portrait, "
                "all 640x480): to be rerun",
            )
            + ".",
        ),
        (
            "Accuracy after re-encoding?",
            "Not measured: no training run compared the original photos with -q:v 3; the slides give PSNR only.",
        ),
        (
            "What ran on a GPU?",
            (
                f"One lease of {gpu}: {', '.join(measured)}. Everything else is a CPU measurement or a design."
                if gpu
                else "Nothing yet: every GPU claim is a design."
            ),
        ),
        ("DALI?", "It decodes on the GPU with nvJPEG, reads s3:// and has far more augmentations; not measured here."),
        ("FFCV?", "The pinned ring and uint8-then-normalise are its ideas too (ToTorchImage, NormalizeImage); not measured here: no pip install on this machine."),
    ]  # fmt: skip
    return {"crib_notes": "\n\n".join(f"{question} {answer}" for question, answer in answers)}


def _store_results(results: Results, root: Path) -> dict[str, str]:
    store = Store(results["jpeg_store"])
    every = [name for name in LABELS if (name, "warm") in store.rows]
    notes = "; ".join(
        f"{LABELS[name]}: {_count(store.rate(name))} warm, {_count(store.rate(name, 'cold'))} cold" for name in every
    )
    return {
        "store_plot": _plot(root, "jpeg_store", "images/s of every cropping contender, warm and cold"),
        "store_takeaway": _takeaway(
            f"The jpeg store crops at {_times(store.rate('jpeg_crop') / store.rate('stock'))} the stock loader's "
            f"rate warm, {_times(store.rate('jpeg_crop', 'cold') / store.rate('stock', 'cold'))} cold."
        ),
        "store_notes": f"Every contender, images/s: {notes}.",
    }


DECODER_NAMES = {
    "pillow": "Pillow",
    "torchvision": "torchvision",
    "torchcodec": "TorchCodec",
    "simplejpeg": "simplejpeg",
    "opencv": "OpenCV",
    "spdl": "SPDL",
}


def _decoders(results: Results, root: Path) -> dict[str, str]:
    result = results["decoders"]
    threads = max(row["threads"] for row in result["rows"])
    rate = {row["decoder"]: row["images_per_second"]["median"] for row in result["rows"] if row["threads"] == threads}
    ranked = sorted((name for name in DECODER_NAMES if name in rate), key=rate.get, reverse=True)
    store = Store(results["jpeg_store"])
    return {
        "decoders_plot": _plot(root, "decoders", "images/s of each JPEG decoder, one and two threads"),
        "decoders_takeaway": _takeaway(
            f"On {threads} threads: "
            + ", ".join(f"{DECODER_NAMES[name]} {_count(rate[name])}" for name in ranked)
            + " images/s. FFCV does not install with pip here; DALI needs a GPU."
        ),
        "decoders_notes": (
            "gpuload decodes with simplejpeg (libjpeg-turbo) for what the others lack: a strict mode that reports "
            "damaged files, DCT-domain scaling, and decoding into a reused buffer. As a loader, in the headline's "
            f"run: SPDL {_count(store.rate('spdl'))} images/s warm, gpuload's jpeg crops "
            f"{_count(store.rate('jpeg_crop'))}. FFCV was not measured: it does not install with pip here."
        ),
    }


def _limits(results: Results, root: Path) -> dict[str, str]:
    """Where gpuload does not help, each item only when the results show it."""
    train = results["train_augment"]
    rate = {row["contender"]: row for row in train["rows"]}
    stock, ours = rate["stock"], rate["gpuload"]
    wait = max(stock["data_wait_share"]["median"], ours["data_wait_share"]["median"])
    pre = results["gpu_preprocess"]
    largest = max(row["batch_size"] for row in pre["rows"])
    at = {row["contender"]: row["images_per_second"]["median"] for row in pre["rows"] if row["batch_size"] == largest}
    store = Store(results["jpeg_store"])
    build = results["build_memmap"]["results"][0]["images_per_second"]
    items, notes = [], []
    if wait < WAITING:
        items.append(
            f"**A compute-bound step**: a ResNet-18 on {_cores(train)} CPU cores trains at "
            f"{_count(stock['images_per_second']['median'])} images/s with the crop in workers, "
            f"{_count(ours['images_per_second']['median'])} with it in the model; "
            + ("it never waits for data." if wait == 0 else f"it waits {_percent(wait)} of the step for data.")
        )
        notes.append(
            f"The training run: ResNet-18 at {train['size']} px, batch {train['batch_size']}, {train['steps']} "
            f"steps, on {train['device_name']}; steps of {_ms(stock['step_ms']['median'])} and "
            f"{_ms(ours['step_ms']['median'])}. When the model is this slow nothing waits for data, and where the "
            "crop runs only changes who does the arithmetic."
        )
    if at["gpuload_compiled"] < at["torchvision_per_sample"]:
        items.append(
            f"**The batched crop on a CPU**: compiled, {_count(at['gpuload_compiled'])} images/s against "
            f"torchvision's {_count(at['torchvision_per_sample'])} per sample: its matrix products are for GPUs; "
            "on a CPU, crop in the loader."
        )
        notes.append(
            f"The batched crop: gpu_preprocess, batch {largest}, {pre['input'][1]}x{pre['input'][0]} to "
            f"{pre['output']}, on {pre['device_name']}. Eager on a CPU, gpuload's crop resizes each sample with "
            f"torch's own resize: {_count(at['gpuload_eager'])} images/s. Compiled, it takes the batched "
            "matrix products meant for GPUs."
        )
    gpu = results.gpu("jpeg_store_cuda")
    if gpu is not None and Store(gpu).rate("jpeg_crop") < Store(gpu).rate("stock"):
        there = Store(gpu)
        items.append(
            f"**JPEG crops on a big CPU**: on the {gpu['machine']['gpu']} machine's {_cores(gpu)} cores, gpuload's "
            f"threads made {_count(there.rate('jpeg_crop'))} crops/s, the stock loader "
            f"{_count(there.rate('stock'))}: there, crop on the GPU."
        )
        notes.append(
            f"On that machine the raw store's crops after the copy made {_count(there.rate('raw_crop_device'))}/s, "
            f"and nvJPEG decoding on the GPU {_count(there.rate('jpeg_gpu_decode'))}/s: gpuload's threads do not "
            "scale as workers do on many cores."
        )
    items += [
        f"**Raw past RAM**: cold, raw crops come at the disk's speed ({_count(store.rate('raw_crop_host', 'cold'))} "
        f"images/s, jpeg's {_count(store.rate('jpeg_crop', 'cold'))}) from "
        f"{_times(store.on_disk('raw') / store.on_disk('jpeg_crop'))} the bytes.",
        f"**The build**: {_percent(build['gpuload']['median'] / build['simplejpeg_limit']['median'])} of the "
        "decoder's own rate here.",
        "**Accuracy**: `-q:v 3` and resizing to one size are not tested in training.",
    ]
    notes.append("A raw dataset larger than the page cache reads every byte from the disk each epoch.")
    return {"limits_list": "\n".join(f"- {item}" for item in items), "limits_notes": " ".join(notes)}


def _tests_outcome(summary: dict) -> str:
    """``": 28 passed, 3 failed"``: what pytest said of the CUDA tests in a ``gpu_check`` summary, if it holds them."""
    steps = summary.get("steps") if summary.get("experiment") == "gpu_check" else None
    tests = next((step for step in steps or () if step.get("step") == "tests"), None)
    said = re.findall(r"(\d+) (passed|failed|errors?)\b", tests.get("output_tail", "")) if tests else []
    return ": " + ", ".join(f"{count} {what}" for count, what in said) if said else ""


def _gpu_owed(results: Results, root: Path) -> dict[str, str]:
    measured = [results.gpu(stem) for stem, _ in GPU_OWED]
    lines = [
        f"- {what}" + ("" if found is None else f" ({found['machine']['date'][:10]}{_tests_outcome(found)})")
        for (_, what), found in zip(GPU_OWED, measured)
    ]
    done = [found for found in measured if found is not None]
    if not done:
        head, title = (
            "No GPU has run these experiments yet. One command on a GPU machine makes every one:",
            "What a GPU run will add",
        )
        notes = (
            "Every number so far came from a CPU. These are the measurements a GPU machine will make, all with one "
            "command, which also runs the CUDA tests and checks they ran.\n\nUntil then, every claim about a GPU in "
            "this talk is a design, not a measurement."
        )
    else:
        gpu = done[0]["machine"]["gpu"]
        pending = len(measured) - len(done)
        title = "What the GPU run measured"
        head = (
            f"On {gpu}, {len(done)} of {len(measured)} measured" + (f", {pending} still owed" if pending else "") + ":"
        )
        notes = (
            f"One lease of a GPU machine ({gpu}) ran the command below: the CUDA tests and the GPU experiments, each result "
            "stamped with the GPU. A claim about a GPU that none of them measured is still a design, and says so."
        )
    return {
        "gpu_owed_title": title,
        "gpu_owed": "\n".join([head, "", *lines, "", "```bash", GPU_CHECK, "```"]),
        "gpu_owed_notes": notes,
    }


def _compile(results: Results, root: Path) -> dict[str, str]:
    breaks = results["gpu_preprocess"]["graph_breaks"]
    return {"graph_breaks": f"{breaks} graph break{'s' * (breaks != 1)} with `fullgraph=True`"}


def _peers(results: Results, root: Path) -> dict[str, str]:
    """The README's table of peers when it has one (a table naming DALI, FFCV and timm), else ``PEERS``."""
    readme = (root / README).read_text() if (root / README).is_file() else ""
    table = _markdown_table_naming(readme, PEER_NAMES)
    sources = " · ".join(url.split("://", 1)[1].split("/blob/")[0].rstrip("/") for _, url in PEER_SOURCES)
    links = "; ".join(f"{name}: {url}" for name, url in PEER_SOURCES)
    if table is not None:
        return {
            "peers_table": table,
            "peers_source": '<p class="gl-source">From the README\'s comparison.</p>',
            "peers_links": links,
        }
    header, *rows = PEERS
    return {
        "peers_table": _table(header, rows),
        "peers_source": f'<p class="gl-source">Features, not speed, from each project\'s docs and code: {sources}</p>',
        "peers_links": links,
    }


def _markdown_table_naming(text: str, names: tuple[str, ...]) -> str | None:
    """The first Markdown table of ``text`` whose header row names every one of ``names``, or None."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("|") and all(name in line for name in names):
            end = index
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            return "\n".join(lines[index:end])
    return None


SECTIONS: tuple[tuple[Section, tuple[str, ...]], ...] = (
    (_title, tuple(HOW_TO_MEASURE)),
    (_problem, ("jpeg_store",)),
    (_cores_per_gpu, ("jpeg_store",)),
    (_breakdown, ("stock_breakdown", "jpeg_store")),
    (_ladder, ("memmap_vs_folder",)),
    (_trace, ("train_order",)),
    (_quality, ("jpeg_quality",)),
    (_formats, ("jpeg_store",)),
    (_build, ("build_memmap",)),
    (_cache, ("jpeg_store",)),
    (_gather, ("jpeg_store",)),
    (_overlap, ()),
    (_ring, ()),
    (_bytes_over_the_bus, ("transfer_order",)),
    (_normalize, ("train_order",)),
    (_crop, ("decode_costs", "jpeg_store")),
    (_headline, ("jpeg_store",)),
    (_store_results, ("jpeg_store",)),
    (_decoders, ("decoders", "jpeg_store")),
    (_limits, ("train_augment", "gpu_preprocess", "jpeg_store", "build_memmap")),
    (_gpu_owed, ()),
    (_compile, ("gpu_preprocess",)),
    (_peers, ()),
    (_crib, ("jpeg_store", "stock_breakdown")),
)


def main(argv: list[str] | None = None) -> int:
    """``python -m slides.generate [--repo DIR] [--check | --pdf]``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m slides.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path("."), help="the gpuload repository (default: .)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if slides/slides.md is stale")
    parser.add_argument("--pdf", action="store_true", help=f"then export the built talk to {PDF} (npm, Chromium)")
    args = parser.parse_args(argv)
    if args.check and args.pdf:
        parser.error("--check writes nothing; run --pdf on its own")
    try:
        if not args.check:
            write_qr(args.repo)  # before the deck, which shows it
        stale = write_slides(args.repo, check=args.check)
        pdf = export_pdf(args.repo) if args.pdf else None
    except (OSError, ValueError) as error:
        print(f"slides.generate: error: {error}", file=sys.stderr)
        return 2
    deck = args.repo / DECK
    if args.check:
        print(f"{deck} is {'stale: run python -m slides.generate' if stale else 'up to date'}")
        return int(stale)
    print(f"{'wrote' if stale else 'unchanged:'} {deck}")
    if pdf is not None:
        print(f"wrote {pdf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
