"""gpuload: get image datasets onto the GPU as fast as the hardware allows."""

from importlib.metadata import version as _version

from .store.build import build_memmap
from .loading.collate import Collate
from .store.compress import CompressReport, compress_folder, find_ffmpeg
from .store.dataset import GatheredSamples, ImageData, MemmapImageDataset
from .store.decode import DecodeError, decode_image
from .loading.loader import DataLoader
from .machine import default_workers, describe_machine, machine_line
from .store.manifest import DatasetError
from .transforms.normalize import IMAGENET_MEAN, IMAGENET_STD, Normalize
from .sample import SAMPLE_CLASSES, make_sample_folder

__version__ = _version("gpuload")

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "SAMPLE_CLASSES",
    "Collate",
    "CompressReport",
    "DataLoader",
    "DatasetError",
    "DecodeError",
    "GatheredSamples",
    "ImageData",
    "MemmapImageDataset",
    "Normalize",
    "build_memmap",
    "compress_folder",
    "decode_image",
    "default_workers",
    "describe_machine",
    "find_ffmpeg",
    "machine_line",
    "make_sample_folder",
]
