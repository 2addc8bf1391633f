"""A node-local cache of object blocks on disk, shared by every process of a node, bounded in size.

Layout of a cache folder::

    gpuload-cache.json      {"format": "gpuload.cache", "version": 1}: the folder is ours
    usage                   the bytes held (blocks and reservations), read and written under its flock
    locks/<0..1023>         flock stripes: a block is written by whoever holds its stripe
    objects/<key>/          one namespace per object version (URL, size, ETag) and block size
        object.json         which object, for people
        <index>             block ``index`` of the object: ``block_size`` bytes (the last one shorter)
        <index>.tmp-<pid>-<token>   a block being written (its size reserved, see below)

Guarantees:

- **Never above the limit.** Bytes are reserved under the cache-wide lock (``usage``) before a block
  is written, its temporary file created and its space allocated (``posix_fallocate``) in the same
  step, evicting the least recently used blocks of any namespace first when needed; the bytes on disk
  are never more than the limit. A block that cannot get room (the limit is taken by reservations in
  flight) is handed back uncached, and so is a block that the disk under the cache has no room for
  (``ENOSPC``, ``EDQUOT``: one warning, nothing left behind; a full disk never stops a job).
- **Once per node.** A block is downloaded by the first process (or thread) that takes its stripe
  lock; the others wait on that lock and then read the file it wrote. A wait is bounded
  (:data:`STRIPE_WAIT`; then the block is fetched and served uncached, warned once), and a process
  forked while a thread holds a lock (a DataLoader worker) does not keep it: the child's copies of
  the lock files' descriptors are pointed at ``/dev/null`` (``os.register_at_fork``).
- **No half-written block is ever read**: a block is written to a temporary name and renamed into
  place; a block file of the wrong size is treated as missing.
- **kill -9 at any moment** leaves only temporary files of dead processes and maybe a ``usage`` that
  counts them: every :class:`BlockCache` opened on the folder first counts the files on disk again and
  removes temporaries whose stripe lock nobody holds (a live writer holds it).
- **No fsync of blocks**: a block the kernel lost in a power cut comes back as zeros or garbage,
  which the dataset's per-image checksum catches; it then drops the block (:meth:`BlockCache.drop`)
  and reads it again.
- **Private.** A new cache folder is made ``0o700``; a folder that another user owns, or that others
  may write, is refused (blocks are read back as data: whoever can write them can feed a job).
- Two datasets, or two versions of one object, never share a block: the namespace key is the hash of
  the object's redacted URL, its size and ETag, and the block size.

Example:
    >>> import tempfile
    >>> cache = BlockCache(tempfile.mkdtemp(), "1MiB")
    >>> space = cache.namespace("s3://bucket/photos.jpeg/data.memmap", "10:abc", block_size=4)
    >>> cache.get(space, 0, 4) is None
    True
    >>> cache.put(space, 0, b"abcd"), cache.get(space, 0, 4), cache.get(space, 0, 4, start=1, length=2), cache.usage()
    (True, b'abcd', b'bc', 4)
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import secrets
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import xxhash

from ..errors import BusyError, UsageError

__all__ = ["CACHE_FORMAT", "CACHE_VERSION", "BlockCache", "Namespace", "clear_cache", "describe_cache", "parse_bytes"]

CACHE_FORMAT = "gpuload.cache"
CACHE_VERSION = 1
MARKER = "gpuload-cache.json"
STRIPES = 1024
_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*$")
_TEMPORARY = re.compile(r"(\d+)\.tmp-\d+-[0-9a-f]+")
_TOUCH_AFTER = 30.0  # seconds: a block read again sooner keeps its time (one write less per hit)
# Seconds to wait for a block's lock (another process fetching it, through its retries) before fetching
# it uncached, and for the cache-wide lock (held for an accounting step or an eviction) before an error.
STRIPE_WAIT = 300.0
CACHE_LOCK_WAIT = 60.0


def _unwritable(folder: Path, error: OSError) -> OSError:
    """``error`` (read-only disk, no permission, full disk) as one line that names the cache folder."""
    return type(error)(
        error.errno,
        f"the cache folder {folder} cannot be written ({error.strerror or error}); gpuload's cache needs a "
        "writable folder with free space: pass another cache folder, or free space there",
    )


def parse_bytes(value: int | str) -> int:
    """A size in bytes from an int or a string such as ``"200GB"``, ``"500MiB"`` or ``"1.5 TB"``.

    Decimal units (KB, MB, GB, TB, and K, M, G, T) are powers of 1000, binary ones (KiB, MiB, GiB,
    TiB) powers of 1024, case-insensitive.

    Raises:
        UsageError: not a positive size.

    Example:
        >>> parse_bytes("200GB"), parse_bytes("500MiB"), parse_bytes(4096)
        (200000000000, 524288000, 4096)
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UsageError(f"a size must be an int of bytes or a string such as '200GB', got {value!r}")
    if isinstance(value, int):
        number = value
    else:
        match = _SIZE.match(value)
        unit = match[2].lower() if match else None
        if match is None or unit not in _UNITS:
            raise UsageError(
                f"a size must be a number with a unit such as '200GB' or '500MiB' (units: B, KB, MB, GB, TB, "
                f"KiB, MiB, GiB, TiB), got {value!r}"
            )
        amount = float(match[1]) * _UNITS[unit]
        if not math.isfinite(amount):
            raise UsageError(f"a size must be a finite number of bytes, got {value!r}")
        number = int(amount)
    if number <= 0:
        raise UsageError(f"a size must be positive, got {value!r}")
    return number


@dataclass(frozen=True)
class Namespace:
    """Where the blocks of one object version live in a cache (see :meth:`BlockCache.namespace`)."""

    key: str
    folder: Path
    block_size: int


class BlockCache:
    """A cache folder of object blocks, at most ``size`` bytes, safe to share between processes.

    Args:
        path: the cache folder: new, empty, or one that a :class:`BlockCache` made.
        size: the most bytes of blocks kept (an int or a string such as ``"200GB"``).

    Raises:
        UsageError: ``path`` holds files and is not a gpuload cache, or a cache of another format
            version; another user owns it or others may write it; a bad ``size``.
        OSError: the folder cannot be created or written (naming it).
    """

    def __init__(self, path: str | os.PathLike, size: int | str) -> None:
        self.path = Path(path).expanduser().absolute()
        self.limit = parse_bytes(size)
        self._claim_folder()
        (self.path / "locks").mkdir(exist_ok=True)
        (self.path / "objects").mkdir(exist_ok=True)
        self._warned: set[str] = set()
        with _cache_lock(self.path) as fd:
            _write_usage(fd, _recount(self.path))
            self._evict(fd, 0)

    # -- namespaces and blocks -----------------------------------------------------------------------------
    def namespace(self, url: str, version: str, *, block_size: int) -> Namespace:
        """The namespace of the object at ``url`` (redacted) in the version ``version``, for ``block_size`` blocks."""
        if not isinstance(block_size, int) or block_size <= 0:
            raise UsageError(f"block_size must be a positive int, got {block_size!r}")
        key = xxhash.xxh3_128_hexdigest(f"{url}\n{version}\n{block_size}".encode())
        folder = self.path / "objects" / key
        if not (folder / "object.json").is_file():
            try:
                folder.mkdir(exist_ok=True)
                _write_atomically(
                    folder / "object.json",
                    json.dumps({"url": url, "version": version, "block_size": block_size}).encode(),
                )
            except OSError as error:  # a full disk: the blocks are then served uncached
                self._full(error, f"the folder of {url}")
        return Namespace(key, folder, block_size)

    def get(
        self, space: Namespace, index: int, block_length: int, start: int = 0, length: int | None = None
    ) -> bytes | None:
        """Bytes ``start`` to ``start + length`` (default: all) of block ``index`` of ``space``, if the block
        is cached whole (``block_length`` bytes), else ``None``."""
        length = block_length - start if length is None else length
        path = space.folder / str(index)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            stat = os.fstat(fd)
            if stat.st_size != block_length:
                return None  # a damaged block: the caller fetches it again and replaces it
            data = os.pread(fd, length, start)
            while len(data) < length:
                more = os.pread(fd, length - len(data), start + len(data))
                if not more:
                    return None
                data += more
            if time.time() - stat.st_mtime > _TOUCH_AFTER:
                try:
                    os.utime(fd)  # least recently used goes first
                except OSError:
                    pass
            return data
        finally:
            os.close(fd)

    def has(self, space: Namespace, index: int, block_length: int) -> bool:
        """Whether block ``index`` of ``space`` is cached whole (``block_length`` bytes), without reading it."""
        try:
            return (space.folder / str(index)).stat().st_size == block_length
        except FileNotFoundError:
            return False

    @contextmanager
    def writing(self, space: Namespace, index: int) -> Iterator[bool]:
        """Hold the stripe lock of block ``index``: the one writer of that block on the node.

        Inside it, check :meth:`get` again (another process may have written the block while this
        one waited), then fetch and :meth:`put`. Yields ``False`` when the lock was not had within
        :data:`STRIPE_WAIT` seconds (its holder is stuck or stopped; warned once): then fetch the block
        without putting it.
        """
        stripe = self.path / "locks" / str(self.stripe(space, index))
        fd = _lock(stripe, STRIPE_WAIT)
        if fd is None:
            self._warn_once(
                "stripe",
                f"waited {STRIPE_WAIT:g} s for the lock {stripe} of a block that another process of this node is "
                f"fetching (stuck or stopped?): reading such blocks uncached; find it with fuser -v {stripe}",
            )
        try:
            yield fd is not None
        finally:
            if fd is not None:
                _unlock(fd)

    @staticmethod
    def stripe(space: Namespace, index: int) -> int:
        """The stripe lock of block ``index``: blocks of one stripe are written one at a time."""
        return _stripe(space.key, index)

    def put(self, space: Namespace, index: int, data: bytes) -> bool:
        """Store block ``index`` (hold :meth:`writing`); ``False`` where it is not kept: the limit leaves
        no room now, the disk under the cache is full (``ENOSPC``, ``EDQUOT``), or the cache-wide lock
        was held too long (both warned once, nothing left behind; the caller serves the block from
        memory, and the cache goes on when it can).
        """
        length = len(data)
        if length > self.limit:
            return False
        temporary = space.folder / f"{index}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            with _cache_lock(self.path) as lock:
                if not self._evict(lock, length):
                    return False
                try:
                    fd = _create(temporary)
                    try:
                        _allocate(fd, length)
                    except OSError:
                        os.close(fd)
                        temporary.unlink()
                        raise
                except OSError as error:
                    return self._full(error, f"a block of {length:,} bytes")
                _write_usage(lock, _read_usage(lock) + length)
        except BusyError as error:
            self._warn_once("cache-lock", f"{error}; blocks are read uncached meanwhile")
            return False
        try:
            _write_all(fd, data)
            os.close(fd)
            fd = -1
            os.replace(temporary, space.folder / str(index))  # replaces a damaged block of the same name
        except BaseException as error:
            if fd >= 0:
                os.close(fd)
            temporary.unlink(missing_ok=True)
            with _cache_lock(self.path) as lock:
                _write_usage(lock, max(0, _read_usage(lock) - length))
            if isinstance(error, OSError):
                return self._full(error, f"a block of {length:,} bytes")
            raise
        return True

    def drop(self, space: Namespace, index: int) -> None:
        """Remove block ``index`` (it failed a checksum): the next read fetches it again. Hold :meth:`writing`."""
        path = space.folder / str(index)
        with _cache_lock(self.path) as lock:
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                return
            _write_usage(lock, max(0, _read_usage(lock) - size))

    def usage(self) -> int:
        """Bytes held now: blocks and the reservations of blocks being written."""
        with _cache_lock(self.path) as lock:
            return _read_usage(lock)

    def __repr__(self) -> str:
        return f"BlockCache({str(self.path)!r}, size={self.limit:,})"

    def __reduce__(self):
        return type(self), (self.path, self.limit)

    # -- the folder, the lock and the accounting --------------------------------------------------------------
    def _claim_folder(self) -> None:
        marker = self.path / MARKER
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as error:
            raise type(error)(
                error.errno, f"cannot create the cache folder {self.path} ({error.strerror}); pass a writable folder"
            ) from None
        if not self.path.is_dir():
            raise UsageError(f"the cache {self.path} is not a folder; pass a folder for gpuload's cache")
        _check_private(self.path)
        if marker.is_file():
            _check_marker(self.path)
        else:
            self._mark_new_folder(marker)

    def _mark_new_folder(self, marker: Path) -> None:
        """Claim a folder with no marker: only an empty one (a user's folder is never evicted from)."""
        entries = sorted(entry.name for entry in self.path.iterdir() if not entry.name.startswith(f".{MARKER}.tmp-"))
        if entries and marker.is_file():
            # Another BlockCache creating this folder at the same moment (ranks start together) wrote
            # the marker, then its folders, since the marker was looked for: theirs, not a user's.
            _check_marker(self.path)
            return
        if entries:
            raise UsageError(
                f"{self.path} is not a gpuload cache (no {MARKER}) and holds {len(entries)} entries (first "
                f"{entries[0]!r}); gpuload evicts files from its cache, so it only uses a new or empty folder: "
                "pass another cache folder"
            )
        try:
            _write_atomically(marker, json.dumps({"format": CACHE_FORMAT, "version": CACHE_VERSION}).encode())
        except OSError as error:
            raise _unwritable(self.path, error) from None

    def _evict(self, lock: int, needed: int) -> bool:
        """Make room for ``needed`` more bytes (under the cache lock): remove the least recently used
        blocks down to 90 % of the limit less ``needed``. ``False`` where blocks being written take the room."""
        used = _read_usage(lock)
        if used + needed <= self.limit:
            return True
        target = min(self.limit - needed, int(self.limit * 0.9))
        blocks = sorted(
            ((stat.st_mtime, path, stat.st_size) for path, stat in _files(self.path) if ".tmp-" not in path.name),
            key=lambda item: item[0],
        )
        for _, path, size in blocks:
            if used <= target:
                break
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            used -= size
        _write_usage(lock, max(0, used))
        return used + needed <= self.limit

    def _full(self, error: OSError, what: str) -> bool:
        """A block that the disk had no room for is not kept (``False``), said once; other errors raise."""
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise error
        stats = os.statvfs(self.path)
        self._warn_once(
            "full",
            f"the disk of the cache {self.path} is full ({what} did not fit, {stats.f_bavail * stats.f_frsize:,} "
            f"bytes free): blocks are read uncached until there is room; free space there, lower cache_size (now "
            f"{self.limit:,} bytes) or pass a cache folder on another disk",
        )
        return False

    def _warn_once(self, kind: str, message: str) -> None:
        """Warn of a degraded cache (blocks served uncached) once per kind, not once a block."""
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message, stacklevel=3)


def _stripe(key: str, index: int) -> int:
    return xxhash.xxh3_64_intdigest(f"{key}/{index}".encode()) % STRIPES


def describe_cache(path: str | os.PathLike) -> dict:
    """What the cache folder ``path`` holds: its blocks and bytes per object version, and the blocks being
    written now by live processes (the temporary file of a writer killed outright is not counted; the next
    :class:`BlockCache` or :func:`clear_cache` removes it); read without a lock, changing nothing.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        UsageError: ``path`` is not a gpuload cache (see :func:`clear_cache`).

    Example:
        >>> import tempfile
        >>> cache = BlockCache(tempfile.mkdtemp(), "1MiB")
        >>> cache.put(cache.namespace("s3://bucket/photos.jpeg/data.memmap", "10:abc", block_size=4), 0, b"abcd")
        True
        >>> info = describe_cache(cache.path)
        >>> info["blocks"], info["bytes"], [(o["url"], o["blocks"]) for o in info["objects"]]
        (1, 4, [('s3://bucket/photos.jpeg/data.memmap', 1)])
    """
    folder = _existing_cache(path)
    objects: dict[str, dict] = {}
    writing = written = 0
    for file, stat in _files(folder):
        temporary = _TEMPORARY.fullmatch(file.name)
        if temporary:
            if _stripe_held(folder, file.parent.name, int(temporary[1])):  # else its writer died (kill -9)
                writing, written = writing + 1, written + stat.st_size
            continue
        if not file.name.isdigit():
            continue
        entry = objects.get(file.parent.name)
        if entry is None:
            entry = objects[file.parent.name] = {**_object_record(file.parent), "blocks": 0, "bytes": 0, "used": 0.0}
        entry["blocks"] += 1
        entry["bytes"] += stat.st_size
        entry["used"] = max(entry["used"], stat.st_mtime)
    listed = sorted(objects.values(), key=lambda entry: -entry["used"])  # the most recently used first
    return {
        "path": str(folder),
        "blocks": sum(entry["blocks"] for entry in listed),
        "bytes": sum(entry["bytes"] for entry in listed),
        "objects": listed,
        "being_written": {"blocks": writing, "bytes": written},
    }


def clear_cache(path: str | os.PathLike) -> dict:
    """Remove every block of the cache folder ``path``, safely while other processes use it.

    Only a folder that a :class:`BlockCache` made is touched (its marker, owned by this user, not
    writable by others). The whole clear holds the cache-wide lock, so no block is reserved or
    evicted meanwhile; each block is removed under its stripe lock, taken without waiting: a block
    whose stripe another process holds (it is writing or dropping that block) is kept and counted
    in ``kept``, and so is its temporary file. Temporary files of dead writers are removed. A
    reader that has a block open keeps reading it (a removed file lives on while open); its next
    read fetches the block again. Afterwards the bytes held are counted again. The marker, the lock
    files and each object's folder stay (another process may be writing into one): the cache opens as before.

    Returns:
        ``{"path", "removed": {"blocks", "bytes"}, "kept": {"blocks", "bytes"}}``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        UsageError: ``path`` is not a gpuload cache, is another version's, another user's, or
            writable by others: nothing is removed.
        BusyError: another process held the cache-wide lock for more than :data:`CACHE_LOCK_WAIT` s.

    Example:
        >>> import tempfile
        >>> cache = BlockCache(tempfile.mkdtemp(), "1MiB")
        >>> cache.put(cache.namespace("s3://bucket/photos.jpeg/data.memmap", "10:abc", block_size=4), 0, b"abcd")
        True
        >>> clear_cache(cache.path)["removed"], cache.usage(), describe_cache(cache.path)["blocks"]
        ({'blocks': 1, 'bytes': 4}, 0, 0)
    """
    folder = _existing_cache(path)
    removed, kept = {"blocks": 0, "bytes": 0}, {"blocks": 0, "bytes": 0}
    with _cache_lock(folder) as lock:
        for file, stat in _files(folder):
            temporary = _TEMPORARY.fullmatch(file.name)
            if temporary is None and not file.name.isdigit():
                continue  # not a block: not ours to remove
            index = int(temporary[1] if temporary else file.name)
            stripe = _lock(folder / "locks" / str(_stripe(file.parent.name, index)), 0)
            counted = kept
            if stripe is not None:
                try:
                    file.unlink(missing_ok=True)
                    counted = removed
                finally:
                    _unlock(stripe)
            if counted is removed and temporary:
                continue  # a dead writer's: not a block
            counted["blocks"] += 1
            counted["bytes"] += stat.st_size
        _write_usage(lock, _recount(folder))
    return {"path": str(folder), "removed": removed, "kept": kept}


def _existing_cache(path: str | os.PathLike) -> Path:
    """The folder of an existing gpuload cache (marker, owner and mode checked), changing nothing."""
    folder = Path(path).expanduser().absolute()
    if not folder.exists():
        raise FileNotFoundError(f"{folder} does not exist; pass the folder given as cache= to MemmapImageDataset")
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder; pass the folder given as cache= to MemmapImageDataset")
    if not (folder / MARKER).is_file():
        raise UsageError(
            f"{folder} is not a gpuload cache (no {MARKER}): nothing was touched; pass the folder given as cache= "
            "to MemmapImageDataset"
        )
    _check_private(folder)
    _check_marker(folder)
    return folder


def _object_record(space: Path) -> dict:
    """Which object version a namespace folder holds, from its ``object.json`` (written for people)."""
    try:
        record = json.loads((space / "object.json").read_text())
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict):
        return {"url": f"(unknown object: {space.name})", "version": "", "block_size": 0}
    return {key: record.get(key, "") for key in ("url", "version", "block_size")}


def _check_private(folder: Path) -> None:
    """Blocks are read back as data: a folder that another user owns or may write could feed them in."""
    stat = folder.stat()
    if stat.st_uid != os.geteuid():
        raise UsageError(
            f"the cache {folder} belongs to another user (uid {stat.st_uid}, you are uid {os.geteuid()}): "
            "blocks they put there would be read as your data; pass a cache folder of your own"
        )
    if stat.st_mode & 0o022:
        raise UsageError(
            f"the cache {folder} is writable by other users (mode {oct(stat.st_mode & 0o777)}); blocks they "
            f"put there would be read as your data: run chmod go-w {folder}, or pass a folder of your own"
        )


def _check_marker(folder: Path) -> None:
    marker = folder / MARKER
    try:
        found = json.loads(marker.read_text())
    except (OSError, ValueError):
        found = None
    if not isinstance(found, dict) or found.get("format") != CACHE_FORMAT:
        raise UsageError(f"{marker} is not a gpuload cache marker; pass another cache folder")
    if found.get("version") != CACHE_VERSION:
        raise UsageError(
            f"{folder} is a gpuload cache of version {found.get('version')!r}, this gpuload uses version "
            f"{CACHE_VERSION}; pass another cache folder or delete this one"
        )


@contextmanager
def _cache_lock(folder: Path) -> Iterator[int]:
    """The cache-wide lock (the ``usage`` file's), held for an accounting step, an eviction or a clear.

    Raises:
        BusyError: another process held it for more than :data:`CACHE_LOCK_WAIT` seconds.
    """
    usage = folder / "usage"
    try:
        fd = _lock(usage, CACHE_LOCK_WAIT)
    except OSError as error:  # a read-only disk, a folder we may not write
        raise _unwritable(folder, error) from None
    if fd is None:
        raise BusyError(
            f"the cache {folder} is locked: its lock was held for more than {CACHE_LOCK_WAIT:g} s by another "
            f"process of this node (stuck or stopped?); find it with fuser -v {usage} and end it"
        )
    try:
        yield fd
    finally:
        _unlock(fd)


def _read_usage(fd: int) -> int:
    text = os.pread(fd, 32, 0).strip()
    return int(text) if text.isdigit() else 0


def _write_usage(fd: int, value: int) -> None:
    data = f"{value:020d}\n".encode()  # fixed width: one write replaces the number whole
    os.pwrite(fd, data, 0)


def _files(folder: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every block and temporary block file of the cache ``folder``, with its ``stat``; none where its
    ``objects`` folder is missing (a BlockCache killed before it made it)."""
    try:
        spaces = list(os.scandir(folder / "objects"))
    except FileNotFoundError:
        return
    for space in spaces:
        if not space.is_dir(follow_symlinks=False):
            continue
        for entry in os.scandir(space.path):
            if not entry.name.startswith((".", "object.json")) and entry.is_file(follow_symlinks=False):
                try:
                    yield Path(entry.path), entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue


def _recount(folder: Path) -> int:
    """Count the bytes on disk again (under the cache lock), removing temporaries of dead writers."""
    total = 0
    for path, stat in _files(folder):
        match = _TEMPORARY.fullmatch(path.name)
        if match is not None and _stripe_free(folder, path.parent.name, int(match[1])):
            path.unlink(missing_ok=True)  # its writer died: nobody holds its stripe
            continue
        total += stat.st_size
    return total


def _stripe_held(folder: Path, key: str, index: int) -> bool:
    """Whether a live process holds the stripe of block ``index`` (a writer of it), creating no file and
    taking no lock that a writer could wait on for longer than this look."""
    try:
        fd = os.open(folder / "locks" / str(_stripe(key, index)), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the shared lock where it was taken
    return False


def _stripe_free(folder: Path, key: str, index: int) -> bool:
    fd = _lock(folder / "locks" / str(_stripe(key, index)), 0)
    if fd is None:
        return False
    _unlock(fd)
    return True


# Every flock this process holds (fd -> the thread lock taken with it): a process forked meanwhile (a
# DataLoader worker) inherits the fds, and with them the locks, for its whole life; after a fork the child
# points them at /dev/null. The threads of one process queue on a thread lock per file first (a handover
# without polling), so that only processes poll the flock.
_HELD: dict[int, threading.Lock] = {}
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_HELD_LOCK = threading.Lock()


def _lock(path: Path, wait: float) -> int | None:
    """An fd of ``path`` holding its exclusive flock, or ``None`` when others held it for ``wait`` seconds."""
    deadline = time.monotonic() + wait
    with _HELD_LOCK:
        turn = _THREAD_LOCKS.setdefault(str(path), threading.Lock())
    if not turn.acquire(timeout=wait):
        return None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except BaseException:
        turn.release()
        raise
    pause = 0.001
    while True:
        with _HELD_LOCK:  # locked and registered in one step: a fork sees both or neither
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                _HELD[fd] = turn
                return fd
            except BlockingIOError:
                pass
        left = deadline - time.monotonic()
        if left <= 0:
            os.close(fd)
            turn.release()
            return None
        time.sleep(min(pause, left))
        pause = min(2 * pause, 0.05)


def _unlock(fd: int) -> None:
    with _HELD_LOCK:
        turn = _HELD.pop(fd)
        os.close(fd)
    turn.release()


def _before_fork() -> None:
    _HELD_LOCK.acquire()


def _after_fork_in_parent() -> None:
    _HELD_LOCK.release()


def _after_fork_in_child() -> None:
    """The child's copies of the parent's lock fds would hold the parent's locks until the child exits
    (a flock belongs to the open file, shared by fork): each is pointed at /dev/null instead, so that
    a later close of that number in the child closes nothing of the parent's. The thread locks, which
    the parent's other threads may have held, are made anew."""
    global _HELD_LOCK
    _HELD_LOCK = threading.Lock()
    _THREAD_LOCKS.clear()
    if _HELD:
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        for fd in _HELD:
            os.dup2(null, fd, inheritable=False)
        os.close(null)
    for fd in list(_HELD):
        _HELD[fd] = threading.Lock()  # a thread of the child that held it (the forking one) releases this
        _HELD[fd].acquire()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


def _create(path: Path) -> int:
    """A new temporary block file, its folder made again if it was removed by hand."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o644)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags, 0o644)


def _allocate(fd: int, length: int) -> None:
    """Reserve ``length`` bytes for the file (a full disk fails here, before any byte is written)."""
    if length == 0:
        return
    if hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, length)
            return
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
    os.ftruncate(fd, length)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # pwrite may write less than asked
        view = view[os.pwrite(fd, view, len(data) - len(view)) :]


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(temporary, "xb") as file:
            file.write(data)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
