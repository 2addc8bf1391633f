"""gpuload at ImageNet's count: does anything grow with the number of images that should not?

For each count N (10,000, 100,000 and ImageNet's 1,281,167 by default), an ImageFolder of N small
JPEGs (64x64, in 1,000 class folders when there are enough images, a few hundred bytes of JPEG each:
small enough for this machine's disk) is made once, built into a jpeg dataset, pushed to a
``file://`` URL, and measured, each step in a fresh process so that nothing is shared between them:

- ``build``: images/s, the seconds from the start to the first image written (the scan before it),
  and the peak memory the OS cannot reclaim (anonymous and shared: not the page cache), the
  sources read once before (warm in the page cache at every N);
- ``first_image``: the seconds from ``build_memmap``'s call to its first image written, with the
  page cache dropped first with ``--drop-caches`` (root: ``/proc/sys/vm/drop_caches``, the whole
  machine's; ``page_cache`` says whether), each of 3 runs in a fresh process stopped at its first image (the build removes its
  temporary folder); the median and the range, and the seconds the cold ``import gpuload`` took
  before (a command's start pays it too);
- ``open``: ``MemmapImageDataset(path)`` in a fresh process: seconds, and the resident memory it adds
  (all of it, and its anonymous part); the same at the URL with a warm cache (``cache=``), and in a
  spawned ``DataLoader`` worker (the stock loader's first batch with 2 spawned workers, and each worker's
  private memory);
- ``samples``: one access of ``ds.samples[i]`` and ``ds.targets[i]``;
- ``loader``: ``gpuload.DataLoader`` made, iterated, first batch of 256 (``CenterCropDecode(64)``), and
  ``state_dict``;
- ``classes``: distinct classes in a batch of 256: the exact shuffle, the block-aware order (32 blocks)
  over this dataset's shuffled, block-aligned storage, and over the same images stored in ImageFolder's
  order (the blocks each would start in, computed from the same lengths); these small images are
  thousands a block, so each also at ImageNet's density (40 images a block, in the same stored order);
- ``nodes``: bytes a cold epoch fetches across 4 nodes of 8 ranks (each node's ranks share a cache),
  over the dataset's size: over this dataset's blocks (a few hundred at 1.28M images: a window of 32
  is a large part of a node's share) and at ImageNet's density.

The results (``assets/results/scale.json``) and a plot against N (``assets/scale.png``): the lines
should be flat.

    python -m experiments.scale [--counts 10000 100000 1281167] [--quick] [--drop-caches] [--first-image-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ._common import figure, save_figure, write_result

IMAGENET = 1_281_167
SIDE = 64
VARIANTS = 64  # distinct JPEGs the images are copies of (their bytes do not change what is measured)
BATCH = 256
IMAGENET_PER_BLOCK = 40  # ImageNet's JPEGs in a 4 MiB block (110 KB on average)


def make_images(root: Path, count: int) -> Path:
    """An ImageFolder of ``count`` 64x64 JPEGs in ``min(1000, count // 10)`` class folders, made once
    (under a temporary name, renamed when complete)."""
    folder = root / f"scale-{count}"
    if folder.exists():
        return folder
    partial = root / f".scale-{count}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    import simplejpeg

    rng = np.random.default_rng(0)
    variants = [
        simplejpeg.encode_jpeg(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8), quality=75)
        for _ in range(VARIANTS)
    ]
    classes = max(1, min(1000, count // 10))
    for number in range(count):
        label = number * classes // count
        directory = partial / f"n{label:08d}"
        if number == 0 or label != (number - 1) * classes // count:
            directory.mkdir(parents=True)
        (directory / f"n{label:08d}_{number}.JPEG").write_bytes(variants[number % VARIANTS])
    os.rename(partial, folder)
    return folder


def _bytes_under(folder: Path) -> int:
    """The bytes of the files under ``folder`` (os.walk: Path.rglob keeps every path it gave in a set)."""
    return sum(os.stat(os.path.join(parent, name)).st_size for parent, _, names in os.walk(folder) for name in names)


def _read_every_file(folder: Path) -> None:
    """Read every file under ``folder`` once (32 at a time: a disk's latency, not its bandwidth, bounds it)."""
    from concurrent.futures import ThreadPoolExecutor

    def read(path: str) -> None:
        with open(path, "rb") as file:
            file.read()

    paths = (os.path.join(parent, name) for parent, _, names in os.walk(folder) for name in names)
    with ThreadPoolExecutor(32) as pool:
        for _ in pool.map(read, paths, chunksize=256):
            pass


def run_step(*args: str) -> dict:
    """One measurement in a fresh Python process: its JSON answer."""
    result = subprocess.run(
        [sys.executable, "-m", "experiments.scale", "_step", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if result.returncode != 0:
        raise RuntimeError(f"step {args[0]} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _resident() -> dict[str, int]:
    """This process's resident memory, all of it and its anonymous part, in bytes."""
    fields = {}
    with open("/proc/self/status") as file:
        for line in file:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon"):
                fields[name] = int(value.split()[0]) * 1024
    return fields


def _private(pid: int) -> int:
    """A process's private memory (clean and dirty), in bytes."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as file:
        for line in file:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def step_build(src: str, out: str) -> dict:
    import gpuload
    import gpuload.writing.build as build

    from ._common import UnreclaimableMemory

    first: list[float] = []
    real = build._JpegStore.append

    def append(self, position, stored):
        if not first:
            first.append(time.perf_counter())
        return real(self, position, stored)

    build._JpegStore.append = append
    # shared="tree": the build's own pages, not other jobs' on a shared machine (the whole machine's
    # shared memory grew by 270 MB beside the first 1.28M run)
    with UnreclaimableMemory(shared="tree") as baseline:  # the interpreter, torch and gpuload: not the build's
        time.sleep(0.2)
    started = time.perf_counter()
    with UnreclaimableMemory(shared="tree") as memory:
        gpuload.build_memmap(src, out, format="jpeg", progress=False)
    seconds = time.perf_counter() - started
    count = len(gpuload.MemmapImageDataset(out))
    return {
        "seconds": seconds,
        "images_per_second": count / seconds,
        "first_image_s": first[0] - started,
        "peak_unreclaimable_bytes": memory.peak_bytes - baseline.peak_bytes,
    }


class _FirstImage(Exception):
    """Stops a build at its first image (``step_first_image``)."""


def step_first_image(src: str, out: str, drop_caches: str) -> dict:
    page_cache = "as found"
    if drop_caches == "yes":
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")  # PermissionError unless root: asked, not done
        page_cache = "dropped"
    started = time.perf_counter()
    import gpuload
    import gpuload.writing.build as build

    imported = time.perf_counter()

    def append(self, position, stored):
        raise _FirstImage(time.perf_counter())

    build._JpegStore.append = append
    try:
        gpuload.build_memmap(src, out, format="jpeg", progress=False)
    except _FirstImage as first:
        return {"seconds": first.args[0] - imported, "import_s": imported - started, "page_cache": page_cache}
    raise RuntimeError(f"the build of {src} wrote no image")


def first_image(src: str, drop_caches: bool, runs: int = 3) -> dict:
    """:func:`step_first_image` ``runs`` times, each in a fresh process (each build stopped before it
    leaves anything at its out, ``SRC.first-image.jpeg``): the median, the range, each run."""
    out, drop = f"{src}.first-image.jpeg", "yes" if drop_caches else "no"
    each = [run_step("first_image", src, out, drop) for _ in range(runs)]
    seconds = sorted(run["seconds"] for run in each)
    return {
        "seconds": seconds[len(seconds) // 2],
        "min_s": seconds[0],
        "max_s": seconds[-1],
        "import_s": sorted(run["import_s"] for run in each)[len(each) // 2],
        "page_cache": each[0]["page_cache"],
        "runs": each,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
    }


def step_open(path: str, cache: str | None) -> dict:
    import gpuload

    _ = gpuload.MemmapImageDataset  # its imports (torch, tensordict...) before measuring
    import gpuload.remote.dataset  # noqa: F401
    import gpuload.remote.store  # noqa: F401

    before = _resident()
    started = time.perf_counter()
    if cache is None:
        dataset = gpuload.MemmapImageDataset(path)
    else:
        dataset = gpuload.MemmapImageDataset(path, cache=cache, cache_size="20GB")
    seconds = time.perf_counter() - started
    after = _resident()
    timings = {}
    for name, read in (("samples", lambda: dataset.samples[len(dataset) // 2]),
                       ("targets", lambda: dataset.targets[len(dataset) // 2])):  # fmt: skip
        began = time.perf_counter()
        read()
        timings[f"{name}_s"] = time.perf_counter() - began
    dataset.close()
    return {
        "seconds": seconds,
        "resident_bytes": after["VmRSS"] - before["VmRSS"],
        "anonymous_bytes": after["RssAnon"] - before["RssAnon"],
        **timings,
    }


class Nothing:
    """A dataset of ``length`` items that holds nothing: what a spawned worker costs without one (with the
    modules a gpuload dataset's worker imports: torch, tensordict, gpuload's store)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __setstate__(self, state: dict) -> None:  # in the worker
        import gpuload.format.dataset  # noqa: F401
        import gpuload.writing.jpeg  # noqa: F401

        self.__dict__.update(state)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


def _first_batch(dataset) -> tuple[float, int]:
    """The stock loader's first batch with 2 spawned workers: seconds, and the most private memory of a worker."""
    import torch

    loader = torch.utils.data.DataLoader(
        dataset, batch_size=BATCH, shuffle=True, num_workers=2, multiprocessing_context="spawn", collate_fn=list
    )
    started = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    first = time.perf_counter() - started
    private = max(_private(worker.pid) for worker in iterator._workers)
    del iterator
    return first, private


def step_workers(path: str) -> dict:
    import gpuload

    dataset = gpuload.MemmapImageDataset(path)
    _, baseline = _first_batch(Nothing(len(dataset)))  # the interpreter, torch and gpuload in a worker
    first, private = _first_batch(dataset)
    return {"first_batch_s": first, "worker_private_bytes": private, "worker_baseline_private_bytes": baseline}


def step_loader(path: str) -> dict:
    import gpuload

    dataset = gpuload.MemmapImageDataset(path)
    started = time.perf_counter()
    loader = gpuload.DataLoader(
        dataset, batch_size=BATCH, shuffle=True, device="cpu", decode=gpuload.CenterCropDecode(SIDE, ratio=1.0)
    )
    made = time.perf_counter()
    iterator = iter(loader)
    iterated = time.perf_counter()
    next(iterator)
    batch = time.perf_counter()
    loader.state_dict()
    state = time.perf_counter() - batch
    iterator.close()
    return {
        "made_s": made - started,
        "iter_s": iterated - made,
        "first_batch_s": batch - iterated,
        "state_dict_s": state,
    }


def step_orders(path: str) -> dict:
    """Distinct classes a batch and the bytes a cold epoch fetches across nodes (a simulation on the
    dataset's own index: the loader's orders, the blocks each image lies in)."""
    import torch

    import gpuload
    from gpuload.loading.order import epoch_order

    dataset = gpuload.MemmapImageDataset(path)
    block = dataset.manifest.order.get("block_size", 4 * 2**20)
    labels = dataset.data.labels
    starts, lengths = dataset.data.starts, dataset.data.lengths
    shuffled = starts // block
    # the same images stored one after the other in ImageFolder's order: the block each would start in
    imagefolder = (torch.cumsum(lengths, 0) - lengths) // block
    count = len(labels)

    def classes(blocks) -> float:
        order = epoch_order(count, epoch=0, seed=1, shuffle=True, blocks=blocks, window=32 if blocks is not None else 0)
        batches = range(0, min(len(order), 20 * BATCH) - BATCH + 1, BATCH)
        return float(np.mean([labels[order[i : i + BATCH]].unique().numel() for i in batches]))

    data_bytes = int(dataset.manifest.files["data.memmap"])

    def fetched(first_blocks, last_blocks, sizes, nodes: int = 4, ranks: int = 8) -> float:
        """Bytes a cold epoch fetches across ``nodes`` nodes of ``ranks`` ranks (a node's ranks share a
        cache: each block it needs once), over the dataset's."""
        total = 0
        for node in range(nodes):
            needed = torch.zeros(len(sizes), dtype=torch.bool)
            for rank in range(node * ranks, (node + 1) * ranks):
                order = epoch_order(count, epoch=0, seed=1, shuffle=True, rank=rank, world_size=nodes * ranks,
                                    blocks=first_blocks, window=32)  # fmt: skip
                firsts, lasts = first_blocks[order], last_blocks[order]
                needed[firsts] = needed[lasts] = True
                longer = lasts - firsts > 1  # an image over more than two blocks
                for first, last in zip(firsts[longer].tolist(), lasts[longer].tolist()):
                    needed[first : last + 1] = True
            total += int(sizes[needed].sum())
        return total / int(sizes.sum())

    block_sizes = torch.full(((data_bytes + block - 1) // block,), block, dtype=torch.int64)
    block_sizes[-1] = data_bytes - (len(block_sizes) - 1) * block
    # ImageNet's density: about 40 of its JPEGs (110 KB on average) a 4 MiB block, where these small
    # images are thousands a block: the same stored order, 40 images a block
    dense = torch.empty(count, dtype=torch.int64)
    dense[torch.argsort(starts)] = torch.arange(count) // IMAGENET_PER_BLOCK
    return {
        "blocks": len(block_sizes),
        "classes_uniform": classes(None),
        "classes_block_shuffled_storage": classes(shuffled),
        "classes_block_imagefolder_storage": classes(imagefolder),
        "classes_block_shuffled_storage_imagenet_density": classes(dense),
        "classes_block_imagefolder_storage_imagenet_density": classes(torch.arange(count) // IMAGENET_PER_BLOCK),
        "fetched_over_dataset_4x8": fetched(shuffled, (starts + lengths - 1) // block, block_sizes),
        "fetched_over_dataset_4x8_imagenet_density": fetched(
            dense, dense, torch.ones(int(dense.max()) + 1, dtype=torch.int64)
        ),
    }


def measure(count: int, workdir: Path, drop_caches: bool) -> dict:
    source = make_images(workdir, count)
    built = workdir / f"scale-{count}.jpeg"
    shutil.rmtree(built, ignore_errors=True)
    os.sync()
    row: dict = {"images": count, "source_bytes": _bytes_under(source)}
    _read_every_file(source)  # the sources in the page cache, at every N (a real build may read them cold)
    row["first_image"] = first_image(str(source), drop_caches)
    row["build"] = run_step("build", str(source), str(built))
    print(f"  N={count:,} build: {row['build']['images_per_second']:,.0f} images/s, first image after "
          f"{row['build']['first_image_s']:.2f} s, peak {row['build']['peak_unreclaimable_bytes'] / 1e6:,.0f} MB", flush=True)  # fmt: skip
    row["open"] = run_step("open", str(built))
    bucket = workdir / f"scale-{count}-bucket"
    shutil.rmtree(bucket, ignore_errors=True)
    import gpuload

    gpuload.push_memmap(built, (bucket / "ds").as_uri(), progress=False)
    cache = Path(tempfile.mkdtemp(prefix="gpuload-scale-cache-"))
    try:
        run_step("open", (bucket / "ds").as_uri(), str(cache))  # cold: fills the cache
        row["open_url_warm"] = run_step("open", (bucket / "ds").as_uri(), str(cache))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(bucket, ignore_errors=True)
    row["workers"] = run_step("workers", str(built))
    row["loader"] = run_step("loader", str(built))
    row["orders"] = run_step("orders", str(built))
    print(f"  N={count:,} open {row['open']['seconds']:.3f} s +{row['open']['resident_bytes'] / 1e6:.0f} MB; "
          f"at a URL (warm) {row['open_url_warm']['seconds']:.3f} s +{row['open_url_warm']['resident_bytes'] / 1e6:.0f} MB; "
          f"spawned workers' first batch {row['workers']['first_batch_s']:.2f} s; classes a batch "
          f"{row['orders']['classes_block_shuffled_storage_imagenet_density']:.0f} (uniform {row['orders']['classes_uniform']:.0f}); "
          f"a cold epoch on 4x8 ranks fetches {row['orders']['fetched_over_dataset_4x8_imagenet_density']:.3f}x", flush=True)  # fmt: skip
    row["disk_bytes"] = _bytes_under(built)
    return row


def plot(result: dict) -> None:
    rows = result["rows"]
    counts = [row["images"] for row in rows]
    fig, axes = figure(1, 3, size=(980, 420))
    left, middle, right = axes[0]
    left.plot(counts, [row["open"]["seconds"] for row in rows], "o-", label="open")
    left.plot(counts, [row["open_url_warm"]["seconds"] for row in rows], "s-", label="open, URL")
    left.plot(counts, [row["first_image"]["seconds"] for row in rows], "^-", label="build: 1st image")
    left.set_ylabel("seconds")
    left.set_title("time")
    middle.plot(counts, [row["open"]["resident_bytes"] / 1e6 for row in rows], "o-", label="open")
    middle.plot(counts, [row["open_url_warm"]["resident_bytes"] / 1e6 for row in rows], "s-", label="open, URL")
    middle.plot(counts, [row["build"]["peak_unreclaimable_bytes"] / 1e6 for row in rows], "^-", label="build")
    middle.set_ylabel("MB")
    middle.set_title("memory")
    for key, style, label in (("classes_uniform", "k--", "uniform"),
                              ("classes_block_shuffled_storage_imagenet_density", "o-", "shuffled store"),
                              ("classes_block_imagefolder_storage_imagenet_density", "x:", "folder order")):  # fmt: skip
        right.plot(counts, [row["orders"][key] for row in rows], style, label=label)
    right.set_ylabel(f"classes a batch of {BATCH}")
    right.set_title("mixing (40 images a block)")
    for axis in (left, middle, right):
        axis.set_xscale("log")
        axis.set_xlabel("images")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=18, loc="best")
    save_figure(fig, "scale", result, statistics="one run per count, each step in a fresh process")


def main(argv: list[str] | None = None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "_step":
        name, *args = argv[1:]
        answer = {"build": step_build, "first_image": step_first_image, "open": step_open, "workers": step_workers, "loader": step_loader,
                  "orders": step_orders}[name]  # fmt: skip
        if name == "open" and len(args) == 1:
            args.append(None)
        print(json.dumps(answer(*args)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[10_000, 100_000, IMAGENET])
    parser.add_argument("--quick", action="store_true", help="2,000 and 6,000 images (a smoke test)")
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument(
        "--drop-caches",
        action="store_true",
        help="drop the whole machine's page cache before each first-image run (root only; the committed run did)",
    )
    parser.add_argument(
        "--first-image-only",
        action="store_true",
        help="measure only the cold build's first image, into the committed result's rows of these counts",
    )
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    args = parser.parse_args(argv)
    from . import _common
    from ._common import read_result

    if args.plot_only:
        plot(read_result("scale"))
        return
    counts = [2_000, 6_000] if args.quick else args.counts
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.first_image_only:
        import gpuload

        if not (_common.RESULTS / "scale.json").is_file():
            raise SystemExit(
                f"{_common.RESULTS / 'scale.json'} does not exist: --first-image-only measures into the rows of a "
                "result; run python -m experiments.scale first"
            )
        result = read_result("scale")
        have = [row["images"] for row in result["rows"]]
        missing = [count for count in counts if count not in have]
        if missing:  # measuring nothing would still rewrite the result with this machine's description
            raise SystemExit(
                f"{_common.RESULTS / 'scale.json'} has no row of {', '.join(map(str, missing))} images (its rows: "
                f"{', '.join(map(str, have))}); measure them first: python -m experiments.scale --counts ..."
            )
        for row in result["rows"]:
            if row["images"] in counts:
                row["first_image"] = first_image(str(make_images(args.workdir, row["images"])), args.drop_caches)
                row["first_image"]["machine"] = gpuload.describe_machine()  # the rest keeps the first run's
                print(f"  N={row['images']:,} first image after {row['first_image']['seconds']:.2f} s "
                      f"({row['first_image']['min_s']:.2f}-{row['first_image']['max_s']:.2f}), page cache "
                      f"{row['first_image']['page_cache']}", flush=True)  # fmt: skip
        path = write_result("scale", {key: value for key, value in result.items() if key != "experiment"})
        plot(json.loads(path.read_text()))
        return
    rows = []
    for count in counts:  # written after each count: the largest takes an hour, and may be stopped
        rows.append(measure(count, args.workdir, args.drop_caches))
        path = write_result(
            "scale", {"device": "cpu", "side": SIDE, "batch_size": BATCH, "quick": args.quick, "rows": rows}
        )
    print(f"wrote {path}")
    plot(json.loads(path.read_text()))


if __name__ == "__main__":
    main()
