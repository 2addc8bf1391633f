"""The experiments' photo set: crops of ten real photographs at sizes drawn like ImageNet's.

Ten photographs ship inside installed packages (scikit-image's ``skimage.data``, matplotlib's sample
data), one class each: an astronaut, a cat, a cup of coffee, a rocket, a galaxy field, stained tissue,
a retina, a motorcycle, a portrait and a cameraman (grey). Each image of the set is a random crop of its
class's photograph (a quarter to all of the largest box of its aspect ratio), resized (bicubic) to a
size drawn as ImageNet's are (:func:`imagenet_like_size`), maybe mirrored, with a little colour,
brightness and sensor-like noise, and saved as a camera would (JPEG quality 92, 4:2:0). The same
arguments give the same files. With a fixed ``size``, every crop is resized to it (the raw store's
experiments need one size). :func:`describe` says what a set is, for footers and tables.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

DESCRIPTION = "crops of 10 photographs (scikit-image, matplotlib) at ImageNet-like sizes"


def describe(size: tuple[int, int] | None) -> str:
    """What a set made with ``size`` ((height, width), or ``None``: ImageNet-like sizes) is, in a few words.

    Example:
        >>> describe((480, 640))
        'crops of 10 photographs (scikit-image, matplotlib) at 640x480'
    """
    return DESCRIPTION if size is None else DESCRIPTION.replace("ImageNet-like sizes", f"{size[1]}x{size[0]}")


CAMERA_QUALITY = 92


def _skimage(name: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        from skimage import data

        return getattr(data, name)()

    return load


def _motorcycle() -> np.ndarray:
    from skimage import data

    return data.stereo_motorcycle()[0]


def _portrait() -> np.ndarray:
    import matplotlib.cbook

    with Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)) as image:
        return np.asarray(image.convert("RGB"))


# class name -> the photograph (uint8 [H, W, 3], or [H, W] grey), all shipped inside the packages
SOURCES: dict[str, Callable[[], np.ndarray]] = {
    "astronaut": _skimage("astronaut"),
    "cat": _skimage("chelsea"),
    "coffee": _skimage("coffee"),
    "rocket": _skimage("rocket"),
    "galaxies": _skimage("hubble_deep_field"),
    "tissue": _skimage("immunohistochemistry"),
    "retina": _skimage("retina"),
    "motorcycle": _motorcycle,
    "portrait": _portrait,
    "cameraman": _skimage("camera"),
}

# ImageNet's training images mostly come from Flickr at 500 pixels on the longer side, landscape 4:3
# far more often than anything else: longer side 500 for 80 % of them, else spread from 200 to 1,600
# (a few large); aspect (width / height) from the shares below, else anything from 1:2 to 2:1.
_ASPECTS = ((4 / 3, 0.45), (3 / 4, 0.15), (3 / 2, 0.1), (2 / 3, 0.05), (1.0, 0.1))


def imagenet_like_size(rng: np.random.Generator) -> tuple[int, int]:
    """One ``(height, width)`` drawn like an ImageNet training image's.

    Example:
        >>> sizes = [imagenet_like_size(np.random.default_rng(seed)) for seed in range(200)]
        >>> 300 <= sorted(min(size) for size in sizes)[100] <= 500
        True
    """
    longer = 500 if rng.random() < 0.8 else int(rng.uniform(200, 1600))
    aspect = _aspect(rng)
    if aspect >= 1:
        return max(1, round(longer / aspect)), longer
    return longer, max(1, round(longer * aspect))


def _aspect(rng: np.random.Generator) -> float:
    pick = rng.random()
    for aspect, share in _ASPECTS:
        if pick < share:
            return aspect
        pick -= share
    return float(np.exp(rng.uniform(np.log(0.5), np.log(2.0))))


def make_photo_set(
    dst: str | os.PathLike,
    count: int,
    *,
    size: tuple[int, int] | None = None,
    seed: int = 0,
    workers: int | None = None,
) -> Path:
    """Write an ImageFolder of ``count`` photos (spread over the ten classes) into ``dst``, each of
    ``size`` ((height, width); ``None``: drawn like ImageNet's): made in a hidden temporary folder beside
    it and renamed when complete; returns ``dst``.

    Raises:
        FileExistsError: ``dst`` exists.
        ValueError: fewer photos than classes.
    """
    dst = Path(dst)
    if count < len(SOURCES):
        raise ValueError(f"count must be at least {len(SOURCES)} (one photo a class), got {count}")
    if dst.exists():
        raise FileExistsError(f"{dst} already exists; choose another destination")
    partial = dst.with_name(f".{dst.name}.partial")
    if partial.exists():
        shutil.rmtree(partial)  # a run killed while writing it

    def write_class(number: int, name: str) -> None:
        rng = np.random.default_rng([seed, number])
        photo = SOURCES[name]()
        photo = Image.fromarray(photo if photo.ndim == 3 else np.repeat(photo[..., None], 3, axis=2))
        folder = partial / name
        folder.mkdir(parents=True)
        for index in range(number, count, len(SOURCES)):
            _crop(photo, size or imagenet_like_size(rng), rng).save(
                folder / f"{index:06d}.jpg", quality=CAMERA_QUALITY, subsampling="4:2:0"
            )

    with ThreadPoolExecutor(workers or os.cpu_count()) as pool:
        for job in [pool.submit(write_class, number, name) for number, name in enumerate(SOURCES)]:
            job.result()
    os.rename(partial, dst)
    return dst


def _crop(photo: Image.Image, size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    """A random crop of ``photo`` with ``size``'s aspect ratio, resized to ``size``, mirrored or not,
    with a little colour, brightness and sensor-like noise."""
    height, width = size
    aspect = width / height
    largest = (min(photo.height, photo.width / aspect), min(photo.width, photo.height * aspect))  # (h, w)
    share = np.sqrt(rng.uniform(0.25, 1.0))  # of the largest box's sides: a quarter to all of its area
    box_height, box_width = largest[0] * share, largest[1] * share
    top, left = rng.uniform(0, photo.height - box_height), rng.uniform(0, photo.width - box_width)
    image = photo.resize((width, height), Image.Resampling.BICUBIC, box=(left, top, left + box_width, top + box_height))
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    image = ImageEnhance.Color(image).enhance(rng.uniform(0.8, 1.2))
    image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.85, 1.15))
    noisy = np.asarray(image, dtype=np.float32) + rng.normal(0, 2.5, (height, width, 3))
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8))
