"""Make a GPU lease count: every CUDA test, their deletion check and every GPU measurement, in one command.

No GPU has run gpuload yet. This script is what a session does first when a GPU machine is lent
(the device tool's ``status`` says ``can_start_another: true``). In order of importance, each step
in a subprocess with its own time limit, stopping cleanly when ``--budget`` runs out:

1. ``tests``: ``pytest -m cuda``: the CUDA tests of the loader, collate, crop, augment and
   normalize, including the deletion check (each step of the stream protocol removed in turn: the
   overlap tests must then fail) and the ``torch.cuda.set_sync_debug_mode`` tests;
2. ``bench_raw``: ``gpuload bench --device cuda --augment 224`` on a raw memmap of 2,000 photos
   (the pinned host-to-device limit, gpuload, the stock loaders, the three places to crop);
3. ``bench_jpeg``: the same on a jpeg memmap: CPU decode (fast and accurate DCT) and nvJPEG;
4. every ``--device cuda`` experiment: ``jpeg_store``, ``gpu_preprocess``, ``transfer_order``,
   ``train_order``, ``memmap_vs_folder``, ``train_augment``, ``jpeg_quality``.

Each writes its results, stamped with the GPU's name, under ``assets/`` (``*_cuda.json``, ``*_cuda.png``,
``bench_cuda*.json``), and this script writes ``assets/results/gpu_check_cuda.json``: the GPU, every
step's outcome, time and output tail. With ``--out DIR`` it also packs the results into
``DIR/gpu_check_results.tar.gz`` (the device tool brings back at most 8 files).

The device machine has PyTorch but none of gpuload's other dependencies and no network: fetch them
here first, as wheels for its Python 3.12, into ``.whl/`` (ignored by git)::

    python -m experiments.gpu_check prepare          # here: the wheels, and the command to run there

then run on the device machine (the device tool's ``run``, carrying ``.whl``), in two calls of at
most 10 minutes each, back to back while the machine is warm::

    python3 -m experiments.gpu_check run --wheels .whl --out "$OUT" --only tests bench_raw bench_jpeg
    python3 -m experiments.gpu_check run --wheels .whl --out "$OUT" --only jpeg_store gpu_preprocess ...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What the device image lacks (it has torch, torchvision, numpy, pillow, matplotlib, tqdm, xxhash,
# pytest, hypothesis, onnx, onnxruntime, onnxscript, opencv): gpuload's other dependencies and the
# contenders' packages, with their own dependencies that the image lacks.
WHEELS = (
    "tensordict>=0.15.3",
    "cloudpickle",
    "orjson",
    "pyvers",
    "importlib_metadata",
    "simplejpeg>=1.8",
    "imageio-ffmpeg>=0.5",
    "torchcodec>=0.16",
    "kornia>=0.9",
    "kornia_rs",
)
DEVICE_PYTHON = "3.12"  # the device image's python3 (the device tool's KINDS.md)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
EXPERIMENTS = (
    "jpeg_store",
    "gpu_preprocess",
    "transfer_order",
    "train_order",
    "memmap_vs_folder",
    "train_augment",
    "jpeg_quality",
)


def steps(python: str) -> list[tuple[str, list[str], int]]:
    """``(name, command, seconds allowed)`` of every step, in order of importance."""
    found = [
        ("tests", [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "tests"], 240),
        ("bench_raw", [python, "-m", "experiments.gpu_check", "bench", "raw"], 150),
        ("bench_jpeg", [python, "-m", "experiments.gpu_check", "bench", "jpeg"], 150),
    ]
    return found + [(name, [python, "-m", f"experiments.{name}", "--device", "cuda"], 240) for name in EXPERIMENTS]


def run_steps(budget: float, out: Path | None, *, only: list[str] | None = None, dry_run: bool = False) -> dict:
    """Run :func:`steps` (those named in ``only``) while ``budget`` seconds last; returns (and
    writes) the summary, merged with an earlier call's (the steps of one lease may take two calls)."""
    import torch

    if not dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_check run: torch sees no CUDA GPU here; run it on a GPU machine (the device tool)")
    started = time.monotonic()
    import gpuload

    summary = {
        "experiment": "gpu_check",
        "machine": gpuload.describe_machine(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "steps": [],
    }
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPULOAD_REQUIRE_CUDA": "1"}
    for name, command, allowed in steps(sys.executable):
        if only is not None and name not in only:
            continue
        left = budget - (time.monotonic() - started)
        record = {"step": name, "command": " ".join(command)}
        if dry_run:
            record["outcome"] = "planned"
        elif left < 30:
            record["outcome"] = "skipped: out of time"
        else:
            timeout = min(allowed, left - 10)
            began = time.monotonic()
            try:
                result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
                record["outcome"] = "passed" if result.returncode == 0 else f"failed (exit {result.returncode})"
                output = result.stdout + result.stderr
            except subprocess.TimeoutExpired as expired:
                record["outcome"] = f"timed out after {timeout:.0f} s"
                output = (expired.stdout or b"").decode(errors="replace") + (expired.stderr or b"").decode(
                    errors="replace"
                )
            record["seconds"] = round(time.monotonic() - began, 1)
            record["output_tail"] = output[-4000:]
        summary["steps"].append(record)
        print(f"gpu_check: {name}: {record['outcome']}", flush=True)
    if dry_run:
        return summary
    from ._common import RESULTS

    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "gpu_check_cuda.json"
    earlier = json.loads(path.read_text()) if path.is_file() else None
    if earlier and (earlier.get("gpu"), earlier.get("date", "")[:10]) == (summary["gpu"], summary["date"][:10]):
        # an earlier call of the same lease (same GPU, same day): keep its steps that this one did not run
        ran = {step["step"] for step in summary["steps"]}
        summary["steps"] = [step for step in earlier["steps"] if step["step"] not in ran] + summary["steps"]
    path.write_text(json.dumps(summary, indent=1) + "\n")
    if out is not None:
        pack(RESULTS.parent, out / "gpu_check_results.tar.gz")
    return summary


def pack(assets: Path, archive: Path) -> None:
    """Every GPU result and plot (``*_cuda*``, ``bench_cuda*``, ``gpu_check*``) into one archive."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(assets.rglob("*")):
            if path.is_file() and ("_cuda" in path.name or path.name.startswith(("bench_cuda", "gpu_check"))):
                tar.add(path, arcname=str(path.relative_to(assets.parent)))


def bench(kind: str) -> None:
    """``gpuload bench --device cuda --augment 224`` on a raw or jpeg memmap of 2,000 photos."""
    import gpuload
    from gpuload.cli import main as gpuload_main

    from ._common import RESULTS, photo_folders

    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "gpuload-experiments"
    workdir.mkdir(parents=True, exist_ok=True)
    _, folder = photo_folders(workdir, 2000)
    dataset = folder.with_suffix(".memmap" if kind == "raw" else ".jpeg")
    if not dataset.exists():
        gpuload.build_memmap(folder, dataset, format=kind, progress=False)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / ("bench_cuda.json" if kind == "raw" else "bench_jpeg_cuda.json")
    command = ["bench", str(dataset), "--device", "cuda", "--augment", "224", "--json", str(path)]
    if gpuload_main(command) != 0:
        raise SystemExit(f"gpuload {' '.join(command)} failed")


def prepare(folder: Path) -> None:
    """Download the wheels the device machine lacks (for its Python) into ``folder``, ignored by git."""
    exclude = ROOT / ".git" / "info" / "exclude"
    line = f"/{folder.name}/"
    if exclude.is_file() and line not in exclude.read_text().splitlines():
        with open(exclude, "a") as file:
            file.write(line + "\n")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(folder)]
    command += ["--python-version", DEVICE_PYTHON, "--implementation", "cp"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run([*command, *WHEELS], check=True)
    print(
        f"wheels in {folder}; on the device machine (carry {folder.name}):\n"
        f'  python3 -m experiments.gpu_check run --wheels {folder.name} --out "$OUT" --budget 540'
    )


def install(folder: Path) -> None:
    """On the device machine: the carried wheels into ``/tmp/site`` and gpuload from this checkout,
    for this process and the steps' subprocesses (no network there)."""
    target = Path("/tmp/site")
    wheels = sorted(str(path) for path in folder.glob("*.whl"))
    if wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target",
             str(target), "--upgrade", *wheels],
            check=True,
        )  # fmt: skip
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            "-e",
            str(ROOT),
        ],
        check=True,
    )
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(target))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prepare_parser = commands.add_parser("prepare", help="here: fetch the wheels the device machine lacks")
    prepare_parser.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    run_parser = commands.add_parser("run", help="on the GPU machine: every step, within the budget")
    run_parser.add_argument("--wheels", type=Path, help="install the carried wheels (and gpuload) first")
    run_parser.add_argument("--out", type=Path, help="also pack the results into OUT/gpu_check_results.tar.gz")
    run_parser.add_argument("--budget", type=float, default=540, help="seconds for all steps (default 540)")
    run_parser.add_argument("--only", nargs="+", choices=[name for name, _, _ in steps("python")], help="these steps")
    run_parser.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    bench_parser = commands.add_parser("bench", help="one bench step (what `run` calls)")
    bench_parser.add_argument("kind", choices=["raw", "jpeg"])
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.wheels)
    elif args.command == "bench":
        bench(args.kind)
    else:
        if args.wheels is not None and not args.dry_run:
            install(args.wheels)
        summary = run_steps(args.budget, args.out, only=args.only, dry_run=args.dry_run)
        if args.dry_run:
            for step in summary["steps"]:
                print(f"{step['step']}: {step['command']}")


if __name__ == "__main__":
    main()
