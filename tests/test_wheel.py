"""The installable package: a wheel built from the repository holds the library only and works without the checkout."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(out),
        str(ROOT),
    ]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
    (found,) = out.glob("gpuload-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> dict[str, str]:
    """The wheel installed alone into a folder; the environment that runs it, from outside the checkout."""
    target = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
    return {**os.environ, "PYTHONPATH": str(target)}


def run(installed, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=installed, capture_output=True, text=True, timeout=600)


def test_the_wheel_holds_the_library_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"gpuload", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    assert not any(part in name for name in names for part in ("slides", "experiments", "tests/", "snippets"))


def test_it_runs_from_outside_the_checkout(installed, tmp_path):
    code = (
        "import gpuload, pathlib; assert 'site' in gpuload.__file__, gpuload.__file__; "
        "print(len(gpuload.__all__), all(getattr(gpuload, name) is not None for name in gpuload.__all__))"
    )
    result = run(installed, "-c", code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[1] == "True"
    help_text = run(installed, "-m", "gpuload", "--help", cwd=tmp_path)
    assert help_text.returncode == 0 and "build-memmap" in help_text.stdout and "slides" not in help_text.stdout


def test_the_demo_runs_from_the_wheel(installed, tmp_path):
    result = run(
        installed, "-m", "gpuload", "demo", "--images", "10", "--workdir", str(tmp_path / "demo"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "4/5 verify: OK" in result.stdout and "5/5 read back" in result.stdout
