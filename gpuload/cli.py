"""The ``gpuload`` command line: a thin layer over the library calls.

Exit codes: 0 done; 1 an input file failed (``compress``: any file; ``build-memmap``: ``--strict``,
or no image could be decoded) or ``verify`` found problems in a dataset; 2 a user error (bad
arguments, paths, a URL where a local path is needed, a path that holds no dataset, a busy or
invalid output, a full disk); 130 interrupted. Errors gpuload raises on purpose
(:class:`gpuload.GpuloadError`) and ``OSError``s about the user's paths print one line on stderr;
anything else is a bug and shows its traceback. The library is imported only by the command that
runs, so ``--help``, ``--version`` and argument errors never import torch.

Progress bars are drawn on stderr when it is a terminal; ``--quiet`` turns them off there, and
``--progress`` draws them into a pipe or a file too. Image sizes are written width x height, as
photo tools write them (``--size 640x480`` is landscape).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import select
import signal
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from . import __version__
from .errors import FileError, GpuloadError, UsageError
from .format.manifest import RESIZE_MODES
from .text import byte_size, count, image_size

__all__ = ["main", "parse_size"]

# OSErrors that are about the user's files or disk, not a bug: one line, exit 2.
_USER_OS_ERRORS = (FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError, IsADirectoryError)
_USER_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG}


class Size(NamedTuple):
    """A ``--size``: ``height`` and ``width`` (torch's order), and whether it was written with a ``!``."""

    height: int
    width: int
    as_written: bool = False


def parse_size(text: str) -> Size:
    """Parse ``"WIDTHxHEIGHT"``, as photo tools write sizes: ``"640x480"`` is landscape, 640 wide.

    A trailing ``!`` keeps a size whose orientation differs from the photos' (see :func:`_check_orientation`).

    Example:
        >>> parse_size("640x480"), parse_size("480x640!")
        (Size(height=480, width=640, as_written=False), Size(height=640, width=480, as_written=True))
    """
    body = text.strip().lower()
    as_written = body.endswith("!")
    parts = body.removesuffix("!").split("x")
    if len(parts) != 2 or not all(part.strip().isdigit() and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(
            f"expected WIDTHxHEIGHT with positive integers, as photo tools write sizes (640x480 is landscape), got {text!r}"
        )
    return Size(int(parts[1]), int(parts[0]), as_written)


def _check_orientation(src: Path, size: Size) -> None:
    """Refuse a ``--size`` whose orientation is the opposite of every photo's that a look at the first
    images finds: gpuload read ``--size`` as HEIGHTxWIDTH until issue 30, and a script written for it would now
    build portrait images of landscape photos (or the reverse) without a word. A size written with a
    ``!``, a square one, or photos of both orientations pass."""
    from .errors import DecodeError
    from .sources.folder import IMG_EXTENSIONS
    from .writing.decode import read_size

    wanted = (size.width > size.height) - (size.width < size.height)  # 1 landscape, -1 portrait
    if size.as_written or not wanted:
        return
    sizes: Counter[tuple[int, int]] = Counter()
    for folder, folders, names in os.walk(src):
        folders.sort()
        for name in sorted(names):
            if name.lower().endswith(IMG_EXTENSIONS) and sum(sizes.values()) < _ORIENTATION_SAMPLE:
                with contextlib.suppress(DecodeError):
                    sizes[read_size(os.path.join(folder, name))] += 1
        if sum(sizes.values()) >= _ORIENTATION_SAMPLE:
            break
    if not sizes or any((width > height) - (width < height) != -wanted for height, width in sizes):
        return
    (height, width), _ = sizes.most_common(1)[0]
    shape = {1: "landscape", -1: "portrait"}
    raise UsageError(
        f"--size {size.width}x{size.height} is WIDTHxHEIGHT ({shape[wanted]}: {size.width} wide, {size.height} high), "
        f"and the photos of {src} are {shape[-wanted]} (first ones {image_size(height, width)}); earlier gpuload read "
        f"--size as HEIGHTxWIDTH: pass --size {size.height}x{size.width}, or '--size {size.width}x{size.height}!' "
        f"for {shape[wanted]} images of {shape[-wanted]} photos"
    )


_ORIENTATION_SAMPLE = 32  # images whose headers the orientation check reads


class _Url(str):
    """A URL given where a command takes a local path: refused by :func:`main` with what the command takes
    (``Path`` would turn ``s3://bucket/photos`` into the local path ``s3:/bucket/photos``)."""


def _path(text: str) -> Path | _Url:
    """A local path argument; an empty one (an unset shell variable) would mean the current folder: refused."""
    from .remote.store import is_url

    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"a path is empty ({text!r}: an unset shell variable?); give a folder, '.' for this one"
        )
    return _Url(text) if is_url(text) else Path(text)


# What each command that takes local paths says to a URL given for one of them.
_LOCAL_ONLY = {
    "compress": "compress reads and writes local folders: copy the photos to a local folder first",
    "build-memmap": "build-memmap reads and writes local folders: copy the photos to a local folder, build "
    "there, then gpuload push DATASET URL",
    "push": "push copies a local dataset folder to a URL: gpuload push DATASET URL",
    "bench": "bench measures a local dataset: copy it to a local disk first (a dataset at a URL is read with "
    "gpuload.MemmapImageDataset(URL, cache=...))",
    "demo": "demo works in a local folder",
    "verify": "--source-folder is the local folder of the sources",
    "cache": "the cache is a folder on this node's disk",
}
_POSITIONALS = {"src": "SRC", "dst": "DST", "dataset": "DATASET"}


def _refuse_urls(args: argparse.Namespace) -> None:
    """One line for a URL given where the command takes a local path."""
    for name, value in vars(args).items():
        if isinstance(value, _Url):
            from .remote.store import redact

            flag = _POSITIONALS.get(name, "--" + name.replace("_", "-"))
            raise UsageError(
                f"{flag} of gpuload {args.command} is a local path, got the URL {redact(value)}; "
                f"{_LOCAL_ONLY[args.command]}"
            )


def _column(text: str) -> tuple[str, str]:
    """A ``NAME=ROLE`` argument (``build-memmap --column``)."""
    name, equals, role = text.partition("=")
    if not equals or not name or not role:
        raise argparse.ArgumentTypeError(f"a column is given as NAME=ROLE (e.g. tags=multilabel), got {text!r}")
    return name, role


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = argparse.ArgumentParser(prog="gpuload", description="Get image datasets onto the GPU fast.")
    parser.add_argument("--version", action="version", version=f"gpuload {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_compress, _add_build, _add_info, _add_verify, _add_push, _add_bench, _add_cache, _add_demo):
        add(subparsers)
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            _refuse_urls(args)
            code = args.run(args)
            sys.stdout.flush()  # here, so that a reader gone (``| head -1``) is caught below
            return code
        except BrokenPipeError:
            if not _stdout_closed():
                raise  # another pipe: not the reader of our output
            # The reader of our output stopped early (``| head -1``): no traceback, and the exit
            # code of a command killed by SIGPIPE; stdout goes to /dev/null so that the flush at
            # exit does not fail again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            return 128 + signal.SIGPIPE
        except KeyboardInterrupt:
            print("gpuload: interrupted", file=sys.stderr)
            return 130
        except FileError as error:
            print(f"gpuload: error: {error}", file=sys.stderr)
            return 1
        except GpuloadError as error:
            print(f"gpuload: error: {error}", file=sys.stderr)
            return 2
        except OSError as error:
            if not isinstance(error, _USER_OS_ERRORS) and error.errno not in _USER_ERRNOS:
                raise
            print(f"gpuload: error: {error}", file=sys.stderr)
            return 2


def _stdout_closed() -> bool:
    """Whether nothing reads our stdout any more (a pipe or socket whose reader is gone)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll, or no real stdout
        return False


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"gpuload: warning: {message}", file=sys.stderr)


def _add_progress(parser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--quiet", dest="progress", action="store_false",
        help="draw no progress bar (the summary, warnings and errors still print)",
    )  # fmt: skip
    group.add_argument(
        "--progress", dest="progress", action="store_true",
        help="draw progress bars on stderr even when it is not a terminal (default: only on a terminal)",
    )  # fmt: skip
    parser.set_defaults(progress=None)


def _progress(args) -> bool:
    """Whether to draw progress bars: as asked, else only where stderr is a terminal (not into CI logs)."""
    return sys.stderr.isatty() if args.progress is None else args.progress


def _add_compress(subparsers) -> None:
    parser = subparsers.add_parser(
        "compress",
        help="re-encode a folder of photos as JPEGs with ffmpeg (exit 0: every file done; 1: some failed, listed)",
        description="Re-encode every image under SRC as a JPEG under DST, the tree mirrored. Every output is a "
        "JPEG: a PNG, TIFF, WebP... source is written under the .jpg suffix (photo.png -> photo.jpg), and the "
        "summary counts them. Exit codes: 0 every file compressed (or already, by an earlier run); 1 one file or "
        "more failed (each listed; the others are compressed and kept, and a rerun redoes only what is not "
        "finished); 2 a usage error (bad arguments, paths, a busy DST, a full disk).",
    )
    parser.add_argument("src", type=_path, help="folder of photos")
    parser.add_argument(
        "dst", type=_path, help="folder to write: the tree is mirrored, every output a JPEG (photo.png -> photo.jpg)"
    )
    parser.add_argument("--quality", "-q", type=int, default=3, help="ffmpeg -q:v, 1 (best) to 31 (default: 3)")
    parser.add_argument("--workers", type=int, default=None, help="ffmpeg processes at once (default: cores)")
    parser.add_argument(
        "--strict", action="store_true",
        help="stop at the first file that fails, with exit code 1 (default: go on, list it, and exit with 1 at the end)",
    )  # fmt: skip
    _add_max_pixels(parser)
    _add_progress(parser)
    parser.set_defaults(run=_run_compress)


def _run_compress(args) -> int:
    from .writing.compress import compress_folder

    with _pixel_limit(args):
        report = compress_folder(
            args.src, args.dst, quality=args.quality, workers=args.workers, strict=args.strict,
            progress=_progress(args),
        )  # fmt: skip
    for path, error in report.failed:
        print(f"failed: {path}: {error}")
    print(report.summary())
    if not report.failed:
        return 0
    files = report.done + report.skipped + len(report.failed)
    print(
        f"gpuload: error: {len(report.failed):,} of {count(files, 'file')} failed (listed above); the others are "
        "compressed and kept: fix or move away those files, then run again (a rerun redoes only what is not finished)",
        file=sys.stderr,
    )
    return 1


def _add_build(subparsers) -> None:
    parser = subparsers.add_parser(
        "build-memmap",
        help="decode an ImageFolder (or a metadata table, tar shards, Parquet) into a memory-mapped dataset",
    )
    parser.add_argument(
        "src",
        type=_path,
        help="an ImageFolder (one subfolder per class); a folder with metadata.csv/.jsonl/.parquet or such a table; "
        "WebDataset tar shards (a .tar, a folder of them, or a pattern train-{000000..000099}.tar); Parquet files "
        "with an image column",
    )
    parser.add_argument("--out", type=_path, default=None, help="dataset folder (default: <SRC>.memmap)")
    parser.add_argument(
        "--size", type=parse_size, default=None, metavar="WIDTHxHEIGHT",
        help="raw: the stored images' size, width x height as photo tools write it: 640x480 is landscape "
        "(default: the images' common size). Earlier gpuload read HEIGHTxWIDTH: a size whose orientation is the "
        "opposite of the photos' is refused; end it with ! to keep it ('640x480!')",
    )  # fmt: skip
    parser.add_argument(
        "--format", choices=("raw", "jpeg"), default="raw",
        help="raw: uint8 pixels at one size (fastest to load); jpeg: the JPEG bytes, each image at its own "
        "size (10-20x smaller, for datasets larger than RAM) (default: raw)",
    )  # fmt: skip
    parser.add_argument("--resize", choices=RESIZE_MODES, default=None, help="raw: how other sizes fit (default: crop)")
    parser.add_argument("--max-side", type=int, default=None, help="jpeg: scale larger images down to this side")
    parser.add_argument("--quality", type=int, default=None, help="jpeg: quality of re-encoded images (default: 90)")
    parser.add_argument(
        "--order", choices=("shuffled", "source"), default=None,
        help="jpeg: how the images lie in data.memmap: shuffled (a seeded random order, none across a 4 MiB block: "
        "blocks read together hold every class) or source (ImageFolder's); the index is ImageFolder's either way "
        "(default: shuffled)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="jpeg: the seed of the shuffled order (default: 0)")
    parser.add_argument(
        "--classes-from", type=_path, default=None, metavar="DATASET",
        help="use the class list (and labels) of this dataset, e.g. the training set's for a validation set",
    )  # fmt: skip
    parser.add_argument(
        "--column", action="append", type=_column, default=[], metavar="NAME=ROLE",
        help="the role of a source's column (repeatable): image, label, multilabel, mask, number, text or ignore, "
        "e.g. --column path=image --column tags=multilabel --column seg=mask",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=None, help="decoding threads (default: cores)")
    parser.add_argument(
        "--strict", action="store_true", help="fail on the first unreadable image instead of skipping it"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing dataset (only a folder holding nothing else)"
    )
    parser.add_argument(
        "--no-sync",
        dest="sync",
        action="store_false",
        help="do not wait for the disk before renaming the dataset into place (a power cut soon after can "
        "leave zeroed images, which verify reports; a stopped build cannot be resumed)",
    )
    parser.add_argument(
        "--no-resume",
        dest="resume",
        action="store_false",
        help="start afresh, removing what a stopped build of OUT left (by default the same build goes on from "
        "its last checkpoint)",
    )
    _add_max_pixels(parser)
    _add_progress(parser)
    parser.set_defaults(run=_run_build)


def _run_build(args) -> int:
    from .errors import DatasetError
    from .format.dataset import MemmapImageDataset
    from .format.manifest import Manifest
    from .writing.build import build_memmap

    classes = None
    if args.classes_from is not None:
        reference = Manifest.read(args.classes_from)
        if "classes" in reference.edited_fields():
            raise DatasetError(
                f"{args.classes_from}: its manifest's classes were changed after its build, so its labels no "
                "longer mean those classes; rebuild that dataset (or check it with gpuload verify)"
            )
        classes = reference.classes
    size = None
    if args.size is not None:
        if args.format == "raw" and args.src.is_dir():
            _check_orientation(args.src, args.size)
        size = (args.size.height, args.size.width)
    started = time.perf_counter()
    with _pixel_limit(args):
        out = build_memmap(
            args.src, args.out, format=args.format, size=size, resize=args.resize, max_side=args.max_side,
            quality=args.quality, classes=classes, columns=dict(args.column) or None, order=args.order, seed=args.seed, workers=args.workers,
            strict=args.strict, overwrite=args.overwrite, sync=args.sync, resume=args.resume, progress=_progress(args),
        )  # fmt: skip
    seconds = time.perf_counter() - started
    dataset = MemmapImageDataset(out)
    nbytes = sum(dataset.manifest.files.values())
    if dataset.image_shape:
        what = f"{count(len(dataset), 'image')} of {image_size(*dataset.image_shape[1:])}"
    else:
        what = f"{count(len(dataset), 'JPEG')} at their own sizes"
    print(
        f"built {out}: {what} ({byte_size(nbytes)}) in {count(len(dataset.classes), 'class', 'classes')}, "
        f"{len(dataset.skipped)} skipped, {seconds:.1f} s ({len(dataset) / seconds:.0f} images/s)"
    )
    if dataset.manifest.fields:
        from .format.fields import describe_fields

        print(f"fields: {'; '.join(describe_fields(dataset.manifest.field_specs))}")
    for entry in dataset.skipped:
        print(f"skipped: {entry['path']}: {entry['reason']}")
    return 0


def _add_info(subparsers) -> None:
    parser = subparsers.add_parser("info", help="describe a dataset (a folder or a URL that gpuload push wrote)")
    parser.add_argument("dataset", help="a dataset folder, or its URL (s3://bucket/photos.jpeg...)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=_run_info)


def _run_info(args) -> int:
    from .remote.store import is_url

    if is_url(args.dataset):
        from .remote.dataset import describe_remote

        info = describe_remote(args.dataset)
    else:
        from .format.verify import describe_memmap

        info = describe_memmap(Path(args.dataset))
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(info["path"])
    on_disk = f"{byte_size(info['bytes_on_disk'])} on disk"
    skipped = f"{count(info['skipped'], 'file')} skipped"
    if info["storage"] == "raw":
        _, height, width = info["image_shape"]
        print(f"  images:  {count(info['images'], 'image')} of {image_size(height, width)} (raw uint8), {on_disk}")
        print(f"  source:  {info['source']} (resize: {info['resize']}, {skipped})")
    else:
        jpeg = info["jpeg"]
        reencoded = ", ".join(f"{number} {reason}" for reason, number in jpeg["reencoded"].items()) or "none"
        print(f"  images:  {count(info['images'], 'JPEG')}, each at its own size, {on_disk}")
        print(f"  source:  {info['source']} ({skipped})")
        print(f"  re-encoded at quality {jpeg['quality']} (max side {jpeg['max_side'] or '-'}): {reencoded}")
    if info["empty_classes"]:
        print(f"  classes without images: {', '.join(info['empty_classes'])}")
    if info.get("fields"):
        from .format.fields import FieldSpec, describe_fields

        print(f"  fields:  {'; '.join(describe_fields([FieldSpec.from_json(entry) for entry in info['fields']]))}")
    print(f"  built:   {info['created']} with gpuload {info['versions'].get('gpuload', '?')}")
    print(f"  classes: {len(info['classes'])}")
    width = max(len(name) for name in info["classes"])
    for name, number in info["classes"].items():
        print(f"    {name:<{width}}  {number}")
    return 0


def _add_verify(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify", help="check a dataset's integrity (exit 1 on any problem, 2 where the path holds no dataset)"
    )
    parser.add_argument("dataset", help="a dataset folder, or its URL (s3://bucket/photos.jpeg...)")
    parser.add_argument(
        "--sources",
        type=_count,
        nargs="?",
        const="all",
        default=0,
        metavar="N",
        help="also take N random sources again (all of them without N) and compare them with what the build stored: "
        "exactly, or within a small tolerance where the decoding libraries changed since the build; a raw and a "
        "jpeg dataset alike",
    )
    parser.add_argument(
        "--source-folder", type=_path, default=None, metavar="DIR",
        help="with --sources: the folder of the sources where it is now, when it moved since the build "
        "(default: the one the build recorded, which gpuload info shows)",
    )  # fmt: skip
    _add_max_pixels(parser, "; for --sources of a dataset whose manifest does not record the build's limit")
    _add_progress(parser)
    parser.set_defaults(run=_run_verify)


def _add_max_pixels(parser, where: str = "") -> None:
    parser.add_argument(
        "--max-pixels", type=_pixels, default=None, metavar="N",
        help="decode images of up to N pixels (Pillow's decompression-bomb guard, PIL.Image.MAX_IMAGE_PIXELS: "
        f"89,478,485 unless changed); raise it for trusted files{where}",
    )  # fmt: skip


def _pixel_limit(args) -> contextlib.AbstractContextManager:
    """Pillow's pixel limit set to ``--max-pixels`` for the run, where it is given."""
    from .writing.decode import pixel_limit

    return contextlib.nullcontext() if args.max_pixels is None else pixel_limit(args.max_pixels)


def _pixels(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of pixels, got {text!r}")
    return int(text)


def _count(text: str) -> int | str:
    if text != "all" and not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a number of images, got {text!r}")
    return text if text == "all" else int(text)


def _run_verify(args) -> int:
    from .errors import UsageError
    from .remote.store import is_url, redact

    if is_url(args.dataset):
        from .remote.dataset import verify_remote

        if args.sources or args.source_folder is not None:
            raise UsageError("--sources compares with the source photos: run it on the local dataset, not a URL")
        problems = verify_remote(args.dataset, progress=_progress(args))
        args.dataset = redact(args.dataset)
    else:
        from .format.verify import verify_memmap

        with _pixel_limit(args):
            problems = verify_memmap(
                Path(args.dataset), sources=args.sources, source_folder=args.source_folder, progress=_progress(args)
            )
    for problem in problems:
        print(f"problem: {problem}")
    print(f"{args.dataset}: {'OK' if not problems else count(len(problems), 'problem')}; checked {problems.checked}")
    return 1 if problems else 0


def _add_push(subparsers) -> None:
    parser = subparsers.add_parser(
        "push",
        help="copy a dataset to object storage (s3://, gs://, az://, file://), each object checked; a rerun resumes",
    )
    parser.add_argument("src", type=_path, help="the dataset folder that build-memmap wrote")
    parser.add_argument("url", help="where to put it, e.g. s3://bucket/photos.jpeg")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace another gpuload dataset at URL (never anything else)"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="read back every object already at URL and compare it with its file, even those the push record "
        "vouches for (default: an object whose size, ETag and checksum were recorded when it was pushed is not read)",
    )
    _add_progress(parser)
    parser.set_defaults(run=_run_push)


def _run_push(args) -> int:
    from .remote.push import push_memmap

    report = push_memmap(args.src, args.url, overwrite=args.overwrite, verify=args.verify, progress=_progress(args))
    print(report.summary())
    return 0


def _add_bench(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="measure loading throughput against the stock loaders and the machine's limit"
    )
    parser.add_argument("dataset", type=_path)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per contender (default: 3)")
    parser.add_argument(
        "--max-batches", type=int, default=None, metavar="N",
        help="time every contender on epochs of the same first N batches of images, for a dataset the stock "
        "loaders take too long to read (default: the whole dataset)",
    )  # fmt: skip
    parser.add_argument("--json", type=_path, default=None, metavar="FILE", help="also write the results here")
    parser.add_argument(
        "--augment", type=int, default=None, metavar="SIZE",
        help="also measure a per-sample random resized crop to SIZE + flip, against torchvision's in workers",
    )  # fmt: skip
    _add_progress(parser)
    parser.set_defaults(run=_run_bench)


def _run_bench(args) -> int:
    from .bench import format_bench, run_bench, short_epochs
    from .errors import UsageError

    if args.json is not None and not args.json.parent.is_dir():  # before minutes of measuring, not after
        raise UsageError(f"--json {args.json}: its folder {args.json.parent} does not exist; create it first")
    report = run_bench(
        args.dataset,
        batch_size=args.batch_size,
        device=args.device,
        epochs=args.epochs,
        max_batches=args.max_batches,
        augment=args.augment,
        progress=_progress(args),
    )
    print(format_bench(report))
    short = short_epochs(report)
    if short is not None:
        warnings.warn(short, stacklevel=1)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    failed = report["failed"]
    if failed:  # the table says why; 1 when gpuload's own numbers are missing (see run_bench)
        print(
            f"gpuload bench: {len(failed)} contender{'s' * (len(failed) > 1)} failed ({', '.join(failed)}): "
            f"{'their' if len(failed) > 1 else 'its'} numbers are missing",
            file=sys.stderr,
        )
    return 1 if any(name.startswith("gpuload") for name in failed) else 0


def _add_demo(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the whole job on a built-in sample (no download)")
    parser.add_argument("--workdir", type=_path, default=None, help="keep the files here (default: a temporary folder)")
    parser.add_argument("--images", type=int, default=500, help="sample images to make (default: 500)")
    _add_progress(parser)
    parser.set_defaults(run=_run_demo)


def _run_demo(args) -> int:
    from .demo import run_demo

    run_demo(args.workdir, images=args.images, progress=_progress(args))
    return 0


def _add_cache(subparsers) -> None:
    parser = subparsers.add_parser(
        "cache",
        help="see or clear a node's object-storage cache (the folder given as cache= to MemmapImageDataset)",
        description="See what a gpuload block cache holds, or clear it. Only a folder that gpuload made as its "
        "cache is touched. A clear is safe while jobs use the cache: it holds the cache's lock, keeps every block "
        "that another process is writing at that moment, and what jobs read next is fetched again.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    info = actions.add_parser("info", help="the blocks held, per object, and the bytes")
    info.add_argument("folder", type=_path, metavar="DIR", help="the cache folder")
    info.add_argument("--json", action="store_true", help="print JSON")
    clear = actions.add_parser("clear", help="remove every block (safe while jobs use the cache)")
    clear.add_argument("folder", type=_path, metavar="DIR", help="the cache folder")
    parser.set_defaults(run=_run_cache)


def _run_cache(args) -> int:
    from .remote.cache import clear_cache, describe_cache

    if args.action == "clear":
        result = clear_cache(args.folder)
        removed, kept = result["removed"], result["kept"]
        print(
            f"cleared {result['path']}: {count(removed['blocks'], 'block')} removed ({byte_size(removed['bytes'])})"
            + (
                f", {count(kept['blocks'], 'block')} kept ({byte_size(kept['bytes'])}): another process was "
                "writing them"
                if kept["blocks"]
                else ""
            )
        )
        return 0
    info = describe_cache(args.folder)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(info["path"])
    print(
        f"  held:    {count(info['blocks'], 'block')}, {byte_size(info['bytes'])}, of "
        f"{count(len(info['objects']), 'object')}"
    )
    writing = info["being_written"]
    if writing["blocks"]:
        print(f"  being written: {count(writing['blocks'], 'block')} ({byte_size(writing['bytes'])} reserved)")
    for entry in info["objects"]:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry["used"]))
        print(f"    {entry['url']}  {count(entry['blocks'], 'block')}, {byte_size(entry['bytes'])}, last used {used}")
    return 0
