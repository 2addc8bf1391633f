"""Re-encode a folder of photos as smaller JPEGs with a real ffmpeg, in parallel and resumable."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image
from tqdm.auto import tqdm

from .decode import exif_orientation
from ..machine import default_workers
from .scan import IMG_EXTENSIONS

__all__ = ["CompressReport", "compress_folder", "find_ffmpeg"]

_JPEG_SUFFIXES = (".jpg", ".jpeg")
# ffmpeg filters that undo each EXIF orientation (2..8), since ffmpeg's own autorotation varies by version
_ORIENTATION_FILTERS = {
    2: "hflip",
    3: "hflip,vflip",
    4: "vflip",
    5: "transpose=0",
    6: "transpose=1",
    7: "transpose=3",
    8: "transpose=2",
}


@dataclass
class CompressReport:
    """What :func:`compress_folder` did.

    Attributes:
        done: files encoded by this run.
        skipped: files whose output already existed (a rerun resumes).
        failed: ``(source path, ffmpeg's error line)`` per file that could not be encoded.
        bytes_before: total size of the sources of the ``done`` and ``skipped`` files.
        bytes_after: total size of their outputs.
        seconds: wall time of the run.
    """

    done: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        """One line for a human, e.g. ``"2000 done, 0 skipped, 0 failed: 353.2 MB -> 86.1 MB (4.1x smaller) in 25.3 s"``."""
        ratio = f" ({self.bytes_before / self.bytes_after:.1f}x smaller)" if self.bytes_after else ""
        return (
            f"{self.done} done, {self.skipped} skipped, {len(self.failed)} failed: "
            f"{self.bytes_before / 1e6:.1f} MB -> {self.bytes_after / 1e6:.1f} MB{ratio} in {self.seconds:.1f} s"
        )


def find_ffmpeg() -> str:
    """The ffmpeg to run: the binary that the ``imageio-ffmpeg`` wheel ships (or the one
    ``IMAGEIO_FFMPEG_EXE`` names), else ``ffmpeg`` on ``PATH``.

    Raises:
        FileNotFoundError: no ffmpeg anywhere, with how to get one.
    """
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError):
        found = shutil.which("ffmpeg")
        if found:
            return found
    raise FileNotFoundError(
        "no ffmpeg found: pip install imageio-ffmpeg (it ships one), or install ffmpeg (apt-get install ffmpeg)"
    )


def compress_folder(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    quality: int = 3,
    workers: int | None = None,
    strict: bool = False,
    progress: bool = True,
    ffmpeg: str | None = None,
) -> CompressReport:
    """Re-encode every image under ``src`` into ``dst`` with ffmpeg's JPEG encoder at ``-q:v quality``.

    The folder tree is mirrored; outputs are JPEGs (a ``.png`` becomes ``.jpg``), upright
    (EXIF orientation applied) and without metadata. Each output is written under a
    temporary name and renamed when complete, and outputs that already exist are
    skipped, so an interrupted run resumes where it stopped. A file ffmpeg cannot
    read is reported with ffmpeg's error line and does not stop the run.

    Args:
        src: the folder of photos.
        dst: the folder to write; created if needed.
        quality: ffmpeg's ``-q:v``, 1 (best) to 31 (smallest). 3 keeps photos visually intact.
        workers: ffmpeg processes run at once; defaults to the number of cores.
        strict: raise ``RuntimeError`` after the run if any file failed.
        progress: show a progress bar.
        ffmpeg: the ffmpeg binary; defaults to :func:`find_ffmpeg`.

    Raises:
        FileNotFoundError: ``src`` is missing or holds no image, or no ffmpeg is found.
        ValueError: bad arguments, or ``dst`` inside ``src``.
        RuntimeError: with ``strict``, some files failed.
    """
    started = time.perf_counter()
    src = Path(src).expanduser().absolute()
    dst = Path(dst).expanduser().absolute()
    if not isinstance(quality, int) or not 1 <= quality <= 31:
        raise ValueError(f"quality must be an integer from 1 (best) to 31 (smallest), got {quality!r}")
    workers = default_workers() if workers is None else workers
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if not src.is_dir():
        raise FileNotFoundError(f"{src} is not a folder; pass the folder of photos to compress")
    if dst.is_relative_to(src):
        raise ValueError(f"dst ({dst}) must not be inside src ({src})")
    ffmpeg = ffmpeg or find_ffmpeg()
    jobs = _plan(src, dst)
    report = CompressReport()
    todo = []
    for source, target, problem in jobs:
        if problem:
            report.failed.append((str(source), problem))
        elif target.exists():
            report.skipped += 1
            report.bytes_before += source.stat().st_size
            report.bytes_after += target.stat().st_size
        else:
            todo.append((source, target))

    with (
        ThreadPoolExecutor(workers, thread_name_prefix="gpuload-ffmpeg") as pool,
        tqdm(total=len(todo), unit="file", desc="compress", disable=not progress, file=sys.stderr) as bar,
    ):
        futures = [(source, target, pool.submit(_encode, ffmpeg, source, target, quality)) for source, target in todo]
        try:
            for source, target, future in futures:
                error = future.result()
                if error:
                    report.failed.append((str(source), error))
                    bar.set_postfix(failed=len(report.failed), refresh=False)
                else:
                    report.done += 1
                    report.bytes_before += source.stat().st_size
                    report.bytes_after += target.stat().st_size
                bar.update()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    report.seconds = time.perf_counter() - started
    if strict and report.failed:
        path, error = report.failed[0]
        raise RuntimeError(f"{len(report.failed)} files failed to compress; first: {path}: {error}")
    return report


def _plan(src: Path, dst: Path) -> list[tuple[Path, Path, str]]:
    """``(source, target, problem)`` for every image under ``src``, in sorted order."""
    sources = sorted(
        Path(root) / name
        for root, _, names in os.walk(src, followlinks=True)
        for name in names
        if name.lower().endswith(IMG_EXTENSIONS)
    )
    if not sources:
        raise FileNotFoundError(f"{src} holds no image; supported extensions are: {', '.join(IMG_EXTENSIONS)}")
    jobs, claimed = [], {}
    for source in sources:
        relative = source.relative_to(src)
        if relative.suffix.lower() not in _JPEG_SUFFIXES:
            relative = relative.with_suffix(".jpg")
        target = dst / relative
        if target in claimed:
            jobs.append((source, target, f"its output {target.name} is also the output of {claimed[target].name}"))
        else:
            claimed[target] = source
            jobs.append((source, target, ""))
    return jobs


def _encode(ffmpeg: str, source: Path, target: Path, quality: int) -> str:
    """Encode one file; returns ``""`` on success, else the error line."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    orientation = _filter_args(source)
    command = [
        ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-y", "-threads", "1", "-noautorotate",
        "-i", str(source), *orientation, "-frames:v", "1", "-qmin", "1", "-q:v", str(quality),
        "-threads", "1", "-f", "image2", "-c:v", "mjpeg", "-update", "1", str(partial),
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=300)
        if result.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            return lines[-1].strip() if lines else f"ffmpeg exited with code {result.returncode}"
        os.replace(partial, target)
        return ""
    except subprocess.TimeoutExpired:
        return "ffmpeg took more than 300 s"
    finally:
        partial.unlink(missing_ok=True)


def _filter_args(source: Path) -> list[str]:
    try:
        with Image.open(source) as image:
            orientation = exif_orientation(image)
    except Exception:  # let ffmpeg read (or reject) what Pillow cannot
        return []
    return ["-vf", _ORIENTATION_FILTERS[orientation]] if orientation in _ORIENTATION_FILTERS else []
