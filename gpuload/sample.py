"""A built-in sample ImageFolder, made from the photo that matplotlib ships (no download)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import matplotlib.cbook
import numpy as np
from PIL import Image, ImageEnhance

from .machine import default_workers

__all__ = ["SAMPLE_CLASSES", "make_sample_folder", "sample_photo"]

# Each class is a region of the portrait (centre x, centre y, as fractions of its width and height).
SAMPLE_CLASSES: dict[str, tuple[float, float]] = {
    "face": (0.5, 0.3),
    "collar": (0.5, 0.6),
    "sleeve_left": (0.2, 0.8),
    "sleeve_right": (0.8, 0.8),
    "background": (0.12, 0.12),
}


def sample_photo() -> Path:
    """The path of ``grace_hopper.jpg`` (512x600), shipped with matplotlib."""
    return Path(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))


def make_sample_folder(
    dst: str | os.PathLike,
    *,
    images_per_class: int = 8,
    size: tuple[int, int] = (480, 640),
    classes: int = len(SAMPLE_CLASSES),
    seed: int = 0,
    quality: int = 95,
) -> Path:
    """Write an ImageFolder of distinct JPEG photos cut from ``grace_hopper.jpg``; returns ``dst``.

    Every image is a random crop around its class's region of the portrait, scaled to
    ``size`` = ``(height, width)``, maybe mirrored, with random colour, brightness and
    sensor-like noise, saved at JPEG ``quality`` (95: a camera original). Classes are
    written in parallel; the same arguments give the same files.

    Raises:
        FileExistsError: ``dst`` exists and is not an empty folder.
        ValueError: bad counts or size.

    Example:
        >>> import tempfile
        >>> root = make_sample_folder(Path(tempfile.mkdtemp()) / "photos", images_per_class=1, size=(30, 40))
        >>> sorted(p.relative_to(root).as_posix() for p in root.rglob("*.jpg"))[:2]
        ['background/0000.jpg', 'collar/0000.jpg']
    """
    dst = Path(dst)
    if not 1 <= classes <= len(SAMPLE_CLASSES):
        raise ValueError(f"classes must be between 1 and {len(SAMPLE_CLASSES)}, got {classes}")
    if images_per_class < 1:
        raise ValueError(f"images_per_class must be at least 1, got {images_per_class}")
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"size must be (height, width) with positive sides, got {size!r}")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise FileExistsError(f"{dst} already exists and is not an empty folder; choose another destination")
    with Image.open(sample_photo()) as opened:
        photo = opened.convert("RGB")

    def write_class(class_index: int, name: str, centre: tuple[float, float]) -> None:
        rng = np.random.default_rng([seed, class_index])
        folder = dst / name
        folder.mkdir(parents=True, exist_ok=True)
        for number in range(images_per_class):
            _variant(photo, centre, size, rng).save(folder / f"{number:04d}.jpg", quality=quality)

    with ThreadPoolExecutor(default_workers()) as pool:
        jobs = [
            pool.submit(write_class, i, name, centre)
            for i, (name, centre) in enumerate(list(SAMPLE_CLASSES.items())[:classes])
        ]
        for job in jobs:
            job.result()
    return dst


def _variant(
    photo: Image.Image, centre: tuple[float, float], size: tuple[int, int], rng: np.random.Generator
) -> Image.Image:
    height, width = size
    aspect = width / height
    crop_height = photo.height * rng.uniform(0.3, 0.6)
    crop_width = min(crop_height * aspect, photo.width)
    crop_height = crop_width / aspect
    x = np.clip(
        centre[0] * photo.width + rng.normal(0, 0.05) * photo.width - crop_width / 2, 0, photo.width - crop_width
    )
    y = np.clip(
        centre[1] * photo.height + rng.normal(0, 0.05) * photo.height - crop_height / 2, 0, photo.height - crop_height
    )
    image = photo.resize((width, height), Image.Resampling.BICUBIC, box=(x, y, x + crop_width, y + crop_height))
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    image = ImageEnhance.Color(image).enhance(rng.uniform(0.6, 1.4))
    image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.75, 1.25))
    noisy = np.asarray(image, dtype=np.float32) + rng.normal(0, 4, (height, width, 3))
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8))
