"""The talk (``slides/slides.md``) from its template and what the experiments measured:
``python -m slides.generate [--check]``, run in the repository.

The template (``slides/template.md``) holds the story and the layout; every number, table, plot
and code block on the slides is a ``${name}`` placeholder filled here from
``assets/results/*.json``, ``assets/*.png`` and the project's source files. A result that is
missing (no GPU run yet, say) becomes a sentence saying so. Same inputs, same Markdown.

Results of a GPU run (``<name>_cuda.json``, ``<name>_cuda.png``, ``bench_cuda.json``: what
``python -m experiments.run --device cuda`` writes) are preferred to the CPU results of the same
name; each slide says which device produced its numbers, and a slide whose numbers come from the
CPU says that it is a stand-in, what the GPU version measures, and the command that makes it.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from string import Template

from gpuload.bench import BENCH_LABELS, gather_limit
from gpuload.machine import machine_line

from .snippets import Snippet

__all__ = ["PLOT_DENSITY", "SNIPPETS", "main", "plot_size", "render_slides", "write_slides"]

TEMPLATE = Path("slides/template.md")
DECK = Path("slides/slides.md")
RESULTS = Path("assets/results")
PLOTS = Path("assets")
PLOT_DENSITY = 2  # PNG pixels per slide-canvas pixel: experiments/_common.py PIXEL_DENSITY
GPU_RUN = "python -m experiments.run --device cuda"

# How to produce each result the talk reads, for the slides that have to say it is missing.
HOW_TO_MEASURE = {
    "bench_cpu": "python -m experiments.run --only bench",
    "build_memmap": "python -m experiments.build_memmap",
    "gpu_preprocess": "python -m experiments.gpu_preprocess",
    "jpeg_quality": "python -m experiments.jpeg_quality",
    "jpeg_store": "python -m experiments.jpeg_store",
    "memmap_vs_folder": "python -m experiments.memmap_vs_folder",
    "train_augment": "python -m experiments.train_augment",
    "train_order": "python -m experiments.train_order",
    "transfer_order": "python -m experiments.transfer_order",
}

SNIPPETS = {
    "code_profiler": Snippet(
        "experiments/train_order.py",
        "run_variant",
        start="activities = [",
        end="with profile(",
        steps=(("schedule(",), ("with profile(",)),
    ),
    "code_trace_export": Snippet(
        "experiments/train_order.py", "run_variant", start="if trace is not None", end="export_chrome_trace"
    ),
    "code_orders": Snippet("experiments/transfer_order.py", "ORDERS"),
    "code_timer": Snippet(
        "experiments/transfer_order.py",
        "measure",
        start="timer = Timer(",
        end="blocked_autorange",
        steps=(("num_threads",), ("blocked_autorange",)),
    ),
    "code_cuda_first": Snippet(
        "experiments/train_order.py",
        "run_variant",
        start='if variant == "cuda_first":',
        end="images = normalize(images.half())",
    ),
    "code_half_first": Snippet(
        "experiments/train_order.py",
        "run_variant",
        start='elif variant == "half_first":',
        end="images = normalize(images)",
    ),
    "code_normalize_buffers": Snippet(
        "gpuload/transforms/normalize.py",
        "Normalize.__init__",
        start="shape = (1, -1, 1, 1)",
        end='register_buffer("shift"',
    ),
    "code_normalize_forward": Snippet(
        "gpuload/transforms/normalize.py", "Normalize.forward", steps=(("return torch.addcmul",),)
    ),
    "code_in_model": Snippet(
        "experiments/train_order.py",
        "run_variant",
        start='if variant == "normalize_in_model":',
        end="model = nn.Sequential(normalize, model)",
    ),
    "code_onnx": Snippet(
        "tests/test_normalize.py",
        "test_onnx_export_runs_the_same_in_onnx_runtime",
        start="torch.onnx.export(",
        steps=(("torch.onnx.export",), ("tensor(uint8)",), ("assert_close",)),
    ),
    "code_ffmpeg": Snippet(
        "gpuload/store/compress.py", "_ffmpeg_jpeg", start="command = [", end="]  # fmt: skip", steps=(('"-q:v"',),)
    ),
    "code_tensorclass": Snippet("gpuload/store/dataset.py", "ImageData"),
    "code_recipe_build": Snippet(
        "experiments/build_memmap.py",
        "talk_recipe",
        start="data = TutorialImageData(",
        end="data.memmap_(prefix=out)",
        steps=(("MemoryMappedTensor.empty",), ("memmap_(",)),
    ),
    "code_build_window": Snippet(
        "gpuload/store/build.py",
        "_RawStore.submit",
        steps=(("self.free.pop()",), ("self.pool.submit",)),
    ),
    "code_getitems": Snippet(
        "gpuload/store/dataset.py",
        "MemmapImageDataset.__getitems__",
        start="indices = torch.as_tensor(indices",
        end="return GatheredSamples(",
    ),
    "code_gather": Snippet(
        "gpuload/loading/loader.py",
        "_PinnedSlot.fill",
        start="with torch.cuda.device(self.device)",
        end="self.event.record(stream)",
        steps=(("torch.cuda.stream",), ("non_blocking",), ("Event(", ".record(")),
    ),
    "code_consume": Snippet(
        "gpuload/loading/loader.py",
        "_EpochIterator.__next__",
        start="if event is None:",
        end="self._pipeline.release(slot)",
        steps=(("_stream_waits",), ("_record_on",), ("release",)),
    ),
    "code_three_loaders": Snippet(
        "experiments/memmap_vs_folder.py",
        "loaders",
        start='"talk_recipe": torch.utils.data.DataLoader(',
        end='"gpuload": gpuload.DataLoader(',
        steps=(("gpuload.Collate",), ("gpuload.DataLoader",)),
    ),
    "code_preprocess": Snippet(
        "gpuload/transforms/augment.py",
        "resample",
        start="batch, channels, height, width",
        end="return torch.bmm(columns",
        steps=(("torch.bmm(weights_y",), ("weights_x.transpose",)),
    ),
    "code_compile": Snippet(
        "experiments/gpu_preprocess.py",
        "contenders",
        start="augment = gpuload.RandomResizedCrop(",
        end="ours = nn.Sequential(",
        steps=(("nn.Sequential",),),
    ),
}


def render_slides(root: str | os.PathLike = ".") -> str:
    """The deck's Markdown: ``slides/template.md`` under ``root`` with every placeholder filled.

    Raises:
        FileNotFoundError: ``root`` is not the gpuload repository (no template).
        ValueError: the template names a placeholder nobody fills, or leaves one unused, or a
            result file is not valid JSON or lacks what its slides read.
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
    template = Template(template_path.read_text())
    results = _load_results(root / RESULTS)
    values = {name: snippet.markdown(root) for name, snippet in SNIPPETS.items()}
    for section in SECTIONS:
        try:
            values.update(section(results, root))
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as error:
            raise ValueError(
                f"a result in {RESULTS} does not have the layout the {section.__name__.strip('_')} slides read "
                f"({type(error).__name__}: {error}): rerun its experiment"
            ) from None
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


def plot_size(path: Path) -> tuple[int, int]:
    """The size (width, height) a plot PNG is shown at on the slide canvas: its pixels / ``PLOT_DENSITY``."""
    with open(path, "rb") as file:
        header = file.read(24)
    if header[:8] != b"\x89PNG\r\n\x1a\n" or header[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    width, height = struct.unpack(">II", header[16:24])
    return round(width / PLOT_DENSITY), round(height / PLOT_DENSITY)


def _load_results(folder: Path) -> dict[str, dict]:
    results = {}
    for path in sorted(folder.glob("*.json")):
        try:
            results[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from None
    return results


def _pick(results: dict[str, dict], name: str) -> tuple[str, dict | None]:
    """The file name and result of ``name``: the GPU run's (``<name>_cuda``) when there is one, else the CPU's."""
    for stem in (f"{name}_cuda", name):
        if stem in results:
            return stem, results[stem]
    return name, None


def _tagged(name: str, result: dict | None) -> str:
    """The name of a plot made from ``result``, as ``experiments`` saves it: ``<name>_cuda`` for a GPU result."""
    return name if result is None or _on_cpu(result) else f"{name}_cuda"


def _bench(results: dict[str, dict]) -> tuple[str, dict | None]:
    """``gpuload bench``'s report: the GPU's (``bench_cuda``) when there is one, else the CPU's."""
    for stem in ("bench_cuda", "bench_cpu"):
        if stem in results:
            return stem, results[stem]
    return "bench_cpu", None


# --- formatting -------------------------------------------------------------------------------


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _times(value: float) -> str:
    return f"{value:.1f}x"


def _percent(part: float, whole: float) -> str:
    share = 100 * part / whole
    return f"{share:.2f} %" if share < 0.1 else f"{share:.1f} %" if share < 10 else f"{share:.0f} %"


def _ms(seconds: float) -> str:
    milliseconds = seconds * 1e3
    return f"{milliseconds:.2f} ms" if milliseconds < 10 else f"{milliseconds:,.1f} ms"


def _kb(size: float, digits: int = 0) -> str:
    return f"{size / 1e3:,.{digits}f} KB"


def _mib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:,.0f} MiB"


def _size(row: dict) -> str:
    return f"{row['width']}x{row['height']}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _device(result: dict) -> str:
    """What produced a result: ``"cpu (AMD EPYC, 2 cores)"`` or ``"cuda (NVIDIA H100 80GB HBM3)"``."""
    if "device_name" in result:
        return result["device_name"]
    machine = result["machine"]
    if str(result.get("device", "cpu")).startswith("cuda") and machine.get("gpu"):
        return f"cuda ({machine['gpu']})"
    return f"cpu ({machine['cpu']}, {machine['cores']} cores)"


def _on_cpu(result: dict) -> bool:
    return str(result.get("device", "cpu")).startswith("cpu")


def _source(result: dict, stem: str) -> str:
    """Where a result came from: the machine, the date and the JSON file."""
    return (
        f'<p class="measured">Measured on {machine_line(result["machine"])}, {result["machine"]["date"][:10]} '
        f"(<code>assets/results/{stem}.json</code>).</p>"
    )


def _missing(name: str) -> str:
    gpu = f" (on a GPU machine: `{GPU_RUN}`)" if name not in ("build_memmap", "bench_cpu") else ""
    return (
        f"**Not measured yet:** there is no `assets/results/{name}.json`. "
        f"Run `{HOW_TO_MEASURE[name]}`{gpu}, then `python -m slides.generate`."
    )


def _stand_in(result: dict, measures: str) -> str:
    """On a CPU result: the visible line saying so, what the GPU version measures and how to make it."""
    if not _on_cpu(result):
        return ""
    return (
        f'<div class="standin">\n\n**CPU stand-in:** on a GPU this measures {measures}; `{GPU_RUN}` makes it.\n\n</div>'
    )


def _takeaway(text: str) -> str:
    return f'<div class="takeaway">\n\n{text}\n\n</div>'


def _plot(root: Path, stem: str, alt: str) -> str:
    path = root / PLOTS / f"{stem}.png"
    if not path.is_file():
        return f"**No plot yet:** `assets/{stem}.png` is made by `python -m experiments.run`."
    width, height = plot_size(path)
    return f'<img class="plot" src="/{stem}.png" width="{width}" height="{height}" alt="{alt}"/>'


def _grouped(rows: list[dict], by: str, *fields: str) -> dict[tuple, dict[str, dict]]:
    """The rows of one configuration side by side: ``{(row[f] for f in fields): {row[by]: row}}``."""
    groups: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[field] for field in fields), {})[row[by]] = row
    return groups


def _largest_batch_per_size(groups: dict[tuple, dict[str, dict]]) -> list[tuple[tuple, dict[str, dict]]]:
    """For groups keyed ``(height, width, batch_size)``: the largest batch of each image size, by size."""
    largest = {}
    for key in groups:
        if key[:2] not in largest or key[2] > largest[key[:2]][2]:
            largest[key[:2]] = key
    return [(key, groups[key]) for _, key in sorted(largest.items())]


def _original_and_default(result: dict) -> tuple[dict, dict | None]:
    """The jpeg_quality rows of the original photos and of ``-q:v 3`` (``None`` if not run)."""
    original = next(row for row in result["rows"] if row["quality"] is None)
    return original, next((row for row in result["rows"] if row["quality"] == 3), None)


def _headline(report: dict) -> dict:
    """The talk's one headline comparison, from one ``gpuload bench`` report: gpuload.DataLoader against
    the fastest of the stock DataLoader ways it measured, and the machine's limit."""
    rates = {name: result["images_per_second"] for name, result in report["results"].items()}
    stock = {name: rates[name] for name in ("collate", "image_folder") if name in rates}
    best = max(stock, key=stock.get)
    return {
        "gpuload": rates["gpuload"],
        "stock": stock[best],
        "stock_label": BENCH_LABELS[best],
        "limit": gather_limit(report),
        "ratio": rates["gpuload"] / stock[best],
    }


# --- sections, in the order of the talk ----------------------------------------------------------
# Each returns the placeholders of its slides; a missing result fills them with what to run.

Section = Callable[[dict[str, dict], Path], dict[str, str]]


def _title(results: dict[str, dict], root: Path) -> dict[str, str]:
    machines: dict[str, list[str]] = {}
    for name, result in results.items():
        line = f"{machine_line(result['machine'])}, {result['machine']['date'][:10]}"
        machines.setdefault(line, []).append(name)
    if not machines:
        return {
            "title_machines": "No results yet: run `python -m experiments.run`, then `python -m slides.generate`.",
            "title_device": "",
        }
    lines = [f"- {line}: {', '.join(names)}" for line, names in sorted(machines.items())]
    gpus = sorted({result["machine"]["gpu"] for result in results.values() if result["machine"].get("gpu")})
    device = (
        f"GPU results from {', '.join(gpus)}."
        if gpus
        else f"**No GPU has run these experiments yet**: every number is a CPU stand-in. On a GPU machine, "
        f"`{GPU_RUN}` makes this the GPU talk."
    )
    return {"title_machines": "Measured on:\n\n" + "\n".join(lines), "title_device": device}


def _headline_slides(results: dict[str, dict], root: Path) -> dict[str, str]:
    stem, report = _bench(results)
    if report is None:
        missing = _missing("bench_cpu")
        return {
            "headline_number": "?",
            "headline_text": missing,
            "bench_table": missing,
            "bench_takeaway": "",
            "bench_gap": missing,
        }
    headline = _headline(report)
    limit = headline["limit"]
    rows = []
    for contender, result in report["results"].items():
        rate = result["images_per_second"]
        rows.append(
            [BENCH_LABELS[contender], _count(rate), f"{result['gigabytes_per_second']:.1f}", _percent(rate, limit)]
        )
    channels, height, width = report["image_shape"]
    image_mb = channels * height * width * report["batch_size"] / 1e6
    collate = report["results"].get("collate")
    gap = []
    if collate is not None:
        gap.append(
            f"- **The stock loader with `Collate`** ({_percent(collate['images_per_second'], limit)} of the limit) "
            "runs `num_workers=0` (worker processes cannot copy to a GPU): one thread gathers each batch, into "
            f"a new {image_mb:,.0f} MB tensor every time, fresh pages each faulted in and zeroed by the kernel. "
            "`gpuload.DataLoader` and the limit gather on every core into buffers they reuse. Two differences, "
            "not measured apart."
        )
    if "image_folder" in report["results"]:
        gap.append(
            f"- **`ImageFolder`** ({_percent(report['results']['image_folder']['images_per_second'], limit)}) "
            "decodes every JPEG again, every epoch, in worker processes."
        )
    augment = report["results"].get("gpuload_augment")
    if augment is not None and _on_cpu(report) and "image_folder_augment" in report["results"]:
        gap.append(
            f"- **With a crop**, gpuload crops on the device, here the CPU ({_count(augment['images_per_second'])} "
            "images/s), with interpolation matrices made for a GPU; torchvision's per-sample crop in workers "
            "suits a CPU better. On a GPU, that row is what the GPU run measures."
        )
    what = "gpuload.DataLoader against the fastest stock DataLoader way measured"
    return {
        "headline_number": _times(headline["ratio"]),
        "headline_text": (
            f"{what}: **{_count(headline['gpuload'])}** against **{_count(headline['stock'])} images/s** "
            f"({headline['stock_label']}), {_percent(headline['gpuload'], limit)} of what the machine can gather "
            f"({_count(limit)} images/s).\n\n"
            f"One run of `gpuload bench`: {report['images']} photos of {width}x{height}, batch "
            f"{report['batch_size']}, batches to `{report['device']}`, on {machine_line(report['machine'])}."
            + ("" if not _on_cpu(report) else f" A CPU stand-in: `{GPU_RUN}` measures it on a GPU.")
        ),
        "bench_table": "\n\n".join(
            [
                f"On {_device(report)}: {report['images']} images of {width}x{height}, batch "
                f"{report['batch_size']}, shuffled, page cache warm:",
                _table(["way", "images/s", "GB/s", "of the gather limit"], rows),
                _source(report, stem),
            ]
        ),
        "bench_takeaway": _takeaway(
            f"`gpuload.DataLoader` gathers at {_percent(headline['gpuload'], limit)} of the machine's limit, "
            f"{_times(headline['ratio'])} the fastest stock loader measured."
        ),
        "bench_gap": "\n".join(gap),
    }


def _bottlenecks(results: dict[str, dict], root: Path) -> dict[str, str]:
    build = results.get("build_memmap")
    if build is None:
        return {"build_memory": _missing("build_memmap"), "build_table": _missing("build_memmap")}
    runs = build["results"]
    memory = "; ".join(
        f"{run['images']} photos: tutorial recipe {_mib(run['peak_unreclaimable_bytes']['talk_recipe'])}, "
        f"gpuload {_mib(run['peak_unreclaimable_bytes']['gpuload'])}"
        for run in runs
    )
    rows = []
    for run in runs:
        rates = {name: spread["median"] for name, spread in run["images_per_second"].items()}
        rows.append(
            [
                _count(run["images"]),
                _count(rates["gpuload"]),
                _count(rates["talk_recipe"]),
                _count(rates["pillow_limit"]),
                _mib(run["peak_unreclaimable_bytes"]["gpuload"]),
                _mib(run["peak_unreclaimable_bytes"]["talk_recipe"]),
            ]
        )
    first = runs[0]
    table = _table(["photos", "gpuload img/s", "recipe img/s", "Pillow limit", "gpuload memory", "recipe memory"], rows)
    return {
        "build_memory": f"Peak memory the OS cannot reclaim while building, on {_device(build)}: {memory}.",
        "build_table": "\n\n".join(
            [
                f"On {_device(build)}: {_kb(first['mean_file_bytes'])} JPEGs, {first['workers']} decode workers, "
                f"medians of {len(first['images_per_second']['gpuload']['runs'])} runs:",
                table,
                _source(build, "build_memmap"),
            ]
        ),
    }


def _storage(results: dict[str, dict], root: Path) -> dict[str, str]:
    """Raw against jpeg: bytes per image, what fits in RAM, and (from jpeg_store) the speed of each."""
    stem, store = _pick(results, "jpeg_store")
    quality = results.get("jpeg_quality")
    if store is not None:
        images = store["images"]
        raw, jpeg = store["bytes_on_disk"]["raw"] / images, store["bytes_on_disk"]["jpeg"] / images
        memory, where = store["machine"]["memory_gib"] * 2**30, _device(store)
    elif quality is not None and _original_and_default(quality)[1] is not None:
        height, width = quality["image_size"]
        raw, jpeg = 3 * height * width, _original_and_default(quality)[1]["mean_file_bytes"]
        memory, where = quality["machine"]["memory_gib"] * 2**30, _device(quality)
    else:
        missing = _missing("jpeg_store")
        return {"storage_table": missing, "storage_takeaway": "", "jpeg_store_plot": missing, "jpeg_store_takeaway": ""}
    gib = memory / 2**30
    sizes = (
        f"Per image: raw pixels {_kb(raw, 1)}, `-q:v 3` JPEG bytes {_kb(jpeg, 1)} ({_times(raw / jpeg)} smaller). "
        f"The {gib:.1f} GiB of RAM of this machine hold {_count(memory / raw)} raw images or "
        f"{_count(memory / jpeg)} JPEGs."
    )
    values = {"jpeg_store_plot": _plot(root, stem, "raw and jpeg stores, warm and cold page cache")}
    if store is None:
        return values | {
            "storage_table": "\n\n".join([f"From `jpeg_quality`, on {where}: {sizes}", _missing("jpeg_store")]),
            "storage_takeaway": _takeaway(
                f"A jpeg store is {_times(raw / jpeg)} smaller than raw pixels: what each costs to load is not "
                "measured yet."
            ),
            "jpeg_store_takeaway": "",
        }
    rate = {(row["contender"], row["cache"]): row for row in store["rows"]}

    def images(contender: str, cache: str) -> float:
        return rate[contender, cache]["images_per_second"]["median"]

    labels = {
        "raw": "raw, whole batches",
        "jpeg_full": "jpeg, whole decode",
        "raw_crop": "raw + crop on the device",
        "jpeg_crop": "jpeg, crop while decoding",
        "stock": "stock: JPEG files, crop in workers",
    }
    rows = [
        [
            label,
            _count(images(name, "warm")),
            _count(images(name, "cold")),
            f"{rate[name, 'cold']['megabytes_per_second']['median']:,.0f}",
        ]
        for name, label in labels.items()
        if (name, "warm") in rate and (name, "cold") in rate
    ]
    warm, cold = (images("raw", cache) / images("jpeg_full", cache) for cache in ("warm", "cold"))
    verdict = (
        "raw while the dataset fits in the page cache, jpeg when it does not."
        if warm > 1 > cold
        else f"{'raw' if cold > 1 else 'jpeg'} in both cases here."
    )
    storage = (
        f"Warm, raw batches arrive at {_times(warm)} the rate of jpeg's; cold, raw reads "
        f"{_times(raw / jpeg)} the bytes from the disk and gets {_times(cold)} jpeg's rate: {verdict}"
    )
    crop = (
        f"With a crop to 224: jpeg crops while decoding, {_count(images('jpeg_crop', 'warm'))} images/s warm, "
        f"{_times(images('jpeg_crop', 'warm') / images('stock', 'warm'))} the stock loader; raw batches are "
        f"cropped on the device, {_count(images('raw_crop', 'warm'))} images/s on {_device(store)}."
    )
    return values | {
        "storage_table": "\n\n".join(
            [
                sizes,
                f"Loading {store['images']} photos in batches of {store['batch_size']}, on {where}:",
                _table(["store", "warm images/s", "cold images/s", "cold MB/s from disk"], rows),
                _source(store, stem),
            ]
        ),
        "storage_takeaway": _takeaway(storage),
        "jpeg_store_takeaway": _takeaway(crop)
        + "\n\n"
        + _stand_in(store, "the same stores with batches on the GPU, its crop and nvJPEG decoding"),
    }


def _profiling(results: dict[str, dict], root: Path) -> dict[str, str]:
    stem, result = _pick(results, "train_order")
    plot = _plot(root, _tagged("train_order_trace", result), "one profiler step drawn from the Chrome trace")
    if result is None:
        return {"trace_plot": plot, "trace_takeaway": "", "trace_ranges": _missing("train_order")}
    last = result["rows"][-1]  # train_order traces its last configuration
    traced = _grouped(result["rows"], "variant", "height", "width", "batch_size")[
        (last["height"], last["width"], last["batch_size"])
    ]
    names = ("data", "transfer", "cast", "forward", "backward", "optimizer")
    rows = [
        [f"`{row['variant']}`"]
        + [
            "-" if row["range_ms_per_step"][name] is None else f"{row['range_ms_per_step'][name]:,.2f}"
            for name in names
        ]
        for row in traced.values()
    ]
    first = traced["cuda_first"]
    feeding = sum(first["range_ms_per_step"][name] or 0 for name in ("data", "transfer", "cast"))
    step = first["step_seconds"]["median"]
    return {
        "trace_plot": plot,
        "trace_takeaway": _takeaway(
            f"On {_device(result)} a step of {_ms(step)} spends {feeding:.2f} ms ({_percent(feeding / 1e3, step)}) "
            "getting the batch to the model: the zoom below is the part this talk is about."
        ),
        "trace_ranges": "\n\n".join(
            [
                f"On {_device(result)}: `record_function` ranges, ms per step, {_size(last)}, "
                f"batch {last['batch_size']}:",
                _table(["variant", *names], rows),
                _source(result, stem),
            ]
        ),
    }


def _data_type(results: dict[str, dict], root: Path) -> dict[str, str]:
    transfer_stem, transfer = _pick(results, "transfer_order")
    train_stem, train = _pick(results, "train_order")
    values = {
        "transfer_order_plot": _plot(root, transfer_stem, "cast-then-copy time over copy-then-cast time"),
        "train_order_plot": _plot(root, train_stem, "training step time, three ways, per configuration"),
    }
    if transfer is None:
        values |= {
            "dtype_bytes": _missing("transfer_order"),
            "transfer_order_takeaway": _missing("transfer_order"),
            "transfer_order_standin": "",
            "pinned_summary": _missing("transfer_order"),
        }
    else:
        rows = transfer["rows"]
        largest = max(rows, key=lambda row: (row["height"] * row["width"], row["batch_size"]))
        pixels = largest["batch_size"] * 3 * largest["height"] * largest["width"]
        values["dtype_bytes"] = _table(
            ["one batch", "uint8", "float16", "float32"],
            [
                [f"{largest['batch_size']} x 3 x {largest['height']} x {largest['width']}"]
                + [f"{pixels * size / 1e6:,.0f} MB" for size in (1, 2, 4)]
            ],
        )
        pairs = _grouped(rows, "order", "height", "width", "batch_size", "memory")
        ratios = [
            pair["half_first"]["seconds"]["median"] / pair["cuda_first"]["seconds"]["median"] for pair in pairs.values()
        ]
        memory = "pinned" if any(key[3] == "pinned" for key in pairs) else "pageable"
        example = pairs[(largest["height"], largest["width"], largest["batch_size"], memory)]
        values["transfer_order_takeaway"] = _takeaway(
            f"Casting first was slower in **{sum(ratio > 1 for ratio in ratios)} of {len(ratios)}** configurations, "
            f"{min(ratios):.1f}x to {max(ratios):.1f}x the time ({_size(largest)}, batch {largest['batch_size']}, "
            f"{memory}: {_ms(example['cuda_first']['seconds']['median'])} against "
            f"{_ms(example['half_first']['seconds']['median'])})."
        )
        values["transfer_order_standin"] = _stand_in(
            transfer, "the bus, from pageable and pinned memory (here a copy into new host memory stands in)"
        )
        values["pinned_summary"] = _pinned(transfer, transfer_stem, results)
    if train is None:
        values |= {
            "train_order_takeaway": _missing("train_order"),
            "train_order_summary": _missing("train_order"),
            "train_order_standin": "",
            "normalize_summary": _missing("train_order"),
        }
        return values
    configurations = _grouped(train["rows"], "variant", "height", "width", "batch_size")
    lines = []
    for (height, width, batch), variants in _largest_batch_per_size(configurations):
        step = {variant: row["step_seconds"]["median"] for variant, row in variants.items()}
        lines.append(
            f"- {width}x{height}, batch {batch}: copy-then-cast {_ms(step['cuda_first'])}, "
            f"cast-then-copy {_ms(step['half_first'])}, Normalize in the model {_ms(step['normalize_in_model'])} "
            "per step"
        )
    feeding = max(
        sum(row["range_ms_per_step"][name] or 0 for name in ("data", "transfer", "cast"))
        / (1e3 * row["step_seconds"]["median"])
        for row in train["rows"]
    )
    spread = max(
        row["step_seconds"]["max"] / row["step_seconds"]["min"] - 1
        for row in train["rows"]
        if row["variant"] == "cuda_first"
    )
    ratios = [
        variants["half_first"]["step_seconds"]["median"] / variants["cuda_first"]["step_seconds"]["median"]
        for variants in configurations.values()
    ]
    values["train_order_takeaway"] = _takeaway(
        f"Feeding the model takes at most {_percent(feeding, 1)} of a step on {_device(train)}; cast-then-copy "
        f"took {min(ratios):.2f}x to {max(ratios):.2f}x the step time of copy-then-cast, while the same way's "
        f"steps vary by up to {_percent(spread, 1)}: "
        + ("within noise here." if _on_cpu(train) else "the order shows in the step time.")
    )
    values["train_order_standin"] = _stand_in(
        train, "how much of a real GPU step the host-to-device copy and the cast take, each way"
    )
    values["train_order_summary"] = "\n".join(lines) + "\n\n" + _source(train, train_stem)
    in_model = [
        variants["normalize_in_model"]["step_seconds"]["median"] / variants["cuda_first"]["step_seconds"]["median"]
        for variants in configurations.values()
    ]
    values["normalize_summary"] = (
        f"In the training experiment, `nn.Sequential(Normalize, resnet18)` fed uint8 took "
        f"{min(in_model):.2f}x to {max(in_model):.2f}x the step time of casting outside the model "
        f"({len(in_model)} configurations, on {_device(train)})"
        + (": within this CPU's noise." if _on_cpu(train) else ".")
    )
    return values


def _pinned(transfer: dict, stem: str, results: dict[str, dict]) -> str:
    """Pinned against pageable copies: from a GPU transfer_order run (and bench_cuda's copy limit)."""
    rows = [row for row in transfer["rows"] if row["order"] == "cuda_first"]
    if not any(row["memory"] == "pinned" for row in rows):
        return (
            f'<div class="standin">\n\n**CPU stand-in:** measured on {_device(transfer)}, without a GPU: no pinned '
            "memory and no bus, so no number for them. On a GPU, `transfer_order` times every batch "
            "copied from pageable and from pinned memory, and `gpuload bench` the pinned copy limit: "
            f"run `{GPU_RUN}`, then `python -m slides.generate`.\n\n</div>"
        )
    pairs = _grouped(rows, "memory", "height", "width", "batch_size")
    lines = []
    for (height, width, batch), memories in _largest_batch_per_size(pairs):
        if {"pinned", "pageable"} <= set(memories):
            size = batch * 3 * height * width
            speed = {memory: size / row["seconds"]["median"] / 1e9 for memory, row in memories.items()}
            lines.append(
                f"- {width}x{height}, batch {batch} (uint8, then cast): pageable {speed['pageable']:.1f} GB/s, "
                f"pinned **{speed['pinned']:.1f} GB/s** ({_times(speed['pinned'] / speed['pageable'])})"
            )
    bench = results.get("bench_cuda")
    if bench is not None and "limit_h2d" in bench["results"]:
        lines.append(
            f"- `gpuload bench`: pinned copies back to back, "
            f"{bench['results']['limit_h2d']['gigabytes_per_second']:.1f} GB/s"
        )
    return f"On {_device(transfer)}:\n\n" + "\n".join(lines) + "\n\n" + _source(transfer, stem)


def _image_quality(results: dict[str, dict], root: Path) -> dict[str, str]:
    stem, result = _pick(results, "jpeg_quality")
    values = {
        "jpeg_crops_plot": _plot(root, _tagged("jpeg_quality_crops", result), "the same crop at each ffmpeg quality"),
        "jpeg_quality_plot": _plot(root, stem, "file size, PSNR and folder throughput per quality"),
    }
    if result is None:
        missing = _missing("jpeg_quality")
        return values | {
            "jpeg_quality_table": missing,
            "jpeg_quality_takeaway": missing,
            "jpeg_crops_takeaway": "",
        }
    original, default = _original_and_default(result)
    table_rows = [
        [
            row["name"],
            _kb(row["mean_file_bytes"]),
            _times(original["mean_file_bytes"] / row["mean_file_bytes"]) + " smaller" if row is not original else "-",
            "-" if row["psnr_db"] is None else f"{row['psnr_db']:.1f} dB",
            _count(row["images_per_second"]["median"]),
        ]
        for row in result["rows"]
    ]
    height, width = result["image_size"]
    values["jpeg_quality_table"] = "\n\n".join(
        [
            f"On {_device(result)}: {result['images']} photos of {width}x{height}; ImageFolder + DataLoader, "
            f"{result['workers']} workers, batch {result['batch_size']}:",
            _table(["encoding", "mean file", "size", "PSNR", "images/s"], table_rows),
            _source(result, stem),
        ]
    )
    if default is None:
        values["jpeg_quality_takeaway"] = "`-q:v 3` was not part of this run."
        values["jpeg_crops_takeaway"] = ""
        return values
    worst = max((row for row in result["rows"] if row["quality"] is not None), key=lambda row: row["quality"])
    speed = default["images_per_second"]["median"] / original["images_per_second"]["median"]
    values["jpeg_crops_takeaway"] = _takeaway(
        f"`-q:v 3` ({default['psnr_db']:.1f} dB) keeps the detail of the original; the blocks show from "
        f"`-q:v {worst['quality']}` ({worst['psnr_db']:.1f} dB) on."
    )
    values["jpeg_quality_takeaway"] = _takeaway(
        f"`-q:v 3`: {_kb(original['mean_file_bytes'])} to {_kb(default['mean_file_bytes'])} per photo "
        f"({_times(original['mean_file_bytes'] / default['mean_file_bytes'])} smaller) at "
        f"{default['psnr_db']:.1f} dB; ImageFolder loads it only {_times(speed)} faster: decoding, not reading, "
        "costs most once the files are in the page cache."
    )
    return values


def _memmap(results: dict[str, dict], root: Path) -> dict[str, str]:
    stem, result = _pick(results, "memmap_vs_folder")
    values = {"memmap_plot": _plot(root, stem, "three loaders, per image size and batch size")}
    if result is None:
        missing = _missing("memmap_vs_folder")
        return values | {"memmap_device": "the device", "memmap_takeaway": missing, "memmap_numbers": missing}
    devices = sorted({row["device"] for row in result["rows"]})
    values["memmap_device"] = " and ".join(device.split(":")[0].upper() for device in devices)
    blocks, ratios = [], []
    for device in devices:
        rows = [row for row in result["rows"] if row["device"] == device]
        lines = []
        for (height, width, batch), contenders in _largest_batch_per_size(
            _grouped(rows, "contender", "height", "width", "batch_size")
        ):
            rate = {contender: row["images_per_second"]["median"] for contender, row in contenders.items()}
            ratios.append(rate["gpuload"] / rate["talk_recipe"])
            lines.append(
                f"- {width}x{height}, batch {batch}: ImageFolder {_count(rate['image_folder'])}, "
                f"tensorclass + `Collate` {_count(rate['talk_recipe'])}, `gpuload.DataLoader` "
                f"**{_count(rate['gpuload'])}** images/s"
            )
        blocks.append(f"To {result['device_names'][device]}, {result['images']} photos:\n\n" + "\n".join(lines))
    values["memmap_numbers"] = "\n\n".join(blocks) + "\n\n" + _source(result, stem)
    values["memmap_takeaway"] = _takeaway(
        f"The same memmap, read {min(ratios):.1f}x to {max(ratios):.1f}x faster by `gpuload.DataLoader` than by "
        "the stock loader with `Collate` (a smaller run than the headline's, same ranking)."
    )
    return values


def _augmentation(results: dict[str, dict], root: Path) -> dict[str, str]:
    stem, result = _pick(results, "gpu_preprocess")
    train_stem, train = _pick(results, "train_augment")
    plot = _plot(root, stem, "per-sample crop + flip + normalise, images/s per batch size")
    values: dict[str, str] = {"gpu_preprocess_plot": plot}
    parts, sources, stand_ins = [], [], []
    if result is None:
        parts.append(_missing("gpu_preprocess"))
        values |= {"gpu_preprocess_takeaway": "", "gpu_preprocess_summary": _missing("gpu_preprocess")}
    else:
        largest = max(row["batch_size"] for row in result["rows"])
        at = {row["contender"]: row for row in result["rows"] if row["batch_size"] == largest}
        names = {
            "torchvision_per_sample": "torchvision v2, per sample",
            "torchvision_batch": "torchvision v2, one crop per batch",
            "kornia": "Kornia, per sample",
            "gpuload_eager": "gpuload, eager",
            "gpuload_compiled": "gpuload, `torch.compile`",
            "gpuload_reduce_overhead": "gpuload, `reduce-overhead`",
        }
        shares = any("share_of_bandwidth" in row for row in at.values())
        rows = [
            [names.get(name, name), _count(row["images_per_second"]["median"])]
            + ([_percent(row.get("share_of_bandwidth", 0), 1)] if shares else [])
            for name, row in at.items()
            if name != "limit_copy"
        ]
        header = ["crop + flip + normalise", "images/s"] + (["of memory bandwidth"] if shares else [])
        height, width = result["input"]
        parts += [
            f"On {_device(result)}, batch {largest}, {width}x{height} uint8 to {result['output']}x"
            f"{result['output']} {result['dtype']}:",
            _table(header, rows),
        ]
        sources.append(_source(result, stem))
        if _on_cpu(result):
            stand_ins.append("the same contenders on batches already on the GPU, against its memory bandwidth")
        ours, theirs = at["gpuload_compiled"], at["torchvision_per_sample"]
        ratio = ours["images_per_second"]["median"] / theirs["images_per_second"]["median"]
        verdict = "faster" if ratio > 1 else "slower"
        why = (
            ": on a CPU its dense interpolation matrices cost more arithmetic than a direct resize."
            if _on_cpu(result) and ratio < 1
            else "."
        )
        values["gpu_preprocess_takeaway"] = _takeaway(
            f"Compiled, gpuload's batched crop is {_times(max(ratio, 1 / ratio))} {verdict} than torchvision "
            f"per sample at batch {largest}{why}"
        ) + _stand_in(result, "the same contenders on batches on the GPU")
        values["gpu_preprocess_summary"] = (
            f"On {_device(result)}: graph breaks under `torch.compile(fullgraph=True)`: **{result['graph_breaks']}**."
        )
    if train is None:
        parts.append(_missing("train_augment"))
    else:
        rate = {row["contender"]: row for row in train["rows"]}
        stock, ours = rate["stock"], rate["gpuload"]
        parts.append(
            f"Training `resnet18` at {train['size']} px, batch {train['batch_size']}, on {_device(train)}: the "
            f"stock loader cropping in its workers **{_count(stock['images_per_second']['median'])}**, gpuload "
            f"cropping in the model **{_count(ours['images_per_second']['median'])} images/s**."
        )
        sources.append(_source(train, train_stem))
        if _on_cpu(train):
            stand_ins.append("whether training waits for data when workers crop and when the GPU does")
    standin = ""
    if stand_ins:
        standin = (
            f'<div class="standin">\n\n**CPU stand-in:** measured without a GPU. On a GPU these measure '
            f"{' and '.join(stand_ins)}: run `{GPU_RUN}`, then `python -m slides.generate`.\n\n</div>"
        )
    values["augment_numbers"] = "\n\n".join([*parts, standin, *sources])
    return values


def _gpu_bench(results: dict[str, dict], root: Path) -> dict[str, str]:
    report = results.get("bench_cuda")
    if report is None:
        return {
            "bench_gpu_title": "What the GPU run adds",
            "bench_gpu": "\n".join(
                [
                    "- `gpuload bench --device cuda`: a third limit, pinned host-to-device copies of one batch-sized "
                    "buffer, and the share of it `gpuload.DataLoader` reaches; with `--augment 224`, the crop on "
                    "the GPU against torchvision in workers",
                    "- Copy-then-cast over the real bus, from pageable and from pinned memory",
                    "- Training steps where feeding the GPU is a real share of the step",
                    "- Augmentation on the GPU against its memory bandwidth, nvJPEG decoding of the jpeg store",
                    "",
                    '<div class="standin">',
                    "",
                    f"**No GPU run yet.** On a machine with a GPU, `{GPU_RUN}` writes every `*_cuda` result "
                    "and `bench_cuda.json`; `python -m slides.generate` then makes this the GPU talk.",
                    "",
                    "</div>",
                ]
            ),
        }
    lines = [f"On {_device(report)}, {report['images']} photos, batch {report['batch_size']}:", ""]
    rates = {name: result["images_per_second"] for name, result in report["results"].items()}
    if "limit_h2d" in rates:
        lines.append(
            f"- `gpuload.DataLoader` reaches **{_percent(rates['gpuload'], rates['limit_h2d'])}** of the pinned "
            f"host-to-device limit ({_count(rates['limit_h2d'])} images/s)"
        )
    if "gpuload_augment" in rates and "image_folder_augment" in rates:
        lines.append(
            f"- with a random resized crop: gpuload on the GPU {_count(rates['gpuload_augment'])}, "
            f"ImageFolder + torchvision in workers {_count(rates['image_folder_augment'])} images/s"
        )
    return {
        "bench_gpu_title": "gpuload bench on a GPU",
        "bench_gpu": "\n".join(lines) + "\n\n" + _source(report, "bench_cuda"),
    }


def _closing(results: dict[str, dict], root: Path) -> dict[str, str]:
    lines = []
    _, bench = _bench(results)
    if bench:
        headline = _headline(bench)
        lines.append(
            f"- **Loading**, on {machine_line(bench['machine'])}: `gpuload.DataLoader` {_count(headline['gpuload'])} "
            f"images/s, {_times(headline['ratio'])} the fastest stock DataLoader way measured, "
            f"{_percent(headline['gpuload'], headline['limit'])} of the gather limit"
        )
    build = results.get("build_memmap")
    if build:
        run = build["results"][0]
        rates = {name: spread["median"] for name, spread in run["images_per_second"].items()}
        lines.append(
            f"- **Building** {run['images']} photos: {_times(rates['gpuload'] / rates['talk_recipe'])} the tutorial "
            f"recipe's rate in {_mib(run['peak_unreclaimable_bytes']['gpuload'])} of memory against "
            f"{_mib(run['peak_unreclaimable_bytes']['talk_recipe'])}"
        )
    quality = results.get("jpeg_quality")
    original, default = _original_and_default(quality) if quality else (None, None)
    if default:
        lines.append(
            f"- **`ffmpeg -q:v 3`**: {_times(original['mean_file_bytes'] / default['mean_file_bytes'])} smaller "
            f"files at {default['psnr_db']:.1f} dB PSNR"
        )
    _, transfer = _pick(results, "transfer_order")
    if transfer:
        pairs = _grouped(transfer["rows"], "order", "height", "width", "batch_size", "memory").values()
        count = sum(pair["half_first"]["seconds"]["median"] > pair["cuda_first"]["seconds"]["median"] for pair in pairs)
        lines.append(
            f"- **Copy uint8, cast on the device**: casting first was slower in {count} of {len(pairs)} "
            f"configurations, on {_device(transfer)}"
        )
    if not any(result["machine"].get("gpu") for result in results.values()):
        lines.append(
            f"- **No GPU has run these experiments yet**: every number here is a CPU stand-in; `{GPU_RUN}` "
            "on a GPU machine measures the real thing"
        )
    return {"closing_numbers": "\n".join(lines) if lines else _missing("bench_cpu")}


SECTIONS: tuple[Section, ...] = (
    _title,
    _headline_slides,
    _bottlenecks,
    _storage,
    _profiling,
    _data_type,
    _image_quality,
    _memmap,
    _augmentation,
    _gpu_bench,
    _closing,
)


def main(argv: list[str] | None = None) -> int:
    """``python -m slides.generate [--repo DIR] [--check]``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m slides.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path("."), help="the gpuload repository (default: .)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if slides/slides.md is stale")
    args = parser.parse_args(argv)
    try:
        stale = write_slides(args.repo, check=args.check)
    except (OSError, ValueError) as error:
        print(f"slides.generate: error: {error}", file=sys.stderr)
        return 2
    deck = args.repo / DECK
    if args.check:
        print(f"{deck} is {'stale: run python -m slides.generate' if stale else 'up to date'}")
        return int(stale)
    print(f"{'wrote' if stale else 'unchanged:'} {deck}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
