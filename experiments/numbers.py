"""Every measured number of README.md and experiments/README.md, from ``assets/results/*.json``.

A number in those files is written as a span, ``<!--n NAME-->22,815<!--/n-->``, whose text this
script writes from :func:`values` (``NAME`` is a key of it), and a table as a block,
``<!--t NAME-->`` ... ``<!--/t-->``, whose lines it writes from :data:`TABLES`. Outside them no
number may carry a unit of measurement (images/s, ms, %, MB, a ratio such as 3.4x): :func:`untagged`
finds any such number, so a figure typed by hand, or left behind by an older run, fails the tests.
A number that is not measured (arithmetic, a setting) is marked so: ``<!--fact-->4x<!--/fact-->``.

    python -m experiments.numbers            # rewrite the spans and tables from the results
    python -m experiments.numbers --check    # exit 1 when a file is stale or holds an untagged number
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "experiments/README.md")
RESULTS = ROOT / "assets" / "results"

SPAN = re.compile(r"<!--n ([\w.:-]+)-->(.*?)<!--/n-->", re.S)
TABLE = re.compile(r"(<!--t ([\w.-]+)-->\n)(.*?)(<!--/t-->)", re.S)
FACT = re.compile(r"<!--fact-->.*?<!--/fact-->", re.S)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
# A number with a unit of measurement, or a ratio: what a reader takes for a measurement.
MEASURED = re.compile(
    r"(?<![\w.,/-])\d[\d,]*(?:\.\d+)?\s?(?:images/s|img/s|ms\b|µs\b|s\b|MB/s|GB/s|MB\b|GB\b|KB\b|MiB\b|GiB\b|TB\b|%|x\b)"
)


# --- formats -----------------------------------------------------------------------------------


def count(value: float) -> str:
    return f"{value:,.0f}"


def spread(stats: dict) -> str:
    return f"{stats['min']:,.0f}-{stats['max']:,.0f}"


def times(value: float) -> str:
    return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"


def percent(value: float) -> str:
    return f"{100 * value:.0f} %"


def ms(value: float) -> str:
    return f"{value:.2f} ms"


def megabytes(value: float) -> str:
    return f"{value / 1e6:,.1f} MB" if value < 1e9 else f"{value / 1e6:,.0f} MB"


def mebibytes(value: float) -> str:
    return f"{value / 2**20:,.0f} MiB"


def machine_line(result: dict) -> str:
    machine = result["machine"]
    gpu = machine.get("gpu") or "no GPU"
    return f"{machine['cores']}-core {machine['cpu']} VM, {machine['memory_gib']:.1f} GiB, {gpu}"


def _describe(prefix: str, result: dict, into: dict[str, str]) -> None:
    into[f"{prefix}.date"] = result["machine"]["date"][:10]
    into[f"{prefix}.machine"] = machine_line(result)
    into[f"{prefix}.torch"] = result["machine"]["torch"].split("+")[0]


# --- values ------------------------------------------------------------------------------------


def values(results: dict[str, dict]) -> dict[str, str]:
    """Every named number, formatted, from the results that are there (a missing result: no names)."""
    found: dict[str, str] = {}
    for name, make in SECTIONS.items():
        if name in results:
            _describe(name, results[name], found)
            make(results[name], found)
    return found


def _jpeg_store(result: dict, into: dict[str, str]) -> None:
    rates: dict[tuple[str, str], dict] = {}
    for row in result["rows"]:
        stats = row["images_per_second"]
        rates[row["contender"], row["cache"]] = stats
        into[f"jpeg_store.{row['contender']}.{row['cache']}"] = count(stats["median"])
        into[f"jpeg_store.{row['contender']}.{row['cache']}.spread"] = spread(stats)
    for cache in ("warm", "cold"):
        for ours, theirs in (
            ("raw_crop_host", "jpeg_crop"),
            ("raw_crop_host", "raw_crop_device"),
            ("raw_crop_host", "stock"),
            ("raw_crop_device", "stock"),
            ("jpeg_crop", "stock"),
            ("jpeg_crop_exact", "stock"),
            ("jpeg_crop", "jpeg_crop_exact"),
            ("raw", "jpeg_crop"),
            ("raw", "raw_crop_host"),
        ):
            if (ours, cache) in rates and (theirs, cache) in rates:
                ratio = rates[ours, cache]["median"] / rates[theirs, cache]["median"]
                into[f"jpeg_store.{ours}_x_{theirs}.{cache}"] = times(ratio)
    sizes = result["bytes_on_disk"]
    for store, size in sizes.items():
        into[f"jpeg_store.bytes.{store}"] = megabytes(size)
        into[f"jpeg_store.bytes_per_image.{store}"] = f"{size / result['images'] / 1e3:,.1f} KB"
    into["jpeg_store.raw_over_jpeg_bytes"] = times(sizes["raw"] / sizes["jpeg"])
    into["jpeg_store.images"] = count(result["images"])
    into["jpeg_store.batch_size"] = str(result["batch_size"])
    into["jpeg_store.device"] = result["device_name"]
    for mode, stats in result["decoder_alone"].items():
        into[f"jpeg_store.decoder.{mode}"] = count(stats["median"])
    accurate = result["decoder_alone"]["accurate"]["median"]
    for name in ("jpeg_full", "jpeg_full_fast"):
        if (name, "warm") in rates:
            into[f"jpeg_store.{name}_of_decoder"] = f"{rates[name, 'warm']['median'] / accurate:.2f}"
    for name, stats in result["reads"].items():
        into[f"jpeg_store.reads.{name}"] = count(stats["median"])


def _build_memmap(result: dict, into: dict[str, str]) -> None:
    run = result["results"][0]
    rates = {name: stats for name, stats in run["images_per_second"].items()}
    for name, stats in rates.items():
        into[f"build_memmap.{name}"] = count(stats["median"])
        into[f"build_memmap.{name}.spread"] = spread(stats)
    for name, peak in run["peak_unreclaimable_bytes"].items():
        into[f"build_memmap.peak.{name}"] = mebibytes(peak)
    decoder = rates["simplejpeg_limit"]["median"]
    into["build_memmap.images"] = count(run["images"])
    into["build_memmap.share_of_decoder"] = percent(rates["gpuload"]["median"] / decoder)
    into["build_memmap.share_of_decoder.no_sync"] = percent(rates["gpuload_no_sync"]["median"] / decoder)
    into["build_memmap.x_recipe"] = times(rates["gpuload"]["median"] / rates["talk_recipe"]["median"])
    into["build_memmap.x_recipe.no_sync"] = times(rates["gpuload_no_sync"]["median"] / rates["talk_recipe"]["median"])
    if "write_limit" in rates:
        into["build_memmap.write_limit_of_decoder"] = percent(rates["write_limit"]["median"] / decoder)
        into["build_memmap.write_limit.gbps"] = f"{rates['write_limit']['median'] * 3 * 480 * 640 / 1e9:.1f} GB/s"


def _bench(result: dict, into: dict[str, str], prefix: str = "bench") -> None:
    rates = {name: stats["images_per_second"] for name, stats in result["results"].items()}
    limit = max(rate for name, rate in rates.items() if name.startswith(("limit_gather", "limit_decode")))
    for name, stats in result["results"].items():
        into[f"{prefix}.{name}"] = count(stats["images_per_second"])
        into[f"{prefix}.{name}.gbps"] = f"{stats['gigabytes_per_second']:.1f}"
        into[f"{prefix}.{name}.of_limit"] = percent(stats["images_per_second"] / limit)
    for ours, theirs in (
        ("gpuload", "image_folder"),
        ("gpuload", "collate"),
        ("collate", "image_folder"),
        ("gpuload_crop", "image_folder_augment"),
        ("gpuload_augment", "image_folder_augment"),
        ("gpuload_decode", "image_folder_augment"),
        ("gpuload_decode_exact", "image_folder_augment"),
        ("gpuload_decode_gpu", "image_folder_augment"),
    ):
        if ours in rates and theirs in rates:
            into[f"{prefix}.{ours}_x_{theirs}"] = times(rates[ours] / rates[theirs])
    into[f"{prefix}.images"] = count(result["images"])
    into[f"{prefix}.batch_size"] = str(result["batch_size"])


def _gpu_preprocess(result: dict, into: dict[str, str]) -> None:
    rates: dict[tuple[str, int], float] = {}
    for row in result["rows"]:
        rates[row["contender"], row["batch_size"]] = row["images_per_second"]["median"]
        into[f"gpu_preprocess.{row['contender']}.{row['batch_size']}"] = count(row["images_per_second"]["median"])
    for (name, batch), rate in rates.items():
        if name == "gpuload_eager" and ("torchvision_same_boxes", batch) in rates:
            into[f"gpu_preprocess.eager_x_same_boxes.{batch}"] = times(rate / rates["torchvision_same_boxes", batch])
    into["gpu_preprocess.device"] = result["device_name"]


def _decode_costs(result: dict, into: dict[str, str]) -> None:
    for name, stats in result["ms_per_image"].items():
        into[f"decode_costs.{name.replace('/', '_')}"] = ms(stats["median"])


def _decoders(result: dict, into: dict[str, str]) -> None:
    for row in result["rows"]:
        into[f"decoders.{row['decoder']}.{row['threads']}"] = count(row["images_per_second"]["median"])


SECTIONS: dict[str, Callable[[dict, dict[str, str]], None]] = {
    "jpeg_store": _jpeg_store,
    "build_memmap": _build_memmap,
    "bench_cpu": _bench,
    "bench_jpeg_cpu": lambda result, into: _bench(result, into, "bench_jpeg_cpu"),
    "gpu_preprocess": _gpu_preprocess,
    "decode_costs": _decode_costs,
    "decoders": _decoders,
}


# --- tables ------------------------------------------------------------------------------------


def _markdown(header: list[str], rows: list[list[str]], align: str) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


WHICH_FORMAT = (  # contender, what it is, what it serves
    ("raw", "raw: `gpuload.DataLoader`, whole batches (no crop: the store's own limit)", "640x480"),
    ("raw_crop_host", "raw: `decode=RandomResizedCropDecode(224)`, crop in the loader's threads", "224x224"),
    (
        "raw_crop_device",
        "raw: whole batches, then `transform=RandomResizedCrop(224, flip=True)` on the device",
        "224x224",
    ),
    ("jpeg_crop", "jpeg: `decode=RandomResizedCropDecode(224)` (fast DCT)", "224x224"),
    ("jpeg_crop_exact", "jpeg: the same, `fast=False` (accurate DCT, as the stock loader)", "224x224"),
    (
        "stock",
        "stock `DataLoader(ImageFolder)`, `decode_jpeg`, v2 `RandomResizedCrop(224)` + flip, persistent workers",
        "224x224",
    ),
    ("spdl", "SPDL 0.8, FFmpeg crop + scale filters, one batch at a time", "224x224"),
)


def _which_format(results: dict[str, dict]) -> str:
    result = results["jpeg_store"]
    rows = {(row["contender"], row["cache"]): row["images_per_second"] for row in result["rows"]}
    sizes = result["bytes_on_disk"]
    store = {"raw": sizes["raw"], "jpeg": sizes["jpeg"], "stock": sizes["source"], "spdl": sizes["source"]}
    table = []
    for name, label, serves in WHICH_FORMAT:
        if (name, "warm") not in rows:
            continue
        warm, cold = rows[name, "warm"], rows[name, "cold"]
        size = store[name.split("_")[0]]
        table.append(
            [
                label,
                serves,
                megabytes(size),
                f"{count(warm['median'])} ({spread(warm)})",
                f"{count(cold['median'])} ({spread(cold)})",
            ]
        )
    return _markdown(
        ["contender (threads or workers = cores)", "serves", "on disk", "warm, images/s", "cold, images/s"],
        table,
        "llrrr",
    )


def _bench_table(results: dict[str, dict], stem: str) -> str:
    from gpuload.bench import bench_rows

    rows = [
        [
            row["label"],
            count(row["images_per_second"]),
            f"{row['gigabytes_per_second']:.1f}",
            "" if row["of_limit"] is None else percent(row["of_limit"]),
            "" if row["x_stock"] is None else times(row["x_stock"]),
        ]
        for row in bench_rows(results[stem])
    ]
    return _markdown(["contender", "images/s", "GB/s", "of the limit", "x stock"], rows, "lrrrr")


def _build_table(results: dict[str, dict]) -> str:
    run = results["build_memmap"]["results"][0]
    rates, peaks = run["images_per_second"], run["peak_unreclaimable_bytes"]
    labels = {
        "simplejpeg_limit": "decode limit: simplejpeg decoding the files on all cores, into memory, writing nothing",
        "write_limit": "disk limit: the same bytes written and flushed (`fsync`), decoding nothing",
        "gpuload": "`gpuload build-memmap` (accurate decode, checksums, `fsync` before the rename: the default)",
        "gpuload_no_sync": "`gpuload build-memmap --no-sync`",
        "talk_recipe": "tensordict tutorial: `DataLoader(ImageFolder)`, workers, into a tensorclass memmap",
        "pillow_limit": "reference: Pillow decoding the files on all cores",
        "decode_jpeg_limit": "reference: torchvision `decode_jpeg` on all cores",
    }
    rows = []
    for name, label in labels.items():
        if name in rates:
            peak = mebibytes(peaks[name]) if name in peaks else "-"
            rows.append([label, f"{count(rates[name]['median'])} ({spread(rates[name])})", peak])
    return _markdown(["", "images/s", "peak unreclaimable memory"], rows, "lrr")


TABLES: dict[str, Callable[[dict[str, dict]], str]] = {
    "which_format": _which_format,
    "bench_cpu": lambda results: _bench_table(results, "bench_cpu"),
    "bench_jpeg_cpu": lambda results: _bench_table(results, "bench_jpeg_cpu"),
    "build_memmap": _build_table,
}


# --- documents ---------------------------------------------------------------------------------


def load_results(folder: Path = RESULTS) -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def render(text: str, results: dict[str, dict], where: str = "the document") -> str:
    """``text`` with every span and table written from ``results``.

    Raises:
        KeyError: a span or table names nothing the results give (named, with ``where``).
    """
    known = values(results)

    def span(match: re.Match) -> str:
        if match[1] not in known:
            raise KeyError(f"{where}: no result gives the number {match[1]!r}: rerun its experiment, or fix the name")
        return f"<!--n {match[1]}-->{known[match[1]]}<!--/n-->"

    def table(match: re.Match) -> str:
        if match[2] not in TABLES:
            raise KeyError(f"{where}: there is no table {match[2]!r} (tables: {', '.join(TABLES)})")
        return match[1] + TABLES[match[2]](results) + match[4]

    return TABLE.sub(table, SPAN.sub(span, text))


def untagged(text: str) -> list[str]:
    """The numbers with a unit of measurement outside spans, tables, facts and code: each as
    ``line N: text``."""
    hidden = text
    for pattern in (TABLE, SPAN, FACT, CODE):
        hidden = pattern.sub(lambda match: re.sub(r"[^\n]", " ", match[0]), hidden)
    found = []
    for number, line in enumerate(hidden.splitlines(), start=1):
        found += [f"line {number}: {match[0]!r}" for match in MEASURED.finditer(line)]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a file is stale")
    args = parser.parse_args(argv)
    results = load_results()
    problems = []
    for name in DOCUMENTS:
        path = ROOT / name
        text = path.read_text()
        rendered = render(text, results, name)
        problems += [f"{name}: {found} has a unit but no tag" for found in untagged(rendered)]
        if rendered != text:
            if args.check:
                problems.append(f"{name} is stale: run python -m experiments.numbers")
            else:
                path.write_text(rendered)
                print(f"wrote {name}")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
