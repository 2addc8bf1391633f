"""Run every experiment: ``python -m experiments.run [--quick] [--device cpu|cuda|auto] [--only NAME ...]``.

``--device`` (default ``auto``: cuda when a GPU is there) goes to every experiment, so on a machine
with a GPU one command reproduces every GPU result of the talk::

    python -m experiments.run --device cuda && python -m slides.generate

A GPU run writes ``assets/results/<name>_cuda.json`` and ``assets/<name>_cuda.png`` beside the CPU
results, which keep their plain names; each result carries the device's name (``device_name``: the
GPU's, for a GPU run) and the machine. The last step, ``bench``, builds a memmap of photos and runs
``gpuload bench --device cuda --augment 224`` on it and on a jpeg memmap of the same photos, writing
``bench_cuda.json`` and ``bench_jpeg_cuda.json`` (``bench_cpu.json`` and ``bench_jpeg_cpu.json`` on the
CPU): every contender, the stock loaders included, timed on whole epochs of the same photos.
The talk's generator prefers a GPU result to the CPU one of the same name.

``--quick``: tiny sizes, a smoke test (CI runs it). Its results are not worth keeping, so it writes
under ``GPULOAD_ASSETS`` and, when that is not set, into a new temporary folder, never into the
repository's ``assets/``.

``remote_loading`` runs its gpuload contenders only with ``--quick`` (LitData, WebDataset and MosaicML
Streaming are not in ``.[test]``); its full run needs them (see its docstring).

The build benchmark (``experiments.build_memmap``) and the decoder comparison (``experiments.decoders``)
are not part of it: they need thousands of photos and a quiet machine, and no GPU; run them on their own.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import tempfile
import time
from pathlib import Path

EXPERIMENTS = (
    "transfer_order",
    "train_order",
    "jpeg_quality",
    "memmap_vs_folder",
    "gpu_preprocess",
    "train_augment",
    "recipe",
    "jpeg_store",
    "remote_reads",
    "remote_loading",
    "bench",
)


def bench(argv: list[str]) -> None:
    """``gpuload bench`` on a raw and a jpeg memmap of the same photos, built here:
    ``assets/results/bench_<cpu|cuda>.json`` and ``bench_jpeg_<cpu|cuda>.json``."""
    from ._common import add_device_argument, photo_folders, resolve_device

    parser = argparse.ArgumentParser(prog="bench")
    add_device_argument(parser)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "gpuload-experiments")
    args = parser.parse_args(argv)
    if args.plot_only:
        return  # a table on the slides, no plot
    import gpuload

    device = resolve_device(args.device)
    images, size, batch_size, epochs, augment = (
        (100, (120, 160), 8, 1, 32) if args.quick else (2000, (480, 640), 64, 3, 224)
    )
    _, folder = photo_folders(args.workdir, images, size)
    failed = []
    for kind, suffix, stem in (("raw", ".memmap", "bench"), ("jpeg", ".jpeg", "bench_jpeg")):
        dataset = folder.with_suffix(suffix)
        if not dataset.exists():
            gpuload.build_memmap(folder, dataset, format=kind, progress=False)
        command = ["bench", str(dataset), "--device", device.type, "--batch-size", str(batch_size)]
        command += ["--epochs", str(epochs), "--augment", str(augment)]
        failed += _bench_report(command, f"{stem}_{device.type}", device, args.quick)
    if failed:
        raise SystemExit(f"gpuload bench failed: {'; '.join(failed)}")


def _bench_report(command: list[str], name: str, device, quick: bool) -> list[str]:
    """Run ``gpuload <command> --json assets/results/<name>.json`` and stamp the report; returns the failure, if any."""
    from gpuload.cli import main as gpuload_main

    from . import _common
    from ._common import RESULTS, device_name

    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    command = [*command, "--json", str(path)]
    print(f"  gpuload {' '.join(command)}", flush=True)
    path.unlink(missing_ok=True)  # an earlier run's report is not this one's
    code = gpuload_main(command)
    if path.is_file():  # measured, even where a gpuload contender failed (code 1: the report says which)
        report = json.loads(path.read_text())
        report.update(experiment="bench", device_name=device_name(device), quick=quick, photos=_common.PHOTOS)
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}")
    return [] if code == 0 else [f"gpuload {' '.join(command)} exited with {code}"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a smoke test; written outside assets/")
    parser.add_argument("--only", nargs="+", choices=EXPERIMENTS, default=list(EXPERIMENTS))
    parser.add_argument("--plot-only", action="store_true", help="re-plot the last results of --device")
    parser.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto", help="where batches go (default: auto)"
    )
    args = parser.parse_args(argv)
    if args.quick and not os.environ.get("GPULOAD_ASSETS"):
        os.environ["GPULOAD_ASSETS"] = tempfile.mkdtemp(prefix="gpuload-quick-")
    from . import _common  # reads GPULOAD_ASSETS

    if args.quick and _common.ASSETS.resolve() == (_common.ROOT / "assets").resolve():
        raise SystemExit("--quick would overwrite the repository's results: set GPULOAD_ASSETS to another folder")
    print(f"results and plots go to {_common.ASSETS}", flush=True)
    for name in args.only:
        started = time.perf_counter()
        print(f"== {name}", flush=True)
        flags = ["--quick"] * args.quick + ["--plot-only"] * args.plot_only + ["--device", args.device]
        run = bench if name == "bench" else importlib.import_module(f"{__package__}.{name}").main
        run(flags)
        print(f"== {name} done in {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
