"""gpuload/loading/device.py: the loader's device, and whether TorchCodec decodes JPEGs with nvJPEG on it."""

import sys

import pytest
import simplejpeg
import torch

from gpuload import UsageError
from gpuload.loading.device import check_gpu_decode, current_device, resolve_device


def test_a_device_is_resolved_as_torch_names_it():
    assert resolve_device("cpu") == torch.device("cpu") and current_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 1)], ids=["any", "index0", "index1"])
def test_cuda_without_cuda_is_refused(device, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"CUDA is not available.*use device='cpu'"):
        resolve_device(device)


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        ("missing", r"TorchCodec's nvJPEG .* does not load here \(ModuleNotFoundError"),
        ("no_decode_jpeg", r"does not load here \(ImportError"),  # 0.8 to 0.15: no decode_jpeg
        ("broken", r"does not load here \(RuntimeError: Could not load libtorchcodec\)"),  # no FFmpeg, say
        ("0.16", r"needs TorchCodec 0.17 or newer, found 0.16.0\+cu130"),
        ("no_nvjpeg", r"TorchCodec 0.17.0 could not decode a 16x16 JPEG on cuda \(RuntimeError: nvjpegCreate"),
        ("wrong_shape", r"TorchCodec 0.17.0 decoded a 16x16 RGB JPEG to shape \[16, 16, 3\]"),
    ],
)
def test_gpu_decode_without_a_working_torchcodec_says_what_to_install(monkeypatch, failure, message):
    """Each is refused when the loader is made, never found at the first batch, a quiet CPU fallback
    or a traceback: the check decodes a small JPEG on the device."""
    import types

    package = types.ModuleType("torchcodec")
    package.__version__ = "0.16.0+cu130" if failure == "0.16" else "0.17.0"
    decoders = types.ModuleType("torchcodec.decoders")

    def decode_jpeg(blobs, mode, device):
        assert isinstance(blobs, list) and mode == "RGB" and device == torch.device("cuda", 0)
        if failure == "no_nvjpeg":
            raise RuntimeError("nvjpegCreate failed: NVJPEG_STATUS_LIBRARY_NOT_INITIALIZED\nmore")
        image = torch.from_numpy(simplejpeg.decode_jpeg(blobs[0]))  # [16, 16, 3]
        return [image if failure == "wrong_shape" else image.permute(2, 0, 1)]

    if failure != "no_decode_jpeg":
        decoders.decode_jpeg = decode_jpeg
    if failure == "broken":
        decoders.__getattr__ = lambda name: (_ for _ in ()).throw(RuntimeError("Could not load libtorchcodec"))
        del decoders.decode_jpeg
    monkeypatch.setitem(sys.modules, "torchcodec", None if failure == "missing" else package)
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", decoders)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(UsageError, match=message) as refused:
        check_gpu_decode(torch.device("cuda"))
    assert str(refused.value).count("\n") == 0
    assert str(refused.value).endswith("pip install 'gpuload[cuda]' (TorchCodec 0.17 or newer), or use gpu=False")


def test_a_working_torchcodec_passes_the_check(monkeypatch):
    import types

    package, decoders = types.ModuleType("torchcodec"), types.ModuleType("torchcodec.decoders")
    package.__version__ = "0.17.0"
    decoders.decode_jpeg = lambda blobs, mode, device: [
        torch.from_numpy(simplejpeg.decode_jpeg(blob)).permute(2, 0, 1) for blob in blobs
    ]
    monkeypatch.setitem(sys.modules, "torchcodec", package)
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", decoders)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    check_gpu_decode(torch.device("cuda"))
