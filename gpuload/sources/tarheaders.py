"""The members of an uncompressed tar file, read by their headers: one ``pread`` of 512 bytes a member,
the data skipped.

Python's ``tarfile`` reads a header through a buffered file (a ``seek`` and a ``tell`` around each)
and builds a ``TarInfo`` of every field; a WebDataset shard holds three members a sample, so its scan
cost more than the build's open of a file per image. This reader takes what a scan needs (name, where
the data lies, its size) from the ustar fields, with the extensions tar writers use for long names and
sizes: POSIX pax headers (``path``, ``size``; Python's ``tarfile`` writes one per member whose mtime
is a float, as webdataset's ``TarWriter`` does), GNU long names (``L``), the ustar ``prefix``, base-256
sizes. Anything else it does not read (a sparse member, a pax header of sparse maps, a global pax
header naming or sizing the members after it, a type of another tar; a first header whose checksum
fails: a compressed shard?) raises :class:`Unusual` at that
header's offset, and the caller reads on from there with ``tarfile``. A later header whose checksum
fails is damage, where ``tarfile`` would end the archive there without a word.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator

__all__ = ["BLOCK", "Unusual", "cut_short", "members"]

BLOCK = 512
_REGULAR = (b"0", b"\0", b"7")  # tarfile's REGULAR_TYPES but the sparse one
_SKIPPED = (b"1", b"2", b"3", b"4", b"5", b"6", b"K")  # links, devices, folders, FIFOs, GNU long link names


class Unusual(Exception):
    """A header this reader does not read; ``offset``: where it starts (read on from there with ``tarfile``)."""

    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


def members(fd: int, size: int, start: int = 0) -> Iterator[tuple[str, int, int]]:
    """``(name, data offset, data size)`` of each regular file in the uncompressed tar open as ``fd``
    (``size`` bytes), from the header at ``start`` on, in order; as ``tarfile`` names them.

    Raises:
        Unusual: a header it does not read (see the module).
        tarfile.ReadError: the file ends inside a header or a member's data, or where a header would
            start (without the zero blocks that end a tar: cut short, where tarfile would stop there
            without a word), or a header after the first fails its checksum.

    Example:
        >>> import io, tempfile
        >>> with tempfile.TemporaryFile() as file:
        ...     with tarfile.open(fileobj=file, mode="w") as tar:
        ...         info = tarfile.TarInfo("a/000001.jpg"); info.size = 3
        ...         tar.addfile(info, io.BytesIO(b"abc"))
        ...     list(members(file.fileno(), file.seek(0, 2)))
        [('a/000001.jpg', 512, 3)]
    """
    offset, long_name, pax = start, None, {}
    member = start  # where the current member's headers begin (its long name or pax header, if any)
    while offset + BLOCK <= size:
        header = os.pread(fd, BLOCK, offset)
        if len(header) < BLOCK:
            raise tarfile.ReadError("unexpected end of data")
        if header.count(0) == BLOCK:  # the end of the archive
            return
        if not _checksum_holds(header):
            if offset == start:
                raise Unusual(offset)
            raise tarfile.ReadError(f"the header at byte {offset:,} fails its checksum")
        kind = header[156:157]
        length = _number(header[124:136], member)
        if "size" in pax:
            length = _size(pax["size"], member)
        data = offset + BLOCK
        following = data + -(-length // BLOCK) * BLOCK
        if following > size:
            raise tarfile.ReadError("unexpected end of data")
        if kind in (b"x", b"X", b"L", b"g"):
            value = os.pread(fd, length, data)
            if kind == b"L":
                long_name = _text(value.split(b"\0", 1)[0])
            elif kind != b"g":
                pax = _pax(value, member)
            elif {"path", "size"} & set(_pax(value, member)):  # for every member after it (WebDataset's make none)
                raise Unusual(member)
            offset = following
            continue
        if kind in _REGULAR:
            name = long_name if long_name is not None else pax.get("path") or _ustar_name(header)
            if not name.endswith("/"):  # an old-style folder: a regular type with a trailing slash
                yield name, data, length
        elif kind not in _SKIPPED:
            raise Unusual(member)  # a sparse member, or a type of some other tar: tarfile reads its long name too
        offset, long_name, pax = following, None, {}
        member = offset
    if offset < size:
        raise tarfile.ReadError("unexpected end of data")
    raise cut_short(offset)


def cut_short(offset: int) -> tarfile.ReadError:
    """The error of a tar that ends at byte ``offset``, where a header would start, without the zero blocks
    that end a tar (a writer stopped, a download cut)."""
    return tarfile.ReadError(f"the tar ends without the two zero blocks that end a tar (at byte {offset:,}): cut short")


def _checksum_holds(header: bytes) -> bool:
    field = header[148:156].split(b"\0", 1)[0].strip()
    try:
        stored = int(field or b"0", 8)
    except ValueError:
        return False
    unsigned = 256 + sum(header[:148]) + sum(header[156:])
    if stored == unsigned:
        return True
    signed = unsigned - 256 * sum(1 for byte in header[:148] + header[156:] if byte > 127)  # some old tars
    return stored == signed


def _number(field: bytes, offset: int) -> int:
    if field[0] & 0x80:  # GNU base-256: a size beyond 8 GiB
        if field[0] != 0x80:
            raise Unusual(offset)  # negative
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits or b"0", 8)
    except ValueError:
        raise Unusual(offset) from None


def _size(value: str, offset: int) -> int:
    """A pax header's ``size``; :class:`Unusual` where it is no whole number of bytes (tarfile reads it as 0)."""
    digits = value.strip()
    if not digits.isascii() or not digits.isdigit():
        raise Unusual(offset)
    return int(digits)


def _ustar_name(header: bytes) -> str:
    name = _text(header[:100].split(b"\0", 1)[0])
    if header[257:263] == b"ustar\0":  # POSIX ustar (GNU's "ustar  " uses those bytes for times)
        prefix = _text(header[345:500].split(b"\0", 1)[0])
        if prefix:
            return f"{prefix}/{name}"
    return name


def _pax(records: bytes, offset: int) -> dict[str, str]:
    """The ``length key=value\\n`` records of a pax header; :class:`Unusual` where they describe a sparse file."""
    found, at = {}, 0
    while at < len(records) and records[at : at + 1] != b"\0":
        space = records.find(b" ", at)
        try:
            length = int(records[at:space])
        except ValueError:
            raise Unusual(offset) from None
        if not at < space < at + length <= len(records):  # a length of 0 read the same record forever
            raise Unusual(offset)
        key, _, value = records[space + 1 : at + length - 1].partition(b"=")
        found[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        at += length
    if any(key.startswith("GNU.sparse") for key in found):
        raise Unusual(offset)
    return found


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")
