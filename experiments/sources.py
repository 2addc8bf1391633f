"""The build rate of each source and the loader's cost of extra fields: ``python -m experiments.sources``.

The same photos (:mod:`experiments._photos`: real photographs at ImageNet-like sizes) as four sources:
an ImageFolder, the same files named by a ``metadata.csv`` (hard links: no copy), WebDataset tar shards
(Python's ``tarfile``: ``jpg``, ``cls``) and a Parquet file in Hugging Face's layout (an ``image``
column of ``{bytes, path}`` and a ``label``). Each of the three holds what the folder holds (images and
class names: like with like), and each again with three numeric fields beside (``table-fields``, ...: a
float score, an int64 box of 4 and a bool flag; in the tar, a ``json`` member), what the fields cost.

Each is built into a jpeg store (the source bytes kept: what a build from bytes costs beside one from
files) and into a raw store at 160x160 (every photo decoded and cropped), once untimed (the page cache
and the decoders' threads warm for all alike), then ``repeats`` rounds, the sources taken in turn so
that the machine's load falls on all alike (each round starting with the next); a rate is images per
second of a whole ``build_memmap`` (scan, write, fsync, rename), beside the CPU time it took per image
(the decoders' threads' too); each source's rate is also taken over the folder's of the same round. A
raw build at a given size from a source of samples writes as it scans; a jpeg build in the default
shuffled order scans first, as from the folder.

Then ``gpuload.DataLoader`` on the CPU: whole shuffled epochs (``passes`` a measurement) of each raw
store with the three fields against the ImageFolder's raw store (images and labels only), in turn
(each round starting with the next), ``epochs`` rounds, each source's rate taken over the folder's of the
same round; the bar is the issue's, at least 90 % of the images-only rate. Writes
``assets/results/sources.json`` (the machine named).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

from ._common import median_spread, write_result

SOURCES = ("folder", "table", "tar", "parquet")  # images and class names, each
FIELDS = tuple(f"{name}-fields" for name in SOURCES[1:])  # the same, with three numeric fields
FORMATS = ("jpeg", "raw")
RAW_SIZE = (160, 160)


def fields(position: int) -> dict:
    """The three numeric fields of photo ``position``."""
    return {"score": position / 7, "box": [position % 13, 2, 30, 40 + position % 5], "flag": position % 3 == 0}


def make_sources(workdir: Path, count: int) -> dict[str, Path]:
    """The sources of ``count`` photos under ``workdir`` (:data:`SOURCES` and :data:`FIELDS`, made once, reused)."""
    from ._photos import make_photo_set

    folder = workdir / f"sources-{count}" / "folder"
    if not folder.exists():
        make_photo_set(folder, count)
    photos = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*.jpg"))
    made = {"folder": folder}
    for with_fields in (False, True):
        name, kind = ("-fields", "fields") if with_fields else ("", "plain")
        made[f"table{name}"] = _table(folder, folder.with_name(f"table-{kind}"), photos, with_fields)
        made[f"tar{name}"] = _shards(folder, folder.with_name(f"shards-{kind}"), photos, with_fields)
        made[f"parquet{name}"] = _parquet(folder, folder.with_name(f"train-{kind}.parquet"), photos, with_fields)
    return made


def _table(folder: Path, table: Path, photos: list[str], with_fields: bool) -> Path:
    """The photos of ``folder`` hard-linked into ``table`` with a ``metadata.csv`` naming them."""
    if not (table / "metadata.csv").exists():
        shutil.rmtree(table, ignore_errors=True)
        lines = ["file_name,label" + (",score,box,flag" if with_fields else "")]
        for position, name in enumerate(photos):
            (table / name).parent.mkdir(parents=True, exist_ok=True)
            os.link(folder / name, table / name)
            line = f"{name},{name.split('/')[0]}"
            if with_fields:
                values = fields(position)
                line += f',{values["score"]},"{values["box"]}",{values["flag"]}'
            lines.append(line)
        (table / "metadata.csv").write_text("\n".join(lines) + "\n")
    return table


def _shards(folder: Path, shards: Path, photos: list[str], with_fields: bool) -> Path:
    """The photos of ``folder`` as 4 WebDataset shards (``jpg``, ``cls``, and ``json`` ``with_fields``)."""
    if not shards.exists():
        partial = shards.with_name(f".{shards.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        per_shard = -(-len(photos) // 4)
        for shard in range(0, len(photos), per_shard):
            with tarfile.open(partial / f"train-{shard // per_shard:06d}.tar", "w") as tar:
                for position in range(shard, min(len(photos), shard + per_shard)):
                    name = photos[position]
                    members = {"jpg": (folder / name).read_bytes(), "cls": name.split("/")[0].encode()}
                    if with_fields:
                        members["json"] = json.dumps(fields(position)).encode()
                    for extension, data in members.items():
                        info = tarfile.TarInfo(f"{position:06d}.{extension}")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
        os.rename(partial, shards)
    return shards


def _parquet(folder: Path, parquet: Path, photos: list[str], with_fields: bool) -> Path:
    """The photos of ``folder`` in one Parquet file of Hugging Face's layout (pyarrow's defaults: snappy)."""
    if not parquet.exists():
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [
            {"image": {"bytes": (folder / name).read_bytes(), "path": name}, "label": name.split("/")[0]}
            | (fields(position) if with_fields else {})
            for position, name in enumerate(photos)
        ]
        partial = parquet.with_name(f".{parquet.name}.partial")
        pq.write_table(pa.Table.from_pylist(rows), partial, row_group_size=256)
        os.rename(partial, parquet)
    return parquet


def build_rates(
    sources: dict[str, Path], out: Path, repeats: int
) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, list[float]]]]:
    """Images per second of each build, and this process's CPU time per image (its threads': user and
    system), per format and source, the sources in turn (each round starting with the next)."""
    import resource

    import gpuload

    def cpu_seconds() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    rates: dict[str, dict[str, list[float]]] = {fmt: {name: [] for name in sources} for fmt in FORMATS}
    cpu: dict[str, dict[str, list[float]]] = {fmt: {name: [] for name in sources} for fmt in FORMATS}
    names = list(sources)
    for fmt in FORMATS:  # untimed: the page cache and the decoders' threads warm for every source alike
        for name in names:
            gpuload.build_memmap(sources[name], out / f"{name}.{fmt}", overwrite=True, progress=False,
                                 **_options(fmt))  # fmt: skip
    for round in range(repeats):
        for fmt in FORMATS:
            for name in names[round % len(names) :] + names[: round % len(names)]:
                target = out / f"{name}.{fmt}"
                started, used = time.perf_counter(), cpu_seconds()
                gpuload.build_memmap(sources[name], target, overwrite=True, progress=False, **_options(fmt))
                seconds, used = time.perf_counter() - started, cpu_seconds() - used
                images = len(gpuload.MemmapImageDataset(target))
                rates[fmt][name].append(images / seconds)
                cpu[fmt][name].append(1000 * used / images)
    return rates, cpu


def _options(fmt: str) -> dict:
    return {"format": "jpeg"} if fmt == "jpeg" else {"size": RAW_SIZE}


def epoch_rates(out: Path, repeats: int, batch_size: int, passes: int) -> dict[str, list[float]]:
    """Images per second of whole shuffled epochs of gpuload.DataLoader on the CPU, ``passes`` epochs a
    measurement: the folder's raw store (images only) and each source's with its three fields
    (:data:`FIELDS`), in turn."""
    import gpuload

    loaders = {
        name: gpuload.DataLoader(
            gpuload.MemmapImageDataset(out / f"{name}.raw"), batch_size=batch_size, shuffle=True, device="cpu"
        )
        for name in ("folder", *FIELDS)
    }
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for loader in loaders.values():  # a warm-up epoch each: the pages in memory, the rings allocated
        for _ in loader:
            pass
    for round in range(repeats):
        names = list(loaders)
        for name in names[round % len(names) :] + names[: round % len(names)]:  # each first in turn
            loader = loaders[name]
            started, served = time.perf_counter(), 0
            for _ in range(passes):
                served += sum(len(batch["label"] if isinstance(batch, dict) else batch[1]) for batch in loader)
            rates[name].append(served / (time.perf_counter() - started))
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=10, help="timed builds of each source and store")
    parser.add_argument("--epochs", type=int, default=9, help="timed measurements of each loader")
    parser.add_argument("--passes", type=int, default=100, help="epochs a measurement")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.repeats, args.epochs, args.passes, args.batch_size = 40, 1, 1, 1, 8
    from ._photos import DESCRIPTION

    sources = make_sources(args.workdir, args.images)
    out = args.workdir / f"sources-{args.images}" / "built"
    out.mkdir(exist_ok=True)
    load = os.getloadavg()
    builds, cpu = build_rates(sources, out, args.repeats)
    epochs = epoch_rates(out, args.epochs, args.batch_size, args.passes)
    path = write_result(
        "sources",
        {
            "device": "cpu",
            "quick": args.quick,
            "photos": DESCRIPTION,
            "images": args.images,
            "raw_size": list(RAW_SIZE),
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "epochs": args.epochs,
            "passes": args.passes,
            "fields": ["score: float32", "box: int64 [4]", "flag: bool"],
            "load_average_at_start": [round(value, 1) for value in load],
            "build_images_per_second": {
                fmt: {name: median_spread(runs) for name, runs in by_source.items()}
                for fmt, by_source in builds.items()
            },
            # each round's build rate over the folder's of the same round: the machine's load falls on both alike
            "build_of_folder_paired": {
                fmt: {
                    name: median_spread([ours / theirs for ours, theirs in zip(runs, by_source["folder"], strict=True)])
                    for name, runs in by_source.items()
                    if name != "folder"
                }
                for fmt, by_source in builds.items()
            },
            # the work a build costs, which the load of other jobs changes less than its time
            "build_cpu_ms_per_image": {
                fmt: {name: median_spread(runs) for name, runs in by_source.items()} for fmt, by_source in cpu.items()
            },
            "epoch_images_per_second": {name: median_spread(runs) for name, runs in epochs.items()},
            # each round's rate over the folder's of the same round (taken back to back): the load of the
            # shared machine falls on both alike
            "epoch_of_folder_paired": {
                name: median_spread([ours / theirs for ours, theirs in zip(runs, epochs["folder"], strict=True)])
                for name, runs in epochs.items()
                if name != "folder"
            },
        },
    )
    import gpuload

    print(f"machine: {gpuload.machine_line()}")
    for fmt, by_source in builds.items():
        print(fmt, {name: f"{statistics.median(runs):,.0f}/s" for name, runs in by_source.items()})
        print(f"{fmt} CPU", {name: f"{statistics.median(runs):.2f} ms/img" for name, runs in cpu[fmt].items()})
    print("epochs", {name: f"{statistics.median(runs):,.0f}/s" for name, runs in epochs.items()})
    print(path)


if __name__ == "__main__":
    main()
