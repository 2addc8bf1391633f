"""Which gather fills a batch from one dataset: whole raw images, raw images read at a URL, or crops
(of raw pixels, decoded JPEGs, or JPEGs decoded on the device), as the dataset and ``decode`` ask."""

from __future__ import annotations

from functools import partial

import torch

from ..format.dataset import ImageData, MemmapImageDataset, storage_order
from .crop import CenterCropDecode, RandomResizedCropDecode, crop_raw, crop_remote_raw, decode_crops
from .pipeline import Gather, decode_on_device, index_select, read_raw

__all__ = ["dataset_gather", "stored_pixels"]


def stored_pixels(dataset: MemmapImageDataset | ImageData) -> tuple[torch.Tensor | None, bool]:
    """A dataset's pixels in the order of their bytes and whether that is channels-last: a raw dataset's
    ``[N, H, W, 3]`` view and ``True`` (``[N, 3, H, W]`` and ``False`` for a channel-first one, see
    :func:`~gpuload.format.dataset.storage_order`); ``None`` where the pixels are not in memory (a jpeg
    dataset: ``False``; a raw dataset at a URL: its stored layout).

    Example:
        >>> data = ImageData(images=torch.zeros(2, 3, 4, 5, dtype=torch.uint8), labels=torch.zeros(2, dtype=torch.int64), batch_size=[2])
        >>> pixels, channels_last = stored_pixels(data)
        >>> pixels.shape, channels_last
        (torch.Size([2, 3, 4, 5]), False)
    """
    if isinstance(dataset, MemmapImageDataset) and dataset.storage == "jpeg":
        return None, False
    if isinstance(dataset, MemmapImageDataset) and dataset.remote:
        return None, dataset.manifest.layout == "channels_last"
    data = dataset.data if isinstance(dataset, MemmapImageDataset) else dataset
    return storage_order(data.images)


def dataset_gather(
    dataset: MemmapImageDataset | ImageData,
    decode: RandomResizedCropDecode | CenterCropDecode | None,
    *,
    seed: int,
    epoch: int,
    device: torch.device,
) -> Gather:
    """The gather of ``dataset``'s batches in ``epoch``: ``gather(indices, out)`` fills the uint8 host
    buffer ``out`` ``[B, 3, H, W]`` (or returns the batch made on ``device``, for ``decode.gpu``); a
    crop's also takes ``keys``, the indices its draws are made for (see :func:`~gpuload.loading.crop.decode_crops`).

    Example:
        >>> data = ImageData(images=torch.arange(6, dtype=torch.uint8).view(2, 3, 1, 1), labels=torch.zeros(2, dtype=torch.int64), batch_size=[2])
        >>> out = torch.empty(1, 3, 1, 1, dtype=torch.uint8)
        >>> dataset_gather(data, None, seed=0, epoch=0, device=torch.device("cpu"))(torch.tensor([1]), out)
        >>> out.flatten().tolist()
        [3, 4, 5]
    """
    pixels, channels_last = stored_pixels(dataset)
    crop = {"decode": decode, "seed": seed, "epoch": epoch}
    if isinstance(dataset, MemmapImageDataset) and dataset.storage == "jpeg":
        if decode is not None and decode.gpu:
            return partial(decode_on_device, dataset, decode, seed, epoch, device)
        return partial(decode_crops, dataset, **crop)
    if pixels is None:  # a raw dataset at a URL: its images read by ranges
        return (
            partial(read_raw, dataset, channels_last) if decode is None else partial(crop_remote_raw, dataset, **crop)
        )
    if decode is None:
        return partial(index_select, pixels, channels_last)
    return partial(crop_raw, pixels.permute(0, 3, 1, 2) if channels_last else pixels, **crop)
