"""gpuload.remote.cache: a bounded block cache shared by processes, crash-safe."""

import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import gpuload.remote.cache as cache_module
from gpuload.errors import BusyError, UsageError
from gpuload.remote.cache import MARKER, BlockCache, parse_bytes

ROOT = Path(__file__).resolve().parent.parent


def files_on_disk(cache: BlockCache) -> dict[str, int]:
    return {
        f"{path.parent.name[:6]}/{path.name}": path.stat().st_size
        for path in (cache.path / "objects").glob("*/*")
        if path.name != "object.json"
    }


class TestParseBytes:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [("200GB", 200 * 10**9), ("500MiB", 500 * 2**20), ("1.5 TB", 15 * 10**11), ("64k", 64_000), (4096, 4096)],
    )
    def test_sizes(self, text, expected):
        assert parse_bytes(text) == expected

    @pytest.mark.parametrize("bad", ["", "12 parsecs", "-5GB", "0", 0, True, 1.5, "GB", "1" + "0" * 400 + "GB"])
    def test_bad_sizes(self, bad):
        with pytest.raises(UsageError, match="size must be"):
            parse_bytes(bad)


class TestFolder:
    def test_a_new_folder_is_marked_as_ours(self, tmp_path):
        BlockCache(tmp_path / "cache", "1MB")
        assert json.loads((tmp_path / "cache" / MARKER).read_text()) == {"format": "gpuload.cache", "version": 1}
        BlockCache(tmp_path / "cache", "2MB")  # and opens again

    def test_a_folder_that_is_not_ours_is_refused_and_left_alone(self, tmp_path):
        (tmp_path / "photos").mkdir()
        (tmp_path / "photos" / "cat.jpg").write_bytes(b"meow")
        with pytest.raises(UsageError, match=r"is not a gpuload cache \(no gpuload-cache.json\) and holds 1 entries"):
            BlockCache(tmp_path / "photos", "1MB")
        assert sorted(path.name for path in (tmp_path / "photos").iterdir()) == ["cat.jpg"]

    @pytest.mark.parametrize("name", ["objects", "locks", "usage"])
    def test_a_users_folder_with_a_cache_like_name_is_refused_and_left_alone(self, tmp_path, name):
        """No marker: ``objects/`` is the user's (3-D models, say), not a cache's being created."""
        folder = tmp_path / "work" / name / "chairs"
        folder.mkdir(parents=True)
        (folder / "chair1.obj").write_bytes(b"v 0 0 0")
        with pytest.raises(UsageError, match=rf"is not a gpuload cache .* holds 1 entries \(first '{name}'\)"):
            BlockCache(tmp_path / "work", "1MB")
        assert (folder / "chair1.obj").read_bytes() == b"v 0 0 0"
        assert sorted(path.name for path in (tmp_path / "work").iterdir()) == [name]

    def test_a_cache_that_cannot_be_written_is_one_line_naming_it(self, tmp_path, monkeypatch):
        BlockCache(tmp_path / "cache", "1MB")
        (tmp_path / "cache" / "usage").unlink()
        real_open = os.open

        def read_only(path, flags, *args):
            if str(path).endswith("usage") and flags & os.O_CREAT:
                raise OSError(errno.EROFS, "Read-only file system", str(path))
            return real_open(path, flags, *args)

        monkeypatch.setattr(os, "open", read_only)
        with pytest.raises(OSError, match=r"the cache folder .*cache cannot be written \(Read-only file system\)"):
            BlockCache(tmp_path / "cache", "1MB")  # it opens its usage file to count what is there

    def test_a_new_folder_is_private(self, tmp_path):
        BlockCache(tmp_path / "cache", "1MB")
        assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700

    def test_a_folder_that_others_may_write_is_refused(self, tmp_path):
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache").chmod(0o777)
        with pytest.raises(UsageError, match=r"cache is writable by other users \(mode 0o777\); .*chmod go-w"):
            BlockCache(tmp_path / "cache", "1MB")
        assert list((tmp_path / "cache").iterdir()) == []

    @pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
    def test_a_folder_of_another_user_is_refused(self, tmp_path):
        BlockCache(tmp_path / "cache", "1MB")
        os.chown(tmp_path / "cache", 12345, 12345)
        with pytest.raises(UsageError, match=r"cache belongs to another user \(uid 12345, you are uid 0\)"):
            BlockCache(tmp_path / "cache", "1MB")

    def test_another_cache_version_is_refused(self, tmp_path):
        BlockCache(tmp_path / "cache", "1MB")
        (tmp_path / "cache" / MARKER).write_text(json.dumps({"format": "gpuload.cache", "version": 99}))
        with pytest.raises(UsageError, match="a gpuload cache of version 99, this gpuload uses version 1"):
            BlockCache(tmp_path / "cache", "1MB")

    def test_ranks_that_create_one_cache_at_once_all_open_it(self, tmp_path):
        errors = []

        def open_it():
            try:
                BlockCache(tmp_path / "cache", "1MB")
            except Exception as error:  # noqa: BLE001
                errors.append(error)

        for _ in range(20):  # a race: try it many times
            threads = [threading.Thread(target=open_it) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert errors == []
            shutil.rmtree(tmp_path / "cache")


class TestBlocks:
    def test_put_get_and_parts(self, tmp_path):
        cache = BlockCache(tmp_path, "1MB")
        space = cache.namespace("s3://b/ds/data.memmap", "100:e1", block_size=10)
        with cache.writing(space, 3):
            assert cache.put(space, 3, b"0123456789")
        assert cache.get(space, 3, 10) == b"0123456789"
        assert cache.get(space, 3, 10, start=2, length=3) == b"234"
        assert cache.get(space, 4, 10) is None
        assert cache.usage() == 10

    def test_a_block_of_the_wrong_size_is_not_served(self, tmp_path):
        cache = BlockCache(tmp_path, "1MB")
        space = cache.namespace("s3://b/k", "1", block_size=10)
        cache.put(space, 0, b"0123456789")
        os.truncate(space.folder / "0", 5)  # a damaged block
        assert cache.get(space, 0, 10) is None

    def test_two_versions_or_two_objects_never_share_a_block(self, tmp_path):
        cache = BlockCache(tmp_path, "1MB")
        old = cache.namespace("s3://b/ds/data.memmap", '100:"v1"', block_size=10)
        new = cache.namespace("s3://b/ds/data.memmap", '100:"v2"', block_size=10)
        other = cache.namespace("s3://b/other/data.memmap", '100:"v1"', block_size=10)
        cache.put(old, 0, b"old-bytes!")
        assert cache.get(new, 0, 10) is None and cache.get(other, 0, 10) is None
        assert json.loads((old.folder / "object.json").read_text())["version"] == '100:"v1"'

    def test_never_above_the_limit_and_least_recently_used_goes_first(self, tmp_path, monkeypatch):
        cache = BlockCache(tmp_path, 1000)
        space = cache.namespace("s3://b/k", "1", block_size=100)
        monkeypatch.setattr(cache_module, "_TOUCH_AFTER", 0.0)
        for index in range(10):
            assert cache.put(space, index, bytes([index]) * 100)
            os.utime(space.folder / str(index), (index, index))  # block i last used at time i
        assert cache.usage() == 1000 == sum(files_on_disk(cache).values())
        cache.get(space, 0, 100)  # block 0 is used again: now the most recent
        for index in range(10, 15):
            assert cache.put(space, index, bytes([index]) * 100)
            assert sum(files_on_disk(cache).values()) <= 1000 and cache.usage() <= 1000
        kept = {int(name.split("/")[1]) for name in files_on_disk(cache)}
        assert 0 in kept and not {1, 2, 3, 4, 5} & kept
        assert cache.usage() == sum(files_on_disk(cache).values())

    def test_a_lower_limit_at_open_evicts_at_once(self, tmp_path):
        cache = BlockCache(tmp_path, 1000)
        space = cache.namespace("s3://b/k", "1", block_size=100)
        for index in range(10):
            cache.put(space, index, b"x" * 100)
        smaller = BlockCache(tmp_path, 500)
        assert smaller.usage() <= 500 and sum(files_on_disk(smaller).values()) <= 500

    def test_a_block_larger_than_the_cache_is_not_kept(self, tmp_path):
        cache = BlockCache(tmp_path, 50)
        space = cache.namespace("s3://b/k", "1", block_size=100)
        assert not cache.put(space, 0, b"x" * 100)
        assert cache.usage() == 0 and files_on_disk(cache) == {}

    def test_drop(self, tmp_path):
        cache = BlockCache(tmp_path, "1MB")
        space = cache.namespace("s3://b/k", "1", block_size=4)
        cache.put(space, 0, b"abcd")
        with cache.writing(space, 0):
            cache.drop(space, 0)
            cache.drop(space, 0)  # gone already: fine
        assert cache.get(space, 0, 4) is None and cache.usage() == 0


class TestFaults:
    @pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
    @pytest.mark.parametrize("step", ["_allocate", "_write_all"])
    def test_a_full_disk_keeps_the_block_out_with_one_warning_and_the_cache_goes_on(
        self, tmp_path, monkeypatch, code, step
    ):
        cache = BlockCache(tmp_path, "1MB")
        space = cache.namespace("s3://b/k", "1", block_size=4)
        cache.put(space, 0, b"abcd")
        real = getattr(cache_module, step)

        def full(*args):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(cache_module, step, full)
        with pytest.warns(UserWarning) as warned:
            assert not cache.put(space, 1, b"efgh") and not cache.put(space, 2, b"ijkl")  # not kept, no error
        [warning] = warned  # once, not once a block
        assert str(warning.message).startswith(f"the disk of the cache {tmp_path} is full (a block of 4 bytes")
        assert "blocks are read uncached until there is room" in str(warning.message)
        assert files_on_disk(cache) == {f"{space.key[:6]}/0": 4} and cache.usage() == 4  # nothing lost, no leftovers
        monkeypatch.setattr(cache_module, step, real)
        assert cache.put(space, 1, b"efgh") and cache.get(space, 1, 4) == b"efgh" and cache.usage() == 8

    def test_a_really_full_disk(self, tmp_path):
        """A 256 KiB tmpfs under a cache allowed 10 MB: the blocks that do not fit are not kept (one
        warning), nothing half-written stays, and once space is freed the cache goes on."""
        disk = tmp_path / "small-disk"
        disk.mkdir()
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True, text=True
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
        try:
            cache = BlockCache(disk / "cache", "10MB")
            space = cache.namespace("s3://b/k", "1", block_size=64 * 1024)
            with pytest.warns(UserWarning, match="the disk of the cache .* is full") as warned:
                stored = [cache.put(space, index, bytes([index]) * 64 * 1024) for index in range(8)]
            assert any(stored) and not all(stored) and len(warned) == 1
            kept = files_on_disk(cache)
            assert len(kept) == sum(stored) and not any(".tmp-" in name for name in kept)
            assert cache.usage() == sum(kept.values())
            with cache.writing(space, 0):
                cache.drop(space, 0)
            assert cache.put(space, 0, b"z" * 64 * 1024) and cache.get(space, 0, 64 * 1024) == b"z" * 64 * 1024
        finally:
            subprocess.run(["umount", str(disk)], check=True)

    def test_kill_9_while_a_block_is_written_leaves_a_cache_the_next_run_repairs(self, tmp_path):
        """A writer killed between its reservation and its rename: the next BlockCache removes its
        temporary file (nobody holds its stripe lock) and counts the bytes again."""
        cache = BlockCache(tmp_path / "cache", "1MB")
        space = cache.namespace("s3://b/k", "1", block_size=100)
        cache.put(space, 7, b"k" * 100)
        child = textwrap.dedent(f"""
            import os, sys, time
            import gpuload.remote.cache as module
            cache = module.BlockCache({str(tmp_path / "cache")!r}, "1MB")
            space = cache.namespace("s3://b/k", "1", block_size=100)
            def slow(fd, data):
                os.pwrite(fd, data[:10], 0)
                print("writing", flush=True)
                time.sleep(60)
            module._write_all = slow
            with cache.writing(space, 3):
                cache.put(space, 3, b"x" * 100)
        """)
        process = subprocess.Popen(
            [sys.executable, "-c", child],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            assert process.stdout.readline() == "writing\n"
            assert any(".tmp-" in name for name in files_on_disk(cache))
            assert cache.get(space, 3, 100) is None  # a block being written is never read half-written
            assert cache.usage() == 200  # the dead writer's reservation is counted
            process.send_signal(signal.SIGKILL)
            process.wait(10)
        finally:
            process.kill()
            process.stdout.close()
        before = files_on_disk(cache)
        info = cache_module.describe_cache(tmp_path / "cache")  # gpuload cache info, before any repair
        assert info["being_written"] == {"blocks": 0, "bytes": 0}  # its writer is dead: nothing is being written
        assert files_on_disk(cache) == before  # and info changed nothing
        again = BlockCache(tmp_path / "cache", "1MB")
        assert files_on_disk(again) == {f"{space.key[:6]}/7": 100}
        assert again.usage() == 100
        assert again.get(space, 3, 100) is None and again.get(space, 7, 100) == b"k" * 100
        with again.writing(space, 3):  # the stripe lock died with the writer
            assert again.put(space, 3, b"y" * 100)

    def test_a_live_writer_keeps_its_temporary_file(self, tmp_path):
        """Opening the cache while another process writes a block must not remove that block's file."""
        cache = BlockCache(tmp_path, "1MB")
        space = cache.namespace("s3://b/k", "1", block_size=4)
        temporary = space.folder / f"2.tmp-{os.getpid()}-abcd"
        with cache.writing(space, 2):
            temporary.write_bytes(b"half")
            BlockCache(tmp_path, "1MB")
            assert temporary.exists()
        BlockCache(tmp_path, "1MB")
        assert not temporary.exists()

    def test_a_dataloader_worker_forked_while_a_block_is_locked_does_not_keep_the_lock(self, tmp_path):
        """A request thread holds a block's stripe lock when a stock DataLoader forks its worker: once
        the thread lets go, the lock is free, though the worker lives on (it inherited the lock's fd)."""
        import torch.utils.data

        cache = BlockCache(tmp_path, "1MB")
        space = cache.namespace("s3://b/k", "1", block_size=4)
        holding, release = threading.Event(), threading.Event()

        def fetch():
            with cache.writing(space, 0):
                holding.set()
                release.wait(10)

        thread = threading.Thread(target=fetch)
        thread.start()
        assert holding.wait(10)
        loader = torch.utils.data.DataLoader(
            list(range(4)), batch_size=1, num_workers=1, multiprocessing_context="fork", persistent_workers=True
        )
        batches = iter(loader)
        try:
            next(batches)  # the worker runs, forked while the lock was held
            release.set()
            thread.join(10)
            stripe = os.open(cache.path / "locks" / str(cache.stripe(space, 0)), os.O_RDWR)
            try:
                fcntl.flock(stripe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free now, while the worker lives
            finally:
                os.close(stripe)
        finally:
            release.set()
            del batches
            thread.join(10)

    def test_a_stripe_held_too_long_is_given_up_after_a_bounded_wait(self, tmp_path, monkeypatch):
        """Another process holds a block's lock and does not let go: the wait ends, said once, and the
        caller is told that it does not hold the lock (it then fetches the block uncached)."""
        monkeypatch.setattr(cache_module, "STRIPE_WAIT", 0.2)
        cache = BlockCache(tmp_path, "1MB")
        space = cache.namespace("s3://b/k", "1", block_size=4)
        stuck = os.open(cache.path / "locks" / str(cache.stripe(space, 0)), os.O_RDWR | os.O_CREAT)
        fcntl.flock(stuck, fcntl.LOCK_EX)  # another open file: another holder, as another process is
        try:
            started = time.monotonic()
            with pytest.warns(
                UserWarning, match=r"waited 0.2 s for the lock .*locks/\d+ .* reading such blocks uncached"
            ) as warned:
                for _ in range(2):
                    with cache.writing(space, 0) as held:
                        assert held is False
            assert len(warned) == 1 and time.monotonic() - started < 2  # said once
        finally:
            os.close(stuck)
        with cache.writing(space, 0) as held:
            assert held is True

    def test_a_cache_lock_held_too_long_is_a_clear_error(self, tmp_path, monkeypatch):
        BlockCache(tmp_path, "1MB")
        monkeypatch.setattr(cache_module, "CACHE_LOCK_WAIT", 0.2)
        stuck = os.open(tmp_path / "usage", os.O_RDWR)
        fcntl.flock(stuck, fcntl.LOCK_EX)
        try:
            with pytest.raises(BusyError, match=r"held for more than 0.2 s .*; find it with fuser -v .*usage"):
                BlockCache(tmp_path, "1MB")
        finally:
            os.close(stuck)

    def test_writers_of_one_block_take_turns(self, tmp_path):
        cache = BlockCache(tmp_path, "1MB")
        space = cache.namespace("s3://b/k", "1", block_size=4)
        inside, overlaps = [], []

        def write():
            with cache.writing(space, 5):
                inside.append(1)
                overlaps.append(len(inside))
                time.sleep(0.02)
                inside.pop()

        threads = [threading.Thread(target=write) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert overlaps == [1, 1, 1, 1]


class TestInfoAndClear:
    """describe_cache and clear_cache (``gpuload cache info|clear``): only a gpuload cache, safely while in use."""

    def filled(self, path: Path) -> tuple[BlockCache, cache_module.Namespace]:
        cache = BlockCache(path, "1MB")
        space = cache.namespace("s3://b/photos.jpeg/data.memmap", "1", block_size=100)
        for index in (0, 1):
            with cache.writing(space, index):
                assert cache.put(space, index, bytes([index]) * 100)
        return cache, space

    def test_info_lists_what_is_held_and_changes_nothing(self, tmp_path):
        cache, space = self.filled(tmp_path / "cache")
        before = files_on_disk(cache)
        info = cache_module.describe_cache(tmp_path / "cache")
        assert (info["blocks"], info["bytes"], info["being_written"]) == (2, 200, {"blocks": 0, "bytes": 0})
        assert [(entry["url"], entry["blocks"], entry["bytes"]) for entry in info["objects"]] == [
            ("s3://b/photos.jpeg/data.memmap", 2, 200)
        ]
        assert files_on_disk(cache) == before and cache.usage() == 200

    def test_clear_removes_the_blocks_and_the_cache_opens_as_before(self, tmp_path):
        cache, space = self.filled(tmp_path / "cache")
        result = cache_module.clear_cache(tmp_path / "cache")
        assert result["removed"] == {"blocks": 2, "bytes": 200} and result["kept"] == {"blocks": 0, "bytes": 0}
        assert files_on_disk(cache) == {} and cache.usage() == 0
        assert (tmp_path / "cache" / MARKER).is_file()
        again = BlockCache(tmp_path / "cache", "1MB")
        with again.writing(space, 0):
            assert again.put(space, 0, b"a" * 100) and again.get(space, 0, 100) == b"a" * 100

    @pytest.mark.parametrize("function", ["describe_cache", "clear_cache"])
    def test_a_folder_that_is_not_a_cache_is_refused_and_left_alone(self, tmp_path, function):
        (tmp_path / "photos" / "objects" / "x").mkdir(parents=True)
        (tmp_path / "photos" / "objects" / "x" / "0").write_bytes(b"mine")
        with pytest.raises(UsageError, match=r"is not a gpuload cache \(no gpuload-cache.json\): nothing was touched"):
            getattr(cache_module, function)(tmp_path / "photos")
        assert (tmp_path / "photos" / "objects" / "x" / "0").read_bytes() == b"mine"
        with pytest.raises(FileNotFoundError, match="does not exist; pass the folder given as cache="):
            getattr(cache_module, function)(tmp_path / "nowhere")

    @pytest.mark.parametrize("function", ["describe_cache", "clear_cache"])
    def test_a_cache_killed_before_its_folders_were_made_is_empty(self, tmp_path, function):
        """A BlockCache killed (-9) between writing its marker and making objects/ and locks/ leaves a cache
        with no blocks: info and clear say so, instead of "[Errno 2] No such file or directory: .../objects"."""
        BlockCache(tmp_path / "cache", "1MB")
        shutil.rmtree(tmp_path / "cache" / "objects")
        shutil.rmtree(tmp_path / "cache" / "locks")
        result = getattr(cache_module, function)(tmp_path / "cache")
        blocks = result["blocks"] if function == "describe_cache" else result["removed"]["blocks"]
        assert blocks == 0

    def test_a_cache_others_may_write_is_refused_and_left_alone(self, tmp_path):
        cache, _ = self.filled(tmp_path / "cache")
        (tmp_path / "cache").chmod(0o777)
        with pytest.raises(UsageError, match="writable by other users"):
            cache_module.clear_cache(tmp_path / "cache")
        assert len(files_on_disk(cache)) == 2

    def test_a_block_another_process_is_writing_is_kept_and_counted(self, tmp_path):
        """A writer in another process between its reservation and its rename: clear leaves its block (and
        its stripe) alone, removes the rest, and the bytes counted afterwards are what is on disk."""
        cache, space = self.filled(tmp_path / "cache")
        writing = next(
            i for i in range(2, 100) if cache.stripe(space, i) not in {cache.stripe(space, j) for j in (0, 1)}
        )
        child = textwrap.dedent(f"""
            import os, sys
            import gpuload.remote.cache as module
            cache = module.BlockCache({str(tmp_path / "cache")!r}, "1MB")
            space = cache.namespace("s3://b/photos.jpeg/data.memmap", "1", block_size=100)
            real = module._write_all
            def slow(fd, data):
                os.pwrite(fd, data[:10], 0)
                print("writing", flush=True)
                sys.stdin.readline()  # the parent clears meanwhile
                real(fd, data)
            module._write_all = slow
            with cache.writing(space, {writing}):
                assert cache.put(space, {writing}, b"w" * 100)
            print("written", flush=True)
        """)
        process = subprocess.Popen(
            [sys.executable, "-c", child],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            assert process.stdout.readline() == "writing\n"
            assert cache_module.describe_cache(tmp_path / "cache")["being_written"] == {"blocks": 1, "bytes": 100}
            result = cache_module.clear_cache(tmp_path / "cache")
            assert result["removed"] == {"blocks": 2, "bytes": 200}
            assert result["kept"] == {"blocks": 1, "bytes": 100}  # the reservation of the block being written
            assert cache.usage() == 100
            process.stdin.write("go\n")
            process.stdin.flush()
            assert process.stdout.readline() == "written\n"
            assert process.wait(10) == 0
        finally:
            process.kill()
            process.stdin.close()
            process.stdout.close()
        assert files_on_disk(cache) == {f"{space.key[:6]}/{writing}": 100}
        assert cache.usage() == 100 and cache.get(space, writing, 100) == b"w" * 100

    def test_clear_waits_for_the_cache_lock_another_process_holds(self, tmp_path):
        cache, _ = self.filled(tmp_path / "cache")
        child = textwrap.dedent(f"""
            import sys
            import gpuload.remote.cache as module
            with module._cache_lock(module.Path({str(tmp_path / "cache")!r})):
                print("locked", flush=True)
                sys.stdin.readline()
        """)
        process = subprocess.Popen(
            [sys.executable, "-c", child],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        results = []
        try:
            assert process.stdout.readline() == "locked\n"
            clearing = threading.Thread(target=lambda: results.append(cache_module.clear_cache(tmp_path / "cache")))
            clearing.start()
            clearing.join(0.5)
            assert clearing.is_alive() and len(files_on_disk(cache)) == 2  # waiting, nothing removed
            process.stdin.write("go\n")
            process.stdin.flush()
            clearing.join(10)
            assert process.wait(10) == 0
        finally:
            process.kill()
            process.stdin.close()
            process.stdout.close()
        assert results[0]["removed"]["blocks"] == 2 and files_on_disk(cache) == {}
