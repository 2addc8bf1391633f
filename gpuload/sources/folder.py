"""Find the images of a folder as ``torchvision.datasets.ImageFolder`` does, visiting each folder once.

Folder symlinks are followed, as ImageFolder does, but a real folder (``st_dev``, ``st_ino``) is
visited only the first time it is reached: a link back to a parent or to a sibling would
otherwise make the walk list the same files again and again, for minutes, with growing memory.
Each such repeat is reported with a warning naming the link.

The walk lists each folder once (``os.scandir``) and looks up no file's status (a file's type comes
with its folder's listing; only a symlink named like an image is followed, to find a loop), and the
folders are visited in the order of their paths, so each one's images come out in ImageFolder's
order as it is listed: the samples go straight into a table of flat files (see
:mod:`gpuload.format.table`), and memory holds one folder's listing and the folders still to visit,
whatever the number of images.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..format.table import SampleTable, TableWriter
from ..text import count

__all__ = [
    "IMG_EXTENSIONS",
    "ImageFolderIndex",
    "ScannedSamples",
    "estimated_bytes",
    "scan_image_folder",
    "shown_names",
    "walk_images",
]

# torchvision.datasets.folder.IMG_EXTENSIONS (without importing torchvision)
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ScannedSamples(Sequence):
    """``(path relative to the root, class index)`` per image found, in ImageFolder's order: a sequence
    over the scan's table (flat files, mapped), nothing per image in memory.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> with TableWriter(folder) as writer:
        ...     writer.append("cat/1.jpg", 0, 0)
        >>> ScannedSamples(SampleTable.open(folder, 1))[0]
        ('cat/1.jpg', 0)
    """

    def __init__(self, table: SampleTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[position] for position in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"sample {index} is out of range for {len(self)} samples")
        index %= len(self)
        return self.table.path(index), int(self.table.labels[index])

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None


@dataclass(frozen=True)
class ImageFolderIndex:
    """The classes and samples of an image folder.

    Attributes:
        root: the folder that was scanned, absolute.
        classes: the class names, sorted; a class's index is its position.
        samples: ``(path relative to root, class index)`` per image, in ImageFolder's order.
        repeats: ``(link, folder it leads to)`` per folder symlink that led to a folder already scanned.
        empty_classes: the given classes that have no image here.
    """

    root: Path
    classes: list[str]
    samples: ScannedSamples
    repeats: list[tuple[str, str]] = field(default_factory=list)
    empty_classes: list[str] = field(default_factory=list)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: index for index, name in enumerate(self.classes)}

    source_format = "image_folder"
    fields = skipped = ()  # what other sources have beside the images (gpuload.sources.samples)

    @property
    def source_path(self) -> Path:
        return self.root

    def source(self, position: int) -> str:
        """The path of sample ``position``'s file: a string (a ``Path`` per image interns its name in the
        interpreter's table, which keeps growing: 100 MB at ImageNet's count)."""
        return os.path.join(self.root, self.samples.table.path(position))

    def image(self, position: int) -> tuple[str, None]:
        """Sample ``position``'s image for a build: its file's path (and no bytes)."""
        return self.source(position), None

    def image_bytes(self) -> int:
        """The sources' bytes, estimated (see :func:`estimated_bytes`)."""
        return estimated_bytes(self.source, len(self.samples))

    def close(self) -> None:
        """Nothing to release (a scan of other sources holds a file open)."""


def estimated_bytes(path: Callable[[int], str], count: int, sample: int = 256) -> int:
    """The bytes of ``count`` files, estimated from the sizes of at most ``sample`` of them spread over the
    positions (``path(position)`` names each): looking up every file's size would cost a metadata call per
    file before the first image (on a network filesystem, minutes at ImageNet's count); a file whose size
    cannot be read counts none.

    Example:
        >>> estimated_bytes(lambda position: __file__, 10) == 10 * os.path.getsize(__file__)
        True
    """
    positions = range(0, count, max(1, count // sample))
    sizes = []
    for position in positions:
        with contextlib.suppress(OSError):
            sizes.append(os.path.getsize(path(position)))
    return int(sum(sizes) / len(positions) * count) if positions else 0


def scan_image_folder(
    root: str | os.PathLike, *, classes: Sequence[str] | None = None, into: str | os.PathLike | None = None
) -> ImageFolderIndex:
    """Scan ``root`` like ``torchvision.datasets.ImageFolder``: same classes, order and extensions.

    ``root`` holds one subfolder per class. A folder with no subfolders but images
    directly inside is read as a single class named after the folder.

    With ``classes`` (e.g. a training set's, to build its validation set with the same
    ``class_to_idx``), a class's label is its position in that list; a class folder that is not
    in it is an error (a folder without class folders is one class named after it, which must be
    in it), and a listed class without a folder or images is allowed and listed in
    ``empty_classes`` (with one warning naming them).

    The samples are written into a new folder ``into`` as a table (a build's own folder, on the
    output's disk); without it, into a temporary folder, removed once they are mapped.

    Raises:
        NotADirectoryError: ``root`` is not a folder.
        PermissionError: ``root`` cannot be read.
        FileNotFoundError: ``root`` does not exist, holds no image, or (without ``classes``) has a
            class folder with no image.
        UsageError: ``classes`` is not a list of distinct names, or a class folder (or a folder without
            class folders) is not in it.

    Example:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> for name in ("cat/1.jpg", "cat/2.JPG", "dog/a.png", "dog/notes.txt"):
        ...     (root / name).parent.mkdir(exist_ok=True); (root / name).touch()
        >>> index = scan_image_folder(root)
        >>> index.classes, list(index.samples)
        (['cat', 'dog'], [('cat/1.jpg', 0), ('cat/2.JPG', 0), ('dog/a.png', 1)])
    """
    root = Path(root).expanduser().absolute()
    if not root.exists():
        raise FileNotFoundError(f"{root} does not exist; pass a folder of images (one subfolder per class)")
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a folder; pass a folder of images (one subfolder per class)")
    loops: list[tuple[str, str]] = []
    try:
        folders = sorted(entry.name for entry in os.scandir(root) if _is_folder(entry, root, loops))
    except PermissionError as error:
        raise PermissionError(f"cannot read {root}: {error.strerror}") from None
    if not folders:
        return _scan_flat_folder(root, classes, into)
    names = folders if classes is None else _check_classes(root, folders, classes)
    # The class folders belong to their classes: a link to one from elsewhere is a repeat.
    seen = {_identity(root)} | {_identity(root / name) for name in folders}
    repeats, found = loops, set()
    with _Table(into) as table:
        for label, name in enumerate(names):
            if name not in folders:
                continue
            count = table.count
            repeats += _walk(root, root / name, seen, lambda paths, label=label: table.extend(paths, label))
            if table.count > count:
                found.add(label)
    empty = sorted(name for label, name in enumerate(names) if label not in found)
    if empty and classes is None:
        raise FileNotFoundError(
            f"Found no valid file for the classes {', '.join(empty)}. "
            f"Supported extensions are: {', '.join(IMG_EXTENSIONS)}"
        )
    if not found:
        raise FileNotFoundError(f"{root} holds no image of the classes {', '.join(names[:5])}")
    _warn(repeats)
    _warn_empty(root, empty)
    return ImageFolderIndex(root=root, classes=names, samples=table.samples, repeats=repeats, empty_classes=empty)


class _Table:
    """Where a scan writes its samples: a table in ``into``, or in a temporary folder removed once the
    table is mapped (its files live on while mapped)."""

    def __init__(self, into: str | os.PathLike | None) -> None:
        self.into = Path(into) if into is not None else None
        self.folder = self.into if self.into is not None else Path(tempfile.mkdtemp(prefix="gpuload-scan-"))
        if self.into is not None:
            self.folder.mkdir()
        self.writer = TableWriter(self.folder)
        self.samples: ScannedSamples | None = None

    @property
    def count(self) -> int:
        return self.writer.count

    def extend(self, paths: list[str], label: int) -> None:
        self.writer.extend(paths, label)

    def __enter__(self) -> _Table:
        return self

    def __exit__(self, kind, *rest) -> None:
        self.writer.close()
        try:
            if kind is None:
                self.samples = ScannedSamples(SampleTable.open(self.folder, self.writer.count))
        finally:
            if self.into is None:
                shutil.rmtree(self.folder, ignore_errors=True)


def _check_classes(root: Path, folders: list[str], classes: Sequence[str]) -> list[str]:
    names = list(classes) if not isinstance(classes, str) else []
    if not names or not all(isinstance(name, str) and name for name in names) or len(set(names)) != len(names):
        raise UsageError(f"classes must be a list of distinct class names, got {classes!r}")
    unknown = [name for name in folders if name not in set(names)]
    if unknown:
        raise UsageError(
            f"{root} has class folders that are not in the given classes: {', '.join(unknown[:5])}"
            f"{' ...' if len(unknown) > 5 else ''}; add them to the classes or move them away"
        )
    return names


def _scan_flat_folder(root: Path, classes: Sequence[str] | None, into: str | os.PathLike | None) -> ImageFolderIndex:
    """A folder of images without class folders: one class named after the folder."""
    files = sorted(
        entry.name for entry in os.scandir(root) if not entry.is_dir() and entry.name.lower().endswith(IMG_EXTENSIONS)
    )
    if not files:
        raise FileNotFoundError(
            f"{root} holds no image and no class folder; supported extensions are: {', '.join(IMG_EXTENSIONS)}"
        )
    names = [root.name] if classes is None else _check_classes(root, [], classes)
    if root.name not in names:
        shown = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
        raise UsageError(
            f"{root} holds {count(len(files), 'image')} and no class folder, so it would be one class named {root.name!r}, "
            f"which is not in the given classes ({shown}); pass the folder that holds one folder per class, or "
            "name this folder after its class"
        )
    label = names.index(root.name)
    empty = sorted(name for name in names if name != root.name)
    _warn_empty(root, empty)
    with _Table(into) as table:
        table.extend(files, label)
    return ImageFolderIndex(root=root, classes=names, samples=table.samples, empty_classes=empty)


def _warn_empty(root: Path, empty: list[str]) -> None:
    """One warning naming the given classes that have no image under ``root``."""
    if empty:
        warnings.warn(
            f"{len(empty)} of the given classes have no image in {root}: {shown_names(empty)}; their labels are kept",
            stacklevel=3,
        )


def shown_names(names: list[str], limit: int = 10) -> str:
    """``names`` for a message, the first ``limit`` of them and how many more.

    Example:
        >>> shown_names(["a", "b", "c"], limit=2)
        'a, b and 1 more'
    """
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def walk_images(root: Path, *, exclude: Path | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """The images under ``root`` (paths relative to it, in ImageFolder's order), each folder visited
    once, and the ``(link, folder it leads to)`` of each folder symlink that led to a folder already
    seen, to ``exclude`` (a command's output folder, which a link inside ``root`` may reach), or
    nowhere (a symlink loop such as ``ln -s self self``): each is skipped with a warning.

    Example:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> (root / "a").mkdir(); (root / "a" / "1.jpg").touch(); (root / "2.png").touch()
        >>> walk_images(root)
        (['2.png', 'a/1.jpg'], [])
    """
    seen = {_identity(root)}
    output = str(exclude.resolve()) if exclude is not None and exclude.is_dir() else None
    if output is not None:
        seen.add(_identity(exclude))  # a link into the output: skipped like a folder already seen
    files: list[str] = []
    repeats = _walk(root, root, seen, files.extend)
    for link, _ in (repeat for repeat in repeats if repeat[1] == output):
        warnings.warn(f"{link} leads to the output folder {output}; skipped", stacklevel=2)
    _warn([repeat for repeat in repeats if repeat[1] != output])
    return files, repeats


def _walk(
    root: Path, top: Path, seen: set[tuple[int, int]], emit: Callable[[list[str]], None]
) -> list[tuple[str, str]]:
    """Give ``emit`` the images under ``top``, a folder's at a time, relative to ``root``, in torchvision's
    ``make_dataset`` order (folders sorted by path, each one's files by name), each folder listed once; returns the
    ``(link, where it leads)`` of the folder links skipped. ``seen`` holds the folders visited or reserved
    (``top`` among them): a subfolder in it is skipped and reported, a new one added.

    The folders still to list wait in a heap, ordered by path: a folder's path sorts after its
    parent's, so the smallest path waiting is the next in the global order of paths, and each folder's
    images can be given out as soon as it is listed."""
    repeats: list[tuple[str, str]] = []
    waiting = [str(top)]
    skip = len(os.path.join(root, ""))  # an entry's path: root's, a separator, then the path relative to it
    while waiting:
        folder = heapq.heappop(waiting)
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:  # unreadable or gone: skipped, as os.walk (and so ImageFolder) does
            continue
        images = []
        for entry in entries:
            name = entry.name
            if name.lower().endswith(IMG_EXTENSIONS) and not entry.is_symlink() and not entry.is_dir():
                images.append(entry.path[skip:])  # a plain file named like an image: no call, no Path
            elif _is_folder(entry, root, repeats):
                identity = _identity(Path(entry.path))
                if identity in seen:
                    repeats.append((_relative(Path(entry.path), root), str(Path(entry.path).resolve())))
                    continue
                seen.add(identity)
                heapq.heappush(waiting, entry.path)
            elif _looks_like_image(entry):
                images.append(entry.path[skip:])
        if images:
            emit(images)
    return repeats


def _is_folder(entry: os.DirEntry, root: Path, repeats: list[tuple[str, str]]) -> bool:
    """Whether ``entry`` is a folder (through a symlink too); a link that leads nowhere, in a loop
    (``ln -s self self``), is reported in ``repeats`` and is no folder."""
    try:
        return entry.is_dir()
    except OSError as error:  # ELOOP: is_dir follows links, and a loop of them has no end
        if error.errno != errno.ELOOP:
            raise
        repeats.append((_relative(Path(entry.path), root), "nowhere: a symlink loop"))
        return False


def _looks_like_image(entry: os.DirEntry) -> bool:
    """An entry named like an image, unless it is a symlink loop (reported by :func:`_is_folder`). Only a
    symlink is looked up (its type came with the listing): a plain file costs no system call."""
    if not entry.name.lower().endswith(IMG_EXTENSIONS):
        return False
    if not entry.is_symlink():
        return True
    try:
        entry.stat()
    except OSError as error:
        return error.errno != errno.ELOOP  # a broken link is listed (and skipped as unreadable later)
    return True


def _identity(folder: Path) -> tuple[int, int]:
    stat = folder.stat()
    return stat.st_dev, stat.st_ino


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _warn(repeats: list[tuple[str, str]]) -> None:
    for link, target in repeats:
        if target.startswith("nowhere"):
            warnings.warn(f"{link} leads {target}; skipped", stacklevel=3)
            continue
        warnings.warn(
            f"{link} leads to {target}, a folder already scanned (a symlink loop or a second link to it); "
            f"its images are listed once",
            stacklevel=3,
        )
