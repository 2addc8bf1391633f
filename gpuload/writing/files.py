"""Crash-safe file operations: locks, fsync, atomic renames and checks on the paths a user gives.

These are the only places where gpuload replaces or removes anything, so the rules live here once:
compare resolved paths, lock an output before touching it, make data durable before renaming it
into place, and swap a finished folder in atomically.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import BusyError, UsageError
from ..text import byte_size

__all__ = [
    "OutputLock",
    "byte_count",
    "check_apart",
    "full_disk_says",
    "fsync_file",
    "fsync_folder",
    "no_room",
    "rename_exchange",
    "rename_noreplace",
    "resolve",
    "start_writeback",
]

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_SYNC_FILE_RANGE_WRITE = 2


@contextmanager
def full_disk_says(message: str | Callable[[], str]) -> Iterator[None]:
    """A full disk (``ENOSPC``) inside becomes an ``OSError`` with ``message`` (what was being
    written, what to do: see :func:`no_room`, which tells a disk out of inodes from one out of
    bytes; a callable is asked only then), still ``ENOSPC``, so the command line prints it as one
    line; other errors pass.

    Example:
        >>> try:
        ...     with full_disk_says("not enough disk space to write x: free space there"):
        ...         raise OSError(errno.ENOSPC, "No space left on device")
        ... except OSError as error:
        ...     print(error)
        [Errno 28] not enough disk space to write x: free space there
    """
    try:
        yield
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        raise OSError(errno.ENOSPC, message() if callable(message) else message) from None


def no_room(disk: int | str | os.PathLike, doing: str, advice: str, *, needed: str | None = None) -> str:
    """What to say when the disk of ``disk`` (an open file, or a path on it) refused a write with
    ``ENOSPC`` while ``doing`` (e.g. ``"to write x"``): that no inode is left, where the disk counts
    inodes and has none free (one per file or folder, whatever its size: many small files use them
    up while bytes remain), else that disk space is short (with ``needed``: what was needed, and what
    is free). ``advice`` ends the message, after "free space" or "delete files".

    Example:
        >>> no_room("/", "to write x", "there or write to another disk").startswith("not enough disk space to write x; ")
        True
    """
    stats = os.statvfs(_nearest_existing(disk))
    free = byte_count(stats.f_bavail * stats.f_frsize)
    if stats.f_files and not stats.f_favail:  # (btrfs and others that count no inodes report 0 of 0)
        return (
            f"no free inode left {doing} (its disk has {free} free, but all its {stats.f_files:,} inodes are "
            f"taken: each file or folder takes one, whatever its size); delete files {advice}"
        )
    if needed is None:
        return f"not enough disk space {doing}; free space {advice}"
    return f"not enough disk space {doing}: it needs {needed} and its disk has {free} free; free space {advice}"


def byte_count(count: int) -> str:
    """``count`` bytes, for a person.

    Example:
        >>> byte_count(52_428_800), byte_count(10)
        ('52,428,800 bytes (52.4 MB)', '10 bytes')
    """
    return byte_size(count) if count < 1000 else f"{count:,} bytes ({byte_size(count)})"


def _nearest_existing(disk: int | str | os.PathLike) -> int | Path:
    """``disk`` itself (an open file, or a path that exists), else its nearest folder that exists."""
    if isinstance(disk, int):
        return disk
    path = Path(disk)
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def resolve(path: str | os.PathLike) -> Path:
    """``path`` with ``~`` expanded and every symlink and ``..`` resolved (the folder need not exist).

    Raises:
        UsageError: an empty path (an unset shell variable), which would mean the current folder; a
            symlink loop.

    Example:
        >>> resolve("/tmp/../tmp/x").as_posix()
        '/tmp/x'
    """
    if not str(path).strip():
        raise UsageError(f"a path is empty ({str(path)!r}: an unset shell variable?); give a folder, '.' for this one")
    try:
        return Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as error:  # a loop: RuntimeError before Python 3.13, then OSError (ELOOP)
        if isinstance(error, OSError) and error.errno != errno.ELOOP:
            raise
        raise UsageError(
            f"{path} is a symlink loop (it leads back to itself); point it at a folder or a file"
        ) from None


def check_apart(source: Path, output: Path, *, source_name: str, output_name: str) -> None:
    """Refuse an output that is the source, lies inside it, or contains it (resolved paths).

    Raises:
        UsageError: the two overlap, naming both.

    Example:
        >>> check_apart(Path("/data/photos"), Path("/data"), source_name="SRC", output_name="--out")
        Traceback (most recent call last):
        ...
        gpuload.errors.UsageError: --out (/data) contains SRC (/data/photos): ...
    """
    source, output = resolve(source), resolve(output)
    if output == source:
        relation = "is"
    elif output.is_relative_to(source):
        relation = "is inside"
    elif source.is_relative_to(output):
        relation = "contains"
    else:
        return
    raise UsageError(
        f"{output_name} ({output}) {relation} {source_name} ({source}): outputs would mix with your files; "
        f"put {output_name} outside {source}"
    )


# What a disk or its permissions answer to a new file: a read-only disk, a full one, no free
# inode, a quota, a folder we may not write.
_DISK_REFUSALS = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM}


class OutputLock:
    """An exclusive ``flock`` on ``.<name>.lock`` beside ``path``, held for one run that writes ``path``.

    A second run on the same output fails at once instead of racing the first. The lock file is
    removed when the run ends, done or failed, while the lock is still held; a run that opened
    the file just before and takes the lock after finds that the name no longer leads to the file
    it locked, and starts over with a new one (so two runs never both believe they hold it). A
    process killed outright leaves the file; the kernel released its lock, so it never blocks a
    later run, and the next run to finish removes it.

    Raises:
        BusyError: another process holds the lock.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "photos.memmap"
        >>> with OutputLock(out):
        ...     OutputLock(out).__enter__()
        Traceback (most recent call last):
        ...
        gpuload.errors.BusyError: another gpuload run is writing .../photos.memmap ...
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(f".{path.name}.lock")
        self._fd = -1

    def __enter__(self) -> OutputLock:
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise BusyError(
                    f"another gpuload run is writing {self.path} (it holds {self.lock_path}); "
                    f"wait for it to finish or choose another output"
                ) from None
            if _same_file(fd, self.lock_path):
                self._fd = fd
                return self
            os.close(fd)  # the run that held it removed the name meanwhile: lock the file there now

    def __exit__(self, *exc_info) -> None:
        try:
            self.lock_path.unlink(missing_ok=True)  # while still held: see the class's docstring
        finally:
            os.close(self._fd)  # closing releases the lock
            self._fd = -1

    def _open(self) -> int:
        try:
            self.lock_path.parent.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: a link at the lock's name would make the run create or lock what it points to
            return os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except IsADirectoryError:
            raise IsADirectoryError(
                errno.EISDIR,
                f"cannot write {self.path}: its lock file {self.lock_path} is a folder, not a file (made by hand or "
                f"another tool?); move it away or remove it (rmdir {self.lock_path}), then run again",
            ) from None
        except OSError as error:  # a read-only disk, a full one, no free inode, a folder we may not write
            if error.errno == errno.ELOOP:
                raise OSError(
                    errno.ELOOP,
                    f"cannot write {self.path}: its lock file {self.lock_path} is a symbolic link (made by hand or "
                    f"another tool?), which gpuload does not follow; remove the link (rm {self.lock_path}), then run again",
                ) from None
            if error.errno not in _DISK_REFUSALS:
                raise
            if error.errno == errno.ENOSPC:  # out of bytes or of inodes: say which
                raise OSError(
                    errno.ENOSPC,
                    no_room(
                        self.lock_path.parent,
                        f"to write {self.path}: its lock file {self.lock_path} could not be created",
                        "there or choose an output on another disk",
                    ),
                ) from None
            raise type(error)(
                error.errno,
                f"cannot write {self.path}: its lock file {self.lock_path} could not be created "
                f"({error.strerror}: {error.filename}); choose an output on a writable disk with free space",
            ) from None


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (found.st_dev, found.st_ino) == (opened.st_dev, opened.st_ino)


def check_not_written(path: Path) -> None:
    """Refuse to read ``path`` while another gpuload run writes it (holds its :class:`OutputLock`):
    a build of a folder that ``compress`` is still filling would take what is there so far.
    Nothing is created: a folder no run has written has no lock file.

    Raises:
        BusyError: another process holds the lock.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "photos-q3"
        >>> with OutputLock(out):
        ...     check_not_written(out)
        Traceback (most recent call last):
        ...
        gpuload.errors.BusyError: another gpuload run is still writing .../photos-q3 ...
    """
    lock_path = path.with_name(f".{path.name}.lock")
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file (or none we may read): no gpuload run writes it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise BusyError(
            f"another gpuload run is still writing {path} (it holds {lock_path}); wait for it to finish, then run this again"
        ) from None
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Flush a file's data and size to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (new, renamed or removed names) to disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing a file's range to disk now, without waiting for it
    (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, Linux): a later ``fsync`` then waits only for what
    was written since. Does nothing where the call does not exist."""
    if _SYNC_FILE_RANGE is None:
        return
    if _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.ESPIPE):
            raise OSError(code, os.strerror(code))


def rename_exchange(first: Path, second: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns ``False``, changing nothing, where the system or filesystem cannot do it.
    """
    return _renameat2(first, second, _RENAME_EXCHANGE)


def rename_noreplace(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target``, failing with ``FileExistsError`` if ``target`` exists.

    ``os.rename`` would silently replace an empty folder or a file at ``target``; this never does
    (``renameat2(RENAME_NOREPLACE)``, or a check just before the rename where that is missing).
    """
    if not _renameat2(source, target, _RENAME_NOREPLACE):
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, f"{target} appeared while gpuload was writing it", str(target))
        os.rename(source, target)


def _renameat2(source: Path, target: Path, flags: int) -> bool:
    renameat2 = getattr(_LIBC, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # not supported here: the caller falls back
        return False
    raise OSError(code, os.strerror(code), str(source), None, str(target))


_LIBC = ctypes.CDLL(None, use_errno=True)  # this process's C library
_SYNC_FILE_RANGE = getattr(_LIBC, "sync_file_range", None)
if _SYNC_FILE_RANGE is not None:  # 64-bit offsets: the default int conversion would cut them
    _SYNC_FILE_RANGE.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
