"""Training batches streamed from object storage: gpuload against LitData, WebDataset and MosaicML Streaming.

The same photos (``photo_folders(workdir, 2000)``: 640x480 after ffmpeg ``-q:v 3``), each contender in
its own format, on the same loopback S3 endpoint with the same latency added to every request (20 ms,
as within a cloud region), RandomResizedCrop(224) + flip, batches of 64, 2 threads or workers:

- ``gpuload_cold``/``gpuload_warm``: ``MemmapImageDataset("s3://bench/photos.jpeg", cache=<new folder>)``
  and ``DataLoader(..., shuffle=True, decode=RandomResizedCropDecode(224))`` (the block-aware order, its
  default for a URL with a cache): the first epoch with an empty cache, the second from the cache;
- ``gpuload_exact_cold``: the same with ``block_shuffle=0`` (every image in a uniform random order);
- ``gpuload_local``: the same dataset on the local disk, page cache warm;
- ``litdata_cold``/``litdata_warm``: LitData 0.2 ``optimize`` (16 MB chunks of the JPEG bytes) then
  ``StreamingDataset(shuffle=True)`` + ``StreamingDataLoader``, torchvision ``decode_jpeg`` + v2
  ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip`` in its workers;
- ``webdataset``: tar shards of 16 MB read over HTTP (curl) from the same server, ``shardshuffle`` and
  a 1,000-sample shuffle buffer, the same decode and transform (no cache: every epoch downloads);
- ``mosaic_cold``/``mosaic_warm``: MosaicML Streaming 0.13 MDS shards of 16 MB, ``StreamingDataset(shuffle=True)``,
  the same decode and transform, in the virtual environment given by ``--mosaic-python`` (it pins
  ``numpy<2.2``); left out, with the reason, where that is not given.

The endpoint: ``tests/servers.py``'s ``RangeHTTPServer``, which answers S3 clients' path-style GET and
HEAD (ranges, ETags), in a process of its own (so its CPU is not the loaders'), with ``--latency-ms``
before every answer. moto's S3 server serves about 45 requests/s here and copies the whole object on
every ranged GET (``experiments/remote_reads.py``): it would measure itself, not the loaders.

Measured for each contender: images/s of an epoch, seconds from creating the iterator to the first
batch (and to open the dataset), bytes downloaded in the epoch over the photos' bytes, the local disk
its cache holds after it, CPU seconds per 1,000 images (the process and its workers, not the server).
Contenders take turns, ``--repeats`` times, each repeat starting with another one (median, min-max),
after an untimed epoch of the local contender (imports, threads, page cache).

    python -m experiments.remote_loading --mosaic-python /tmp/benchvenv/bin/python
    python -m experiments.remote_loading --quick      # 100 small photos, one repeat
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from experiments._common import (
    ROOT,
    add_device_argument,
    device_name,
    figure,
    median_spread,
    photo_folders,
    read_result,
    save_figure,
    write_result,
)

BUCKET = "bench"
SHARD_BYTES = 16 * 2**20  # LitData chunks, WebDataset shards and MDS shards alike
BARS = {  # name: (what, how it is computed, the bound)
    "cold_x_litdata": "gpuload's cold-cache rate over LitData's cold epoch, at least 1.5",
    "warm_of_local": "gpuload's warm-cache rate over the same dataset on local disk, at least 0.90",
    "first_batch_s": "seconds from creating the cold iterator to its first batch, at most 2",
    "cold_bytes_ratio": "bytes downloaded in a cold epoch over the dataset's bytes (block-aware order), at most 1.1",
}
LABELS = {
    "gpuload_cold": "gpuload, cold cache (block-aware order)",
    "gpuload_warm": "gpuload, warm cache",
    "gpuload_exact_cold": "gpuload, cold cache, exact shuffle",
    "gpuload_exact_warm": "gpuload, warm cache, exact shuffle",
    "gpuload_local": "gpuload, local disk",
    "litdata_cold": "LitData 0.2, cold",
    "litdata_warm": "LitData 0.2, second epoch",
    "webdataset": "WebDataset 1.0 tar shards",
    "mosaic_cold": "MosaicML Streaming 0.13, cold",
    "mosaic_warm": "MosaicML Streaming 0.13, second epoch",
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 small photos, one repeat, gpuload only")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to every request (default: 20)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="threads or workers of every contender (default: 2)")
    parser.add_argument("--mosaic-python", default=os.environ.get("GPULOAD_MOSAIC_PYTHON"),
                        help="an interpreter with mosaicml-streaming, torch and torchvision (it pins numpy<2.2)")  # fmt: skip
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    parser.add_argument(
        "--only",
        nargs="+",
        help="run only these contenders (gpuload, gpuload_local, gpuload_exact, litdata, webdataset, mosaic)",
    )
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # internal: the S3 endpoint's process
    add_device_argument(parser)  # accepted for experiments.run; batches stay on the CPU here
    args = parser.parse_args(argv)
    if args.serve:
        return _serve(Path(args.serve), args.latency_ms / 1000)
    if args.plot_only:
        return plot(read_result("remote_loading"))
    saved = dict(os.environ)
    try:
        result = _measure(args)
    finally:  # the fake AWS variables stay out of the experiments that run after this one
        os.environ.clear()
        os.environ.update(saved)
    plot(result)


# -- the endpoint ------------------------------------------------------------------------------------------
def _serve(root: Path, latency: float) -> None:
    """The S3 endpoint in this process: prints its URL, then answers ``stats`` lines on stdin until EOF."""
    sys.path.insert(0, str(ROOT / "tests"))
    from servers import RangeHTTPServer

    with RangeHTTPServer(root) as server:
        server.latency = latency
        print(server.url, flush=True)
        for line in sys.stdin:
            if line.strip() == "stats":
                print(json.dumps({"bytes": server.bytes_sent, "requests": len(server.requests)}), flush=True)


class Endpoint:
    """The server process: its URL and its counters."""

    def __init__(self, root: Path, latency_ms: float) -> None:
        command = [
            sys.executable,
            "-m",
            "experiments.remote_loading",
            "--serve",
            str(root),
            "--latency-ms",
            str(latency_ms),
        ]
        self.process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith("http://"):
            raise SystemExit(f"the S3 endpoint did not start (it printed {self.url!r})")

    def stats(self) -> dict:
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(10)


# -- measuring --------------------------------------------------------------------------------------------
def cpu_seconds(exclude: set[int]) -> float:
    """CPU time of this process, its reaped children and its live descendants except ``exclude`` (the server)."""
    from experiments._mosaic_runner import cpu_seconds as measure

    return measure(exclude)


def disk_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) if folder.exists() else 0


def epochs(make_loader: Callable[[], object], count: int, server: Endpoint) -> list[dict]:
    """Run ``count`` epochs of the loader that ``make_loader`` opens: one row each (the first carries the open)."""
    gc.collect()  # an earlier contender's garbage is freed here, not inside this one's timings
    exclude = {server.process.pid}
    before, cpu, started = server.stats(), cpu_seconds(exclude), time.perf_counter()
    loader = make_loader()
    opened = time.perf_counter() - started
    rows = []
    for epoch in range(count):
        if epoch:
            before, cpu = server.stats(), cpu_seconds(exclude)
        started = time.perf_counter()
        iterator = iter(loader)
        first, images, first_images = None, 0, 0
        for batch in iterator:
            if first is None:
                first, first_images = time.perf_counter() - started, len(batch[1])
            images += len(batch[1])
        seconds = time.perf_counter() - started
        after = server.stats()
        rows.append(
            {
                "images": images,
                "seconds": seconds,
                "first_batch_s": first,
                "first_images": first_images,
                "open_s": opened if epoch == 0 else 0.0,
                "cpu_s": cpu_seconds(exclude) - cpu,
                "bytes_downloaded": after["bytes"] - before["bytes"],
                "requests": after["requests"] - before["requests"],
            }
        )
    _shut_down(loader)
    return rows


def _shut_down(loader) -> None:
    """Stop a torch DataLoader's persistent workers now (LitData's, WebDataset's). Left to the garbage
    collector (LitData's loader and iterator reference each other), torch's shutdown no longer reaches
    them and waits 5 s a worker, inside whatever is timed next: it was 10.4 s of gpuload's open."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
        loader._iterator = None


# -- the contenders ----------------------------------------------------------------------------------------
class Augment:
    """torchvision's training transform for the stock-decoding contenders: ``decode_jpeg``, v2
    ``RandomResizedCrop(224)``, ``RandomHorizontalFlip``; picklable (LitData's workers are spawned)."""

    def __call__(self, data: bytes, label: int):
        import torch
        from torchvision.io import decode_jpeg
        from torchvision.transforms import v2

        if not hasattr(self, "transform"):
            self.transform = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])
        return self.transform(decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8))), label

    def __getstate__(self) -> dict:
        return {}


def gpuload_loader(url: str, cache: Path | None, args, **options):
    import gpuload

    def make():
        dataset = gpuload.MemmapImageDataset(url, **({"cache": cache, "cache_size": "20GB"} if cache else {}))
        return gpuload.DataLoader(
            dataset, batch_size=args.batch_size, shuffle=True, decode=gpuload.RandomResizedCropDecode(224),
            threads=args.workers, device="cpu", **options,
        )  # fmt: skip

    return make


def litdata_loader(url: str, cache: Path, args):
    def make():
        from litdata import StreamingDataLoader

        from experiments._litdata_photos import Photos

        dataset = Photos(url, cache_dir=str(cache), shuffle=True, seed=0)
        return StreamingDataLoader(
            dataset, batch_size=args.batch_size, num_workers=args.workers, persistent_workers=True
        )

    return make


def _webdataset_sample(augment: Augment, sample: dict):
    return augment(sample["jpg"], int(sample["cls"]))


def webdataset_loader(pattern: str, args):
    def make():
        import webdataset as wds

        augment = Augment()
        dataset = (
            wds.WebDataset(pattern, shardshuffle=100, nodesplitter=wds.split_by_node, seed=0, empty_check=False)
            .shuffle(1000)
            .map(partial(_webdataset_sample, augment))
            .batched(args.batch_size)
        )
        return wds.WebLoader(dataset, batch_size=None, num_workers=args.workers, persistent_workers=True)

    return make


# -- preparing the formats ------------------------------------------------------------------------------------
def prepare(args, root: Path) -> dict:
    """Every contender's copy of the photos under ``root/bench`` (the endpoint's folder); returns their sizes."""
    import gpuload

    images, size = (100, (120, 160)) if args.quick else (args.images, (480, 640))  # quick: the photos of bench --quick
    _, folder = photo_folders(args.workdir, images, size)
    local = folder.with_suffix(".jpeg")
    if not local.exists():
        gpuload.build_memmap(folder, local, format="jpeg", progress=False)
    dataset = gpuload.MemmapImageDataset(local)
    samples = list(dataset.samples)
    bucket = root / BUCKET
    bucket.mkdir(parents=True, exist_ok=True)
    sizes = {"photos": sum(Path(path).stat().st_size for path, _ in samples), "local": local, "count": len(samples)}
    gpuload.push_memmap(local, (bucket / "photos.jpeg").as_uri(), progress=False)
    sizes["gpuload"] = disk_bytes(bucket / "photos.jpeg")
    if args.quick:
        return sizes
    from litdata import optimize

    optimize(
        fn=_litdata_sample, inputs=samples, output_dir=str(bucket / "litdata"), chunk_bytes=SHARD_BYTES,
        num_workers=args.workers, verbose=False, mode="overwrite",
    )  # fmt: skip
    sizes["litdata"] = disk_bytes(bucket / "litdata")
    import webdataset as wds

    (bucket / "wds").mkdir()
    with wds.ShardWriter(str(bucket / "wds" / "shard-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as sink:
        for number, (path, label) in enumerate(samples):
            sink.write({"__key__": f"{number:06d}", "jpg": Path(path).read_bytes(), "cls": str(label).encode()})
    sizes["webdataset"] = disk_bytes(bucket / "wds")
    sizes["shards"] = len(list((bucket / "wds").glob("*.tar")))
    if args.mosaic_python:
        listing = root / "samples.json"
        listing.write_text(json.dumps(samples))
        command = [args.mosaic_python, "-m", "experiments._mosaic_runner", "write", str(listing), str(bucket / "mds")]
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
        sizes["mosaic"] = disk_bytes(bucket / "mds")
    return sizes


def _litdata_sample(sample: tuple[str, int]) -> dict:
    path, label = sample
    return {"image": Path(path).read_bytes(), "label": label}


# -- the run -----------------------------------------------------------------------------------------------
def _measure(args) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from servers import fake_aws_environment

    repeats = 1 if args.quick else args.repeats
    work = args.workdir / "remote-loading"
    shutil.rmtree(work, ignore_errors=True)
    root, caches = work / "served", work / "caches"
    sizes = prepare(args, root)
    server = Endpoint(root, args.latency_ms)
    os.environ.update(fake_aws_environment(server.url))
    os.environ["S3_ENDPOINT_URL"] = server.url  # MosaicML Streaming's variable
    runs: dict[str, list[dict]] = {}
    skipped: dict[str, str] = {}
    if not args.mosaic_python and not args.quick:
        skipped["mosaic"] = "no --mosaic-python given (mosaicml-streaming 0.13 pins numpy<2.2)"
    url = f"s3://{BUCKET}/photos.jpeg"
    try:
        epochs(gpuload_loader(str(sizes["local"]), None, args), 1, server)  # warm-up: imports, threads, page cache
        for repeat in range(repeats):
            contenders = _contenders(args, url, caches / str(repeat), server, sizes)
            contenders = {name: run for name, run in contenders.items() if not args.only or name in args.only}
            names = list(contenders)
            names = names[repeat % len(names) :] + names[: repeat % len(names)]  # each repeat starts elsewhere
            contenders = {name: contenders[name] for name in names}
            for name, run in contenders.items():
                print(f"repeat {repeat + 1}/{repeats}: {name}", flush=True)
                for key, row in run().items():
                    runs.setdefault(key, []).append(row)
                    print(f"  {key:20} {row['images'] / row['seconds']:8,.0f} images/s, first batch "
                          f"{row['first_batch_s']:.2f} s, {row['bytes_downloaded'] / sizes['photos']:.2f}x downloaded, "
                          f"{row['disk_bytes'] / 1e6:,.0f} MB on disk, {1000 * row['cpu_s'] / row['images']:.2f} "
                          "CPU s per 1,000 images", flush=True)  # fmt: skip
                shutil.rmtree(caches, ignore_errors=True)
    finally:
        server.close()
    rows = [_summary(name, rows, sizes["photos"]) for name, rows in runs.items()]
    bars = _bars({row["contender"]: row for row in rows}, quick=args.quick)
    for name, bar in bars.items():
        verdict = "met" if bar["met"] else "NOT met"
        print(f"bar {name}: {bar['value']:.2f} ({BARS[name]}): {verdict}")
    result = {
        "device": "cpu",
        "device_name": device_name("cpu"),
        "quick": args.quick,
        "images": sizes["count"],
        "batch_size": args.batch_size,
        "workers": args.workers,
        "latency_ms": args.latency_ms,
        "repeats": repeats,
        "endpoint": "tests/servers.py RangeHTTPServer answering S3 path-style GET and HEAD (ranges, ETags), in its own "
        "process on 127.0.0.1, latency added before every answer; WebDataset reads the same server over HTTP (curl)",
        "shard_bytes": SHARD_BYTES,
        "bytes": {key: value for key, value in sizes.items() if key not in ("local", "count")},
        "rows": rows,
        "bars": bars,
        "skipped": skipped,
        "versions": _versions(args),
    }
    return json.loads(write_result("remote_loading", result).read_text())  # with the machine


def _contenders(args, url: str, caches: Path, server: Endpoint, sizes: dict) -> dict[str, Callable[[], dict]]:
    def two(prefix: str, make, cache: Path | None, second: str = "warm") -> Callable[[], dict]:
        def run() -> dict:
            cold, warm = epochs(make, 2, server)
            disk = disk_bytes(cache) if cache else 0
            return {f"{prefix}_cold": {**cold, "disk_bytes": disk}, f"{prefix}_{second}": {**warm, "disk_bytes": disk}}

        return run

    contenders = {
        "gpuload": two("gpuload", gpuload_loader(url, caches / "gpuload", args), caches / "gpuload"),
        "gpuload_local": lambda: {
            "gpuload_local": {
                **epochs(gpuload_loader(str(sizes["local"]), None, args), 2, server)[1],
                "disk_bytes": sizes["gpuload"],
            }
        },
        "gpuload_exact": two(
            "gpuload_exact", gpuload_loader(url, caches / "exact", args, block_shuffle=0), caches / "exact"
        ),
    }
    if args.quick:
        return contenders
    contenders["litdata"] = two(
        "litdata", litdata_loader(f"s3://{BUCKET}/litdata", caches / "litdata", args), caches / "litdata"
    )
    last = sizes["shards"] - 1
    pattern = f"{server.url}/{BUCKET}/wds/shard-{{000000..{last:06d}}}.tar"
    contenders["webdataset"] = lambda: {
        "webdataset": {**epochs(webdataset_loader(pattern, args), 2, server)[1], "disk_bytes": 0}
    }
    if args.mosaic_python:
        contenders["mosaic"] = lambda: _mosaic(args, caches / "mosaic", server)
    return contenders


def _mosaic(args, cache: Path, server: Endpoint) -> dict:
    """Two epochs of MosaicML Streaming in its own interpreter; the bytes are counted here, at the server."""
    before = server.stats()
    command = [
        args.mosaic_python, "-m", "experiments._mosaic_runner", "read", f"s3://{BUCKET}/mds", str(cache),
        "2", str(args.batch_size), str(args.workers),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"the MosaicML Streaming runner failed:\n{done.stderr[-3000:]}")
    output = done.stdout
    after = server.stats()
    cold, warm = json.loads(output.strip().splitlines()[-1])["epochs"]
    disk = disk_bytes(cache)
    # The runner cannot see the server: all its downloads are the cold epoch's (its shards stay in its cache).
    cold.update(bytes_downloaded=after["bytes"] - before["bytes"], requests=after["requests"] - before["requests"])
    warm.update(bytes_downloaded=0, requests=0)
    return {"mosaic_cold": {**cold, "disk_bytes": disk}, "mosaic_warm": {**warm, "disk_bytes": disk}}


def _summary(name: str, rows: list[dict], photos: int) -> dict:
    return {
        "contender": name,
        "label": LABELS[name],
        "images": rows[0]["images"],
        "images_per_second": median_spread([row["images"] / row["seconds"] for row in rows]),
        # without the start (workers, first downloads): what a long epoch approaches
        "steady_images_per_second": median_spread(
            [(row["images"] - row["first_images"]) / (row["seconds"] - row["first_batch_s"]) for row in rows]
        ),
        "first_batch_s": median_spread([row["first_batch_s"] for row in rows]),
        "open_s": median_spread([row["open_s"] for row in rows]),
        "downloaded_over_dataset": statistics.median(row["bytes_downloaded"] for row in rows) / photos,
        "requests": statistics.median(row["requests"] for row in rows),
        "disk_bytes": statistics.median(row["disk_bytes"] for row in rows),
        "cpu_s_per_1000": median_spread([1000 * row["cpu_s"] / row["images"] for row in rows]),
    }


def _bars(rows: dict[str, dict], *, quick: bool) -> dict:
    rate = {name: row["images_per_second"]["median"] for name, row in rows.items()}
    bars = {
        "warm_of_local": {"value": rate["gpuload_warm"] / rate["gpuload_local"], "bound": 0.9, "at_least": True},
        "first_batch_s": {"value": rows["gpuload_cold"]["first_batch_s"]["median"], "bound": 2.0, "at_least": False},
        "cold_bytes_ratio": {"value": rows["gpuload_cold"]["downloaded_over_dataset"], "bound": 1.1, "at_least": False},
    }
    if "litdata_cold" in rate:
        bars["cold_x_litdata"] = {"value": rate["gpuload_cold"] / rate["litdata_cold"], "bound": 1.5, "at_least": True}
    for bar in bars.values():
        bar["met"] = bar["value"] >= bar["bound"] if bar["at_least"] else bar["value"] <= bar["bound"]
    return bars


def _versions(args) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("gpuload", "litdata", "webdataset", "obstore", "boto3"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    if args.mosaic_python:
        command = [args.mosaic_python, "-c", "import streaming; print(streaming.__version__)"]
        found["mosaicml-streaming"] = subprocess.run(command, capture_output=True, text=True).stdout.strip()
    return found


# -- the plot ------------------------------------------------------------------------------------------------
def plot(result: dict) -> None:
    """Horizontal bars: images/s of each contender, with its bytes downloaded over the dataset."""
    import numpy as np

    rows = sorted(result["rows"], key=lambda row: row["images_per_second"]["median"])
    fig, axes = figure(1, 1, size=(900, 420))
    axis = axes[0][0]
    medians = [row["images_per_second"]["median"] for row in rows]
    whiskers = [
        [m - row["images_per_second"]["min"] for m, row in zip(medians, rows)],
        [row["images_per_second"]["max"] - m for m, row in zip(medians, rows)],
    ]
    colours = ["tab:blue" if row["contender"].startswith("gpuload") else "tab:gray" for row in rows]
    positions = np.arange(len(rows))
    axis.barh(positions, medians, 0.6, xerr=whiskers, color=colours, capsize=3)
    for y, value, row in zip(positions, medians, rows):  # right of the whisker, so that it crosses no text
        text = f" {value:,.0f}  ({row['downloaded_over_dataset']:.2f}x downloaded)"
        axis.text(row["images_per_second"]["max"], y, text, va="center", fontsize=18)
    axis.set_yticks(positions, [row["label"] for row in rows])
    axis.set_xlim(0, 1.75 * axis.get_xlim()[1])
    axis.set_xlabel("images/s (RandomResizedCrop(224) + flip, batches of 64)")
    axis.grid(True, axis="x", alpha=0.3)
    axis.set_title(
        f"{result['images']:,} photos, loopback S3 + {result['latency_ms']:.0f} ms a request, "
        f"{result['workers']} threads/workers",
        loc="left",
    )
    print(f"wrote {save_figure(fig, 'remote_loading', result)}")


if __name__ == "__main__":
    main()
