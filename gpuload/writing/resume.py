"""What a stopped build leaves to go on from: a checkpoint in its folder, written every
:data:`CHECKPOINT_SECONDS` once everything it counts is on disk.

A build killed (``kill -9``, a lost node, a power cut) or interrupted (Ctrl-C) leaves its hidden folder
beside ``out``; the next build of the same ``out`` from the same source with the same options and
libraries (:func:`recipe`) takes it up at its last checkpoint: the images written before it are kept,
the files cut back to it, and only the images after it are decoded again. Anything else (other
options, another version of a decoder, a source whose samples changed, a checkpoint that cannot be
read) starts the build afresh. The result is the dataset an uninterrupted build would have written,
byte for byte.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import xxhash

from .files import fsync_file, fsync_folder

__all__ = ["CHECKPOINT", "CHECKPOINT_SECONDS", "Checkpoint", "recipe", "scan_digest"]

CHECKPOINT = ".resume.json"
_PARTIAL = f"{CHECKPOINT}.partial"
CHECKPOINT_SECONDS = 30.0  # at most this much decoding is done again after a kill (and one fsync of what came since)


@dataclass
class Checkpoint:
    """How far a build had come, all of it on disk.

    Attributes:
        recipe: what the build was asked to do (:func:`recipe`); a build asked anything else starts afresh.
        scan: the digest of the samples scanned (:func:`scan_digest`); for a build that writes as the scan
            goes, of the first ``done`` samples' names and image lengths.
        done: the images whose jobs are complete, in the order they are written.
        kept: of those, the images written (the others skipped).
        written: the bytes written into each of the store's files, by path in the build's folder.
        skipped: the images the jobs skipped so far (``{"path", "reason"}``).
        reencoded: a jpeg build's re-encoded images so far, by reason.
        size: a raw build's image size, once decided from the images (``[height, width]``).
        unreadable: a raw build's images whose header could not be read when the size was decided
            (sample position -> reason).
    """

    recipe: dict
    scan: str
    done: int
    kept: int
    written: dict[str, int]
    skipped: list[dict] = field(default_factory=list)
    reencoded: dict[str, int] = field(default_factory=dict)
    size: list[int] | None = None
    unreadable: dict[int, str] = field(default_factory=dict)

    def write(self, folder: Path) -> None:
        """Replace the checkpoint in ``folder`` in one step (a temporary file, flushed, renamed, the folder flushed)."""
        partial = folder / _PARTIAL
        with open(partial, "w") as file:
            json.dump(asdict(self) | {"unreadable": {str(k): v for k, v in self.unreadable.items()}}, file)
        fsync_file(partial)
        os.replace(partial, folder / CHECKPOINT)
        fsync_folder(folder)

    @classmethod
    def read(cls, folder: Path) -> Checkpoint | None:
        """The checkpoint in ``folder``, or ``None``: none, or one that cannot be read (a build's own file,
        cut by a crash of the disk: the build starts afresh)."""
        try:
            found = json.loads((folder / CHECKPOINT).read_text())
            found["unreadable"] = {int(position): reason for position, reason in found["unreadable"].items()}
            checkpoint = cls(**found)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None
        return checkpoint if checkpoint._whole() else None

    def _whole(self) -> bool:
        """Whether its counts are counts, and agree (a file that parses may still be damaged)."""
        counts = (
            [self.done, self.kept, *self.written.values(), *self.unreadable] if isinstance(self.written, dict) else []
        )
        return (
            isinstance(self.recipe, dict)
            and isinstance(self.scan, str)
            and bool(counts)
            and all(map(_count, counts))
            and isinstance(self.skipped, list)
            and all(
                isinstance(entry, dict) and _texts(entry.get("path"), entry.get("reason")) for entry in self.skipped
            )
            and self.kept + len(self.skipped) == self.done  # each image done was written or skipped
            and isinstance(self.reencoded, dict)
            and all(isinstance(reason, str) and _count(n) for reason, n in self.reencoded.items())
            and (
                self.size is None
                or (isinstance(self.size, list) and len(self.size) == 2 and all(_count(n) and n > 0 for n in self.size))
            )
            and _texts(*self.unreadable.values())
        )

    def holds(self, folder: Path) -> bool:
        """Whether the files of ``folder`` still hold what the checkpoint counts (none cut since)."""
        files = [folder / ".records", *(folder / path for path in self.written)]
        return all(path.is_file() for path in files) and all(
            (folder / path).stat().st_size >= written for path, written in self.written.items()
        )

    @staticmethod
    def remove(folder: Path, sync: bool = True) -> None:
        """Remove the checkpoint (``sync``: for good, the folder flushed): a kill from now on starts the next
        build afresh."""
        for name in (CHECKPOINT, _PARTIAL):
            (folder / name).unlink(missing_ok=True)
        if sync:
            fsync_folder(folder)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _texts(*values: object) -> bool:
    return all(isinstance(value, str) for value in values)


def recipe(**asked) -> dict:
    """What a build was asked, as a checkpoint records it (JSON's types: a tuple as a list, a path as a
    string): every argument that changes the dataset (the source's path and kind, the options, the
    versions of the libraries that decode and encode).

    Example:
        >>> recipe(format="raw", size=(24, 32), source=Path("/data/photos"))
        {'format': 'raw', 'size': [24, 32], 'source': '/data/photos'}
    """
    return json.loads(json.dumps(asked, default=str))


def scan_digest(folder: Path, leave_out: tuple[str, ...] = ("blobs",)) -> str:
    """The digest of a scan's files in ``folder`` (names and contents, by name), but ``leave_out``: the
    image bytes a scan copies (their lengths and places are in the files digested)."""
    digest = xxhash.xxh3_128()
    for path in sorted(folder.iterdir()):
        if path.name in leave_out:
            continue
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as file:
            while chunk := file.read(1 << 18):  # a little at a time: memory bounded
                digest.update(chunk)
    return digest.hexdigest()
