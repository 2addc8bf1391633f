"""The header reader of uncompressed tars (gpuload.sources.tarheaders), checked against Python's tarfile
on tars written by tarfile in each of its formats and by webdataset's TarWriter."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest
import webdataset as wds
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuload import SourceError
from gpuload.sources.tarheaders import BLOCK, Unusual, members
from gpuload.sources.webdataset import _shard_members, read_shard


def listed(path: Path) -> list[tuple[str, int, int]]:
    with open(path, "rb") as file:
        return list(members(file.fileno(), path.stat().st_size))


def by_tarfile(path: Path) -> list[tuple[str, int, int]]:
    with tarfile.open(path, "r:") as tar:
        return [(member.name, member.offset_data, member.size) for member in tar if member.isfile()]


NAMES = st.text(st.characters(codec="utf-8", exclude_characters="/\0"), min_size=1, max_size=40).filter(
    lambda name: name not in (".", "..")
)
ENTRIES = st.lists(
    st.tuples(
        st.lists(NAMES, min_size=1, max_size=5).map("/".join),  # up to ~200 characters: prefix and long names
        st.sampled_from(["file", "folder", "link"]),
        st.integers(0, 2 * BLOCK + 3),
        st.sampled_from([1_700_000_000, 1_700_000_000.5]),  # a float mtime: a pax header in pax format
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(entries=ENTRIES, fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
def test_every_member_as_tarfile_lists_it(tmp_path_factory, entries, fmt):
    path = tmp_path_factory.mktemp("tars") / "t.tar"
    try:
        with tarfile.open(path, "w", format=fmt, encoding="utf-8") as tar:
            for name, kind, size, mtime in entries:
                info = tarfile.TarInfo(name)
                info.mtime = mtime
                info.type = {"file": tarfile.REGTYPE, "folder": tarfile.DIRTYPE, "link": tarfile.SYMTYPE}[kind]
                info.linkname = "elsewhere" if kind == "link" else ""
                info.size = size if kind == "file" else 0
                tar.addfile(info, io.BytesIO(bytes(range(256)) * (size // 256 + 1)) if kind == "file" else None)
    except ValueError:  # a name too long for ustar: no such tar can be written
        return
    assert listed(path) == by_tarfile(path)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_long_names_each_way_a_format_writes_them(tmp_path, fmt):
    """Beyond 100 bytes a name goes to ustar's prefix, a GNU long-name member, or a pax header."""
    names = ["a" * 90 + "/" + "b" * 60 + ".jpg", "short.cls", "ü" * 30 + "/" + "é" * 40 + ".json"]
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=fmt, encoding="utf-8") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 5
            tar.addfile(info, io.BytesIO(b"12345"))
    assert [name for name, _, _ in listed(path)] == names and listed(path) == by_tarfile(path)


def test_a_webdataset_shard(photo_folder, tmp_path):
    """TarWriter's members each carry a pax header (a float mtime): read, not handed to tarfile."""
    path = tmp_path / "shard.tar"
    with wds.TarWriter(str(path)) as sink:
        for position, photo in enumerate(sorted(photo_folder.rglob("*.jpg"))[:5]):
            sink.write({"__key__": f"dir/{position:06d}", "jpg": photo.read_bytes(), "cls": position})
    assert listed(path) == by_tarfile(path) and len(listed(path)) == 10


def write_tar(path: Path, count: int) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for position in range(count):
            for extension, data in (("jpg", b"j" * (100 + position)), ("cls", str(position).encode())):
                info = tarfile.TarInfo(f"{position:04d}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def patch_header(path: Path, offset: int, kind: bytes | None = None, checksum: bool = True) -> None:
    """Give the header at ``offset`` another type (its checksum recomputed, or left wrong)."""
    data = bytearray(path.read_bytes())
    header = data[offset : offset + BLOCK]
    if kind is not None:
        header[156:157] = kind
    if checksum:
        header[148:156] = b" " * 8
        header[148:156] = f"{sum(header):06o}\0 ".encode()
    else:
        header[0] ^= 0x01
    data[offset : offset + BLOCK] = header
    path.write_bytes(bytes(data))


def test_a_type_it_does_not_read_is_left_to_tarfile_from_there(tmp_path):
    path = write_tar(tmp_path / "t.tar", 4)
    third = by_tarfile(path)[2][1] - BLOCK  # the header of the third member
    patch_header(path, third, kind=b"V")  # a GNU volume header: tarfile skips it
    with pytest.raises(Unusual) as raised:
        listed(path)
    assert raised.value.offset == third
    samples = dict(read_shard(path))
    assert sorted(samples) == ["0000", "0001", "0002", "0003"] and "jpg" not in samples["0001"]
    assert [bytes(samples[key]["cls"]) for key in ("0002", "0003")] == [b"2", b"3"]


def test_a_damaged_header_after_the_first_is_named_where_tarfile_would_stop_without_a_word(tmp_path):
    path = write_tar(tmp_path / "t.tar", 4)
    third = by_tarfile(path)[2][1] - BLOCK
    patch_header(path, third, checksum=False)
    with pytest.raises(tarfile.ReadError, match=f"the header at byte {third:,} fails its checksum"):
        listed(path)
    with pytest.raises(
        SourceError, match=rf"is truncated or damaged after 0 samples \(ReadError: the header at byte {third:,}"
    ):
        list(read_shard(path))


@pytest.mark.parametrize("cut", [BLOCK + 50, 3 * BLOCK + 10])  # inside the first member's data, inside a header
def test_a_tar_cut_short(tmp_path, cut):
    path = write_tar(tmp_path / "t.tar", 4)
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(tarfile.ReadError, match="unexpected end of data"):
        listed(path)


@pytest.mark.parametrize("member", [4, 8])  # at the third sample's first header; after the last member
def test_a_tar_cut_between_members_is_cut_short_not_complete(tmp_path, member):
    """Cut where a header would start, a tar lacks the zero blocks that end an archive: cut short (a
    writer stopped, a download cut), where tarfile reads the members before as the whole archive."""
    path = write_tar(tmp_path / "t.tar", 4)
    ends = [offset - BLOCK for _, offset, _ in by_tarfile(path)] + [
        (lambda _, offset, size: offset + -(-size // BLOCK) * BLOCK)(*by_tarfile(path)[-1])
    ]
    path.write_bytes(path.read_bytes()[: ends[member]])
    with pytest.raises(tarfile.ReadError, match="ends without the two zero blocks that end a tar"):
        listed(path)
    with pytest.raises(SourceError, match=rf"is truncated or damaged after {member // 2 - 1} samples"):
        list(read_shard(path))


def test_a_first_header_that_is_not_a_tar_is_left_to_tarfile(tmp_path):
    path = tmp_path / "t.tar"
    path.write_bytes(b"\x1f\x8b" + bytes(2 * BLOCK))  # a gzip magic: not a header
    with pytest.raises(Unusual) as raised:
        listed(path)
    assert raised.value.offset == 0


@pytest.mark.parametrize("record", [b"0 path=x\n", b"-9 path=x\n"])
def test_a_pax_record_of_no_length_is_left_to_tarfile_not_read_forever(tmp_path, record):
    """A damaged pax record's length (0, negative) would not move the reader on: tarfile reads from there
    (a length of 0 it calls invalid; a record that does not start with digits ends its records)."""
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("0000.jpg")
        info.size, info.pax_headers = 3, {"comment": "x"}
        tar.addfile(info, io.BytesIO(b"abc"))
    data = bytearray(path.read_bytes())
    data[BLOCK : BLOCK + len(record)] = record  # the pax header's first record
    path.write_bytes(bytes(data))
    with pytest.raises(Unusual) as raised:
        listed(path)
    assert raised.value.offset == 0
    if record.startswith(b"0"):
        with pytest.raises(SourceError, match="invalid header"):
            list(read_shard(path))
    else:
        assert [(key, sorted(members)) for key, members in read_shard(path)] == [("0000", ["jpg"])]


@pytest.mark.parametrize(("values", "unusual"), [({"comment": "git archive's commit"}, False), ({"path": "x"}, True)])
def test_a_global_pax_header(tmp_path, values, unusual):
    """A global header's ``path`` (or ``size``) names every member after it that names none of its own,
    as tarfile reads it: left to tarfile from there; one of other keys (git archive's comment) is skipped."""
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers=values) as tar:
        for name in ("0000.jpg", "0000.cls"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    if unusual:
        with pytest.raises(Unusual) as raised:
            listed(path)
        assert raised.value.offset == 0
    else:
        assert listed(path) == by_tarfile(path)
    with open(path, "rb") as file:
        assert [name for name, _ in _shard_members(path, file)] == [name for name, _, _ in by_tarfile(path)]


def test_a_pax_size_that_is_not_a_number_is_left_to_tarfile(tmp_path):
    """It escaped as a ValueError (a traceback); tarfile takes such a size as 0."""
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("0000.cls")
        info.size, info.pax_headers = 0, {"size": "x"}
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(Unusual) as raised:
        listed(path)
    assert raised.value.offset == 0 and by_tarfile(path) == [("0000.cls", 3 * BLOCK, 0)]


def sparse_tar(path: Path, name: str, data: bytes, hole: int) -> Path:
    """A GNU tar (tarfile's gnu format: a long name in an ``L`` member) whose one member is an old-style
    GNU sparse file (type ``S``): ``data``, then a hole of ``hole`` bytes that the tar does not hold."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    raw = bytearray(path.read_bytes())
    [(_, data_offset, _)] = by_tarfile(path)
    header = raw[data_offset - BLOCK : data_offset]
    header[156:157] = b"S"
    header[386:410] = f"{0:011o}\0{len(data):011o}\0".encode()  # one piece: the data at the start
    header[483:495] = f"{len(data) + hole:011o}\0".encode()  # the real size, the hole after the data
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header):06o}\0 ".encode()
    raw[data_offset - BLOCK : data_offset] = header
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("name", ["s.jpg", "n" * 120 + ".jpg"])  # a long name: an L member before it
def test_a_gnu_sparse_member_is_read_by_tarfile_whole_and_named(tmp_path, name):
    """A sparse member is longer than the bytes the tar holds of it: the fallback to tarfile refused it as
    a shard cut short; and the Unusual raised at the sparse header lost the long name read before it."""
    data = bytes(range(256)) * 8
    path = sparse_tar(tmp_path / "t.tar", name, data, hole=1 << 20)
    with tarfile.open(path, "r:") as tar:
        [member] = tar.getmembers()
        expected = tar.extractfile(member).read()
    assert member.issparse() and len(expected) == len(data) + (1 << 20)
    [(key, found)] = list(read_shard(path))
    assert key == name[:-4] and found == {"jpg": expected}


@pytest.mark.parametrize(
    "record",
    [b"0 x=y\n", b"-5 path=c.jpg\n", b"12 size=abc\n", b"12 size=2.5\n", b"11 size=-1\n", b"99 path=c.jpg\n"],
    ids=["zero length", "negative length", "size not a number", "size not an integer", "negative size", "too long"],
)
def test_a_pax_header_of_odd_records_is_left_to_tarfile(tmp_path, record):
    """A record of length 0 looped forever; a size that is not a whole number raised a ValueError (and
    a negative one, read by tarfile, was read to the end of the file)."""
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("././@PaxHeader", record), ("a.jpg", b"j" * 700), ("b.jpg", b"k" * 10)):
            info = tarfile.TarInfo(name)
            info.size, info.type = len(data), tarfile.XHDTYPE if name.endswith("PaxHeader") else tarfile.REGTYPE
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(Unusual) as raised:
        listed(path)
    assert raised.value.offset == 0
    try:
        with tarfile.open(path, "r:") as tar:
            expected = {member.name: tar.extractfile(member).read() for member in tar if member.isfile()}
            ended = tar.offset
    except tarfile.ReadError:  # a record tarfile refuses too
        with pytest.raises(SourceError, match="is truncated or damaged after 0 samples"):
            list(read_shard(path))
        return
    if "b.jpg" not in expected:  # a size tarfile reads as 0: a.jpg's bytes its next header, the end without a word
        with pytest.raises(SourceError, match=f"the header at byte {ended:,} cannot be read"):
            list(read_shard(path))
        return
    with open(path, "rb") as file:
        found = {
            name: data if isinstance(data, bytes) else os.pread(file.fileno(), data.size, data.offset)
            for name, data in _shard_members(path, file)
        }
    assert found == expected


def members_cut_short(path: Path) -> Path:
    """The tar ``path`` cut where its third member's header starts (no zero blocks to end it)."""
    path.write_bytes(path.read_bytes()[: by_tarfile(path)[2][1] - BLOCK])
    return path


@pytest.mark.parametrize("shard", ["global pax path", "gzip"])
def test_a_tar_read_by_tarfile_cut_between_members_is_cut_short_not_complete(tmp_path, shard):
    """Where tarfile reads a shard (from a header this reader leaves to it, or a compressed one as a
    stream), a cut where a header would start read as the whole archive, without a word."""
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers={"path": "x"}) as tar:
        for name in ("0000.jpg", "0000.cls", "0001.jpg", "0001.cls"):
            info = tarfile.TarInfo(name)
            info.size = 600
            tar.addfile(info, io.BytesIO(bytes(600)))
    members_cut_short(path)
    if shard == "gzip":
        path = path.rename(tmp_path / "t.tar.gz")
        path.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(SourceError, match=r"is truncated or damaged after 0 samples .*ends without the two zero"):
        list(read_shard(path))


def test_a_tar_of_one_header_cut_short_is_not_empty(tmp_path):
    """A shard shorter than two blocks is left to tarfile, which read a lone header as an empty archive."""
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w") as tar:
        folder = tarfile.TarInfo("./")  # GNU tar's first member: the folder it was given
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        tar.addfile(tarfile.TarInfo("0000.cls"), io.BytesIO(b""))
    path.write_bytes(path.read_bytes()[:BLOCK])
    with pytest.raises(SourceError, match="ends without the two zero blocks"):
        list(read_shard(path))


def test_a_pax_header_of_sparse_maps_cut_short_is_damage_not_a_traceback(tmp_path):
    """tarfile's parse of a GNU sparse 1.0 map cut short raised a ValueError (a traceback)."""
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("0000.jpg")
        info.size, info.pax_headers = 600, {"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}
        tar.addfile(info, io.BytesIO(b"12" + bytes(598)))  # its map: "12" and no newline
    path.write_bytes(path.read_bytes()[: 3 * BLOCK])
    with pytest.raises(SourceError, match="is truncated or damaged after 0 samples"):
        list(read_shard(path))
