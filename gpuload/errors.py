"""The errors gpuload raises on purpose, under one base class.

Anything gpuload raises that is not a :class:`GpuloadError` (nor an ``OSError`` about a user's
path) is a bug or an environment failure, and the command line shows its traceback. This module
imports nothing heavy, so the command line can tell the two apart without importing torch.
"""

from __future__ import annotations

import os

__all__ = [
    "BusyError",
    "CompressError",
    "DatasetError",
    "DecodeError",
    "FileError",
    "GpuloadError",
    "ObjectChangedError",
    "RemoteError",
    "SourceError",
    "UsageError",
]


class GpuloadError(Exception):
    """Base class of every error gpuload raises about its input: the user can act on it.

    Example:
        >>> issubclass(DecodeError, GpuloadError) and issubclass(UsageError, ValueError)
        True
    """


class UsageError(GpuloadError, ValueError):
    """An argument or path that gpuload refuses before doing any work (a ``ValueError`` too)."""


class BusyError(GpuloadError):
    """Another gpuload run holds the lock of the same output."""


class DatasetError(GpuloadError):
    """A folder that is not a complete, consistent gpuload dataset."""


class RemoteError(GpuloadError):
    """A read or write of an object in storage that failed, after the retries where retrying was worth it;
    the message names the (redacted) URL and, for a read, the byte range."""


class ObjectChangedError(RemoteError):
    """An object was replaced (another ETag or size) after it was opened: its bytes would mix two versions."""


class FileError(GpuloadError):
    """A problem with one input file, named with its reason.

    Attributes:
        path: the file.
        reason: what is wrong with it, in a few words.
    """

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason

    def __reduce__(self):
        return type(self), (self.path, self.reason)


class DecodeError(FileError):
    """A file that cannot be turned into an RGB image: empty, unreadable, damaged, not an image."""


class CompressError(FileError):
    """A source that ``compress`` could not re-encode: damaged, refused by ffmpeg, or whose output
    would replace a file that ``compress`` did not write."""


class SourceError(FileError):
    """A source of samples whose content cannot be taken as it is: a metadata table with a row naming a
    file twice, a column of mixed types, a list of the wrong length, an empty label, an unknown class
    name; a truncated tar shard or Parquet file. ``path`` is the table, shard or file; ``reason`` names
    the row or sample and what to do."""
