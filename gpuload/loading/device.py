"""The loader's device: which one a loader copies to, and whether it can decode JPEGs with nvJPEG."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import torch

from ..errors import UsageError

__all__ = ["check_gpu_decode", "current_device", "resolve_device"]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` checked; CUDA when available and ``device`` is ``None``. ``"cuda"`` without an index
    stays so: it means the current device when a batch is made (see :func:`current_device`).

    Raises:
        UsageError: not a device torch knows, not CPU or CUDA, or CUDA where there is none.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except RuntimeError:  # torch's own message lists every device type it knows
        raise UsageError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(
            f"gpuload.DataLoader copies to 'cpu' or 'cuda' devices, got {str(device)!r}; "
            "use device='cpu' and move batches yourself"
        )
    if device.type == "cpu":
        return device
    if not torch.cuda.is_available():
        raise UsageError(f"device {str(device)!r} was asked for but CUDA is not available here; use device='cpu'")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"device {str(device)!r} was asked for and this machine has {torch.cuda.device_count()} GPUs")
    return device


def current_device(device: torch.device) -> torch.device:
    """``device`` with its CUDA index filled in from the current device (the rank's, once
    ``torch.cuda.set_device(local_rank)`` ran).

    Example:
        >>> current_device(torch.device("cpu"))
        device(type='cpu')
    """
    if device.type != "cuda" or device.index is not None:
        return device
    return torch.device("cuda", torch.cuda.current_device())


MIN_TORCHCODEC = (0, 17)  # 0.16 lacks the stream synchronisation before nvJPEG's hardware decoder


def check_gpu_decode(device: torch.device) -> None:
    """``gpu=True`` decodes with nvJPEG through TorchCodec on the loader's CUDA device: a small JPEG is
    decoded there now, so that a TorchCodec that is missing, too old (before 0.17, nvJPEG's hardware
    engine could write while kernels still ran on the stream), built without nvJPEG or unable to start
    its decoder is refused here, not found at the first batch.

    Raises:
        UsageError: any of those, in one line that says what to install, or to use ``gpu=False``.
    """
    if device.type != "cuda":
        raise UsageError(f"gpu=True decodes on a CUDA device, and this loader's device is {device.type}: use gpu=False")
    advice = "pip install 'gpuload[cuda]' (TorchCodec 0.17 or newer), or use gpu=False"
    try:  # decode_jpeg first appears in TorchCodec 0.16
        import torchcodec
        from torchcodec.decoders import decode_jpeg
    except Exception as error:  # ImportError, or the RuntimeError/OSError of a TorchCodec that cannot load
        raise UsageError(
            f"gpu=True decodes with TorchCodec's nvJPEG (torchcodec.decoders.decode_jpeg), which does not load "
            f"here ({_first_line(error)}): {advice}"
        ) from None
    version = getattr(torchcodec, "__version__", "0")
    if _release(version) < MIN_TORCHCODEC:
        raise UsageError(f"gpu=True needs TorchCodec 0.17 or newer, found {version}: {advice}")
    try:
        (decoded,) = decode_jpeg([_probe_jpeg()], mode="RGB", device=current_device(device))
        found = tuple(decoded.shape)
    except Exception as error:  # nvJPEG missing from the build, its decoder failing to start...
        raise UsageError(
            f"gpu=True: TorchCodec {version} could not decode a 16x16 JPEG on {device} ({_first_line(error)}): {advice}"
        ) from None
    if found != (3, 16, 16):
        raise UsageError(f"gpu=True: TorchCodec {version} decoded a 16x16 RGB JPEG to shape {list(found)}: {advice}")


@functools.cache
def _probe_jpeg() -> bytes:
    """A 16x16 colour JPEG (4:2:0, as photos are), for :func:`check_gpu_decode`."""
    import simplejpeg

    pixels = np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3)
    return simplejpeg.encode_jpeg(pixels, quality=90, colorsubsampling="420")


def _release(version: str) -> tuple[int, ...]:
    """``"0.17.0+cu130"`` -> ``(0, 17, 0)``: the numbers of a version string's release part."""
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
