"""experiments/gpu_check.py, what a GPU lease runs first: its plan, packing and carry, checked without a GPU."""

import json
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from experiments import _common, gpu_check

ROOT = Path(__file__).parent.parent


def test_the_first_call_brings_the_cuda_tests_and_both_benches_in_about_six_minutes():
    first = [step for step in gpu_check.steps("python") if step.call == 1]
    assert [step.name for step in first] == [
        "environment",
        "data",
        "tests",
        "bench_raw",
        "bench_jpeg",
        "bench_jpeg_varied",
    ]
    tests = next(step for step in first if step.name == "tests")
    assert tests.command[-len(gpu_check.CUDA_TEST_FILES) - 2 :] == ("-m", "cuda", *gpu_check.CUDA_TEST_FILES)
    assert sum(step.seconds for step in first) <= 1200  # the limits; what they take is about 6 minutes


def test_every_file_with_a_cuda_test_is_run_and_every_cuda_experiment_planned():
    marked = re.compile(r"^\s*@pytest\.mark\.cuda|marks=pytest\.mark\.cuda", re.M)
    with_cuda_tests = {
        f"tests/{path.name}" for path in (ROOT / "tests").glob("test_*.py") if marked.search(path.read_text())
    }
    assert with_cuda_tests == set(gpu_check.CUDA_TEST_FILES)
    experiments = {path.stem for path in (ROOT / "experiments").glob("*.py")}
    cuda_experiments = {
        name for name in experiments if "add_device_argument" in (ROOT / "experiments" / f"{name}.py").read_text()
    }
    second = {step.name: step for step in gpu_check.steps("python") if step.call == 2}
    assert cuda_experiments - {"_common", "run", "remote_loading", "remote_reads"} <= set(
        second
    )  # object storage: no GPU
    assert all(step.command[-2:] == ("--device", "cuda") for step in second.values())


def test_the_rehearsal_runs_the_same_steps_in_the_same_order_on_the_cpu():
    on_gpu, on_cpu = gpu_check.steps("python", "cuda"), gpu_check.steps("python", "cpu")
    assert [step.name for step in on_cpu] == [step.name for step in on_gpu]
    assert all("cuda" not in " ".join(step.command).replace("not cuda", "") for step in on_cpu)
    short = [step.name for step in gpu_check.steps("python", "cpu", short=True)]
    assert short == ["environment", "data", "bench_raw", "bench_jpeg", "bench_jpeg_varied", gpu_check.EXPERIMENTS[0]]


def test_without_a_gpu_it_says_so_and_runs_nothing(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "experiments.gpu_check", "run", "--only", "tests", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1 and "torch sees no CUDA GPU here" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_cuda_tests_cannot_skip_quietly_where_a_gpu_is_required():
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "tests/test_normalize.py"],
        cwd=ROOT,
        env={**__import__("os").environ, "GPULOAD_REQUIRE_CUDA": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        result.returncode != 0
        and "GPULOAD_REQUIRE_CUDA is set and torch sees no CUDA GPU" in result.stdout + result.stderr
    )


@pytest.fixture
def fake_steps(tmp_path, monkeypatch):
    """Results under tmp_path/assets, and three steps: one writes a result, one fails, one outlasts its limit."""
    monkeypatch.setattr(_common, "RESULTS", tmp_path / "assets" / "results")
    monkeypatch.setattr(gpu_check, "_MARGIN_S", 0)
    result = tmp_path / "assets" / "results" / "a_cuda.json"
    made = gpu_check.Step(
        "a", 1, (sys.executable, "-c", f"open({str(result)!r}, 'w').write('{{}}'); print('made')"), 60
    )
    failing = gpu_check.Step("b", 1, (sys.executable, "-c", "raise SystemExit(3)"), 60)
    slow = gpu_check.Step("c", 2, (sys.executable, "-c", "import time; time.sleep(30)"), 2)
    monkeypatch.setattr(gpu_check, "steps", lambda python, device="cuda", short=False: [made, failing, slow])
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda: "a test GPU")
    return tmp_path


def archived(path: Path) -> list[str]:
    with tarfile.open(path) as tar:
        return sorted(tar.getnames())


def test_results_are_packed_after_every_step_and_a_step_past_its_limit_is_cut(fake_steps, monkeypatch):
    packs = []
    real = gpu_check.pack
    monkeypatch.setattr(gpu_check, "pack", lambda *args, **kwargs: (real(*args, **kwargs), packs.append(1)))
    summary = gpu_check.run_steps("cuda", 60, fake_steps / "out")
    assert [(step["step"], step["outcome"]) for step in summary["steps"]] == [
        ("a", "passed"),
        ("b", "failed (exit 3)"),
        ("c", "timed out after 2 s"),
    ]
    assert len(packs) == 3  # a call killed during step c brings back a and b
    assert archived(fake_steps / "out" / gpu_check.ARCHIVE) == [
        "assets/results/a_cuda.json",
        "assets/results/gpu_check_cuda.json",
        "assets/results/gpu_check_logs/a.log",
        "assets/results/gpu_check_logs/b.log",
        "assets/results/gpu_check_logs/c.log",
    ]
    assert (fake_steps / "assets" / "results" / "gpu_check_logs" / "a.log").read_text() == "made\n"


def test_what_was_there_before_the_run_is_not_packed(fake_steps):
    old = fake_steps / "assets" / "results" / "old_cuda.json"
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    earlier = time.time() - 3600
    __import__("os").utime(old, (earlier, earlier))
    gpu_check.run_steps("cuda", 60, fake_steps / "out", only=["a"])
    assert "assets/results/old_cuda.json" not in archived(fake_steps / "out" / gpu_check.ARCHIVE)


def test_a_call_runs_its_own_steps_and_stops_when_the_budget_runs_out(fake_steps):
    summary = gpu_check.run_steps("cuda", 60, None, call=2)
    assert [step["step"] for step in summary["steps"]] == ["c"]
    summary = gpu_check.run_steps("cuda", 10, None, call=1)  # 10 s: under the 20 s a step needs
    assert {step["outcome"] for step in summary["steps"]} == {"skipped: out of time"}


def test_two_calls_of_one_lease_merge_their_steps(fake_steps):
    gpu_check.run_steps("cuda", 60, None, only=["b"])
    gpu_check.run_steps("cuda", 60, None, only=["a"])
    summary = json.loads((fake_steps / "assets" / "results" / "gpu_check_cuda.json").read_text())
    assert {step["step"]: step["outcome"] for step in summary["steps"]} == {"a": "passed", "b": "failed (exit 3)"}
    assert summary["gpu"] == "a test GPU" and summary["machine"]["cores"] >= 1  # what the talk reads


def test_an_earlier_summary_of_another_gpu_is_not_merged(fake_steps):
    old = {"gpu": "another GPU", "date": "2026-01-01T00:00:00", "steps": [{"step": "b", "outcome": "passed"}]}
    path = fake_steps / "assets" / "results" / "gpu_check_cuda.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old))
    gpu_check.run_steps("cuda", 60, None, only=["a"])
    assert [step["step"] for step in json.loads(path.read_text())["steps"]] == ["a"]


def test_the_carry_is_counted_and_refused_past_the_limit(tmp_path, monkeypatch, capsys):
    (tmp_path / "a.whl").write_bytes(bytes(3 * 2**20))
    sizes = gpu_check.check_carry(tmp_path)
    assert sizes["wheels"] == 3 * 2**20 and sizes["tree"] > 2**20 and sizes["total"] == sizes["tree"] + sizes["wheels"]
    assert "a call to the GPU machine carries" in capsys.readouterr().out
    monkeypatch.setattr(gpu_check, "CARRY_LIMIT", sizes["total"] - 1)
    with pytest.raises(SystemExit, match="over the 4 MiB a call may carry|over the .* MiB a call may carry"):
        gpu_check.check_carry(tmp_path)


def test_the_wheels_leave_out_ffmpeg():
    assert not any("ffmpeg" in wheel for wheel in gpu_check.WHEELS)


def test_without_ffmpeg_the_photos_copy_is_pillows_with_restart_markers(tmp_path, monkeypatch):
    import gpuload
    from gpuload.writing.jpeg import frame_size

    def no_ffmpeg():
        raise FileNotFoundError("no ffmpeg found: ...")

    monkeypatch.setattr(gpuload, "find_ffmpeg", no_ffmpeg)
    originals, copy = _common.photo_folders(tmp_path, 10, (48, 64))
    assert copy.name == "pillow-q3-10-64x48"
    sources = sorted(path.relative_to(originals) for path in originals.rglob("*.jpg"))
    assert sorted(path.relative_to(copy) for path in copy.rglob("*.jpg")) == sources
    data = (copy / sources[0]).read_bytes()
    assert frame_size(data) == (48, 64) and b"\xff\xdd" in data  # DRI: restart markers, as compress writes
    assert _common.photo_folders(tmp_path, 10, (48, 64)) == (originals, copy)  # made once
    with pytest.raises(FileNotFoundError, match="no ffmpeg found"):
        _common.photo_folders(tmp_path, 10, (48, 64), quality=10)  # no Pillow match for it


@pytest.mark.parametrize("size", [(480, 640), None])  # the experiments' photos, and the set at ImageNet-like sizes
def test_pillows_copy_matches_ffmpegs_psnr_and_bytes(tmp_path, monkeypatch, size):
    import numpy as np
    from PIL import Image

    import gpuload

    originals, ffmpeg = _common.photo_folders(tmp_path, 20, size)

    def no_ffmpeg():
        raise FileNotFoundError("no ffmpeg found: ...")

    monkeypatch.setattr(gpuload, "find_ffmpeg", no_ffmpeg)
    _, pillow = _common.photo_folders(tmp_path, 20, size)

    def psnr(path: Path, copy: Path) -> float:
        with Image.open(path) as a, Image.open(copy) as b:
            error = np.mean(
                (np.asarray(a.convert("RGB"), dtype=float) - np.asarray(b.convert("RGB"), dtype=float)) ** 2
            )
        return 10 * np.log10(255**2 / error)

    files = sorted(path.relative_to(originals) for path in originals.rglob("*.jpg"))
    ours = np.mean([psnr(originals / name, pillow / name) for name in files])
    theirs = np.mean([psnr(originals / name, ffmpeg / name) for name in files])
    more = sum((pillow / name).stat().st_size for name in files) / sum((ffmpeg / name).stat().st_size for name in files)
    assert abs(ours - theirs) <= 0.5 and 0.9 <= more <= 1.2, (ours, theirs, more)


def test_the_checkout_is_declared_installed_where_gpuload_never_was(tmp_path):
    """The GPU machine runs gpuload from the checkout, never pip-installed: ``import gpuload`` read its
    version from the distribution's metadata and failed there (the lease's first call, PackageNotFoundError)."""
    import tomllib

    from experiments.gpu_check import ROOT, _declare_checkout

    _declare_checkout(tmp_path / "site")
    code = "import importlib.metadata as m, sys; sys.path.insert(0, sys.argv[1]); print(m.version('gpuload'))"
    found = subprocess.run(  # no site, and not run in the checkout (its gpuload.egg-info of a local install)
        [sys.executable, "-S", "-c", code, str(tmp_path / "site")], capture_output=True, text=True, cwd=tmp_path
    )
    assert found.stdout.strip() == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
