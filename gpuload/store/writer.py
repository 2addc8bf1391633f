"""Append large blocks to a new file whose disk space is reserved up front."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np

__all__ = ["BlockWriter"]


class BlockWriter:
    """Write blocks one after the other into a new file of known maximum size.

    The file's disk space is reserved first (``posix_fallocate``), so a full disk fails
    at once rather than halfway, and ext4 then takes page-cache writes several times
    faster than into a growing file (0.17 against 0.98 ms per 0.9 MB block on the
    development machine). Writes go through the page cache and are not fsync-ed: the
    kernel writes them back on its own, and waiting for the disk would make a build as
    slow as the disk (``gpuload verify`` checks every image against its checksum).
    On close the file is cut to the bytes written.

    Args:
        path: the file to create; it must not exist.
        capacity: the most bytes that will be written.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "blocks.bin"
        >>> with BlockWriter(path, capacity=8) as writer:
        ...     writer.write(np.arange(3, dtype=np.uint8))
        >>> path.read_bytes()
        b'\\x00\\x01\\x02'
    """

    def __init__(self, path: str | os.PathLike, capacity: int) -> None:
        self.path = Path(path)
        self.written = 0
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            _reserve(self._fd, capacity)
        except BaseException:
            self.close()
            raise

    def write(self, block: np.ndarray) -> None:
        """Append the bytes of a C-contiguous array."""
        view = memoryview(block).cast("B")
        while view:  # pwrite may write less than asked
            done = os.pwrite(self._fd, view, self.written)
            self.written += done
            view = view[done:]

    def close(self) -> None:
        """Cut the file to the bytes written and close it."""
        if self._fd < 0:
            return
        try:
            os.ftruncate(self._fd, self.written)
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> BlockWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _reserve(fd: int, capacity: int) -> None:
    if capacity <= 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, capacity)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"not enough disk space for {capacity / 1e9:.2f} GB") from None
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
