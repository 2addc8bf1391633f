"""Crops in the loader's threads: each jpeg image decoded only as large as its crop needs, each raw
image read only where its crop lies.

``gpuload.DataLoader(jpeg_dataset, decode=RandomResizedCropDecode(224))`` decodes every sample of a
batch in the loader's threads: libjpeg-turbo (simplejpeg, which releases the GIL) decodes at the
smallest DCT scale (1/8, 1/4, 1/2 or 1) at which the sample's crop box is still at least as large
as the output, and only the box's rows (:func:`gpuload.writing.jpeg.row_window`: all rows below the
box are skipped, and those above it too where restart markers begin MCU rows, as in the JPEGs
that ``gpuload compress`` writes); the box is cut out and resized (torch's antialiased bilinear
uint8 resize), flipped when drawn so, and written into the batch's pinned buffer: fixed-size uint8
``[B, 3, S, S]`` batches, channels-last, that go to the device exactly as raw batches do.

``gpuload.DataLoader(raw_dataset, decode=RandomResizedCropDecode(224))`` does the same for a raw
dataset (:func:`crop_raw`): nothing to decode, the box's rows are read from the memory-mapped
pixels (a channels-last image's rows lie one after the other, so only their pages are touched),
resized and flipped into the batch: the crop runs where it is cheapest on a CPU, and only
``S x S`` pixels per image cross to the device.

The random boxes and flips are a pure function of (seed, epoch, sample index), by a counter-based
hash (splitmix64): an epoch is the same whatever the thread scheduling, and a resumed epoch
replays it exactly. Their distribution is torchvision's ``RandomResizedCrop`` (the same code as
:class:`gpuload.RandomResizedCrop`, :func:`gpuload.transforms.augment.resized_crop_boxes`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import torch

from ..errors import DatasetError, UsageError
from ..format.dataset import MemmapImageDataset, decode_jpeg_bytes
from ..text import image_size
from ..transforms.augment import (
    CROP_DRAWS,
    box_geometry,
    centre_offset,
    centre_window,
    check_eval_ratio,
    check_range,
    check_size,
    interpolation_weights,
    resample,
    resized_crop_boxes,
    resized_size,
)
from ..writing.decode import resize_image
from ..writing.jpeg import frame_size, row_window, scale_is_exact

__all__ = [
    "CenterCropDecode",
    "RandomResizedCropDecode",
    "counter_uniforms",
    "crop_raw",
    "crop_remote_raw",
    "decode_batch",
    "decode_crops",
    "resample_params",
    "scaled_window",
]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class RandomResizedCropDecode:
    """Load each image of a dataset already cropped: a random resized crop (torchvision's
    distribution), optionally mirrored, for training. "Decode" as in "at load time": a jpeg dataset's
    images are decoded only as far as the crop needs, a raw dataset's are read only where the box
    lies (``fast`` and ``gpu`` apply to jpeg datasets only).

    Each jpeg image is decoded at the smallest DCT scale (1/8, 1/4, 1/2 or 1) at which its box is still
    at least the output's size (and which libjpeg-turbo takes exactly: not for images a few pixels
    across), and only down to the box's last rows (from its first rows too where restart markers
    begin MCU rows, as in the JPEGs ``gpuload compress`` writes); the box is then cut out on that
    scale's pixel grid (its top and left edges move by less than one pixel of that scale, its
    bottom and right by up to half of one) and resized. With ``fast=False`` and a box smaller than twice the output, the pixels are
    exactly torchvision's ``resized_crop(antialias=True)`` of the full decode.

    Args:
        size: output side, or ``(height, width)``.
        scale: range of the box's area, as a fraction of the image's.
        ratio: range of the box's aspect ratio (width / height).
        flip: mirror each sample left-right with probability 1/2.
        fast: libjpeg-turbo's fast integer DCT and fast upsampling: faster, with pixels that differ
            slightly from the accurate decode (measured in ``experiments/jpeg_store.py``).
        gpu: decode on the loader's CUDA device (see :func:`decode_batch`).

    Example:
        >>> decode = RandomResizedCropDecode(224)
        >>> boxes, flips = decode.draw(torch.tensor([[480, 640], [300, 200]]), torch.tensor([0, 1]), seed=0, epoch=0)
        >>> boxes.shape, flips.shape
        (torch.Size([2, 4]), torch.Size([2]))
    """

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        *,
        flip: bool = True,
        fast: bool = True,
        gpu: bool = False,
    ) -> None:
        self.size = check_size(size)
        self.scale = check_range("scale", scale, low=0.0, high=1.0)
        self.ratio = check_range("ratio", ratio, low=0.0, high=math.inf)
        if not all(isinstance(flag, bool) for flag in (flip, fast, gpu)):
            raise UsageError(f"flip, fast and gpu must be bools, got {flip!r}, {fast!r} and {gpu!r}")
        self.flip, self.fast, self.gpu = flip, fast, gpu

    def draw(
        self, shapes: torch.Tensor, indices: torch.Tensor, *, seed: int, epoch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The crop box (``top, left, height, width``) and flip of each sample, from its image's
        ``(height, width)`` and its index: the same for the same (seed, epoch, index)."""
        uniform = counter_uniforms(seed, epoch, indices, 2 * CROP_DRAWS + 1)
        draws = uniform[:, : 2 * CROP_DRAWS].reshape(len(indices), CROP_DRAWS, 2)
        boxes = resized_crop_boxes(draws, shapes[:, 0], shapes[:, 1], self.scale, self.ratio)
        flips = uniform[:, -1] < 0.5 if self.flip else torch.zeros(len(indices), dtype=torch.bool)
        return boxes, flips

    def decode(
        self,
        data: bytes,
        shape: list[int],
        box: list[float],
        flip: bool,
        name: Callable[[], str],
        out: torch.Tensor,
        scratch: Scratch,
    ) -> None:
        """One image into ``out`` (``[3, S, S]``): decoded into ``scratch`` at the smallest DCT scale
        that keeps its box at least the output's size, the box cut out, resized and maybe mirrored."""
        height, width = shape
        denominator, (y0, y1), (x0, x1) = self.scaled_box(shape, box)
        scaled = (-(-height // denominator), -(-width // denominator))  # libjpeg's size at 1/denominator
        _check_header(data, shape, name)  # never cut by a damaged index
        # Decode only the box's rows (scaled row k is rows k*d to k*d + d - 1 of the image):
        # libjpeg's smooth upsampling (accurate mode) reads one more MCU row on each side.
        window = row_window(data, y0 * denominator, min(height, y1 * denominator), context=not self.fast)
        if window is not None and not scale_is_exact(denominator, window[2], width):
            window = None  # a few rows of an image a few pixels wide: the scale would not be 1/denominator
        data, first, rows = window if window is not None else (data, 0, height)
        pixels = decode_jpeg_bytes(
            data,
            name,
            fast=self.fast,
            min_height=-(-rows // denominator),
            min_width=scaled[1],
            buffer=scratch.get(3 * height * width),
            strict=window is None,
        )
        _check_size(pixels.shape[:2], (-(-rows // denominator), scaled[1]), shape, name)
        offset = first // denominator  # the window starts at an MCU row: a multiple of 8 rows
        _resize_into(pixels[y0 - offset : y1 - offset, x0:x1], flip, out)

    def scaled_box(self, shape: list[int], box: list[float]) -> tuple[int, tuple[int, int], tuple[int, int]]:
        """Where :meth:`decode` cuts a jpeg image of ``shape`` (height, width) for ``box``: the DCT scale's
        denominator, and the box's rows and columns on that scale's pixel grid (``[y0, y1)``, ``[x0, x1)``).

        Example:
            >>> RandomResizedCropDecode(16).scaled_box([480, 640], [7, 0, 103, 200])
            (4, (1, 28), (0, 50))
        """
        (height, width), (top, left, box_height, box_width) = shape, box
        out_height, out_width = self.size
        denominator = next(
            (
                d
                for d in (8, 4, 2)
                if box_height >= d * out_height and box_width >= d * out_width and scale_is_exact(d, height, width)
            ),
            1,
        )
        scaled = (-(-height // denominator), -(-width // denominator))  # libjpeg's size at 1/denominator
        return (
            denominator,
            scaled_window(top, box_height, denominator, scaled[0]),
            scaled_window(left, box_width, denominator, scaled[1]),
        )

    def crop(self, pixels: torch.Tensor, box: list[float], flip: bool, out: torch.Tensor) -> None:
        """One raw image (``[H, W, 3]``, a view of the stored pixels) into ``out`` (``[3, S, S]``):
        its box cut out (a view: only the box's rows are read), resized and maybe mirrored."""
        top, left, height, width = (int(side) for side in box)
        _resize_into(pixels[top : top + height, left : left + width], flip, out)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio}, "
            f"flip={self.flip}, fast={self.fast}, gpu={self.gpu})"
        )


def scaled_window(start: float, length: float, denominator: int, scaled: int) -> tuple[int, int]:
    """A box's side ``[start, start + length)`` on the pixel grid of a 1/``denominator`` DCT-scaled
    decode (``scaled`` pixels long): scaled pixel ``k`` holds image pixels ``k*d`` to ``k*d + d - 1``,
    so the first edge moves by less than one scaled pixel and the last by at most half of one
    (clipped to the image), and at least one pixel is kept.

    Example:
        >>> scaled_window(7, 103, 8, 16)  # image rows 7 to 109: scaled rows 0 to 13
        (0, 14)
    """
    first = int(start // denominator)
    return first, max(first + 1, min(scaled, round((start + length) / denominator)))


class CenterCropDecode:
    """Load each image of a dataset (a jpeg one decoded at full scale, a raw one as stored), then
    torchvision's evaluation transform: the shorter side resized to ``round(size / ratio)``
    (``Resize(256)`` for 224) and the centre cut out (``CenterCrop(224)``, which pads an image too
    small with zeros). With ``ratio=1`` and jpeg images already at ``size``, the whole images,
    decoded straight into the batch (``fast`` and ``gpu`` apply to jpeg datasets only).

    Args:
        size: output side, or ``(height, width)``.
        ratio: the output's share of the resized shorter side.
        fast: libjpeg-turbo's fast integer DCT and fast upsampling (FFCV's jpg mode decodes with the
            fast DCT); off by default, since evaluation wants the exact pixels.
        gpu: decode on the loader's CUDA device (see :func:`decode_batch`).

    Example:
        >>> CenterCropDecode(224)
        CenterCropDecode(size=(224, 224), ratio=0.8750, fast=False, gpu=False)
    """

    def __init__(
        self, size: int | Sequence[int], *, ratio: float = 224 / 256, fast: bool = False, gpu: bool = False
    ) -> None:
        self.size = check_size(size)
        check_eval_ratio("ratio", ratio, self.size)
        if not all(isinstance(flag, bool) for flag in (fast, gpu)):
            raise UsageError(f"fast and gpu must be bools, got {fast!r} and {gpu!r}")
        self.ratio, self.fast, self.gpu = float(ratio), fast, gpu

    def draw(self, shapes: torch.Tensor, indices: torch.Tensor, *, seed: int, epoch: int) -> tuple[None, None]:
        """Nothing is random."""
        return None, None

    def decode(
        self,
        data: bytes,
        shape: list[int],
        box: None,
        flip: None,
        name: Callable[[], str],
        out: torch.Tensor,
        scratch: Scratch,
    ) -> None:
        """One image into ``out`` (``[3, S, S]``): decoded, resized as torchvision's ``Resize``, its
        centre cut out. An image already at the output's size is decoded straight into ``out``."""
        height, width = shape
        _check_header(data, shape, name)
        resized = resized_size(height, width, self.size, self.ratio)
        if resized == (height, width) == self.size and out.permute(1, 2, 0).is_contiguous():
            whole = decode_jpeg_bytes(data, name, fast=self.fast, buffer=out.permute(1, 2, 0).numpy())
            _check_size(whole.shape[:2], self.size, shape, name)
            return
        pixels = decode_jpeg_bytes(data, name, fast=self.fast, buffer=scratch.get(3 * height * width))
        _check_size(pixels.shape[:2], (height, width), shape, name)
        self.crop(torch.from_numpy(pixels), None, None, out)

    def crop(self, pixels: torch.Tensor, box: None, flip: None, out: torch.Tensor) -> None:
        """One image's pixels (``[H, W, 3]``: decoded, or a view of a raw dataset's) into ``out``
        (``[3, S, S]``): resized as torchvision's ``Resize``, its centre cut out."""
        height, width = pixels.shape[:2]
        resized = resized_size(height, width, self.size, self.ratio)
        image = _resize_hwc(pixels, resized)
        (top, to_top, rows), (left, to_left, columns) = (
            centre_window(resized[0], self.size[0]),
            centre_window(resized[1], self.size[1]),
        )
        if rows < self.size[0] or columns < self.size[1]:
            out.zero_()  # CenterCrop pads an image smaller than the output with zeros
        out[:, to_top : to_top + rows, to_left : to_left + columns] = image[:, top : top + rows, left : left + columns]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, ratio={self.ratio:.4f}, fast={self.fast}, gpu={self.gpu})"


class Scratch:
    """One decode buffer for a batch, grown to the largest image decoded into it (sized only once
    the image's header has confirmed its recorded size).

    Example:
        >>> scratch = Scratch()
        >>> scratch.get(12).size, scratch.get(6).size
        (12, 12)
    """

    def __init__(self) -> None:
        self.buffer = np.empty(0, dtype=np.uint8)

    def get(self, size: int) -> np.ndarray:
        if self.buffer.size < size:
            self.buffer = np.empty(size, dtype=np.uint8)
        return self.buffer


def _check_header(data: bytes, shape: list[int], name: Callable[[], str]) -> None:
    """The stored JPEG's frame header must give the size the dataset's index records."""
    found = frame_size(data)
    if found is None:
        raise DatasetError(f"{name()} has no JPEG frame header; rebuild the dataset")
    _check_size(found, tuple(shape), shape, name)


def _check_size(found: Sequence[int], expected: tuple[int, int], shape: list[int], name: Callable[[], str]) -> None:
    """An image must decode (or its header say it does) at the size the dataset's index records (at
    the DCT scale asked for): else ``shapes.memmap`` was damaged, and a crop computed from it would be wrong."""
    if tuple(found) != tuple(expected):
        scaled = "" if tuple(expected) == tuple(shape) else f" gives {image_size(*expected)}"
        raise DatasetError(
            f"{name()} decodes to {image_size(*found)} where its recorded size is {image_size(*shape)}{scaled}: "
            f"shapes.memmap is damaged; run gpuload verify, then rebuild the dataset"
        )


def _resize_hwc(pixels: np.ndarray | torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Antialiased bilinear resize of uint8 ``[h, w, 3]`` pixels (a view of the decoder's buffer or
    of a raw dataset's image) to ``[3, *size]`` in channels-last memory: torch's uint8 resize works
    in that layout, and so do the loader's batches, so no pixel is transposed."""
    image = (torch.from_numpy(pixels) if isinstance(pixels, np.ndarray) else pixels).permute(2, 0, 1)
    if tuple(image.shape[1:]) == tuple(size):
        return image
    return resize_image(image[None].contiguous(memory_format=torch.channels_last), size)


def _resize_into(pixels: np.ndarray | torch.Tensor, flip: bool, out: torch.Tensor) -> None:
    """``[h, w, 3]`` pixels resized to ``out``'s size (``[3, S, S]``) and written into it, mirrored left-right
    when ``flip``."""
    resized = _resize_hwc(pixels, tuple(out.shape[1:]))
    out.copy_(resized.flip(-1) if flip else resized)


def decode_crops(
    dataset: MemmapImageDataset,
    indices: torch.Tensor,
    out: torch.Tensor,
    decode: RandomResizedCropDecode | CenterCropDecode,
    *,
    seed: int,
    epoch: int,
    keys: torch.Tensor | None = None,
) -> None:
    """Decode the images ``indices`` of a jpeg dataset, each cropped as ``decode`` says, into ``out``
    (uint8 ``[len(indices), 3, S, S]``, channels-last memory is fastest), through one reused decode
    buffer. The boxes and flips are drawn for ``keys`` (default ``indices``): the indices that a
    ``ConcatDataset`` of this dataset gives these images, so that its parts draw apart.

    Raises:
        DatasetError: an image's bytes fail their checksum or do not decode (named, with its source).
    """
    shapes = dataset.data.shapes[indices]
    boxes, flips = decode.draw(shapes, indices if keys is None else keys, seed=seed, epoch=epoch)
    scratch = Scratch()
    blobs = dataset.read_images(indices.tolist())  # at a URL: the batch's reads in parallel
    for row, (index, shape) in enumerate(zip(indices.tolist(), shapes.tolist())):
        box = None if boxes is None else boxes[row].tolist()
        flip = None if flips is None else bool(flips[row])
        decode.decode(blobs[row], shape, box, flip, partial(dataset.describe, index), out[row], scratch)
        blobs[row] = None  # what is decoded can go


def crop_raw(
    images: torch.Tensor,
    indices: torch.Tensor,
    out: torch.Tensor,
    decode: RandomResizedCropDecode | CenterCropDecode,
    *,
    seed: int,
    epoch: int,
    keys: torch.Tensor | None = None,
) -> None:
    """Crop the images ``indices`` of a raw dataset as ``decode`` says into ``out`` (uint8
    ``[len(indices), 3, S, S]``, channels-last memory is fastest): the same boxes and flips as a
    jpeg dataset of the same images gets for the same (seed, epoch, index), drawn for ``keys``
    (default ``indices``, see :func:`decode_crops`).

    ``images``: the dataset's ``[N, 3, H, W]``; each crop reads only its box's rows of the mapped
    file (channels-last) or its box's pixels (a channel-first dataset of format version 1 or 2).

    Example:
        >>> images = torch.randint(0, 256, (4, 3, 12, 16), dtype=torch.uint8)
        >>> out = torch.empty(2, 3, 8, 8, dtype=torch.uint8)
        >>> crop_raw(images, torch.tensor([3, 0]), out, RandomResizedCropDecode(8), seed=0, epoch=0)
        >>> out.shape
        torch.Size([2, 3, 8, 8])
    """
    keys = indices if keys is None else keys
    boxes, flips = _same_size_draws(decode, images.shape[2:], keys, seed=seed, epoch=epoch)
    for row, index in enumerate(indices.tolist()):
        decode.crop(images[index].permute(1, 2, 0), boxes[row], flips[row], out[row])


def _same_size_draws(
    decode: RandomResizedCropDecode | CenterCropDecode,
    size: Sequence[int],
    indices: torch.Tensor,
    *,
    seed: int,
    epoch: int,
) -> tuple[list, list]:
    """The boxes and flips of ``indices`` in a raw dataset (every image ``size``, height and width), as
    lists of one entry per image (``None`` where ``decode`` draws none)."""
    count = len(indices)
    shapes = torch.tensor(tuple(size), dtype=torch.int64).expand(count, 2)
    boxes, flips = decode.draw(shapes, indices, seed=seed, epoch=epoch)
    return (
        boxes.tolist() if boxes is not None else [None] * count,
        flips.tolist() if flips is not None else [None] * count,
    )


def crop_remote_raw(
    dataset: MemmapImageDataset,
    indices: torch.Tensor,
    out: torch.Tensor,
    decode: RandomResizedCropDecode | CenterCropDecode,
    *,
    seed: int,
    epoch: int,
    keys: torch.Tensor | None = None,
) -> None:
    """:func:`crop_raw` for a raw dataset at a URL: each image read whole (its checksum checked, through
    the node's block cache), then cropped as ``decode`` says into ``out``: the same boxes and flips."""
    keys = indices if keys is None else keys
    boxes, flips = _same_size_draws(decode, dataset.image_shape[1:], keys, seed=seed, epoch=epoch)
    blobs = dataset.read_images(indices.tolist())
    for row in range(len(indices)):
        decode.crop(dataset.raw_pixels(blobs[row]).permute(1, 2, 0), boxes[row], flips[row], out[row])
        blobs[row] = None


# What one step of decode_batch holds on the device: the decoded uint8 pixels of one nvJPEG call, and
# the float pixels of one resampling chunk (its images padded to the chunk's largest height and width,
# in the compute dtype). A single image may exceed either: with Pillow's default pixel limit (89.5 MP)
# one image is at most about 540 MB in float16; a build with --max-pixels 0 can store larger ones, for
# which --max-side bounds what the GPU decode holds.
GPU_DECODE_BYTES = 256 * 2**20
GPU_CHUNK_BYTES = 512 * 2**20
_PAD_WASTE = 2.0  # a chunk's padded pixels at most this many times its images' own
_PARAMS = 10  # per sample: start, step, low, high (rows), the same (columns), flip, its batch row


def decode_batch(
    dataset: MemmapImageDataset,
    indices: torch.Tensor,
    decode: RandomResizedCropDecode | CenterCropDecode,
    *,
    seed: int,
    epoch: int,
    device: torch.device,
    decode_bytes: int = GPU_DECODE_BYTES,
    chunk_bytes: int = GPU_CHUNK_BYTES,
) -> torch.Tensor:
    """A batch of a jpeg dataset decoded on ``device`` and cropped there: uint8 ``[B, 3, S, S]``,
    channels-last, queued on the current stream.

    The calling thread reads (and checks) the bytes and draws every box and flip from the recorded
    sizes; the resampling parameters go to the device in one pinned, non-blocking copy. The images,
    sorted by height and width, are decoded in as few calls as ``decode_bytes`` of uint8 pixels allow
    (the whole batch in one, usually): on CUDA one nvJPEG call through TorchCodec
    (``pip install 'gpuload[cuda]'``, TorchCodec 0.17 or newer, which synchronises its stream around
    the call), an image nvJPEG refuses decoded by libjpeg-turbo instead and uploaded (with a warning
    naming it); on the CPU libjpeg-turbo decodes each image. Each call's images are then resampled in
    chunks of similar sizes, padded to the chunk's largest (at most ``chunk_bytes`` of float pixels
    and twice the images' own), by two batched matrix products with per-sample interpolation
    matrices (built in float32, applied in float16 on CUDA, autocast off: the resampler of
    :class:`gpuload.RandomResizedCrop`), written into the batch, whose rows are put back in the
    batch's order by one gather. Memory stays bounded whatever the sizes.

    Raises:
        DatasetError: an image's bytes fail their checksum, its header or its decode disagree with its
            recorded size, or no decoder reads it.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from gpuload import build_memmap, make_sample_folder
        >>> src = make_sample_folder(Path(tempfile.mkdtemp()) / "p", images_per_class=1, size=(24, 32))
        >>> dataset = MemmapImageDataset(build_memmap(src, format="jpeg", progress=False))
        >>> batch = decode_batch(dataset, torch.tensor([2, 0]), CenterCropDecode(16), seed=0, epoch=0, device=torch.device("cpu"))
        >>> batch.shape, batch.is_contiguous(memory_format=torch.channels_last)
        (torch.Size([2, 3, 16, 16]), True)
    """
    shapes = dataset.data.shapes[indices]
    names = [partial(dataset.describe, index) for index in indices.tolist()]
    blobs = dataset.read_images(indices.tolist())
    for blob, shape, name in zip(blobs, shapes.tolist(), names):
        _check_header(blob, shape, name)  # before sizing anything by shapes
    order = sorted(range(len(blobs)), key=lambda row: (*shapes[row].tolist(), row))  # by size, stable
    sizes = [tuple(shapes[row].tolist()) for row in order]
    params = resample_params(decode, shapes, indices, seed, epoch)[order]
    params[:, 9] = torch.tensor(order, dtype=torch.float32)  # where each sorted row goes in the batch
    on_device = params.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else params
    compute = torch.float16 if device.type == "cuda" else torch.float32
    (out_height, out_width), count = decode.size, len(blobs)
    made = torch.empty((count, out_height, out_width, 3), dtype=torch.uint8, device=device)  # sorted rows
    decoder = _batch_decoder(device)
    for first, last in _decode_calls(sizes, decode_bytes):
        rows = order[first:last]
        images = _decode_with_fallback(decoder, [blobs[row] for row in rows], [names[row] for row in rows], device)
        for image, size, row in zip(images, sizes[first:last], rows):
            _check_size(image.shape[1:], size, list(size), names[row])  # shapes on the host: no sync
        for start, end in _chunks(sizes[first:last], chunk_bytes, compute.itemsize):
            height = sizes[first + end - 1][0]  # sorted: the chunk's tallest is its last
            width = max(size[1] for size in sizes[first + start : first + end])
            pixels = torch.zeros((end - start, 3, height, width), dtype=compute, device=device)
            for padded, image in zip(pixels, images[start:end]):
                padded[:, : image.shape[1], : image.shape[2]].copy_(image)  # the cast in the copy
            chunk = on_device[first + start : first + end]
            weights_y = interpolation_weights(*chunk[:, 0:4].unbind(1), out_height, height)
            weights_x = interpolation_weights(*chunk[:, 4:8].unbind(1), out_width, width)
            weights_x = torch.where(chunk[:, 8, None, None] > 0.5, weights_x.flip(1), weights_x)
            resampled = resample(pixels, weights_y.to(compute), weights_x.to(compute))
            made[first + start : first + end].copy_(resampled.round_().clamp_(0, 255).permute(0, 2, 3, 1))
        del images
    batch = torch.empty_like(made)
    batch.index_copy_(0, on_device[:, 9].long(), made)  # back in the batch's order
    return batch.permute(0, 3, 1, 2)


def _decode_calls(sizes: list[tuple[int, int]], budget: int) -> list[tuple[int, int]]:
    """``(start, end)`` of the decoder calls over ``sizes``: as many images a call as fit in ``budget``
    bytes of uint8 ``3 x H x W`` pixels (a call holds at least one image).

    Example:
        >>> _decode_calls([(2, 2), (2, 2), (4, 4)], budget=60)
        [(0, 2), (2, 3)]
    """
    calls, start, held = [], 0, 0
    for end, (height, width) in enumerate(sizes):
        if end > start and held + 3 * height * width > budget:
            calls.append((start, end))
            start, held = end, 0
        held += 3 * height * width
    return calls + [(start, len(sizes))] if sizes else calls


def _chunks(sizes: list[tuple[int, int]], budget: int, itemsize: int) -> list[tuple[int, int]]:
    """``(start, end)`` of the resampling chunks over ``sizes`` (sorted by height, then width): each
    chunk's images padded to its tallest and widest take at most ``budget`` bytes of ``3 x H x W``
    pixels of ``itemsize`` bytes, and at most ``_PAD_WASTE`` times the images' own pixels (a chunk
    holds at least one image).

    Example:
        >>> _chunks([(2, 2), (2, 2), (2, 2), (4, 4)], budget=48, itemsize=2)
        [(0, 2), (2, 3), (3, 4)]
    """
    chunks, start, widest, own = [], 0, 0, 0
    for end, (height, width) in enumerate(sizes):
        padded = (end - start + 1) * height * max(widest, width)
        if end > start and (3 * padded * itemsize > budget or padded > _PAD_WASTE * (own + height * width)):
            chunks.append((start, end))
            start, widest, own = end, 0, 0
        widest, own = max(widest, width), own + height * width
    return chunks + [(start, len(sizes))] if sizes else chunks


_Decoder = Callable[[list[bytes], list[Callable[[], str]]], list[torch.Tensor]]


def _batch_decoder(device: torch.device) -> _Decoder:
    """The decoder of a list of JPEGs (and their names, for errors) on ``device``: ``[3, H, W]`` uint8
    each, RGB. On CUDA, nvJPEG through TorchCodec, one call for the list (its presence was checked when
    the loader was made); elsewhere, libjpeg-turbo one image at a time."""
    if device.type == "cuda":
        from torchcodec.decoders import decode_jpeg

        # RGB: grayscale JPEGs (stored as they are) too
        return lambda blobs, names: decode_jpeg(blobs, mode="RGB", device=device)
    return lambda blobs, names: [
        torch.from_numpy(decode_jpeg_bytes(blob, name)).permute(2, 0, 1) for blob, name in zip(blobs, names)
    ]


def _decode_with_fallback(
    decoder: _Decoder, blobs: list[bytes], names: list[Callable[[], str]], device: torch.device
) -> list[torch.Tensor]:
    """``decoder`` on all of ``blobs``; where it refuses them, on each alone, and an image it refuses
    (a JPEG nvJPEG does not support: an unusual chroma subsampling...) decoded by libjpeg-turbo and
    copied to ``device``, with a warning that names it.

    Raises:
        DatasetError: libjpeg-turbo does not decode a refused image either (named).
    """
    try:
        return decoder(blobs, names)
    except RuntimeError:
        pass  # which image? each alone
    images = []
    for blob, name in zip(blobs, names):
        try:
            images += decoder([blob], [name])
        except RuntimeError as error:
            pixels = torch.from_numpy(decode_jpeg_bytes(blob, name)).permute(2, 0, 1)
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            warnings.warn(
                f"the GPU decoder refused {name()} ({reason}); decoded by libjpeg-turbo on the CPU instead",
                RuntimeWarning,
                stacklevel=2,
            )
            images.append(pixels.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else pixels)
    return images


def resample_params(
    decode: RandomResizedCropDecode | CenterCropDecode,
    shapes: torch.Tensor,
    indices: torch.Tensor,
    seed: int,
    epoch: int,
) -> torch.Tensor:
    """float32 ``[B, 10]`` on the CPU, drawn from the recorded sizes: for each sample, the arguments of
    :func:`~gpuload.transforms.augment.interpolation_weights` along its rows then its columns (start,
    step, low, high), its flip (1 or 0) (what :func:`gpuload.transforms.masks.crop_masks` takes too), and
    a column for the caller.

    Example:
        >>> resample_params(CenterCropDecode(2, ratio=1.0), torch.tensor([[4, 4]]), torch.tensor([0]), 0, 0)[0, :9]
        tensor([0., 2., 0., 4., 0., 2., 0., 4., 0.])
    """
    height, width = shapes[:, 0].double(), shapes[:, 1].double()
    out_height, out_width = decode.size
    params = torch.zeros((len(shapes), _PARAMS), dtype=torch.float64)
    if isinstance(decode, RandomResizedCropDecode):
        boxes, flips = decode.draw(shapes, indices, seed=seed, epoch=epoch)
        params[:, :8] = box_geometry(boxes, decode.size)
        params[:, 8] = flips.double()
    else:  # torchvision's Resize(round(size / ratio)), then CenterCrop(size), in input pixels
        resized = torch.tensor(
            [resized_size(h, w, decode.size, decode.ratio) for h, w in shapes.tolist()], dtype=torch.float64
        ).reshape(-1, 2)
        step_y, step_x = height / resized[:, 0], width / resized[:, 1]
        top = torch.tensor([centre_offset(int(side), out_height) for side in resized[:, 0]], dtype=torch.float64)
        left = torch.tensor([centre_offset(int(side), out_width) for side in resized[:, 1]], dtype=torch.float64)
        zero = torch.zeros_like(height)
        columns = (top * step_y, step_y, zero, height, left * step_x, step_x, zero, width)
        params[:, :8] = torch.stack(columns, dim=1)
    return params.float()


def counter_uniforms(seed: int, epoch: int, indices: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` uniform floats in [0, 1) per index, a pure function of (seed, epoch, index).

    A counter-based generator: splitmix64 of a key made from the seed and the epoch, mixed with
    each (index, draw) counter; no state, so any sample can be drawn in any order or thread.

    Example:
        >>> first = counter_uniforms(7, 0, torch.tensor([3, 5]), 4)
        >>> bool(torch.equal(first[1], counter_uniforms(7, 0, torch.tensor([5]), 4)[0])), first.shape
        (True, torch.Size([2, 4]))
    """
    with np.errstate(over="ignore"):
        key = _splitmix64(_splitmix64(np.uint64(seed % 2**64)) ^ np.uint64(epoch % 2**64))
        counters = np.asarray(indices, dtype=np.uint64)[:, None] * np.uint64(count) + np.arange(count, dtype=np.uint64)
        bits = _splitmix64(key ^ _splitmix64(counters))
    return torch.from_numpy((bits >> np.uint64(11)).astype(np.float64) * 2.0**-53)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
