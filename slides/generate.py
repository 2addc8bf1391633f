"""The talk (``slides/slides.md``) from its template and what the experiments measured:
``python -m slides.generate [--check]``, run in the repository.

The template (``slides/template.md``) holds the story and the layout; every number, table, plot
and code block on the slides is a ``${name}`` placeholder filled here from
``assets/results/*.json``, ``assets/*.png`` and the project's source files. A result that is
missing (no GPU run yet, say) becomes a sentence saying so. Same inputs, same Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from string import Template

from gpuload.bench import BENCH_LABELS, gather_limit
from gpuload.machine import machine_line

from .snippets import Snippet

__all__ = ["SNIPPETS", "main", "render_slides", "write_slides"]

TEMPLATE = Path("slides/template.md")
DECK = Path("slides/slides.md")
RESULTS = Path("assets/results")
PLOTS = Path("assets")

# How to produce each result, for the slides that have to say it is missing.
HOW_TO_MEASURE = {
    "bench_cpu": "gpuload bench DATASET --device cpu --json assets/results/bench_cpu.json",
    "bench_cuda": "gpuload bench DATASET --device cuda --json assets/results/bench_cuda.json (on a GPU box)",
    "build_memmap": "python -m experiments.build_memmap",
    "gpu_preprocess": "python -m experiments.gpu_preprocess",
    "jpeg_quality": "python -m experiments.jpeg_quality",
    "memmap_vs_folder": "python -m experiments.memmap_vs_folder",
    "train_order": "python -m experiments.train_order",
    "transfer_order": "python -m experiments.transfer_order",
}

SNIPPETS = {
    "code_profiler": Snippet(
        "experiments/train_order.py",
        "run_variant",
        start="activities = [",
        end="batch = next(iterator, None)",
        steps=(("schedule(",), ('record_function("data")',)),
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
    "code_train_variants": Snippet(
        "experiments/train_order.py",
        "run_variant",
        start='if variant == "cuda_first":',
        end="images = normalize(images)",
        steps=(('"cuda_first"',), ('"half_first"',)),
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
        start="model = nn.Sequential(",
        steps=(("torch.onnx.export",), ("tensor(uint8)",), ("assert_close",)),
    ),
    "code_ffmpeg": Snippet(
        "gpuload/store/compress.py", "_encode", start="command = [", end="]  # fmt: skip", steps=(('"-q:v"',),)
    ),
    "code_tensorclass": Snippet("gpuload/store/dataset.py", "ImageData"),
    "code_recipe_build": Snippet(
        "experiments/build_memmap.py",
        "talk_recipe",
        steps=(("ImageFolder(",), ("memmap_(",), ("data[position",)),
    ),
    "code_build_window": Snippet(
        "gpuload/store/build.py",
        "_RawStore.submit",
        steps=(("self.free.pop()",), ("self.pool.submit",)),
    ),
    "code_collate": Snippet(
        "gpuload/loading/collate.py", "Collate.__call__", steps=(("GatheredSamples",), ("pin_memory",))
    ),
    "code_gather": Snippet(
        "gpuload/loading/loader.py",
        "_PinnedSlot.fill",
        steps=(("index_select",), ("torch.cuda.stream", "non_blocking"), ("Event()", ".record(")),
    ),
    "code_consume": Snippet(
        "gpuload/loading/loader.py",
        "_EpochIterator.__next__",
        start="if event is None:",
        end="self._pipeline.release(slot)",
        steps=(("wait_event",), ("record_stream",), ("release",)),
    ),
    "code_three_loaders": Snippet(
        "experiments/memmap_vs_folder.py",
        "loaders",
        steps=(("ImageFolder(",), ("gpuload.Collate",), ("gpuload.DataLoader",)),
    ),
    "code_preprocess": Snippet(
        "gpuload/transforms/augment.py",
        "resample",
        steps=(("weights_x.transpose",), ("torch.bmm(weights_y",)),
    ),
    "code_compile": Snippet(
        "experiments/gpu_preprocess.py",
        "contenders",
        start="ours = nn.Sequential(",
        end='"gpuload_compiled"',
        steps=(("nn.Sequential",), ("torch.compile",)),
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
        except (KeyError, IndexError, TypeError) as error:
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


def _load_results(folder: Path) -> dict[str, dict]:
    results = {}
    for path in sorted(folder.glob("*.json")):
        try:
            results[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from None
    return results


# --- formatting -------------------------------------------------------------------------------


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _times(value: float) -> str:
    return f"{value:.1f}x"


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f} %"


def _ms(seconds: float) -> str:
    milliseconds = seconds * 1e3
    return f"{milliseconds:.2f} ms" if milliseconds < 10 else f"{milliseconds:,.1f} ms"


def _kb(size: float) -> str:
    return f"{size / 1e3:,.0f} KB"


def _mib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:,.0f} MiB"


def _size(row: dict) -> str:
    return f"{row['width']}x{row['height']}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _source(result: dict, name: str) -> str:
    """Where a result came from: the machine, the date and the JSON file."""
    return (
        f'<p class="measured">Measured on {machine_line(result["machine"])}, {result["machine"]["date"][:10]} '
        f"(<code>assets/results/{name}.json</code>).</p>"
    )


def _missing(name: str) -> str:
    return (
        f"**Not measured yet:** there is no `assets/results/{name}.json`. "
        f"Run `{HOW_TO_MEASURE[name]}`, then `python -m slides.generate`."
    )


def _plot(root: Path, name: str, alt: str) -> str:
    if not (root / PLOTS / f"{name}.png").is_file():
        return f"**No plot yet:** `assets/{name}.png` is made by `python -m experiments.run`."
    return f'<img class="plot" src="/{name}.png" alt="{alt}"/>'


def _on_cpu_only(result: dict) -> bool:
    return result.get("device", "cpu") == "cpu"


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


# --- sections, in the order of the talk ----------------------------------------------------------
# Each returns the placeholders of its slides; a missing result fills them with what to run.

Section = Callable[[dict[str, dict], Path], dict[str, str]]


def _title(results: dict[str, dict], root: Path) -> dict[str, str]:
    machines: dict[str, list[str]] = {}
    for name, result in results.items():
        line = f"{machine_line(result['machine'])}, {result['machine']['date'][:10]}"
        machines.setdefault(line, []).append(name)
    if not machines:
        return {"title_machines": "No results yet: run `python -m experiments.run`, then `python -m slides.generate`."}
    lines = [f"- {line}: {', '.join(names)}" for line, names in sorted(machines.items())]
    return {"title_machines": "Measured on:\n\n" + "\n".join(lines)}


def _bench(results: dict[str, dict], root: Path) -> dict[str, str]:
    values = {}
    for device in ("cpu", "cuda"):
        name = f"bench_{device}"
        report = results.get(name)
        if report is None:
            values[name] = _missing(name)
            continue
        limit = gather_limit(report)
        rows = []
        for contender, result in report["results"].items():
            rate = result["images_per_second"]
            rows.append(
                [BENCH_LABELS[contender], _count(rate), f"{result['gigabytes_per_second']:.1f}", _percent(rate, limit)]
            )
        channels, height, width = report["image_shape"]
        values[name] = "\n\n".join(
            [
                f"{report['images']} images of {width}x{height}, batch {report['batch_size']}, shuffled, "
                f"page cache warm, to `{report['device']}`:",
                _table(["way", "images/s", "GB/s", "of the gather limit"], rows),
                *_h2d_share(report),
                _source(report, name),
            ]
        )
    cpu = results.get("bench_cpu")
    if cpu is None:
        values["goals_headline"] = _missing("bench_cpu")
    else:
        rates = {name: result["images_per_second"] for name, result in cpu["results"].items()}
        limit = gather_limit(cpu)
        folder = (
            f"`ImageFolder` + `DataLoader` decoding JPEGs: **{_count(rates['image_folder'])} images/s**; "
            if "image_folder" in rates
            else ""
        )
        values["goals_headline"] = (
            f"{folder}`gpuload.DataLoader`: **{_count(rates['gpuload'])} images/s**, "
            f"{_percent(rates['gpuload'], limit)} of what this machine can gather ({_count(limit)} images/s) "
            f"on {machine_line(cpu['machine'])}."
        )
    return values


def _h2d_share(report: dict) -> list[str]:
    """On CUDA: how much of the pinned host-to-device limit the loader reaches."""
    if "limit_h2d" not in report["results"]:
        return []
    share = _percent(
        report["results"]["gpuload"]["images_per_second"], report["results"]["limit_h2d"]["images_per_second"]
    )
    return [f"`gpuload.DataLoader` reaches **{share}** of the pinned host-to-device limit."]


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
                _percent(rates["gpuload"], rates["pillow_limit"]),
                _mib(run["peak_unreclaimable_bytes"]["gpuload"]),
                _mib(run["peak_unreclaimable_bytes"]["talk_recipe"]),
            ]
        )
    first = runs[0]
    table = _table(
        [
            "photos",
            "gpuload img/s",
            "recipe img/s",
            "Pillow decode limit",
            "of limit",
            "gpuload memory",
            "recipe memory",
        ],
        rows,
    )
    return {
        "build_memory": f"Peak memory the OS cannot reclaim while building: {memory}.",
        "build_table": "\n\n".join(
            [
                f"{_kb(first['mean_file_bytes'])} JPEGs (ffmpeg `-q:v 3`), {first['workers']} decode workers, "
                f"medians of {len(first['images_per_second']['gpuload']['runs'])} runs:",
                table,
                _source(build, "build_memmap"),
            ]
        ),
    }


def _profiling(results: dict[str, dict], root: Path) -> dict[str, str]:
    result = results.get("train_order")
    plot = _plot(root, "train_order_trace", "one profiler step drawn from the Chrome trace")
    if result is None:
        return {"trace_plot": plot, "trace_ranges": _missing("train_order")}
    last = result["rows"][-1]  # train_order traces its last configuration
    traced = _grouped(result["rows"], "variant", "height", "width", "batch_size")[
        (last["height"], last["width"], last["batch_size"])
    ].values()
    names = ("data", "transfer", "cast", "forward", "backward", "optimizer")
    rows = [
        [f"`{row['variant']}`"]
        + [
            "-" if row["range_ms_per_step"][name] is None else f"{row['range_ms_per_step'][name]:,.2f}"
            for name in names
        ]
        for row in traced
    ]
    return {
        "trace_plot": plot,
        "trace_ranges": "\n\n".join(
            [
                f"`record_function` ranges, ms per step, {_size(last)}, batch {last['batch_size']}, "
                f"{result['device_name']}:",
                _table(["variant", *names], rows),
                _source(result, "train_order"),
            ]
        ),
    }


def _data_type(results: dict[str, dict], root: Path) -> dict[str, str]:
    values = {
        "transfer_order_plot": _plot(root, "transfer_order", "copy-then-cast against cast-then-copy"),
        "train_order_plot": _plot(root, "train_order", "training step time, three ways, per image size"),
    }
    transfer = results.get("transfer_order")
    if transfer is None:
        values.update(dtype_bytes=_missing("transfer_order"), transfer_order_summary=_missing("transfer_order"))
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
        slower = sum(ratio > 1 for ratio in ratios)
        memory = "pinned" if any(key[3] == "pinned" for key in pairs) else "pageable"
        key = (largest["height"], largest["width"], largest["batch_size"], memory)
        example = pairs[key]
        caveat = (
            " No GPU in this run: the “transfer” is a copy into new host memory, standing in for the bus."
            if _on_cpu_only(transfer)
            else ""
        )
        values["transfer_order_summary"] = (
            f"`x.half().cuda()` was slower in **{slower} of {len(ratios)}** configurations "
            f"({min(ratios):.1f}x to {max(ratios):.1f}x the time of `x.cuda().half()`); "
            f"{_size(largest)}, batch {largest['batch_size']}, {memory}: "
            f"{_ms(example['cuda_first']['seconds']['median'])} against "
            f"{_ms(example['half_first']['seconds']['median'])} on {transfer['device_name']}.{caveat}"
            f"\n\n{_source(transfer, 'transfer_order')}"
        )
    train = results.get("train_order")
    if train is None:
        values.update(train_order_summary=_missing("train_order"), normalize_summary=_missing("train_order"))
        return values
    configurations = _grouped(train["rows"], "variant", "height", "width", "batch_size")
    lines = []
    for (height, width, batch), variants in _largest_batch_per_size(configurations):
        step = {variant: row["step_seconds"]["median"] for variant, row in variants.items()}
        lines.append(
            f"- {width}x{height}, batch {batch}: cuda-first {_ms(step['cuda_first'])}, "
            f"half-first {_ms(step['half_first'])}, Normalize in the model {_ms(step['normalize_in_model'])} per step"
        )
    caveat = ""
    if _on_cpu_only(train):
        feeding = max(
            sum(row["range_ms_per_step"][name] or 0 for name in ("data", "transfer", "cast")) for row in train["rows"]
        )
        shortest = min(row["step_seconds"]["median"] for row in train["rows"])
        caveat = (
            f"\n\nCPU only: feeding (data + transfer + cast) takes at most {feeding:.2f} ms of steps of "
            f"{_ms(shortest)} or more, so the three ways are within noise here. The question needs a GPU run."
        )
    values["train_order_summary"] = "\n".join(lines) + caveat + "\n\n" + _source(train, "train_order")
    ratios = [
        variants["normalize_in_model"]["step_seconds"]["median"] / variants["cuda_first"]["step_seconds"]["median"]
        for variants in configurations.values()
    ]
    values["normalize_summary"] = (
        f"In the training experiment, `nn.Sequential(Normalize, resnet18)` fed uint8 took "
        f"{min(ratios):.2f}x to {max(ratios):.2f}x the step time of casting outside the model "
        f"({len(ratios)} configurations, {train['device_name']})"
        + (": within this CPU's noise." if _on_cpu_only(train) else ".")
    )
    return values


def _image_quality(results: dict[str, dict], root: Path) -> dict[str, str]:
    values = {
        "jpeg_crops_plot": _plot(root, "jpeg_quality_crops", "the same crop at each ffmpeg quality"),
        "jpeg_quality_plot": _plot(root, "jpeg_quality", "file size, PSNR and folder throughput per quality"),
    }
    result = results.get("jpeg_quality")
    if result is None:
        return values | {
            "jpeg_quality_table": _missing("jpeg_quality"),
            "jpeg_quality_summary": _missing("jpeg_quality"),
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
            f"{result['images']} photos of {width}x{height}; ImageFolder + DataLoader, {result['workers']} workers, "
            f"batch {result['batch_size']}:",
            _table(["encoding", "mean file", "size", "PSNR", "images/s"], table_rows),
            _source(result, "jpeg_quality"),
        ]
    )
    if default is None:
        values["jpeg_quality_summary"] = "`-q:v 3` was not part of this run."
    else:
        speed = default["images_per_second"]["median"] / original["images_per_second"]["median"]
        values["jpeg_quality_summary"] = (
            f"`-q:v 3`: {_kb(original['mean_file_bytes'])} to {_kb(default['mean_file_bytes'])} per photo "
            f"({_times(original['mean_file_bytes'] / default['mean_file_bytes'])} smaller) at "
            f"{default['psnr_db']:.1f} dB PSNR; ImageFolder loads "
            f"{_count(default['images_per_second']['median'])} against "
            f"{_count(original['images_per_second']['median'])} images/s ({_times(speed)}): decoding, "
            f"not reading, costs most once the files are page-cached."
        )
    return values


def _memmap(results: dict[str, dict], root: Path) -> dict[str, str]:
    values = {"memmap_plot": _plot(root, "memmap_vs_folder", "three loaders per device, size and batch")}
    result = results.get("memmap_vs_folder")
    for device in ("cpu", "cuda"):
        key = f"memmap_{device}"
        if result is None:
            values[key] = _missing("memmap_vs_folder")
            continue
        rows = [row for row in result["rows"] if row["device"] == device]
        if not rows:
            values[key] = (
                f"**No {device} run yet**: `python -m experiments.memmap_vs_folder --devices {device}` on a machine "
                f"with {'a GPU' if device == 'cuda' else 'a CPU'}, then `python -m slides.generate`."
            )
            continue
        lines = []
        for (height, width, batch), contenders in _largest_batch_per_size(
            _grouped(rows, "contender", "height", "width", "batch_size")
        ):
            rate = {contender: row["images_per_second"]["median"] for contender, row in contenders.items()}
            lines.append(
                f"- {width}x{height}, batch {batch}: ImageFolder {_count(rate['image_folder'])}, "
                f"tensorclass + `Collate` {_count(rate['talk_recipe'])}, `gpuload.DataLoader` "
                f"**{_count(rate['gpuload'])}** images/s ({_times(rate['gpuload'] / rate['image_folder'])} "
                f"ImageFolder)"
            )
        values[key] = f"To {result['device_names'][device]}, {result['images']} photos:\n\n" + "\n".join(lines)
    values["memmap_source"] = _source(result, "memmap_vs_folder") if result else ""
    return values


def _preprocessing(results: dict[str, dict], root: Path) -> dict[str, str]:
    plot = _plot(root, "gpu_preprocess", "per-sample crop + flip + normalise, images/s per batch size")
    result = results.get("gpu_preprocess")
    if result is None:
        return {"gpu_preprocess_plot": plot, "gpu_preprocess_summary": _missing("gpu_preprocess")}
    lines = []
    for (batch,), contenders in sorted(_grouped(result["rows"], "contender", "batch_size").items()):
        ours, loop = contenders["gpuload_compiled"], contenders["torchvision_per_sample"]
        share = (
            f", {_percent(ours['share_of_bandwidth'], 1)} of the memory bandwidth"
            if "share_of_bandwidth" in ours
            else ""
        )
        lines.append(
            f"- batch {batch}: compiled {_count(ours['images_per_second']['median'])} images/s{share}; "
            f"torchvision per sample {_count(loop['images_per_second']['median'])}"
        )
    if _on_cpu_only(result):
        lines.append("- a CPU stand-in: the GPU version measures the same contenders with `--device cuda`")
    return {
        "gpu_preprocess_plot": plot,
        "gpu_preprocess_summary": (
            f"{result['input'][1]}x{result['input'][0]} uint8 to {result['output']}x{result['output']} "
            f"{result['dtype']}, on {result['device_name']}; graph breaks: **{result['graph_breaks']}**.\n\n"
            + "\n".join(lines)
            + "\n\n"
            + _source(result, "gpu_preprocess")
        ),
    }


def _closing(results: dict[str, dict], root: Path) -> dict[str, str]:
    lines = []
    bench = results.get("bench_cpu")
    if bench:
        rates = {name: result["images_per_second"] for name, result in bench["results"].items()}
        lines.append(
            f"- Loading: `gpuload.DataLoader` {_count(rates['gpuload'])} images/s, "
            f"{_percent(rates['gpuload'], gather_limit(bench))} of the gather limit"
            + (f"; ImageFolder {_count(rates['image_folder'])}" if "image_folder" in rates else "")
            + f" ({machine_line(bench['machine'])})"
        )
    build = results.get("build_memmap")
    if build:
        run = build["results"][0]
        rates = {name: spread["median"] for name, spread in run["images_per_second"].items()}
        lines.append(
            f"- Building {run['images']} photos: {_count(rates['gpuload'])} images/s, "
            f"{_times(rates['gpuload'] / rates['talk_recipe'])} the tutorial recipe, "
            f"{_mib(run['peak_unreclaimable_bytes']['gpuload'])} of memory against "
            f"{_mib(run['peak_unreclaimable_bytes']['talk_recipe'])}"
        )
    original, default = _original_and_default(results["jpeg_quality"]) if "jpeg_quality" in results else (None, None)
    if default:
        lines.append(
            f"- `ffmpeg -q:v 3`: {_times(original['mean_file_bytes'] / default['mean_file_bytes'])} smaller files "
            f"at {default['psnr_db']:.1f} dB PSNR"
        )
    transfer = results.get("transfer_order")
    if transfer:
        pairs = _grouped(transfer["rows"], "order", "height", "width", "batch_size", "memory").values()
        count = sum(pair["half_first"]["seconds"]["median"] > pair["cuda_first"]["seconds"]["median"] for pair in pairs)
        lines.append(
            f"- Copy uint8, cast on the device: casting first was slower in {count} of {len(pairs)} "
            f"configurations ({transfer['device_name']})"
        )
    gpu_runs = [name for name, result in results.items() if result["machine"].get("gpu")]
    if not gpu_runs:
        lines.append(
            "- **No GPU has run these experiments yet**: every number in this talk is from the CPU machine above."
        )
    return {"closing_numbers": "\n".join(lines) if lines else _missing("bench_cpu")}


SECTIONS: tuple[Section, ...] = (
    _title,
    _bench,
    _bottlenecks,
    _profiling,
    _data_type,
    _image_quality,
    _memmap,
    _preprocessing,
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
