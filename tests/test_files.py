import errno
import os

import pytest

import gpuload.store.files
from gpuload.store.files import OutputLock


@pytest.mark.parametrize(
    ("code", "kind"), [(errno.EROFS, OSError), (errno.ENOSPC, OSError), (errno.EACCES, PermissionError)]
)
def test_a_lock_file_that_cannot_be_created_names_the_output_and_what_to_do(tmp_path, monkeypatch, code, kind):
    """A read-only disk, one with no free inode, a folder we may not write: the error is about the
    output the user named, keeps its errno (the command line prints one line), and says what to do."""

    def refuse(path, *args):
        raise kind(code, os.strerror(code), str(path))

    monkeypatch.setattr(gpuload.store.files.os, "open", refuse)
    with pytest.raises(kind) as caught, OutputLock(tmp_path / "out.memmap"):
        pass
    assert caught.value.errno == code
    assert str(caught.value) == (
        f"[Errno {code}] cannot write {tmp_path / 'out.memmap'}: its lock file {tmp_path / '.out.memmap.lock'} "
        f"could not be created ({os.strerror(code)}: {tmp_path / '.out.memmap.lock'}); choose an output on a "
        "writable disk with free space"
    )


def test_an_output_under_a_file_is_not_given_disk_advice(tmp_path):
    """Errors that are not the disk's refusal pass as they are, naming the path that failed."""
    (tmp_path / "afile").write_text("notes")
    with pytest.raises(OSError) as caught, OutputLock(tmp_path / "afile" / "out.memmap"):
        pass
    assert caught.value.filename == str(tmp_path / "afile") and "writable disk" not in str(caught.value)
