"""Re-encode a folder of photos as smaller JPEGs with a real ffmpeg, in parallel, resumable and crash-safe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import simplejpeg
from tqdm.auto import tqdm

from ..errors import CompressError, DecodeError, UsageError
from ..format.manifest import dataset_around
from ..machine import resolve_workers
from ..sources.folder import IMG_EXTENSIONS, walk_images
from ..text import byte_size, count
from .decode import check_image, read_bytes, upright_pixels
from .files import (
    OutputLock,
    byte_count,
    check_apart,
    check_not_written,
    fsync_folder,
    full_disk_says,
    no_room,
    resolve,
)
from .jpeg import arithmetic_coded

__all__ = ["JOURNAL_NAME", "CompressReport", "compress_folder", "find_ffmpeg"]

JOURNAL_NAME = ".gpuload-compress.jsonl"  # in DST: one line per output this tool finished
_PARTIAL = ".gpuload-tmp"  # suffix of the hidden temporary file beside each output being written
_JPEG_SUFFIXES = (".jpg", ".jpeg")
_RECORD_KEYS = {"target", "source_size", "source_mtime_ns", "quality", "restart_markers", "size"}
# Records written before compress asked for restart markers: still this tool's outputs, redone.
_RECORD_KEYS_BEFORE_RESTARTS = _RECORD_KEYS - {"restart_markers"}
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
        failed: ``(source path, why)`` per file that could not be encoded: the strict decoder's reason, ffmpeg's error line, or a check of ffmpeg's output.
        bytes_before: total size of the sources of the ``done`` and ``skipped`` files.
        bytes_after: total size of their outputs.
        seconds: wall time of the run.
        renamed: of the ``done`` and ``skipped`` files, those whose source is not a JPEG (PNG, TIFF,
            WebP...): their output is a JPEG under the ``.jpg`` suffix (``photo.png`` -> ``photo.jpg``).
    """

    done: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0
    seconds: float = 0.0
    renamed: int = 0

    def summary(self) -> str:
        """One line for a human.

        Example:
            >>> CompressReport(done=2000, bytes_before=353_200_000, bytes_after=86_100_000, seconds=25.3, renamed=1).summary()
            '2000 done, 0 skipped, 0 failed: 353 MB -> 86.1 MB (4.1x smaller) in 25.3 s; 1 PNG or other non-JPEG source written as .jpg'
        """
        ratio = f" ({self.bytes_before / self.bytes_after:.1f}x smaller)" if self.bytes_after else ""
        renamed = ""
        if self.renamed:
            renamed = f"; {count(self.renamed, 'PNG or other non-JPEG source', 'PNG or other non-JPEG sources')} written as .jpg"
        return (
            f"{self.done} done, {self.skipped} skipped, {len(self.failed)} failed: "
            f"{byte_size(self.bytes_before)} -> {byte_size(self.bytes_after)}{ratio} in {self.seconds:.1f} s{renamed}"
        )


def find_ffmpeg() -> str:
    """The ffmpeg to run: the binary that the ``imageio-ffmpeg`` wheel ships (or the one
    ``IMAGEIO_FFMPEG_EXE`` names), else ``ffmpeg`` on ``PATH``.

    Raises:
        FileNotFoundError: no ffmpeg anywhere, with how to get one, or one named by
            ``IMAGEIO_FFMPEG_EXE`` that is not an executable file.
    """
    try:
        import imageio_ffmpeg

        found = imageio_ffmpeg.get_ffmpeg_exe()
        if not (os.path.isfile(found) and os.access(found, os.X_OK)):  # the variable is taken as it is
            raise FileNotFoundError(
                f"{found} is not an executable ffmpeg (IMAGEIO_FFMPEG_EXE={os.environ.get('IMAGEIO_FFMPEG_EXE')!r}); "
                "point IMAGEIO_FFMPEG_EXE at an ffmpeg, or unset it to use the one imageio-ffmpeg ships"
            )
        return found
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

    The folder tree is mirrored; outputs are JPEGs (a PNG, TIFF, WebP... source is written under the
    ``.jpg`` suffix: ``photo.png`` becomes ``photo.jpg``, counted in the report's ``renamed``), upright
    (EXIF orientation applied), without metadata, and with a restart marker at every MCU row (a few
    bytes per row, +4.5 % on 640x480 photos at ``-q:v 3``, for the same pixels), so that the training crops of a jpeg dataset built from them
    decode only the rows of their box. Every source is first decoded once by
    gpuload's strict decoder, so a damaged file (truncated, corrupt data) is reported, never
    re-encoded with grey blocks that ffmpeg would pass on without a word.

    Crash-safe and resumable: a lock beside ``dst`` keeps a second run out; ffmpeg writes to a pipe
    and each output is written under a hidden temporary name, flushed to disk, recorded in
    ``dst/.gpuload-compress.jsonl`` and renamed into place. A rerun skips the outputs that record
    says are finished (same source size, modification time and quality), redoes everything else,
    and removes the temporary files of a killed run. A file at an output's path that this tool did
    not write is never replaced: that source fails with a message saying so.

    Args:
        src: the folder of photos.
        dst: the folder to write; created if needed. It must not be ``src``, lie inside it, or contain it.
        quality: ffmpeg's ``-q:v``, 1 (best) to 31 (smallest). 3 keeps photos visually intact.
        workers: ffmpeg processes run at once; defaults to the number of cores.
        strict: stop at the first file that fails, raising :class:`gpuload.CompressError`.
        progress: show a progress bar.
        ffmpeg: the ffmpeg binary; defaults to :func:`find_ffmpeg`.

    Raises:
        FileNotFoundError: ``src`` is missing or holds no image, or no ffmpeg is found.
        UsageError: bad arguments, or ``dst`` overlapping ``src``.
        BusyError: another run writes ``dst``.
        CompressError: with ``strict``, the first file that failed.
        OSError: a write failed, e.g. the disk is full: the run stops, what finished is kept.
    """
    started = time.perf_counter()
    src, dst = resolve(src), resolve(dst)
    if not isinstance(quality, int) or isinstance(quality, bool) or not 1 <= quality <= 31:
        raise UsageError(f"quality must be an integer from 1 (best) to 31 (smallest), got {quality!r}")
    workers = resolve_workers(workers)
    if not src.is_dir():
        raise FileNotFoundError(f"{src} is not a folder; pass the folder of photos to compress")
    check_apart(src, dst, source_name="SRC", output_name="DST")
    check_not_written(src)  # another compress still filling src
    dataset = dataset_around(dst)
    if dataset is not None:
        where = "is" if dataset == dst else f"lies inside {dataset},"
        raise UsageError(f"DST {dst} {where} a gpuload dataset; choose another DST, outside any dataset")
    ffmpeg = ffmpeg or find_ffmpeg()
    jobs = _plan(src, dst)
    report = CompressReport()
    with OutputLock(dst):
        dst.mkdir(parents=True, exist_ok=True)
        _remove_partials(dst)
        journal = _Journal(dst)
        todo = []
        for source, target, problem in jobs:
            problem = problem or journal.conflict(target)
            if problem:
                _fail(report, source, problem, strict)
            elif journal.finished(source, target, quality):
                report.skipped += 1
                report.bytes_before += source.stat().st_size
                report.bytes_after += target.stat().st_size
                report.renamed += _renamed(source)
            else:
                todo.append((source, target))
        with (
            ThreadPoolExecutor(workers, thread_name_prefix="gpuload-ffmpeg") as pool,
            tqdm(total=len(todo), unit="file", desc="compress", disable=not progress, file=sys.stderr) as bar,
        ):
            futures = [
                (source, target, pool.submit(_encode, ffmpeg, source, target, quality, journal))
                for source, target in todo
            ]
            try:
                for source, target, future in futures:
                    error = future.result()
                    if error:
                        _fail(report, source, error, strict)
                        bar.set_postfix(failed=len(report.failed), refresh=False)
                    else:
                        report.done += 1
                        report.bytes_before += source.stat().st_size
                        report.bytes_after += target.stat().st_size
                        report.renamed += _renamed(source)
                    bar.update()
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    report.seconds = time.perf_counter() - started
    return report


def _fail(report: CompressReport, source: Path, reason: str, strict: bool) -> None:
    if strict:
        raise CompressError(source, reason)
    report.failed.append((str(source), reason))


def _renamed(source: Path) -> bool:
    """Whether ``source`` is not a JPEG by name: its output, a JPEG, gets the ``.jpg`` suffix."""
    return source.suffix.lower() not in _JPEG_SUFFIXES


def _plan(src: Path, dst: Path) -> list[tuple[Path, Path, str]]:
    """``(source, target, problem)`` for every image under ``src``, in sorted order."""
    names, _ = walk_images(src, exclude=dst)  # a link in SRC to DST would compress its own outputs again
    if not names:
        raise FileNotFoundError(f"{src} holds no image; supported extensions are: {', '.join(IMG_EXTENSIONS)}")
    jobs, claimed = [], {}
    for name in sorted(names):
        source, relative = src / name, Path(name)
        if _renamed(relative):
            relative = relative.with_suffix(".jpg")
        target = dst / relative
        if target in claimed:
            jobs.append((source, target, f"its output {target} is also the output of {claimed[target]}"))
        else:
            claimed[target] = source
            jobs.append((source, target, ""))
    return jobs


def _remove_partials(dst: Path) -> None:
    """Remove the temporary files that a killed run left (we hold the lock: no run is writing them)."""
    for folder, _, names in os.walk(dst):
        for name in names:
            if name.startswith(".") and name.endswith(_PARTIAL):
                os.unlink(os.path.join(folder, name))


class _Journal:
    """``dst/.gpuload-compress.jsonl``: the outputs this tool wrote, one JSON line each, flushed to disk.

    A line is written after its output's bytes are on disk and before the rename that makes the
    output visible, so an output with a line is this tool's, and finished when its size matches.
    """

    def __init__(self, dst: Path) -> None:
        self.dst = dst
        self.path = dst / JOURNAL_NAME
        self.records: dict[str, dict] = {}
        if self.path.exists():
            text = self.path.read_text(encoding="utf-8", errors="replace")
            if text and not text.endswith("\n"):  # a last line torn by a crash: end it, so the next is whole
                with open(self.path, "a", encoding="utf-8") as file:
                    file.write("\n")
                    file.flush()
                    os.fsync(file.fileno())
            for line in text.splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line torn by a crash
                    continue
                if isinstance(record, dict) and set(record) in (_RECORD_KEYS, _RECORD_KEYS_BEFORE_RESTARTS):
                    self.records[record["target"]] = record
        self._lock = threading.Lock()

    def conflict(self, target: Path) -> str:
        """Why ``target`` may not be written: a file there that this tool did not write."""
        if os.path.lexists(target) and self._key(target) not in self.records:
            return (
                f"{target} exists and was not written by gpuload compress (it is not in {self.path.name}); "
                f"move it away or choose another DST"
            )
        return ""

    def finished(self, source: Path, target: Path, quality: int) -> bool:
        """Whether ``target`` is this tool's finished output of ``source`` as it is now, at ``quality``."""
        record = self.records.get(self._key(target))
        if record is None or not target.is_file():
            return False
        return record == self._record(source, target, quality, target.stat().st_size)

    def add(self, source: Path, target: Path, quality: int, size: int) -> None:
        record = self._record(source, target, quality, size)
        with self._lock:
            with open(self.path, "a", encoding="utf-8") as file:
                file.write(json.dumps(record, separators=(",", ":")) + "\n")
                file.flush()
                os.fsync(file.fileno())
            self.records[record["target"]] = record

    def _key(self, target: Path) -> str:
        return target.relative_to(self.dst).as_posix()

    def _record(self, source: Path, target: Path, quality: int, size: int | None) -> dict:
        stat = source.stat()
        return {
            "target": self._key(target),
            "source_size": stat.st_size,
            "source_mtime_ns": stat.st_mtime_ns,
            "quality": quality,
            "restart_markers": True,  # asked for; ffmpeg cannot write them into images 16 px wide
            "size": size,
        }


def _encode(ffmpeg: str, source: Path, target: Path, quality: int, journal: _Journal) -> str:
    """Encode one file; returns ``""`` on success, else why it failed. Errors writing the output raise.

    A JPEG goes to ffmpeg as it is (its orientation applied by a filter); any other format, and an
    arithmetic-coded JPEG (which ffmpeg cannot read), as the pixels Pillow decodes, upright, as
    ``build-memmap`` reads them (ffmpeg's own TIFF decoder turns a JPEG-compressed TIFF black
    without an error).
    """
    try:
        data = read_bytes(source)  # once: what is checked is what ffmpeg encodes
        if data[:2] == b"\xff\xd8" and not arithmetic_coded(data):
            orientation, size = check_image(source, data)
            pixels = None
        else:
            pixels = upright_pixels(source, data)
            size = pixels.shape[:2]
    except DecodeError as error:
        return error.reason
    if pixels is None:
        rotate = ["-vf", _ORIENTATION_FILTERS[orientation]] if orientation in _ORIENTATION_FILTERS else []
        encoded, written, error = _ffmpeg_jpeg(ffmpeg, ["-frame_size", str(len(data))], data, rotate, quality)
    else:
        height, width = size
        raw = ["-f", "rawvideo", "-pix_fmt", "rgb24", "-video_size", f"{width}x{height}"]
        encoded, written, error = _ffmpeg_jpeg(ffmpeg, raw, memoryview(pixels).cast("B"), [], quality)
    if error:
        return error
    if written is None:
        return "ffmpeg wrote a JPEG that libjpeg-turbo reports as corrupt"
    if written != size:
        return f"ffmpeg wrote a {written[1]}x{written[0]} JPEG for this {size[1]}x{size[0]} image"
    partial = target.with_name(f".{target.name}{_PARTIAL}")
    try:
        with full_disk_says(
            lambda: no_room(
                target.parent,
                f"to write {target}",
                "there and run again (what is finished is kept), or choose another DST",
                needed=byte_count(len(encoded)),
            )
        ):
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb") as file:
                file.write(encoded)
                file.flush()
                os.fsync(file.fileno())
            journal.add(source, target, quality, len(encoded))
            os.replace(partial, target)
            fsync_folder(target.parent)
    finally:
        if os.path.lexists(partial):
            os.unlink(partial)
    return ""


def _ffmpeg_jpeg(
    ffmpeg: str, source: list[str], data: bytes | memoryview, filters: list[str], quality: int
) -> tuple[bytes, tuple[int, int] | None, str]:
    """ffmpeg's JPEG of ``data`` read as ``source`` says (filtered by ``filters``), its decoded
    ``(height, width)`` (``None``: it does not decode cleanly) and ``""``; or ``b""``, ``None``
    and why ffmpeg failed."""
    # The bytes go on stdin (a file's: its format found from them, read as one packet with
    # ``-frame_size``; or raw pixels): given a file name, ffmpeg would read ``img%d.jpg`` as the
    # numbered sequence img1.jpg, img2.jpg...
    command = [
        ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-threads", "1", "-noautorotate",
        *source, "-i", "pipe:0", *filters, "-frames:v", "1", "-qmin", "1",
        "-q:v", str(quality), "-threads", "1", "-f", "image2pipe", "-c:v", "mjpeg", "pipe:1",
    ]  # fmt: skip
    # More than one slice makes ffmpeg's JPEG encoder write a restart marker at every MCU row (the
    # same pixels, a few bytes per row): a crop of a jpeg dataset then decodes only its rows. For
    # images one macroblock wide (16 px) it numbers them out of sequence: each output is checked,
    # and encoded again without them where it does not decode (or ffmpeg refused the option).
    encoded, error = _run_ffmpeg([*command[:-1], "-slices", "2", command[-1]], data)
    written = None if error else _decoded_size(encoded)
    if written is None:
        encoded, error = _run_ffmpeg(command, data)
        written = None if error else _decoded_size(encoded)
    return encoded, written, error


def _run_ffmpeg(command: list[str], data: bytes | memoryview) -> tuple[bytes, str]:
    """The JPEG that ``command`` writes to its stdout from ``data`` on its stdin, and ``""``; or
    ``b""`` and why it failed."""
    try:
        result = subprocess.run(command, input=data, capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        return b"", "ffmpeg took more than 300 s"
    if result.returncode != 0 or not result.stdout.startswith(b"\xff\xd8"):
        lines = [line for line in result.stderr.decode(errors="replace").splitlines() if line.strip()]
        return b"", lines[-1].strip() if lines else f"ffmpeg exited with code {result.returncode} and wrote no JPEG"
    return result.stdout, ""


def _decoded_size(data: bytes) -> tuple[int, int] | None:
    """The ``(height, width)`` of a JPEG that libjpeg-turbo decodes with no warning (strict mode), else ``None``."""
    try:
        return simplejpeg.decode_jpeg(data, strict=True).shape[:2]
    except ValueError:
        return None
