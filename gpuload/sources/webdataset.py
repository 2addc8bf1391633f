"""Images held in WebDataset tar shards: no unpacking to disk, one sample in memory.

A shard is a tar file (``.tar``, or compressed: ``.tar.gz``, ``.tgz``...) whose members are grouped
into samples by key, as WebDataset groups them: ``000123.jpg``, ``000123.cls`` and ``000123.json`` are
the members ``jpg``, ``cls`` and ``json`` of sample ``000123`` (the key is the member's path up to the
first dot of its name, and a sample's members lie one after the other). The shards are given as a
file, a folder of them (in the order of their names), or a brace pattern as WebDataset's
(``train-{000000..000099}.tar``, ``{a,b}``).

What a sample's members become:

- the image: its member with an image extension (``jpg``, ``jpeg``, ``webp``, ``png``... the first of
  those in that order), or the member given the role ``image``;
- ``cls``: the class label (an index, or a class name: a zero-padded ``001`` is a name), as WebDataset
  writes it; or a JSON key ``label``;
- ``txt``: a text field named ``txt``;
- ``json``: an object, each of whose keys is a field (see :mod:`gpuload.sources.samples`);
- another image member: a segmentation mask, a field named ``mask`` (``000123.png`` beside
  ``000123.jpg``) or by what precedes its extension (``000123.seg.png``: ``seg``); left out with
  ``--column mask=ignore``. A role given to an image extension is its: ``--column png=mask`` makes
  the ``png`` member a mask field named ``png`` (and not the image), ``--column png=ignore`` leaves it out.

An uncompressed shard is read by its headers: an image's bytes are left where they lie in the shard,
and the build reads them there (no copy of the images); a compressed shard is read as a stream, its
images copied into the build's folder. A sample with no image member is skipped and listed; members of other extensions are left out, with
one warning per extension. A shard that ends before its last member (truncated, or a damaged
compressed stream) stops the build with an error naming it.
"""

from __future__ import annotations

import itertools
import os
import re
import tarfile
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..errors import SourceError, UsageError
from . import tarheaders
from .samples import Mask, Sample, SampleScan, ScannedIndex, Sink, Stored

__all__ = [
    "IMAGE_EXTENSIONS",
    "TAR_SUFFIXES",
    "expand_braces",
    "is_pattern",
    "read_shard",
    "scan_webdataset",
    "shard_paths",
]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "webp", "png", "ppm", "bmp", "pgm", "tif", "tiff")  # the image's, in preference
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
_KEY = re.compile(r"^((?:.*/|)[^./][^.]*)[.]([^/]*)$")  # WebDataset's base_plus_ext: path up to the name's first dot
_BRACES = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")


def is_pattern(text: str) -> bool:
    """Whether ``text`` holds a brace pattern of WebDataset's.

    Example:
        >>> is_pattern("train-{000000..000009}.tar"), is_pattern("train-000000.tar")
        (True, False)
    """
    return _BRACES.search(text) is not None


def expand_braces(pattern: str) -> list[str]:
    """The names a brace pattern stands for, as WebDataset (``braceexpand``) expands them: ``{a..b}``
    a range of integers (zero-padded to ``a``'s width), ``{x,y}`` alternatives, several groups combined.

    Raises:
        UsageError: an empty group or a backwards range.

    Example:
        >>> expand_braces("s-{08..10}-{a,b}.tar")
        ['s-08-a.tar', 's-08-b.tar', 's-09-a.tar', 's-09-b.tar', 's-10-a.tar', 's-10-b.tar']
    """
    parts = _BRACES.split(pattern)  # text, group, text, group, ..., text
    choices: list[list[str]] = []
    for position, part in enumerate(parts):
        if position % 2 == 0:
            choices.append([part])
            continue
        found = _RANGE.match(part)
        if found:
            first, last = int(found[1]), int(found[2])
            if last < first:
                raise UsageError(f"{pattern}: the range {{{part}}} goes backwards; write {{{found[2]}..{found[1]}}}")
            width = len(found[1])
            choices.append([f"{number:0{width}d}" for number in range(first, last + 1)])
        elif part and "," in part:
            choices.append(part.split(","))
        else:
            raise UsageError(f"{pattern}: {{{part}}} is neither a range {{000..009}} nor alternatives {{a,b}}")
    return ["".join(names) for names in itertools.product(*choices)]


def shard_paths(src: str | Path) -> list[Path]:
    """The shards ``src`` names: a tar file, a folder of them (sorted by name), or a brace pattern.

    Raises:
        FileNotFoundError: a shard the pattern names is missing, or a folder holds none.
    """
    text = str(src)
    if is_pattern(text):
        paths = [Path(name).expanduser().absolute() for name in expand_braces(text)]
        missing = [path for path in paths if not path.is_file()]
        if missing:
            raise FileNotFoundError(
                f"{missing[0]} does not exist ({len(missing)} of the {len(paths)} shards the pattern {text} names "
                "are missing); fix the pattern or fetch the shards"
            )
        return paths
    path = Path(text).expanduser().absolute()
    if path.is_dir():
        shards = sorted(entry for entry in path.iterdir() if entry.name.endswith(TAR_SUFFIXES) and entry.is_file())
        if not shards:
            raise FileNotFoundError(f"{path} holds no tar shard ({', '.join(TAR_SUFFIXES)})")
        return shards
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass a tar shard, a folder of them or a brace pattern")
    return [path]


def read_shard(path: Path) -> Iterator[tuple[str, dict[str, bytes | Stored]]]:
    """``(key, {extension: bytes})`` for each sample of the shard ``path``; one sample's members in memory
    at a time. An uncompressed shard is read by its headers (:mod:`gpuload.sources.tarheaders`), its
    image members (by extension) given as :class:`Stored`: where their bytes lie, unread; a compressed
    one is read as a stream (tarfile's ``r|*``), every member's bytes read.

    Raises:
        SourceError: the shard ends before a member does, or is not a tar file.
    """
    key, members, count = None, {}, 0
    try:
        with open(path, "rb") as file:
            for name, data in _shard_members(path, file):
                found = _KEY.match(name)
                if found is None:
                    continue  # no extension: no member of a sample (WebDataset leaves them out too)
                extension = found[2].lower()
                if found[1] != key:
                    if members:
                        yield key, members
                        count += 1
                    key, members = found[1], {}
                if extension in members:  # which is the sample's? webdataset refuses it too
                    raise SourceError(
                        path,
                        f"sample {key!r} holds the member {extension!r} twice; keep one of them (rewrite the shard)",
                    )
                members[extension] = data
    except (tarfile.TarError, EOFError, OSError) as error:
        if isinstance(error, OSError) and not _damage(error):
            raise
        raise SourceError(
            path,
            f"is truncated or damaged after {count} samples ({type(error).__name__}: {error}); download it again, "
            "or leave it out",
        ) from None
    if members:
        yield key, members


def _shard_members(path: Path, file) -> Iterator[tuple[str, bytes | Stored]]:
    """The name of each regular member of the shard open as ``file``, with its bytes, or where they lie
    (:class:`Stored`: an uncompressed shard's images). Read by the headers; from a header that
    :func:`gpuload.sources.tarheaders.members` does not read (or a compressed shard: from the start) on,
    by ``tarfile``."""
    fd, size = file.fileno(), os.fstat(file.fileno()).st_size
    start = 0
    try:
        if size < 2 * tarheaders.BLOCK:  # too short for a tar: tarfile says what it is
            raise tarheaders.Unusual(0)
        for name, offset, length in tarheaders.members(fd, size):
            yield name, _member_data(path, fd, name, offset, length)
        return
    except tarheaders.Unusual as unusual:
        start = unusual.offset
    file.seek(start)
    try:
        tar, seekable = _opened(file, "r:"), True
    except tarfile.ReadError:
        if start:
            raise
        file.seek(0)
        tar, seekable = _opened(file, "r|*"), False
    with tar:
        for member in _each(tar):
            tar.members = []  # tarfile keeps every TarInfo read: millions in one big shard
            if not member.isfile():
                continue
            if seekable and not member.issparse() and member.offset_data + member.size > size:
                raise tarfile.ReadError("unexpected end of data")  # (a sparse member's size counts its holes)
            if seekable and not member.issparse() and member.size >= 0:  # (tarfile reads a negative size as 0)
                yield member.name, _member_data(path, fd, member.name, member.offset_data, member.size)
            else:
                yield member.name, tar.extractfile(member).read()
        # tarfile ends a tar at any header it cannot read, a missing one too (a shard cut where a header
        # would start), without a word; a tar ends at a zero block (a stream cut short reads less than one)
        ended = tar.offset
        block = os.pread(fd, tarheaders.BLOCK, ended) if seekable else None
        if block is not None and len(block) == tarheaders.BLOCK and block.count(0) < tarheaders.BLOCK:
            raise tarfile.ReadError(f"the header at byte {ended:,} cannot be read")
        if (len(block) if block is not None else tar.fileobj.tell() - ended) < tarheaders.BLOCK:
            raise tarheaders.cut_short(ended)


def _opened(file, mode: str) -> tarfile.TarFile:
    """``tarfile.open`` (which reads the first member); see :func:`_header_damage`."""
    with _header_damage():
        return tarfile.open(fileobj=file, mode=mode)


def _each(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The members ``tar`` reads; see :func:`_header_damage`."""
    with _header_damage():
        yield from tar


@contextmanager
def _header_damage() -> Iterator[None]:
    """tarfile's ``ValueError`` of its parse of a damaged header (a GNU sparse map cut short) as the
    damage it is (only tarfile's own reading: a ``ValueError`` of ours stays a traceback)."""
    try:
        yield
    except ValueError as error:
        raise tarfile.ReadError(f"a damaged header ({error})") from None


def _member_data(path: Path, fd: int, name: str, offset: int, length: int) -> bytes | Stored:
    """A member of an uncompressed shard: an image's place (:class:`Stored`), anything else's bytes."""
    if name.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS:
        return Stored(path, offset, length)
    return os.pread(fd, length, offset)


def _damage(error: OSError) -> bool:
    """An ``OSError`` that a damaged compressed stream raises (gzip's, lzma's), not the machine's."""
    return type(error).__name__ in ("BadGzipFile", "LZMAError") or "compressed" in str(error).lower()


def scan_webdataset(
    src: str | Path,
    *,
    classes: Sequence[str] | None,
    roles: dict[str, str],
    into: Path,
    shards: list[Path] | None = None,
    progress: bool = False,
    sink: Sink | None = None,
) -> ScannedIndex:
    """Scan the samples of the shards ``src`` names into the new folder ``into`` (see the module).

    Raises:
        SourceError: a shard is truncated or damaged, or a sample cannot be taken (named, with what to do).
        FileNotFoundError: a shard is missing.
    """
    shards = shards or shard_paths(src)
    root = Path(_common_folder(shards))
    image_role = next((name for name, role in roles.items() if role == "image"), None)
    label_role = next((name for name, role in roles.items() if role == "label"), None)
    scan = SampleScan(
        into,
        root=root,
        source=Path(str(src)),
        source_format="webdataset",
        classes=classes,
        roles=roles,
        default_class=_default_class(str(src), shards),
        progress=progress,
        sink=sink,
    )
    unknown: Counter[str] = Counter()
    with scan:  # a failure (or Ctrl-C) closes the scan's files and the shards it read images from
        for shard in shards:
            named = shard.relative_to(root).as_posix()
            for key, members in read_shard(shard):
                where = f"sample {key!r} of {shard}"
                extension = (  # an image member given another role (--column png=mask) is not the image
                    image_role
                    if image_role in members
                    else next((e for e in IMAGE_EXTENSIONS if e in members and e not in roles), None)
                )
                if extension is None:
                    scan.skip(
                        f"{named}/{key}",
                        f"no image among its members ({', '.join(sorted(members))})",
                    )
                    continue
                image = members.pop(extension)
                values, label = _values(members, f"sample {key!r}", shard, roles, unknown, scan.read)
                if label_role is not None:
                    label = values.pop(label_role, label)
                elif label is None and "label" in values and roles.get("label") is None:
                    label = values.pop("label")
                scan.add(
                    Sample(
                        name=f"{named}/{key}.{extension}",
                        image=image,
                        label=label,
                        values=values,
                        where=where,
                    )
                )
    for extension, count in sorted(unknown.items()):
        warnings.warn(
            f"{count} samples of {src} have a member {extension!r}, which gpuload does not read (it reads images, "
            "cls, txt and json); left out",
            stacklevel=3,
        )
    return scan.finish(describe=lambda position: f"sample {position}")


def _values(
    members: dict[str, bytes | Stored],
    where: str,
    shard: Path,
    roles: dict[str, str],
    unknown: Counter,
    read: Callable[[Stored], bytes],
) -> tuple[dict[str, object], int | str | None]:
    """A sample's members (but its image) as named values, and its ``cls`` label (``read``: a
    :class:`Stored` member's bytes)."""
    import json

    values: dict[str, object] = {}
    label = None
    for extension, data in members.items():
        if extension == "cls":
            label = _text(data, where, shard, "cls").strip()
            zero_padded = len(label) > 1 and label.startswith("0")  # folder 001: a class name, as a table's
            label = int(label) if label.lstrip("-").isdigit() and not zero_padded else label
        elif extension == "txt":
            values["txt"] = _text(data, where, shard, "txt")
        elif extension == "json":
            try:
                decoded = json.loads(data)
            except ValueError as error:
                raise SourceError(shard, f"{where}: its json is not valid JSON ({error}); fix it") from None
            if not isinstance(decoded, dict):
                raise SourceError(shard, f"{where}: its json is not an object of named values")
            values.update(decoded)
        elif roles.get(extension) == "ignore":
            continue
        elif extension.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS:  # a second image: a mask
            mask = read(data) if isinstance(data, Stored) else data
            named = extension if extension in roles else extension.rsplit(".", 1)[0] if "." in extension else "mask"
            values[named] = Mask(mask)
        else:
            unknown[extension] += 1
    return values, label


def _text(data: bytes, where: str, shard: Path, extension: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SourceError(shard, f"{where}: its {extension} is not UTF-8 text") from None


def _common_folder(shards: list[Path]) -> str:
    import os

    return os.path.commonpath([str(shard.parent) for shard in shards])


def _default_class(src: str, shards: list[Path]) -> str:
    """The one class of unlabelled samples: the pattern's or shard's name without its numbers and suffix."""
    name = (
        Path(_BRACES.sub("", src)).name if is_pattern(src) else shards[0].name if len(shards) == 1 else Path(src).name
    )
    for suffix in TAR_SUFFIXES:
        name = name.removesuffix(suffix)
    return name.strip("-_.") or "samples"
