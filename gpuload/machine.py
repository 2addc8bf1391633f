"""What machine a measurement ran on: cores, CPU, memory, GPU and library versions."""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from .errors import UsageError

__all__ = ["default_workers", "describe_machine", "machine_line", "limit_torch_threads", "resolve_workers"]


def default_workers() -> int:
    """The number of CPU cores this process may run on.

    Example:
        >>> default_workers() >= 1
        True
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_workers(workers: int | None) -> int:
    """``workers`` checked to be a positive int, or :func:`default_workers` when ``None``.

    Raises:
        UsageError: anything else.

    Example:
        >>> resolve_workers(3), resolve_workers(None) >= 1
        (3, True)
    """
    if workers is None:
        return default_workers()
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise UsageError(f"workers must be a positive integer, got {workers!r}")
    return workers


def limit_torch_threads(count: int = 1) -> None:
    """Run this thread's torch CPU ops on at most ``count`` intra-op threads, leaving every other
    thread as it is.

    For worker threads that share the cores (decoding, gathering): an OpenMP parallel region
    started from each of them brings its own team of threads as large as the machine, and the
    teams fight for the cores (measured: 2 decoding threads of a jpeg loader went 3-5x slower).
    Give each worker its share of the cores. OpenMP's thread count is a per-thread setting; torch
    sets this thread's on its first use, so it is set after that. ``torch.set_num_threads`` would
    change it for the whole process.
    """
    torch.get_num_threads()
    if _OMP_SET_NUM_THREADS is not None:
        _OMP_SET_NUM_THREADS(max(1, count))


def describe_machine() -> dict:
    """CPU, cores, memory, GPU and versions, for stamping benchmark results.

    Example:
        >>> sorted(describe_machine())[:3]
        ['cores', 'cpu', 'cuda']
    """
    import PIL
    import tensordict
    import torchvision

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "cpu": _cpu_name(),
        "cores": default_workers(),
        "memory_gib": round(_total_memory() / 2**30, 1),
        "gpu": gpu,
        "cuda": torch.version.cuda if gpu else None,
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "tensordict": tensordict.__version__,
        "pillow": PIL.__version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def machine_line(machine: dict | None = None) -> str:
    """One line naming the machine, e.g. ``"AMD EPYC 7B13, 2 cores, 23.5 GiB, no GPU; torch 2.14.1"``."""
    machine = machine or describe_machine()
    gpu = f"{machine['gpu']} (CUDA {machine['cuda']})" if machine.get("gpu") else "no GPU"
    return f"{machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, {gpu}; torch {machine['torch']}"


def _torch_openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime torch loaded (its own copy in torch/lib, or the process's): another library's
    OpenMP, loaded later, may own the global ``omp_set_num_threads`` symbol."""
    bundled = sorted(Path(torch.__file__).parent.joinpath("lib").glob("lib*omp*.so*"))
    for library in bundled:
        try:
            return ctypes.CDLL(str(library))  # already loaded: this is a handle to torch's copy
        except OSError:
            continue
    return ctypes.CDLL(None)


_OMP_SET_NUM_THREADS = getattr(_torch_openmp(), "omp_set_num_threads", None)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
