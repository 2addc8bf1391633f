"""A stopped build goes on where it stopped (gpuload.writing.resume): killed (``kill -9``) or
interrupted (Ctrl-C) from every source, into every store, the next build of the same ``out`` keeps
what was written and writes the dataset an uninterrupted build writes, byte for byte; anything else
starts afresh."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
from conftest import open_files, shard_of, write_bad_file, write_odd_image, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuload.writing.build
import gpuload.writing.resume
from gpuload import MemmapImageDataset, build_memmap, verify_memmap
from gpuload.writing.resume import CHECKPOINT, Checkpoint, recipe, scan_digest

BUILDS = {  # the sources of samples write raw at a size and jpeg in their order as they scan
    "raw at a size": {"size": (24, 32)},
    "raw at the images' size": {},
    "jpeg shuffled": {"format": "jpeg"},
    "jpeg in order": {"format": "jpeg", "order": "source"},
}
SOURCES = ("folder", "table", "tar", "parquet")
INTERVAL = gpuload.writing.resume.CHECKPOINT_SECONDS  # before the tests make it 0


@pytest.fixture(scope="module")
def sources(photo_folder, table_folder, tmp_path_factory) -> dict[str, Path]:
    """The 20 photos as each source (the table with its fields: numbers, multi-label, text)."""
    folder = tmp_path_factory.mktemp("sources")
    photos = sorted(photo_folder.rglob("*.jpg"))
    classes = sorted({photo.parent.name for photo in photos})
    return {
        "folder": photo_folder,
        "table": table_folder,
        "tar": shard_of(photo_folder, folder / "train.tar"),
        "parquet": write_parquet(folder / "train.parquet", photos, classes, score=[i / 3 for i in range(len(photos))]),
    }


@pytest.fixture(autouse=True)
def checkpoint_after_every_image(monkeypatch):
    monkeypatch.setattr(gpuload.writing.resume, "CHECKPOINT_SECONDS", 0.0)


def interrupt_at(monkeypatch, job: int) -> list[int]:
    """Make the ``job``-th image job (1 on) raise KeyboardInterrupt, as Ctrl-C would stop the build; returns
    the list that counts the jobs run."""
    run: list[int] = []
    for name in ("_decode_raw", "_store_jpeg"):
        real = getattr(gpuload.writing.build, name)

        def counted(*args, real=real):
            run.append(1)
            if len(run) == job:
                raise KeyboardInterrupt
            return real(*args)

        monkeypatch.setattr(gpuload.writing.build, name, counted)
    return run


def files_of(dataset: Path) -> dict[str, bytes]:
    """Every file of a dataset by path, the manifest without the moment it was written."""
    files = {path.relative_to(dataset).as_posix(): path.read_bytes() for path in dataset.rglob("*") if path.is_file()}
    manifest = json.loads(files.pop("manifest.json"))
    manifest.pop("created")
    return files | {"manifest.json": json.dumps(manifest, sort_keys=True).encode()}


def leftovers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if ".tmp-" in path.name)


def checkpoints_until(monkeypatch, last: int) -> None:
    """A checkpoint after every image up to the ``last``-th, none after it."""
    monkeypatch.setattr(gpuload.writing.build._Saves, "due", lambda self: self.next != 1)
    saves = gpuload.writing.build._Saves.save

    def save(self, store, done, *args):
        saves(self, store, done, *args)
        self.next = 1 if done >= last else 0

    monkeypatch.setattr(gpuload.writing.build._Saves, "save", save)


def stop_and_resume(src: Path, work: Path, options: dict, stop: int, monkeypatch) -> tuple[Checkpoint | None, int]:
    """Build ``src`` into ``work/out`` interrupted at job ``stop`` (one decoding thread: jobs run in the
    order they are written), then again; returns the checkpoint the first left and the jobs the second ran."""
    with monkeypatch.context() as patched:
        interrupt_at(patched, stop)
        with pytest.raises(KeyboardInterrupt), warnings.catch_warnings(record=True):
            build_memmap(src, work / "out", workers=1, progress=False, **options)
    left = leftovers(work)
    checkpoint = Checkpoint.read(work / left[0]) if left else None
    with monkeypatch.context() as patched:
        run = interrupt_at(patched, 0)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            build_memmap(src, work / "out", progress=False, **options)
    resumed = [str(warning.message) for warning in said if "resuming" in str(warning.message)]
    assert bool(resumed) == (checkpoint is not None), resumed
    assert leftovers(work) == []
    return checkpoint, len(run)


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("source", SOURCES)
def test_a_stopped_build_goes_on_and_writes_what_an_uninterrupted_one_writes(
    sources, tmp_path, monkeypatch, source, build
):
    """Stopped at its 8th image, a build keeps the 7 written: the next one decodes the 13 after them only,
    and its dataset is the uninterrupted build's, file by file."""
    src, options = sources[source], BUILDS[build]
    fresh = build_memmap(src, tmp_path / "fresh", progress=False, **options)
    checkpoint, run = stop_and_resume(src, tmp_path, options, 8, monkeypatch)
    assert checkpoint is not None and checkpoint.done == 7
    assert run == len(MemmapImageDataset(fresh)) - 7
    assert files_of(tmp_path / "out") == files_of(fresh)
    assert verify_memmap(tmp_path / "out", progress=False) == []


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source=st.sampled_from(SOURCES), build=st.sampled_from(list(BUILDS)), stop=st.integers(1, 20))
def test_any_stop(sources, monkeypatch, source, build, stop):
    """Wherever it stops (the first image: nothing to keep; the last), the dataset is the uninterrupted one."""
    src, options = sources[source], BUILDS[build]
    with tempfile.TemporaryDirectory() as work:
        fresh = build_memmap(src, Path(work) / "fresh", progress=False, **options)
        checkpoint, run = stop_and_resume(src, Path(work), options, stop, monkeypatch)
        done = checkpoint.done if checkpoint is not None else 0
        assert done == stop - 1 and run == 20 - done
        assert files_of(Path(work) / "out") == files_of(fresh)


def test_what_came_after_the_last_checkpoint_is_done_again(photo_folder, tmp_path, monkeypatch):
    """Images written after the last checkpoint are decoded again, and their records too: one that can no
    longer be read is skipped, not kept from the stopped build (and one skipped before the stop stays
    listed)."""
    src = Path(shutil.copytree(photo_folder, tmp_path / "photos"))
    write_bad_file(src / "background", "truncated.jpg")  # the 5th image: skipped before the stop
    checkpoints_until(monkeypatch, 6)
    with monkeypatch.context() as patched:
        interrupt_at(patched, 10)  # images 7 to 9 written after the last checkpoint
        with pytest.raises(KeyboardInterrupt), warnings.catch_warnings(record=True):
            build_memmap(src, tmp_path / "out", size=(24, 32), workers=1, progress=False)
    (left,) = leftovers(tmp_path)
    assert Checkpoint.read(tmp_path / left).done == 6
    eighth = sorted(src.rglob("*.jpg"))[7]
    eighth.write_bytes(eighth.read_bytes()[:200])  # damaged since
    with pytest.warns(UserWarning, match="after the 6 images"):
        build_memmap(src, tmp_path / "out", size=(24, 32), progress=False)
    fresh = build_memmap(src, tmp_path / "fresh", size=(24, 32), progress=False)
    assert files_of(tmp_path / "out") == files_of(fresh)
    assert len(MemmapImageDataset(fresh).manifest.skipped) == 2


@pytest.mark.parametrize("build", ["raw at a size", "jpeg in order"])
def test_a_streamed_source_cut_short_after_the_checkpoint(photo_folder, tmp_path, monkeypatch, build):
    """A tar whose last samples are gone since the stop, but not those before its checkpoint, is taken up:
    what the stopped build noted of the samples after its checkpoint, past the new end, is not kept."""
    photos = Path(shutil.copytree(photo_folder, tmp_path / "photos"))
    src, options = shard_of(photos, tmp_path / "train.tar"), BUILDS[build]
    checkpoints_until(monkeypatch, 6)
    with monkeypatch.context() as patched:
        interrupt_at(patched, 12)  # 11 images written, the last checkpoint after the 6th
        with pytest.raises(KeyboardInterrupt), warnings.catch_warnings(record=True):
            build_memmap(src, tmp_path / "out", workers=1, progress=False, **options)
    for photo in sorted(photos.rglob("*.jpg"))[8:]:
        photo.unlink()
    shard_of(photos, src)  # its first 8 samples only
    with pytest.warns(UserWarning, match="resuming the build of .* after the 6 images"):
        build_memmap(src, tmp_path / "out", progress=False, **options)
    fresh = build_memmap(src, tmp_path / "fresh", progress=False, **options)
    assert files_of(tmp_path / "out") == files_of(fresh) and len(MemmapImageDataset(fresh)) == 8


KILLED = """
import os, signal, sys
import gpuload.writing.build as build
import gpuload.writing.resume as resume

resume.CHECKPOINT_SECONDS = 0.0
jobs = []
for name in ("_decode_raw", "_store_jpeg"):
    def killed(*args, real=getattr(build, name)):
        jobs.append(1)
        if len(jobs) == 12:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args)
    setattr(build, name, killed)
build.build_memmap(sys.argv[1], sys.argv[2], workers=1, progress=False, **eval(sys.argv[3]))
"""


@pytest.mark.parametrize(("source", "build"), [("folder", "raw at a size"), ("tar", "jpeg in order")])
def test_after_kill_9(sources, tmp_path, source, build):
    """A build killed in its 12th image's job (nothing of Python runs: no cleanup) goes on from its last
    checkpoint."""
    src, options = sources[source], BUILDS[build]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED, str(src), str(tmp_path / "out"), repr(options)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    (left,) = leftovers(tmp_path)
    done = Checkpoint.read(tmp_path / left).done  # the jobs ahead of the writes: killed in the 12th
    assert 1 <= done <= 11
    with pytest.warns(UserWarning, match=rf"resuming the build of .*out after the {done} images it had done"):
        build_memmap(src, tmp_path / "out", progress=False, **options)
    fresh = build_memmap(src, tmp_path / "fresh", progress=False, **options)
    assert files_of(tmp_path / "out") == files_of(fresh) and leftovers(tmp_path) == []


def test_interrupted_says_what_was_kept(sources, tmp_path, monkeypatch):
    interrupt_at(monkeypatch, 5)
    with pytest.warns(UserWarning, match=r"was interrupted; what it wrote is kept in .*\.out\.tmp-\w+: build it again"):
        with pytest.raises(KeyboardInterrupt):
            build_memmap(sources["folder"], tmp_path / "out", progress=False)


def test_the_command_line_no_resume(sources, tmp_path, monkeypatch, capsys):
    from gpuload.cli import main

    with monkeypatch.context() as patched:
        interrupt_at(patched, 6)
        with pytest.raises(KeyboardInterrupt), warnings.catch_warnings(record=True):
            build_memmap(sources["tar"], tmp_path / "out", format="jpeg", workers=1, progress=False)
    run = interrupt_at(monkeypatch, 0)
    with warnings.catch_warnings(action="error"):
        assert main(["build-memmap", str(sources["tar"]), "--out", str(tmp_path / "out"), "--format", "jpeg",
                     "--no-resume", "--quiet"]) == 0  # fmt: skip
    assert len(run) == 20 and leftovers(tmp_path) == []


def test_reencoded_images_before_the_stop_stay_counted(photo_folder, tmp_path, monkeypatch):
    """A jpeg build re-encodes some images (CMYK, rotated by their EXIF tag); those before the stop stay in
    the manifest's count."""
    src = Path(shutil.copytree(photo_folder, tmp_path / "photos"))
    write_odd_image(src / "background" / "0000.jpg", "cmyk")
    write_odd_image(src / "background" / "0001.jpg", "exif_rotated")
    fresh = build_memmap(src, tmp_path / "fresh", format="jpeg", order="source", progress=False)
    assert MemmapImageDataset(fresh).manifest.jpeg["reencoded"] == {"exif_rotated": 1, "not_rgb_or_gray": 1}
    checkpoint, _ = stop_and_resume(src, tmp_path, {"format": "jpeg", "order": "source"}, 8, monkeypatch)
    assert checkpoint.reencoded == {"exif_rotated": 1, "not_rgb_or_gray": 1}
    assert files_of(tmp_path / "out") == files_of(fresh)


def test_without_sync_a_build_goes_on_from_a_checkpoint_and_writes_none(sources, tmp_path, monkeypatch):
    """What a build that flushed its files wrote before its checkpoint is on disk: one with --no-sync takes
    it up (and, stopped in turn, leaves the same checkpoint)."""
    fresh = build_memmap(sources["tar"], tmp_path / "fresh", format="jpeg", progress=False)
    with monkeypatch.context() as patched:
        interrupt_at(patched, 8)
        with pytest.raises(KeyboardInterrupt), warnings.catch_warnings(record=True):
            build_memmap(sources["tar"], tmp_path / "out", format="jpeg", workers=1, progress=False)
    with monkeypatch.context() as patched:
        interrupt_at(patched, 4)
        with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match="after the 7 images"):
            build_memmap(sources["tar"], tmp_path / "out", format="jpeg", sync=False, workers=1, progress=False)
    (left,) = leftovers(tmp_path)
    assert Checkpoint.read(tmp_path / left).done == 7
    with pytest.warns(UserWarning, match="after the 7 images"):
        build_memmap(sources["tar"], tmp_path / "out", format="jpeg", sync=False, progress=False)
    assert files_of(tmp_path / "out") == files_of(fresh)


def test_a_system_exit_keeps_what_was_written(sources, tmp_path, monkeypatch):
    """A launcher's SIGTERM handler that calls sys.exit stops the build as Ctrl-C does."""
    run: list[int] = []
    real = gpuload.writing.build._decode_raw

    def decode(*args):
        run.append(1)
        if len(run) == 6:
            raise SystemExit(143)
        return real(*args)

    monkeypatch.setattr(gpuload.writing.build, "_decode_raw", decode)
    with pytest.raises(SystemExit), pytest.warns(UserWarning, match="what it wrote is kept"):
        build_memmap(sources["folder"], tmp_path / "out", workers=1, progress=False)
    (left,) = leftovers(tmp_path)
    assert Checkpoint.read(tmp_path / left).done == 5


def test_the_newest_stopped_build_is_taken_up(sources, tmp_path, monkeypatch):
    """Two stopped builds of one out (the first left when its machine was lost): the newer goes on, the
    other is removed."""
    for stop in (4, 9):
        with monkeypatch.context() as patched:
            interrupt_at(patched, stop)
            with pytest.raises(KeyboardInterrupt), warnings.catch_warnings(record=True):
                build_memmap(sources["parquet"], tmp_path / "out", size=(24, 32), workers=1, resume=False,
                             progress=False)  # fmt: skip
            (older,) = leftovers(tmp_path)
            os.rename(tmp_path / older, tmp_path / f".out.tmp-{stop:08x}")  # kept from the next build's tidying
            os.utime(tmp_path / f".out.tmp-{stop:08x}", (stop, stop))
    os.utime(tmp_path / f".out.tmp-{9:08x}", (99, 99))
    with pytest.warns(UserWarning, match="after the 8 images"):
        build_memmap(sources["parquet"], tmp_path / "out", size=(24, 32), progress=False)
    fresh = build_memmap(sources["parquet"], tmp_path / "fresh", size=(24, 32), progress=False)
    assert files_of(tmp_path / "out") == files_of(fresh) and leftovers(tmp_path) == []


def test_a_raw_build_goes_on_whatever_seed_it_is_given(sources, tmp_path, monkeypatch):
    """The seed orders a shuffled jpeg store's images only: a raw build given another is the same build."""
    with monkeypatch.context() as patched:
        interrupt_at(patched, 5)
        with pytest.raises(KeyboardInterrupt), warnings.catch_warnings(record=True):
            build_memmap(sources["folder"], tmp_path / "out", seed=1, workers=1, progress=False)
    with pytest.warns(UserWarning, match="after the 4 images"):
        build_memmap(sources["folder"], tmp_path / "out", seed=2, progress=False)


class TestAfresh:
    """What a stopped build left is not taken up where the dataset would not be the one asked: the build
    starts afresh (saying why), and its result is a fresh build's."""

    def stop(self, src: Path, out: Path, monkeypatch, **options) -> None:
        with monkeypatch.context() as patched:
            interrupt_at(patched, 6)
            with pytest.raises(KeyboardInterrupt), warnings.catch_warnings(record=True):
                build_memmap(src, out, workers=1, progress=False, **options)
        assert leftovers(out.parent)

    def test_other_options(self, sources, tmp_path, monkeypatch):
        self.stop(sources["folder"], tmp_path / "out", monkeypatch, format="jpeg", quality=80)
        with pytest.warns(
            UserWarning, match=r"stopped after 5 images \(\.out\.tmp-\w+\) starts afresh: asked differently: quality$"
        ):
            build_memmap(sources["folder"], tmp_path / "out", format="jpeg", quality=70, progress=False)
        fresh = build_memmap(sources["folder"], tmp_path / "fresh", format="jpeg", quality=70, progress=False)
        assert files_of(tmp_path / "out") == files_of(fresh) and leftovers(tmp_path) == []

    @pytest.mark.parametrize("build", ["raw at the images' size", "jpeg in order"])
    def test_a_source_whose_samples_changed(self, photo_folder, tmp_path, monkeypatch, build):
        """Scanned first (a folder), or as it goes (a tar), samples renamed since the stop are found."""
        src = Path(shutil.copytree(photo_folder, tmp_path / "photos"))
        if build == "jpeg in order":
            src = shard_of(photo_folder, tmp_path / "train.tar")
        self.stop(src, tmp_path / "out", monkeypatch, **BUILDS[build])
        if src.is_dir():
            first = min(src.rglob("*.jpg"))
            first.rename(first.with_name("renamed.jpg"))
        else:
            shard_of(photo_folder, src, bad="truncated.jpg")  # a sample more, 4th: the 4th and 5th differ
        with pytest.warns(UserWarning, match="starts afresh: its source's .*not the ones it scanned"):
            build_memmap(src, tmp_path / "out", progress=False, **BUILDS[build])
        fresh = build_memmap(src, tmp_path / "fresh", progress=False, **BUILDS[build])
        assert files_of(tmp_path / "out") == files_of(fresh) and leftovers(tmp_path) == []

    def test_a_checkpoint_that_cannot_be_read(self, sources, tmp_path, monkeypatch):
        self.stop(sources["tar"], tmp_path / "out", monkeypatch, size=(24, 32))
        (left,) = leftovers(tmp_path)
        (tmp_path / left / CHECKPOINT).write_text('{"recipe": {"format": "ra')  # cut by a crash of the disk
        with pytest.warns(UserWarning, match=rf"stopped \({left}\) starts afresh: its checkpoint cannot be read"):
            build_memmap(sources["tar"], tmp_path / "out", size=(24, 32), progress=False)
        assert leftovers(tmp_path) == [] and verify_memmap(tmp_path / "out", progress=False) == []

    def test_another_pixel_limit(self, photo_folder, tmp_path, monkeypatch):
        """The pixel limit (--max-pixels) decides which images are skipped: stopped under one, a build under
        another starts afresh (here the 5 images skipped as too large before the stop are kept)."""
        from gpuload.writing.decode import pixel_limit

        with pixel_limit(500):  # the 48x64 photos are too large
            self.stop(photo_folder, tmp_path / "out", monkeypatch, size=(16, 16))
        with pytest.warns(UserWarning, match="asked differently: max_image_pixels$"):
            build_memmap(photo_folder, tmp_path / "out", size=(16, 16), progress=False)
        fresh = build_memmap(photo_folder, tmp_path / "fresh", size=(16, 16), progress=False)
        assert files_of(tmp_path / "out") == files_of(fresh) and leftovers(tmp_path) == []

    @pytest.mark.parametrize("masks", ["since", "before"])
    def test_a_streamed_source_whose_masks_changed(self, photo_folder, tmp_path, monkeypatch, masks):
        """A tar whose samples have a mask since the stop, or no longer have one (their images the same), is
        built afresh, masks and all (not as a checkpoint that does not match its files)."""
        before, since = (None, 0) if masks == "since" else (0, None)
        src = shard_of(photo_folder, tmp_path / "train.tar", masks=before)
        self.stop(src, tmp_path / "out", monkeypatch, size=(24, 32))
        shard_of(photo_folder, src, masks=since)
        with pytest.warns(UserWarning, match="starts afresh: its samples' masks are not the ones it wrote"):
            build_memmap(src, tmp_path / "out", size=(24, 32), progress=False)
        fresh = build_memmap(src, tmp_path / "fresh", size=(24, 32), progress=False)
        assert ("fields/mask.memmap" in files_of(fresh)) == (masks == "since")
        assert files_of(tmp_path / "out") == files_of(fresh) and leftovers(tmp_path) == []

    def test_files_cut_since_the_stop(self, sources, tmp_path, monkeypatch):
        self.stop(sources["folder"], tmp_path / "out", monkeypatch, size=(24, 32))
        (left,) = leftovers(tmp_path)
        os.truncate(tmp_path / left / "images.memmap", 100)  # less than the 5 images the checkpoint counts
        with pytest.warns(UserWarning, match="starts afresh: its files are shorter than its checkpoint says"):
            build_memmap(sources["folder"], tmp_path / "out", size=(24, 32), progress=False)
        fresh = build_memmap(sources["folder"], tmp_path / "fresh", size=(24, 32), progress=False)
        assert files_of(tmp_path / "out") == files_of(fresh) and leftovers(tmp_path) == []

    def test_a_streamed_source_with_fewer_samples_than_written(self, photo_folder, tmp_path, monkeypatch):
        photos = Path(shutil.copytree(photo_folder, tmp_path / "photos"))
        src = shard_of(photos, tmp_path / "train.tar")
        self.stop(src, tmp_path / "out", monkeypatch, size=(24, 32))
        for photo in sorted(photos.rglob("*.jpg"))[3:]:
            photo.unlink()
        shard_of(photos, src)  # its first 3 samples only: 5 were written
        with pytest.warns(UserWarning, match="starts afresh: its source holds 3 samples, fewer than it wrote"):
            build_memmap(src, tmp_path / "out", size=(24, 32), progress=False)
        fresh = build_memmap(src, tmp_path / "fresh", size=(24, 32), progress=False)
        assert files_of(tmp_path / "out") == files_of(fresh) and leftovers(tmp_path) == []

    def test_no_resume(self, sources, tmp_path, monkeypatch):
        self.stop(sources["parquet"], tmp_path / "out", monkeypatch)
        run = interrupt_at(monkeypatch, 0)
        with warnings.catch_warnings(action="error"):
            build_memmap(sources["parquet"], tmp_path / "out", resume=False, progress=False)
        assert len(run) == 20 and leftovers(tmp_path) == []

    def test_without_sync_nothing_is_kept(self, sources, tmp_path, monkeypatch):
        """A build that does not flush its files cannot say what of them is on disk."""
        interrupt_at(monkeypatch, 6)
        with pytest.raises(KeyboardInterrupt):
            build_memmap(sources["folder"], tmp_path / "out", sync=False, progress=False)
        assert leftovers(tmp_path) == []


def test_the_checkpoint_is_written_whole_and_read_back(tmp_path):
    checkpoint = Checkpoint(
        recipe=recipe(format="raw", size=(24, 32), source=tmp_path),
        scan="ab" * 16,
        done=7,
        kept=6,
        written={"images.memmap": 7 * 2304, "fields/mask.memmap": 7 * 768},
        skipped=[{"path": "cat/3.jpg", "reason": "truncated"}],
        size=[24, 32],
        unreadable={3: "not an image"},
    )
    checkpoint.write(tmp_path)
    assert Checkpoint.read(tmp_path) == checkpoint
    assert sorted(os.listdir(tmp_path)) == [CHECKPOINT]
    Checkpoint.remove(tmp_path)
    assert Checkpoint.read(tmp_path) is None


WHOLE = '"recipe": {}, "scan": "", "reencoded": {}, "size": null, "unreadable": {}'


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"recipe": 1}',
        '{"recipe": {}, "scan": "", "done": 1}',
        "{" + WHOLE + ', "done": 3, "kept": 3, "written": {"data.memmap": -5}, "skipped": []}',  # not a count
        "{"
        + WHOLE
        + ', "done": 3, "kept": 1, "written": {"data.memmap": 5}, "skipped": []}',  # 2 neither kept nor skipped
        "{" + WHOLE + ', "done": 3, "kept": 3, "written": ["data.memmap"], "skipped": []}',
        "{" + WHOLE.replace("null", '["24", "32"]') + ', "done": 3, "kept": 3, "written": {"a": 5}, "skipped": []}',
        "{" + WHOLE + ', "done": 3, "kept": 2, "written": {"data.memmap": 5}, "skipped": [1]}',  # not an image
        "{" + WHOLE + ', "done": 3, "kept": 2, "written": {"data.memmap": 5}, "skipped": [{"path": "a.jpg"}]}',
    ],
)
def test_a_checkpoint_that_cannot_be_read_is_none(tmp_path, text):
    (tmp_path / CHECKPOINT).write_text(text)
    assert Checkpoint.read(tmp_path) is None


def test_the_scan_digest_is_of_every_file_but_the_image_bytes(tmp_path):
    (tmp_path / "paths.memmap").write_bytes(b"cat/1.jpg")
    (tmp_path / "blobs").write_bytes(b"\xff\xd8 image bytes")
    digest = scan_digest(tmp_path)
    (tmp_path / "blobs").write_bytes(b"other bytes")
    assert scan_digest(tmp_path) == digest
    (tmp_path / "paths.memmap").write_bytes(b"cat/2.jpg")
    assert scan_digest(tmp_path) != digest


def test_the_interval_the_docs_give_is_the_one_used():
    root = Path(__file__).parent.parent
    assert f"Every {INTERVAL:.0f} seconds a build flushes" in (root / "docs" / "guarantees.md").read_text()
    assert f"every {INTERVAL:.0f} seconds a build flushes" in gpuload.writing.build.build_memmap.__doc__


def test_a_mask_file_that_cannot_be_made_closes_the_image_file(photo_folder, tmp_path, monkeypatch):
    """A raw store whose mask file cannot be made (a full disk) closes the image file it made before,
    at once (its descriptor was held until the store was collected)."""
    import errno

    src = shard_of(photo_folder, tmp_path / "train.tar", masks=0)
    real = gpuload.writing.build.BlockWriter

    def writer(path, *args, **kwargs):
        if "fields" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(gpuload.writing.build, "BlockWriter", writer)
    with pytest.raises(OSError) as raised:
        build_memmap(src, tmp_path / "out", size=(24, 32), progress=False)
    assert raised.value and [path for path in open_files() if path.startswith(f"{tmp_path}/.out.tmp-")] == []


def test_links_in_a_stopped_build_are_not_followed(sources, tmp_path, monkeypatch):
    """A file of the stopped build's folder that became a link to someone's file: that file is left as it
    is (a resumed build would have cut it back and written into it), and so is the folder."""
    with monkeypatch.context() as patched:
        interrupt_at(patched, 12)
        with pytest.raises(KeyboardInterrupt), warnings.catch_warnings(record=True):
            build_memmap(sources["folder"], tmp_path / "out", size=(24, 32), workers=1, progress=False)
    (left,) = leftovers(tmp_path)
    theirs = tmp_path / "theirs.bin"
    theirs.write_bytes(b"someone's file" * 1000)
    (tmp_path / left / "images.memmap").unlink()
    os.symlink(theirs, tmp_path / left / "images.memmap")
    with pytest.warns(UserWarning, match="left .* alone: it is named like a gpuload build but holds other files"):
        build_memmap(sources["folder"], tmp_path / "out", size=(24, 32), progress=False)
    assert theirs.read_bytes() == b"someone's file" * 1000
    fresh = build_memmap(sources["folder"], tmp_path / "fresh", size=(24, 32), progress=False)
    assert files_of(tmp_path / "out") == files_of(fresh)


def test_masks_changed_since_the_stop_are_found_as_the_scan_goes(photo_folder, tmp_path, monkeypatch):
    """A raw build writes each mask with its image: a tar whose masks (not images) changed since the stop
    is built afresh, not with the old masks of the samples done."""
    src = shard_of(photo_folder, tmp_path / "train.tar", masks=0)
    with monkeypatch.context() as patched:
        interrupt_at(patched, 8)
        with pytest.raises(KeyboardInterrupt), warnings.catch_warnings(record=True):
            build_memmap(src, tmp_path / "out", size=(24, 32), workers=1, progress=False)
    shard_of(photo_folder, src, masks=100)  # other class ids, the same images
    with pytest.warns(UserWarning, match="starts afresh: its source's first 7 samples are not the ones it scanned"):
        build_memmap(src, tmp_path / "out", size=(24, 32), progress=False)
    fresh = build_memmap(src, tmp_path / "fresh", size=(24, 32), progress=False)
    assert files_of(tmp_path / "out") == files_of(fresh)


def test_a_full_disk_at_a_checkpoint_names_it(sources, tmp_path, monkeypatch):
    import errno

    def full(self, folder):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Checkpoint, "write", full)
    with pytest.raises(OSError, match=r"to write the checkpoint .*\.out\.tmp-\w+/\.resume\.json"):
        build_memmap(sources["folder"], tmp_path / "out", size=(24, 32), progress=False)
    assert leftovers(tmp_path) == []


def test_more_images_done_than_there_are(sources, tmp_path, monkeypatch):
    """A checkpoint that counts more images done than the source has (edited) starts afresh."""
    with monkeypatch.context() as patched:
        interrupt_at(patched, 8)
        with pytest.raises(KeyboardInterrupt), warnings.catch_warnings(record=True):
            build_memmap(sources["folder"], tmp_path / "out", format="jpeg", workers=1, progress=False)
    (left,) = leftovers(tmp_path)
    found = json.loads((tmp_path / left / CHECKPOINT).read_text())
    found.update(done=25, kept=25)
    (tmp_path / left / CHECKPOINT).write_text(json.dumps(found))
    with pytest.warns(UserWarning, match="starts afresh: its checkpoint counts more images done than the 20 there are"):
        build_memmap(sources["folder"], tmp_path / "out", format="jpeg", progress=False)
    fresh = build_memmap(sources["folder"], tmp_path / "fresh", format="jpeg", progress=False)
    assert files_of(tmp_path / "out") == files_of(fresh)


def _cut_a_row(folder: Path) -> None:
    os.truncate(folder / ".records", (folder / ".records").stat().st_size - 1)


DAMAGES = {  # a checkpoint that parses, whose counts are counts and add up, but does not match its files
    "written an image short": lambda found, folder: found.update(
        written={path: max(0, n - 1) for path, n in found["written"].items()}
    ),
    "re-encoded for an unknown reason": lambda found, folder: found.update(reencoded={"nonsense": 1}),
    "re-encoded not a count": lambda found, folder: found.update(reencoded={"cmyk": "x"}),
    "unreadable beyond the samples": lambda found, folder: found.update(unreadable={"999": "not an image"}),
    "records emptied": lambda found, folder: (folder / ".records").write_bytes(b""),
    "records zeroed": lambda found, folder: (folder / ".records").write_bytes(
        bytes((folder / ".records").stat().st_size)
    ),
    "records cut": lambda found, folder: _cut_a_row(folder),
    "records of ones": lambda found, folder: (folder / ".records").write_bytes(
        b"\xff" * (folder / ".records").stat().st_size
    ),  # each image's kept flag neither 0 nor 1: a raw build kept their checksums (a dataset verify fails)
    "written no file": lambda found, folder: found.update(written={}),
    "size not numbers": lambda found, folder: found.update(size=["24", "32"]),
}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize(
    ("source", "build"),
    [
        ("folder", "raw at the images' size"),
        ("tar", "raw at a size"),
        ("parquet", "jpeg shuffled"),
        ("table", "jpeg in order"),
    ],
)
def test_a_checkpoint_that_does_not_match_its_files(sources, tmp_path, monkeypatch, damage, source, build):
    """No traceback, no dataset of the wrong bytes: the build starts afresh (saying why) where what it
    would take up does not add up, and the dataset is the uninterrupted build's."""
    src, options = sources[source], BUILDS[build]
    with monkeypatch.context() as patched:
        interrupt_at(patched, 12)
        with pytest.raises(KeyboardInterrupt), warnings.catch_warnings(record=True):
            build_memmap(src, tmp_path / "out", workers=1, progress=False, **options)
    (left,) = leftovers(tmp_path)
    found = json.loads((tmp_path / left / CHECKPOINT).read_text())
    DAMAGES[damage](found, tmp_path / left)
    (tmp_path / left / CHECKPOINT).write_text(json.dumps(found))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        build_memmap(src, tmp_path / "out", progress=False, **options)
    fresh = build_memmap(src, tmp_path / "fresh", progress=False, **options)
    assert files_of(tmp_path / "out") == files_of(fresh) and leftovers(tmp_path) == []
    used = {"re-encoded": "jpeg" in build, "unreadable": build == "raw at the images' size"}  # else not read
    if used.get(damage.split()[0], True):
        assert any("starts afresh" in str(warning.message) for warning in said), [str(w.message) for w in said]


@pytest.mark.parametrize("build", ["raw at a size", "jpeg in order"])
def test_a_streamed_build_whose_last_images_before_the_stop_were_skipped(photo_folder, tmp_path, monkeypatch, build):
    """A streamed build's records grow with the images kept: the 4 skipped before the stop (after the 8
    kept) are not in them. It is taken up, not started afresh as a checkpoint that does not match its
    files."""
    photos = Path(shutil.copytree(photo_folder, tmp_path / "photos"))
    for photo in sorted(photos.rglob("*.jpg"))[8:12]:
        photo.write_bytes(photo.read_bytes()[:200])  # cannot be decoded: skipped
    src, options = shard_of(photos, tmp_path / "train.tar"), BUILDS[build]
    checkpoint, run = stop_and_resume(src, tmp_path, options, 13, monkeypatch)
    assert (checkpoint.done, checkpoint.kept, run) == (12, 8, 8)
    fresh = build_memmap(src, tmp_path / "fresh", progress=False, **options)
    assert files_of(tmp_path / "out") == files_of(fresh)
