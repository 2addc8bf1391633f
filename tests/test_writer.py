import errno
import os

import numpy as np
import pytest

import gpuload.writing.writer
from gpuload.writing.writer import BlockWriter


def test_blocks_are_appended_and_the_file_cut_to_size(tmp_path):
    path = tmp_path / "out.bin"
    with BlockWriter(path, capacity=1000) as writer:
        assert path.stat().st_size == 1000  # space reserved up front
        writer.write(np.arange(10, dtype=np.uint8))
        writer.write(np.full((2, 3), 255, dtype=np.uint8))
        assert writer.written == 16
    assert path.read_bytes() == bytes(range(10)) + b"\xff" * 6


def test_existing_file_is_never_overwritten(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        BlockWriter(path, capacity=10)
    assert path.read_bytes() == b"keep"


@pytest.mark.parametrize("capacity", [None, 64])
def test_resume_at_goes_on_after_the_bytes_counted(tmp_path, capacity):
    """What came after the checkpoint's count is cut off: a block skipped past it reads as zeros again."""
    path = tmp_path / "out.bin"
    path.write_bytes(b"kept" + b"\xee" * 20)  # a stopped build's file, written past its checkpoint (4 bytes)
    with BlockWriter(path, capacity=capacity, resume_at=4) as writer:
        assert writer.written == 4
        writer.skip(3)
        writer.write(np.frombuffer(b"new", np.uint8))
    assert path.read_bytes() == b"kept" + bytes(3) + b"new"


class TestFullDisk:
    """A full disk names the file, the bytes it needed, the space left and what to do; errno stays ENOSPC
    (the command line prints it as one line)."""

    @pytest.mark.parametrize("name", [None, "dataset/out.bin"])
    def test_the_reservation_fails_at_once(self, tmp_path, monkeypatch, name):
        monkeypatch.setattr(gpuload.writing.writer.os, "posix_fallocate", _failing(errno.ENOSPC))
        monkeypatch.setattr(gpuload.writing.writer.os, "statvfs", lambda fd: _Statvfs(free_blocks=1000))
        path = tmp_path / "out.bin"
        with pytest.raises(OSError) as caught:
            BlockWriter(path, capacity=2 * 10**9, name=name)
        assert caught.value.errno == errno.ENOSPC
        assert str(caught.value) == (
            f"[Errno 28] not enough disk space to write {name or path}: it needs 2,000,000,000 bytes (2 GB) and its disk "
            "has 4,096,000 bytes (4.1 MB) free; free space there or write to another disk"
        )

    def test_a_write_past_the_reservation(self, tmp_path, monkeypatch):
        path = tmp_path / "out.bin"
        with BlockWriter(path, capacity=4) as writer:
            writer.write(np.zeros(4, np.uint8))
            monkeypatch.setattr(gpuload.writing.writer.os, "pwrite", _failing(errno.ENOSPC))
            monkeypatch.setattr(gpuload.writing.writer.os, "statvfs", lambda fd: _Statvfs(free_blocks=0))
            with pytest.raises(OSError) as caught:
                writer.write(np.zeros(10, np.uint8))
        assert caught.value.errno == errno.ENOSPC
        assert str(caught.value) == (
            f"[Errno 28] not enough disk space to write {path}: it needs 10 bytes beyond the 4 written and "
            "its disk has 0 bytes free; free space there or write to another disk"
        )

    def test_no_room_for_a_new_file_names_it(self, tmp_path, monkeypatch):
        """ENOSPC at the file's creation (no free inodes, a full directory)."""
        real_open = os.open
        monkeypatch.setattr(
            gpuload.writing.writer.os,
            "open",
            lambda path, *args: _failing(errno.ENOSPC)() if str(path).endswith("out.bin") else real_open(path, *args),
        )
        monkeypatch.setattr(gpuload.writing.writer.os, "statvfs", lambda path: _Statvfs(free_blocks=0))
        with pytest.raises(OSError) as caught:
            BlockWriter(tmp_path / "out.bin", capacity=10, name="dataset/out.bin")
        assert caught.value.errno == errno.ENOSPC
        assert str(caught.value) == (
            "[Errno 28] not enough disk space to write dataset/out.bin: it needs a new file and its disk has "
            "0 bytes free; free space there or write to another disk"
        )

    def test_no_free_inode_is_not_called_a_lack_of_space(self, tmp_path, monkeypatch):
        """ENOSPC at the file's creation on a disk with 50 MB free and no inode left."""
        real_open = os.open
        monkeypatch.setattr(
            gpuload.writing.writer.os,
            "open",
            lambda path, *args: _failing(errno.ENOSPC)() if str(path).endswith("out.bin") else real_open(path, *args),
        )
        monkeypatch.setattr(gpuload.writing.writer.os, "statvfs", lambda path: _Statvfs(12_800, free_inodes=0))
        with pytest.raises(OSError) as caught:
            BlockWriter(tmp_path / "out.bin", capacity=10, name="dataset/out.bin")
        assert caught.value.errno == errno.ENOSPC
        assert str(caught.value) == (
            "[Errno 28] no free inode left to write dataset/out.bin (its disk has 52,428,800 bytes (52.4 MB) free, "
            "but all its 1,000 inodes are taken: each file or folder takes one, whatever its size); delete files "
            "there or write to another disk"
        )

    def test_a_full_disk_found_by_the_write_behind_names_the_file(self, tmp_path, monkeypatch):
        monkeypatch.setattr(gpuload.writing.writer, "_WRITE_BEHIND_BYTES", 1)
        monkeypatch.setattr(gpuload.writing.writer, "start_writeback", _failing(errno.ENOSPC))
        monkeypatch.setattr(gpuload.writing.writer.os, "statvfs", lambda path: _Statvfs(free_blocks=0))
        with BlockWriter(tmp_path / "out.bin", capacity=4, write_behind=True, name="dataset/out.bin") as writer:
            with pytest.raises(OSError) as caught:
                writer.write(np.zeros(4, np.uint8))
        assert caught.value.errno == errno.ENOSPC
        assert str(caught.value).startswith("[Errno 28] not enough disk space to write dataset/out.bin: it needs")

    def test_other_write_errors_are_left_as_they_are(self, tmp_path, monkeypatch):
        with BlockWriter(tmp_path / "out.bin", capacity=4) as writer:
            monkeypatch.setattr(gpuload.writing.writer.os, "pwrite", _failing(errno.EIO))
            with pytest.raises(OSError, match=r"^\[Errno 5\] Input/output error$"):
                writer.write(np.zeros(4, np.uint8))


def _failing(code: int):
    """A stand-in for an os call that fails with ``code``."""

    def fail(*args):
        raise OSError(code, os.strerror(code))

    return fail


class _Statvfs:
    def __init__(self, free_blocks: int, free_inodes: int = 1000) -> None:
        self.f_bavail, self.f_frsize = free_blocks, 4096
        self.f_files, self.f_favail = 1000, free_inodes


def test_filesystems_without_fallocate_still_work(tmp_path, monkeypatch):
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(gpuload.writing.writer.os, "posix_fallocate", unsupported)
    with BlockWriter(tmp_path / "out.bin", capacity=100) as writer:
        writer.write(np.ones(4, np.uint8))
    assert (tmp_path / "out.bin").read_bytes() == b"\x01" * 4


def test_short_writes_are_completed(tmp_path, monkeypatch):
    real = os.pwrite
    monkeypatch.setattr(gpuload.writing.writer.os, "pwrite", lambda fd, data, offset: real(fd, data[:3], offset))
    with BlockWriter(tmp_path / "out.bin", capacity=100) as writer:
        writer.write(np.arange(10, dtype=np.uint8))
    assert (tmp_path / "out.bin").read_bytes() == bytes(range(10))


def test_write_behind_starts_the_disk_writes_as_the_file_grows(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(gpuload.writing.writer, "_WRITE_BEHIND_BYTES", 10)
    monkeypatch.setattr(
        gpuload.writing.writer, "start_writeback", lambda fd, offset, length: started.append((offset, length))
    )
    with BlockWriter(tmp_path / "out.bin", capacity=100, write_behind=True) as writer:
        for _ in range(5):
            writer.write(np.zeros(6, np.uint8))
    assert started == [(0, 12), (12, 12)]  # every 10 bytes or more, the range since the last start
    with BlockWriter(tmp_path / "other.bin", capacity=100) as writer:
        writer.write(np.zeros(60, np.uint8))
    assert len(started) == 2  # off by default


def test_start_writeback_is_harmless_on_a_real_file(tmp_path):
    from gpuload.writing.files import start_writeback

    with open(tmp_path / "f", "wb") as file:
        file.write(b"x" * 10_000)
        start_writeback(file.fileno(), 0, 10_000)
