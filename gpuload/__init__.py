"""gpuload: get image datasets onto the GPU as fast as the hardware allows.

The public names are imported when first used (a module ``__getattr__``), so ``import gpuload``
and ``gpuload --help`` do not import torch.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version as _version
from typing import TYPE_CHECKING

from .errors import (
    BusyError,
    CompressError,
    DatasetError,
    DecodeError,
    FileError,
    GpuloadError,
    ObjectChangedError,
    RemoteError,
    SourceError,
    UsageError,
)

__version__ = _version("gpuload")

# public name -> the module that defines it
_LAZY = {
    "build_memmap": ".writing.build",
    "CompressReport": ".writing.compress",
    "compress_folder": ".writing.compress",
    "find_ffmpeg": ".writing.compress",
    "GatheredSamples": ".format.dataset",
    "ImageData": ".format.dataset",
    "JpegData": ".format.dataset",
    "MemmapImageDataset": ".format.dataset",
    "RemoteRawData": ".format.dataset",
    "decode_image": ".writing.decode",
    "verify_memmap": ".format.verify",
    "push_memmap": ".remote.push",
    "BlockCache": ".remote.cache",
    "open_store": ".remote.store",
    "Retry": ".remote.store",
    "RemoteFile": ".remote.file",
    "describe_memmap": ".format.verify",
    "Collate": ".loading.collate",
    "CenterCropDecode": ".loading.crop",
    "RandomResizedCropDecode": ".loading.crop",
    "DataLoader": ".loading.loader",
    "IMAGENET_MEAN": ".transforms.normalize",
    "IMAGENET_STD": ".transforms.normalize",
    "Normalize": ".transforms.normalize",
    "RandomResizedCrop": ".transforms.augment",
    "AutoAugment": ".transforms.policies",
    "RandAugment": ".transforms.policies",
    "TrivialAugmentWide": ".transforms.policies",
    "RandomErasing": ".transforms.erasing",
    "MixUpCutMix": ".transforms.mix",
    "Recipe": ".transforms.recipe",
    "default_workers": ".machine",
    "describe_machine": ".machine",
    "machine_line": ".machine",
    "SAMPLE_CLASSES": ".sample",
    "make_sample_folder": ".sample",
}

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "SAMPLE_CLASSES",
    "AutoAugment",
    "BlockCache",
    "BusyError",
    "CenterCropDecode",
    "Collate",
    "CompressError",
    "CompressReport",
    "DataLoader",
    "DatasetError",
    "DecodeError",
    "FileError",
    "GatheredSamples",
    "GpuloadError",
    "ImageData",
    "JpegData",
    "MemmapImageDataset",
    "MixUpCutMix",
    "Normalize",
    "ObjectChangedError",
    "RandAugment",
    "RandomErasing",
    "RandomResizedCrop",
    "RandomResizedCropDecode",
    "Recipe",
    "RemoteError",
    "RemoteFile",
    "RemoteRawData",
    "Retry",
    "SourceError",
    "TrivialAugmentWide",
    "UsageError",
    "build_memmap",
    "compress_folder",
    "decode_image",
    "default_workers",
    "describe_machine",
    "describe_memmap",
    "find_ffmpeg",
    "machine_line",
    "make_sample_folder",
    "open_store",
    "push_memmap",
    "verify_memmap",
]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'gpuload' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what type checkers and IDEs see
    from .format.dataset import GatheredSamples, ImageData, JpegData, MemmapImageDataset, RemoteRawData
    from .format.verify import describe_memmap, verify_memmap
    from .loading.collate import Collate
    from .loading.crop import CenterCropDecode, RandomResizedCropDecode
    from .loading.loader import DataLoader
    from .machine import default_workers, describe_machine, machine_line
    from .remote.cache import BlockCache
    from .remote.file import RemoteFile
    from .remote.push import push_memmap
    from .remote.store import Retry, open_store
    from .sample import SAMPLE_CLASSES, make_sample_folder
    from .transforms.augment import RandomResizedCrop
    from .transforms.erasing import RandomErasing
    from .transforms.mix import MixUpCutMix
    from .transforms.normalize import IMAGENET_MEAN, IMAGENET_STD, Normalize
    from .transforms.policies import AutoAugment, RandAugment, TrivialAugmentWide
    from .transforms.recipe import Recipe
    from .writing.build import build_memmap
    from .writing.compress import CompressReport, compress_folder, find_ffmpeg
    from .writing.decode import decode_image
