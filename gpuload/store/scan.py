"""Find the images of a folder exactly as ``torchvision.datasets.ImageFolder`` does."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

__all__ = ["IMG_EXTENSIONS", "ImageFolderIndex", "scan_image_folder"]


@dataclass(frozen=True)
class ImageFolderIndex:
    """The classes and samples of an image folder.

    Attributes:
        root: the folder that was scanned, absolute.
        classes: the class names, sorted; a class's index is its position.
        samples: ``(path relative to root, class index)`` per image, in ImageFolder's order.
    """

    root: Path
    classes: list[str]
    samples: list[tuple[str, int]]

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: index for index, name in enumerate(self.classes)}


def scan_image_folder(root: str | os.PathLike) -> ImageFolderIndex:
    """Scan ``root`` like ``torchvision.datasets.ImageFolder``: same classes, order and extensions.

    ``root`` holds one subfolder per class. A folder with no subfolders but images
    directly inside is read as a single class named after the folder.

    Raises:
        NotADirectoryError: ``root`` is not a folder.
        PermissionError: ``root`` cannot be read.
        FileNotFoundError: ``root`` does not exist, holds no image, or has a class folder with no image.

    Example:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> for name in ("cat/1.jpg", "cat/2.JPG", "dog/a.png", "dog/notes.txt"):
        ...     (root / name).parent.mkdir(exist_ok=True); (root / name).touch()
        >>> index = scan_image_folder(root)
        >>> index.classes, index.samples
        (['cat', 'dog'], [('cat/1.jpg', 0), ('cat/2.JPG', 0), ('dog/a.png', 1)])
    """
    root = Path(root).expanduser().absolute()
    if not root.exists():
        raise FileNotFoundError(f"{root} does not exist; pass a folder of images (one subfolder per class)")
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a folder; pass a folder of images (one subfolder per class)")
    try:
        classes, class_to_idx = find_classes(root)
    except PermissionError as error:
        raise PermissionError(f"cannot read {root}: {error.strerror}") from None
    except FileNotFoundError:
        return _scan_flat_folder(root)
    found = make_dataset(str(root), class_to_idx, extensions=IMG_EXTENSIONS)
    samples = [(Path(path).relative_to(root).as_posix(), label) for path, label in found]
    return ImageFolderIndex(root=root, classes=classes, samples=samples)


def _scan_flat_folder(root: Path) -> ImageFolderIndex:
    names = sorted(
        entry.name for entry in os.scandir(root) if entry.is_file() and entry.name.lower().endswith(IMG_EXTENSIONS)
    )
    if not names:
        raise FileNotFoundError(
            f"{root} holds no image and no class folder; supported extensions are: {', '.join(IMG_EXTENSIONS)}"
        )
    return ImageFolderIndex(root=root, classes=[root.name], samples=[(name, 0) for name in names])
