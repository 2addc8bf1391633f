import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpuload
import gpuload.writing.files
from gpuload.errors import BusyError
from gpuload.writing.files import OutputLock, no_room


@pytest.mark.parametrize(("code", "kind"), [(errno.EROFS, OSError), (errno.EACCES, PermissionError)])
def test_a_lock_file_that_cannot_be_created_names_the_output_and_what_to_do(tmp_path, monkeypatch, code, kind):
    """A read-only disk, a folder we may not write: the error is about the output the user named,
    keeps its errno (the command line prints one line), and says what to do."""

    def refuse(path, *args):
        raise kind(code, os.strerror(code), str(path))

    monkeypatch.setattr(gpuload.writing.files.os, "open", refuse)
    with pytest.raises(kind) as caught, OutputLock(tmp_path / "out.memmap"):
        pass
    assert caught.value.errno == code
    assert str(caught.value) == (
        f"[Errno {code}] cannot write {tmp_path / 'out.memmap'}: its lock file {tmp_path / '.out.memmap.lock'} "
        f"could not be created ({os.strerror(code)}: {tmp_path / '.out.memmap.lock'}); choose an output on a "
        "writable disk with free space"
    )


def test_a_lock_file_that_is_a_folder_says_to_remove_it_and_is_left_alone(tmp_path):
    """Not "[Errno 21] Is a directory: ...": what it is, and what to do; the folder is not the tool's to remove."""
    (tmp_path / ".out.memmap.lock" / "inside").mkdir(parents=True)
    with pytest.raises(IsADirectoryError, match=r"its lock file .*\.out\.memmap\.lock is a folder, not a file"):
        with OutputLock(tmp_path / "out.memmap"):
            pass
    assert (tmp_path / ".out.memmap.lock" / "inside").is_dir()


@pytest.mark.parametrize("target", ["ghost", "notes.txt"])
def test_a_lock_file_that_is_a_symlink_is_not_followed(tmp_path, target):
    """A link at the lock's name, to a missing path or to a user's file: nothing is created or locked there,
    the link stays, and the error says what to do."""
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / ".out.memmap.lock").symlink_to(tmp_path / target)
    with pytest.raises(OSError, match=r"lock file .*\.out\.memmap\.lock is a symbolic link .*remove the link"):
        with OutputLock(tmp_path / "out.memmap"):
            pass
    assert not (tmp_path / "ghost").exists() and (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / ".out.memmap.lock").is_symlink()


def test_an_output_under_a_file_is_not_given_disk_advice(tmp_path):
    """Errors that are not the disk's refusal pass as they are, naming the path that failed."""
    (tmp_path / "afile").write_text("notes")
    with pytest.raises(OSError) as caught, OutputLock(tmp_path / "afile" / "out.memmap"):
        pass
    assert caught.value.filename == str(tmp_path / "afile") and "writable disk" not in str(caught.value)


class Statvfs:
    """What ``os.statvfs`` says of a disk with ``free_blocks`` of 4 KiB and ``free_inodes`` of 1,000."""

    def __init__(self, free_blocks: int, free_inodes: int = 1000) -> None:
        self.f_bavail, self.f_frsize = free_blocks, 4096
        self.f_files, self.f_favail = 1000, free_inodes


@pytest.mark.parametrize(
    ("free_inodes", "message"),
    [
        (
            1000,
            "not enough disk space to write {out}: its lock file {lock} could not be created; free space there or "
            "choose an output on another disk",
        ),
        (
            0,
            "no free inode left to write {out}: its lock file {lock} could not be created (its disk has 52,428,800 "
            "bytes (52.4 MB) free, but all its 1,000 inodes are taken: each file or folder takes one, whatever its "
            "size); delete files there or choose an output on another disk",
        ),
    ],
)
def test_a_lock_file_on_a_full_disk_says_whether_bytes_or_inodes_ran_out(tmp_path, monkeypatch, free_inodes, message):
    def full(path, *args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(gpuload.writing.files.os, "open", full)
    monkeypatch.setattr(gpuload.writing.files.os, "statvfs", lambda path: Statvfs(12_800, free_inodes))
    with pytest.raises(OSError) as caught, OutputLock(tmp_path / "out.memmap"):
        pass
    assert caught.value.errno == errno.ENOSPC
    assert str(caught.value) == "[Errno 28] " + message.format(
        out=tmp_path / "out.memmap", lock=tmp_path / ".out.memmap.lock"
    )


class TestNoRoom:
    def test_no_free_inode_while_bytes_remain(self, monkeypatch):
        monkeypatch.setattr(gpuload.writing.files.os, "statvfs", lambda path: Statvfs(12_800, free_inodes=0))
        assert no_room("/", "to write x", "there or write to another disk", needed="a new file") == (
            "no free inode left to write x (its disk has 52,428,800 bytes (52.4 MB) free, but all its 1,000 inodes "
            "are taken: each file or folder takes one, whatever its size); delete files there or write to another disk"
        )

    def test_a_disk_that_counts_no_inodes_is_short_of_bytes(self, monkeypatch):
        """btrfs reports 0 inodes of 0: that is no inode count, not a full table."""
        stats = Statvfs(0, free_inodes=0)
        stats.f_files = 0
        monkeypatch.setattr(gpuload.writing.files.os, "statvfs", lambda path: stats)
        assert no_room("/", "to write x", "there", needed="10 bytes") == (
            "not enough disk space to write x: it needs 10 bytes and its disk has 0 bytes free; free space there"
        )

    def test_the_disk_of_a_path_not_made_yet_is_that_of_its_nearest_folder(self, tmp_path, monkeypatch):
        asked = []
        monkeypatch.setattr(gpuload.writing.files.os, "statvfs", lambda path: asked.append(path) or Statvfs(1))
        no_room(tmp_path / "a" / "b", "to write b", "there")
        assert asked == [tmp_path]


class TestOutputLock:
    """The lock file beside an output is gone after a run, done or failed, and never shared by two runs."""

    def test_no_lock_file_is_left_after_a_run_done_or_failed(self, tmp_path):
        with OutputLock(tmp_path / "out"):
            assert os.listdir(tmp_path) == [".out.lock"]
        with pytest.raises(RuntimeError), OutputLock(tmp_path / "out"):
            raise RuntimeError("a failed run")
        assert os.listdir(tmp_path) == []

    def test_a_run_that_opened_the_file_as_the_holder_removed_it_locks_a_new_one(self, tmp_path, monkeypatch):
        """The race of removing a lock file: a second run opens the file, the first removes it and lets
        go, the second takes the lock of the removed file; it must see that and lock the file at the name,
        or a third run would create a new file and hold "the" lock at the same time."""
        out = tmp_path / "out"
        first = OutputLock(out).__enter__()
        real_open = OutputLock._open

        def open_as_the_holder_finishes(self):
            fd = real_open(self)
            if first._fd != -1:
                first.__exit__(None, None, None)
            return fd

        monkeypatch.setattr(OutputLock, "_open", open_as_the_holder_finishes)
        with OutputLock(out) as second:
            assert os.path.samestat(os.fstat(second._fd), os.stat(second.lock_path))
            with pytest.raises(BusyError, match=f"another gpuload run is writing {out}"):
                OutputLock(out).__enter__()
        assert os.listdir(tmp_path) == []

    def test_runs_in_two_processes_never_hold_it_at_once(self, tmp_path):
        """Two processes take and leave the lock of one output hundreds of times: each, while it holds it,
        creates a file that must not exist (O_EXCL) and removes it."""
        child = textwrap.dedent(f"""
            import os
            from pathlib import Path
            from gpuload.errors import BusyError
            from gpuload.writing.files import OutputLock
            out, held, taken = Path({str(tmp_path / "out")!r}), {str(tmp_path / "held")!r}, 0
            for _ in range(400):
                try:
                    with OutputLock(out):
                        os.close(os.open(held, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # FileExistsError: shared
                        os.unlink(held)
                        taken += 1
                except BusyError:
                    pass
            print(taken)
        """)
        env = {**os.environ, "PYTHONPATH": str(Path(gpuload.__file__).parent.parent)}
        runs = [
            subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, env=env)
            for _ in range(2)
        ]
        outputs = [run.communicate(timeout=120)[0] for run in runs]
        assert [run.returncode for run in runs] == [0, 0] and all(int(taken) > 0 for taken in outputs)
        assert os.listdir(tmp_path) == []
