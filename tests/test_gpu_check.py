"""experiments/gpu_check.py, the one command a GPU lease runs first: what can be checked without a GPU."""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from experiments import gpu_check

ROOT = Path(__file__).parent.parent


def test_the_steps_cover_the_cuda_tests_both_benches_and_every_cuda_experiment():
    names = [name for name, _, _ in gpu_check.steps("python")]
    assert names[:3] == ["tests", "bench_raw", "bench_jpeg"]  # the most important first
    commands = {name: command for name, command, _ in gpu_check.steps("python")}
    assert commands["tests"][-3:] == ["-m", "cuda", "tests"]
    experiments = {path.stem for path in (ROOT / "experiments").glob("*.py")}
    cuda_experiments = {name for name in experiments if "--device" in (ROOT / "experiments" / f"{name}.py").read_text()}
    assert cuda_experiments - {"run", "_common", "gpu_check", "trace_figure"} <= set(
        names
    )  # train_order draws its trace
    assert all(
        command[-2:] == ["--device", "cuda"] for name, command in commands.items() if name in gpu_check.EXPERIMENTS
    )
    assert sum(seconds for _, _, seconds in gpu_check.steps("python")[:3]) <= 540  # one device call of 10 minutes


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


def test_the_archive_holds_only_gpu_results(tmp_path):
    assets = tmp_path / "assets"
    (assets / "results").mkdir(parents=True)
    for name in ("results/jpeg_store_cuda.json", "results/bench_cuda.json", "results/gpu_check_cuda.json",
                 "jpeg_store_cuda.png", "results/jpeg_store.json", "jpeg_store.png"):  # fmt: skip
        (assets / name).write_text("{}")
    gpu_check.pack(assets, tmp_path / "out" / "gpu_check_results.tar.gz")
    with tarfile.open(tmp_path / "out" / "gpu_check_results.tar.gz") as tar:
        names = sorted(tar.getnames())
    assert names == [
        "assets/jpeg_store_cuda.png",
        "assets/results/bench_cuda.json",
        "assets/results/gpu_check_cuda.json",
        "assets/results/jpeg_store_cuda.json",
    ]


@pytest.mark.parametrize("earlier", [True, False])
def test_two_calls_of_one_lease_merge_their_steps(tmp_path, monkeypatch, earlier):
    import experiments._common

    monkeypatch.setattr(experiments._common, "RESULTS", tmp_path)
    monkeypatch.setattr(
        gpu_check,
        "steps",
        lambda python: [("a", [python, "-c", "pass"], 60), ("b", [python, "-c", "raise SystemExit(3)"], 60)],
    )
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda: "a test GPU")
    if earlier:  # an earlier call of the same lease; one of another GPU is not merged
        today = __import__("time").strftime("%Y-%m-%dT%H:%M:%S%z")
        steps = [{"step": "b", "outcome": "passed"}]
        (tmp_path / "gpu_check_cuda.json").write_text(json.dumps({"gpu": "a test GPU", "date": today, "steps": steps}))
    gpu_check.run_steps(60, None, only=["a"])
    summary = json.loads((tmp_path / "gpu_check_cuda.json").read_text())
    assert [(step["step"], step["outcome"]) for step in summary["steps"]] == [("b", "passed")] * earlier + [
        ("a", "passed")
    ]
    gpu_check.run_steps(60, None, only=["b"])
    summary = json.loads((tmp_path / "gpu_check_cuda.json").read_text())
    assert {step["step"]: step["outcome"] for step in summary["steps"]} == {"a": "passed", "b": "failed (exit 3)"}
    assert summary["gpu"] == "a test GPU" and summary["machine"]["cores"] >= 1  # what the talk reads


def test_an_earlier_summary_of_another_gpu_is_not_merged(tmp_path, monkeypatch):
    import experiments._common

    monkeypatch.setattr(experiments._common, "RESULTS", tmp_path)
    monkeypatch.setattr(gpu_check, "steps", lambda python: [("a", [python, "-c", "pass"], 60)])
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda: "this GPU")
    old = {"gpu": "another GPU", "date": "2026-01-01T00:00:00", "steps": [{"step": "b", "outcome": "passed"}]}
    (tmp_path / "gpu_check_cuda.json").write_text(json.dumps(old))
    gpu_check.run_steps(60, None)
    assert [step["step"] for step in json.loads((tmp_path / "gpu_check_cuda.json").read_text())["steps"]] == ["a"]
