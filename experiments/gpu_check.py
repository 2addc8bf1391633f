"""Make a GPU lease count: the CUDA tests, their deletion check and the GPU measurements, in two calls.

A GPU machine (the device tool) is lent to a session rarely, for 15 minutes in all, its start included,
at most 10 minutes a command, and what a call carries (the working tree and the wheels) must stay under
64 MiB. The machine has PyTorch and no network: ``prepare`` fetches here, as wheels for its Python, what
it lacks. Then, on the GPU machine, each call runs its steps in order of importance, each in a
subprocess with its own time limit, stopping cleanly when ``--budget`` runs out, and packs what it has
after every step into ``OUT/gpu_check_results.tar.gz`` (a call killed at its limit still brings back
every finished step):

call 1 (about 6 minutes):
  1. ``environment``: the GPU, torch, CUDA, TorchCodec (and whether it decodes a JPEG there), ffmpeg;
  2. ``data``: 2,000 photos (the experiments' photos; without ffmpeg, the -q:v 3 copy is Pillow's match,
     see ``experiments._common.FFMPEG_QTABLES``), built into a raw and a jpeg memmap, and 2,000 photos
     at ImageNet-like sizes built into a jpeg memmap;
  3. ``tests``: ``pytest -m cuda`` on the files that hold CUDA tests, with the deletion check (each step
     of the stream protocol removed in turn: the tests that guard it must then fail);
  4. ``bench_raw``, 5. ``bench_jpeg``: ``gpuload bench --device cuda --augment 224`` on each memmap
     (the pinned host-to-device limit, the stock loaders, the three places to crop, nvJPEG);
  6. ``bench_jpeg_varied``: the same on a jpeg memmap of 2,000 photos at ImageNet-like sizes
     (``experiments._photos``: crops of ten real photographs), where nvJPEG meets many sizes;
call 2 (what the lease has left): the ``--device cuda`` experiments, most important first:
  ``gpu_preprocess``, ``transfer_order``, ``train_order``, ``jpeg_store``, ``train_augment``,
  ``memmap_vs_folder``, ``jpeg_quality`` (this one needs ffmpeg's qualities: it fails without ffmpeg).

Every result is stamped with the GPU's name (``*_cuda.json``, ``*_cuda.png``, ``bench_*cuda.json``), every
step's whole output is kept (``assets/results/gpu_check_logs/``), and ``assets/results/gpu_check_cuda.json``
sums up each step's outcome, time and output tail (two calls of one lease merge their steps).

``rehearse`` runs the same harness here, on the CPU, before any machine is started: the same steps in
the same order with ``--device cpu`` (the CPU tests of those files, both benches and every experiment on
small sizes), the same packing into a temporary ``OUT``, and the same size check of what a call carries
(the wheels fetched into a temporary folder). ``--short`` (CI) keeps one experiment and leaves the tests
to CI's own run. Usage::

    python -m experiments.gpu_check rehearse                   # here, no GPU: must pass first
    python -m experiments.gpu_check prepare                    # here: the wheels in .whl/, and the carry size
    # on the GPU machine (the device tool's run, carry [".whl"]), at once, then while the lease lasts:
    python3 -m experiments.gpu_check run --call 1 --wheels .whl --out "$OUT" --budget 480
    # here, before call 2: tar xzf <files_at>/gpu_check_results.tar.gz  (the results land under assets/;
    # each call gets this working tree, so call 2 finds call 1's summary and merges its steps with it)
    python3 -m experiments.gpu_check run --call 2 --wheels .whl --out "$OUT" --budget 480
    # here: tar xzf <files_at>/gpu_check_results.tar.gz
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRY_LIMIT = 64 * 2**20  # what one call to the GPU machine may carry: the working tree and the wheels
# What the GPU image lacks, with their own needs that it lacks (it has torch, torchvision, numpy,
# matplotlib, tqdm, xxhash, fsspec, pytest, hypothesis, scikit-image, cloudpickle...): gpuload's
# dependencies, TorchCodec for nvJPEG and kornia for the augmentation comparison. Not imageio-ffmpeg:
# its wheel alone is about 65 MiB (the photos' -q:v 3 copy is Pillow's there). Pillow: gpuload needs 11.2.
WHEELS = (
    "tensordict>=0.15.3",
    "pyvers>=0.2,<0.3",
    "simplejpeg>=1.8",
    "torchcodec>=0.17",
    "kornia>=0.9",
    "kornia_rs",
    "pillow>=11.2",
)
DEVICE_PYTHON = "3.12"  # the GPU image's python3 (the device tool's KINDS.md)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# The test files that hold CUDA tests (all of them: collecting every file would import the object
# storage clients the GPU image lacks).
CUDA_TEST_FILES = (
    "tests/test_loader.py",
    "tests/test_crop.py",
    "tests/test_collate.py",
    "tests/test_augment.py",
    "tests/test_normalize.py",
    "tests/test_fields.py",
    "tests/test_masks.py",
)
EXPERIMENTS = (
    "gpu_preprocess",
    "transfer_order",
    "train_order",
    "jpeg_store",
    "train_augment",
    "recipe",
    "memmap_vs_folder",
    "jpeg_quality",
)
ARCHIVE = "gpu_check_results.tar.gz"
LOGS = "gpu_check_logs"
_MARGIN_S = 15  # kept back from the budget for the last packing


@dataclass(frozen=True)
class Step:
    name: str
    call: int  # the device call it belongs to (1: the first, about 6 minutes)
    command: tuple[str, ...]
    seconds: int  # its own time limit


def data_sizes(device: str, short: bool = False) -> tuple[int, tuple[int, int], int]:
    """Photos and their size (height, width) for the benches: the experiments' 2,000 on a GPU, a few
    here; and how many of the photos at ImageNet-like sizes (:mod:`experiments._photos`)."""
    if device == "cuda":
        return 2000, (480, 640), 2000
    return (64, (60, 80), 20) if short else (200, (120, 160), 60)


def steps(python: str, device: str = "cuda", *, short: bool = False) -> list[Step]:
    """Every step of a run on ``device``, in order of importance (``short``: the rehearsal CI runs)."""
    this = (python, "-m", "experiments.gpu_check")
    short_flag = ("--short",) if short else ()
    tests = (python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "--durations=15")
    tests += ("-m", "cuda" if device == "cuda" else "not cuda")
    found = [
        Step("environment", 1, (*this, "environment", "--device", device), 90),
        Step("data", 1, (*this, "data", "--device", device, *short_flag), 180),
        Step("tests", 1, (*tests, *CUDA_TEST_FILES), 330),
        Step("bench_raw", 1, (*this, "bench", "raw", "--device", device, *short_flag), 150),
        Step("bench_jpeg", 1, (*this, "bench", "jpeg", "--device", device, *short_flag), 150),
        Step("bench_jpeg_varied", 1, (*this, "bench", "jpeg_varied", "--device", device, *short_flag), 150),
    ]
    if short:  # CI: its own run covers the tests; one experiment shows the packing of a plot
        found = [step for step in found if step.name != "tests"]
    quick = () if device == "cuda" else ("--quick",)
    experiments = EXPERIMENTS[:1] if short else EXPERIMENTS
    return found + [
        Step(name, 2, (python, "-m", f"experiments.{name}", "--device", device, *quick), 300) for name in experiments
    ]


def run_steps(
    device: str,
    budget: float,
    out: Path | None,
    *,
    call: int | None = None,
    only: list[str] | None = None,
    short: bool = False,
    dry_run: bool = False,
) -> dict:
    """Run the steps of ``call`` (or those named in ``only``; all of them without either) while ``budget``
    seconds last, packing the results into ``out`` after each; returns (and writes) the summary,
    merged with an earlier call's of the same lease (the same GPU, the same day)."""
    import torch

    if device == "cuda" and not dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_check run: torch sees no CUDA GPU here; run it on a GPU machine (the device tool)")
    started, wall = time.monotonic(), time.time()
    import gpuload

    from ._common import RESULTS

    summary = {
        "experiment": "gpu_check",
        "device": device,
        "machine": gpuload.describe_machine(),
        "gpu": torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "budget_s": budget,
        "steps": [],
    }
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if device == "cuda":
        env["GPULOAD_REQUIRE_CUDA"] = "1"  # a CUDA test that skipped would hide
    logs = RESULTS / LOGS
    chosen = [
        step
        for step in steps(sys.executable, device, short=short)
        if (only is None or step.name in only) and (call is None or only is not None or step.call == call)
    ]
    path = RESULTS / f"gpu_check_{device}.json"
    for step in chosen:
        left = budget - (time.monotonic() - started) - _MARGIN_S
        record = {"step": step.name, "call": step.call, "command": " ".join(step.command)}
        if dry_run:
            record["outcome"] = "planned"
        elif left < 20:
            record["outcome"] = "skipped: out of time"
        else:
            timeout = min(step.seconds, left)
            record.update(_run(step, timeout, env, logs))
        summary["steps"].append(record)
        print(f"gpu_check: {step.name}: {record['outcome']}" + (f" ({record['seconds']} s)" if "seconds" in record else ""),
              flush=True)  # fmt: skip
        if not dry_run:
            _write_summary(path, summary)
            if out is not None:
                pack(RESULTS.parent, out / ARCHIVE, since=wall)
    return summary


def _run(step: Step, timeout: float, env: dict, logs: Path) -> dict:
    """One step in a subprocess, its whole output written to ``logs/<name>.log``."""
    logs.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with open(logs / f"{step.name}.log", "w+") as log:
        try:
            result = subprocess.run(
                step.command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
            )
            outcome = "passed" if result.returncode == 0 else f"failed (exit {result.returncode})"
        except subprocess.TimeoutExpired:
            outcome = f"timed out after {timeout:.0f} s"
        log.seek(0)
        tail = log.read()[-4000:]
    return {"outcome": outcome, "seconds": round(time.monotonic() - began, 1), "output_tail": tail}


def _write_summary(path: Path, summary: dict) -> None:
    """Write the summary, keeping the steps of an earlier call of the same lease that this one did not run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = summary["steps"]
    earlier = json.loads(path.read_text()) if path.is_file() else None
    if earlier and (earlier.get("gpu"), earlier.get("date", "")[:10]) == (summary["gpu"], summary["date"][:10]):
        ran = {step["step"] for step in steps}
        steps = [step for step in earlier["steps"] if step["step"] not in ran] + steps
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps({**summary, "steps": steps}, indent=1) + "\n")
    os.replace(temporary, path)


def pack(assets: Path, archive: Path, *, since: float) -> None:
    """Every file under ``assets`` written since ``since`` (a time.time()) into ``archive``, named from
    the repository's root; written under a temporary name and renamed, so a kill leaves the last one whole."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.partial")
    with tarfile.open(partial, "w:gz") as tar:
        for path in sorted(assets.rglob("*")):
            if path.is_file() and path.stat().st_mtime >= since - 1 and not path.name.startswith("."):
                tar.add(path, arcname=str(Path("assets") / path.relative_to(assets)))
    os.replace(partial, archive)


def workdir() -> Path:
    """Where the photos and memmaps are made (the experiments' default, shared with them)."""
    return Path(tempfile.gettempdir()) / "gpuload-experiments"


def datasets(device: str, short: bool = False) -> dict[str, Path]:
    """The photos and their memmaps, made once: ``photos`` (the -q:v 3 copy of the experiments' photos,
    all of one size) built ``raw`` and ``jpeg``, and ``varied`` (the -q:v 3 copy of the photo set at
    ImageNet-like sizes) built ``jpeg_varied``."""
    import gpuload

    from ._common import photo_folders

    count, size, varied = data_sizes(device, short)
    work = workdir()
    work.mkdir(parents=True, exist_ok=True)
    found = {"photos": photo_folders(work, count, size)[1], "varied": photo_folders(work, varied, None)[1]}
    found["raw"], found["jpeg"] = found["photos"].with_suffix(".memmap"), found["photos"].with_suffix(".jpeg")
    found["jpeg_varied"] = found["varied"].with_suffix(".jpeg")
    for name, source, kind in (("raw", "photos", "raw"), ("jpeg", "photos", "jpeg"), ("jpeg_varied", "varied", "jpeg")):
        if not found[name].exists():
            gpuload.build_memmap(found[source], found[name], format=kind, progress=False)
    return found


def data(device: str, short: bool = False) -> None:
    """The ``data`` step: :func:`datasets`, and what the photos are, written beside the results."""
    from ._common import RESULTS
    from ._photos import describe

    made = datasets(device, short)
    described = {}
    for name, what in (("photos", describe((480, 640))), ("varied", describe(None))):
        files = sorted(made[name].rglob("*.jpg"))
        described[name] = {
            "folder": str(made[name]),
            "what": what,
            "images": len(files),
            "encoder": "Pillow (no ffmpeg on this machine)"
            if made[name].name.startswith("pillow")
            else "ffmpeg -q:v 3",
            "bytes_per_image": sum(path.stat().st_size for path in files) / max(1, len(files)),
        }
    for name in ("raw", "jpeg", "jpeg_varied"):
        described[f"{name}_bytes"] = sum(path.stat().st_size for path in made[name].rglob("*") if path.is_file())
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"gpu_check_data_{device}.json").write_text(json.dumps(described, indent=1) + "\n")
    print(json.dumps(described, indent=1))


def bench(kind: str, device: str, short: bool = False) -> None:
    """``gpuload bench --device DEVICE --augment 224`` on a memmap of :func:`datasets` (``kind``: raw,
    jpeg or jpeg_varied)."""
    from gpuload.cli import main as gpuload_main

    from ._common import RESULTS

    dataset = datasets(device, short)[kind]
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"bench_{'' if kind == 'raw' else kind + '_'}{device}.json"
    command = ["bench", str(dataset), "--device", device, "--json", str(path)]
    command += ["--augment", "224"] if device == "cuda" else ["--augment", "32", "--batch-size", "8", "--epochs", "1"]
    code = gpuload_main(command)
    if code != 0:
        raise SystemExit(f"gpuload {' '.join(command)} exited with {code}")


def environment(device: str) -> None:
    """What the machine runs: written beside the results and printed."""
    import importlib.metadata

    import torch

    import gpuload

    from ._common import RESULTS

    found = {"machine": gpuload.describe_machine(), "python": sys.version.split()[0], "packages": {}}
    for name in ("torch", "torchvision", "torchcodec", "tensordict", "simplejpeg", "numpy", "pillow", "kornia"):
        try:
            found["packages"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found["packages"][name] = None
    try:
        found["ffmpeg"] = gpuload.find_ffmpeg()
    except FileNotFoundError as error:
        found["ffmpeg"] = f"none ({error})"
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        found["gpu"] = {"name": properties.name, "memory_gib": round(properties.total_memory / 2**30, 1),
                        "multiprocessors": properties.multi_processor_count}  # fmt: skip
        from gpuload.loading.device import check_gpu_decode

        try:
            check_gpu_decode(torch.device("cuda"))
            found["gpu_decode"] = "decodes a JPEG with nvJPEG through TorchCodec"
        except gpuload.UsageError as error:
            found["gpu_decode"] = str(error)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"gpu_check_environment_{device}.json").write_text(json.dumps(found, indent=1) + "\n")
    print(json.dumps(found, indent=1))


def carried_bytes(wheels: Path | None) -> dict[str, int]:
    """What a call to the GPU machine carries: the working tree the device tool sends (tracked files and
    untracked ones git does not ignore) and the wheels, in bytes."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    tree = sum((ROOT / name.decode()).stat().st_size for name in listed if name and (ROOT / name.decode()).is_file())
    carried = sum(path.stat().st_size for path in wheels.glob("*.whl")) if wheels is not None else 0
    return {"tree": tree, "wheels": carried, "total": tree + carried}


def check_carry(wheels: Path | None) -> dict[str, int]:
    """Print what a call carries; refuse past the limit.

    Raises:
        SystemExit: the total is over ``CARRY_LIMIT``.
    """
    sizes = carried_bytes(wheels)
    print(
        f"a call to the GPU machine carries {sizes['total'] / 2**20:.1f} MiB: the working tree "
        f"{sizes['tree'] / 2**20:.1f} MiB and the wheels {sizes['wheels'] / 2**20:.1f} MiB "
        f"(limit {CARRY_LIMIT / 2**20:.0f} MiB)"
    )
    if sizes["total"] > CARRY_LIMIT:
        raise SystemExit(
            f"gpu_check: {sizes['total'] / 2**20:.1f} MiB is over the {CARRY_LIMIT / 2**20:.0f} MiB a call may carry; "
            "leave large files out of the working tree (git ignores .whl/ only through .git/info/exclude) or fewer wheels"
        )
    return sizes


def prepare(folder: Path, *, exclude: bool = True) -> dict[str, int]:
    """Download the wheels the GPU machine lacks (for its Python) into ``folder`` (ignored by git through
    ``.git/info/exclude`` when ``exclude``), then check what a call carries."""
    if exclude:
        info = ROOT / ".git" / "info" / "exclude"
        line = f"/{folder.resolve().relative_to(ROOT).as_posix()}/"
        info.parent.mkdir(parents=True, exist_ok=True)
        if not info.is_file() or line not in info.read_text().splitlines():
            with open(info, "a") as file:
                file.write(line + "\n")
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(folder)]
    command += ["--python-version", DEVICE_PYTHON, "--implementation", "cp"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run([*command, *WHEELS], check=True)
    return check_carry(folder)


def install(folder: Path) -> None:
    """On the GPU machine: the carried wheels into ``/tmp/site``, first on the path of this process and
    of the steps' subprocesses (no network there; gpuload itself runs from this checkout)."""
    target = Path("/tmp/site")
    wheels = sorted(str(path) for path in folder.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"gpu_check: no wheels in {folder}: run `python -m experiments.gpu_check prepare` here first")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade",
         "--target", str(target), *wheels],
        check=False,
    )  # fmt: skip
    if installed.returncode != 0:  # no pip in that Python: a wheel is a zip of what goes into site-packages
        import zipfile

        print("gpu_check: pip failed; unpacking the wheels into /tmp/site instead", flush=True)
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(target)
    _declare_checkout(target)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(target))


def _declare_checkout(target: Path) -> None:
    """Declare this checkout's gpuload as installed in ``target`` (its distribution metadata only: the code
    runs from the checkout), so that ``importlib.metadata.version("gpuload")`` (``gpuload.__version__``, a
    build's manifest) finds it on a machine where gpuload was never pip-installed."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    info = target / f"gpuload-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: gpuload\nVersion: {version}\n")


def rehearse(short: bool) -> dict:
    """The CPU rehearsal: ``run --device cpu`` as the GPU machine runs it (a subprocess from this
    checkout, results under a temporary ``GPULOAD_ASSETS``, packed into a temporary ``OUT``), and the
    carry check with the wheels fetched into a temporary folder.

    Raises:
        SystemExit: a step failed or is missing from the archive, or the carry is over the limit.
    """
    with tempfile.TemporaryDirectory(prefix="gpu-check-rehearsal-") as scratch:
        scratch = Path(scratch)
        prepare(scratch / "wheels", exclude=False)
        env = {**os.environ, "GPULOAD_ASSETS": str(scratch / "assets"), "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "experiments.gpu_check", "run", "--device", "cpu", "--budget", "3600"]
        command += ["--out", str(scratch / "out"), *(["--short"] if short else [])]
        subprocess.run(command, cwd=ROOT, env=env, check=False)
        summary_path = scratch / "assets" / "results" / "gpu_check_cpu.json"
        if not summary_path.is_file():
            raise SystemExit("gpu_check rehearsal: the run wrote no summary (see its output above)")
        summary = json.loads(summary_path.read_text())
        with tarfile.open(scratch / "out" / ARCHIVE) as tar:
            names = tar.getnames()
    for step in summary["steps"]:
        if step["outcome"] != "passed":
            print(f"--- {step['step']}: {step['outcome']}\n{step.get('output_tail', '')}", file=sys.stderr)
    failed = [step["step"] for step in summary["steps"] if step["outcome"] != "passed"]
    expected = [step.name for step in steps("python", "cpu", short=short)]
    missing = [name for name in expected if f"assets/results/{LOGS}/{name}.log" not in names]
    if failed or missing or [step["step"] for step in summary["steps"]] != expected:
        raise SystemExit(f"gpu_check rehearsal: failed steps {failed}, steps missing from the archive {missing}")
    print(f"gpu_check rehearsal passed: {len(summary['steps'])} steps, {len(names)} files packed")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prepare_parser = commands.add_parser(
        "prepare", help="here: fetch the wheels the GPU machine lacks, check the carry"
    )
    prepare_parser.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    rehearse_parser = commands.add_parser("rehearse", help="here, on the CPU: every step, packed, and the carry check")
    rehearse_parser.add_argument("--short", action="store_true", help="CI's form: no tests step, one experiment")
    run_parser = commands.add_parser("run", help="on the GPU machine: one call's steps, within the budget")
    run_parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    run_parser.add_argument("--call", type=int, choices=[1, 2], help="the steps of this call (default: all)")
    run_parser.add_argument("--only", nargs="+", choices=[step.name for step in steps("python")], help="these steps")
    run_parser.add_argument("--wheels", type=Path, help="install the carried wheels first")
    run_parser.add_argument("--out", type=Path, help=f"pack the results into OUT/{ARCHIVE} after each step")
    run_parser.add_argument("--budget", type=float, default=480, help="seconds for all steps (default 480)")
    run_parser.add_argument("--short", action="store_true", help="the short form (CI's rehearsal)")
    run_parser.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    for name, help_text in (("environment", "record the machine"), ("data", "make the photos and memmaps")):
        sub = commands.add_parser(name, help=f"one step: {help_text}")
        sub.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
        sub.add_argument("--short", action="store_true")
    bench_parser = commands.add_parser("bench", help="one bench step")
    bench_parser.add_argument("kind", choices=["raw", "jpeg", "jpeg_varied"])
    bench_parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    bench_parser.add_argument("--short", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.wheels)
        print(f'on the GPU machine (carry ["{args.wheels.name}"]):\n'
              f'  python3 -m experiments.gpu_check run --call 1 --wheels {args.wheels.name} --out "$OUT" --budget 480')  # fmt: skip
    elif args.command == "rehearse":
        rehearse(args.short)
    elif args.command == "environment":
        environment(args.device)
    elif args.command == "data":
        data(args.device, args.short)
    elif args.command == "bench":
        bench(args.kind, args.device, args.short)
    else:
        if args.wheels is not None and not args.dry_run:
            install(args.wheels)
        summary = run_steps(
            args.device, args.budget, args.out, call=args.call, only=args.only, short=args.short, dry_run=args.dry_run
        )
        if args.dry_run:
            for step in summary["steps"]:
                print(f"  {step['command']}")


if __name__ == "__main__":
    main()
