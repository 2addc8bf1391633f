import errno
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from conftest import NOT_FILES, ODD_KINDS, photo, write_bad_file, write_odd_image
from PIL import Image

import gpuload.writing.compress
import gpuload.writing.files
from gpuload import BusyError, CompressError, CompressReport, UsageError, compress_folder, decode_image, find_ffmpeg
from gpuload.writing.jpeg import row_window


def relative_files(root):
    """The files under ``root`` that a user sees (not the hidden journal)."""
    return sorted(
        path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file() and path.name[0] != "."
    )


class TestCompress:
    def test_mirrors_the_tree_with_smaller_jpegs(self, photo_folder, tmp_path):
        report = compress_folder(photo_folder, tmp_path / "q", progress=False)
        assert relative_files(tmp_path / "q") == relative_files(photo_folder)
        assert (report.done, report.skipped, report.failed) == (20, 0, [])
        sizes_before = sum(path.stat().st_size for path in photo_folder.rglob("*.jpg"))
        sizes_after = sum(path.stat().st_size for path in (tmp_path / "q").rglob("*.jpg"))
        assert (report.bytes_before, report.bytes_after) == (sizes_before, sizes_after)
        assert sizes_after < sizes_before
        with (
            Image.open(tmp_path / "q" / "face" / "0000.jpg") as out,
            Image.open(photo_folder / "face" / "0000.jpg") as src,
        ):
            assert out.format == "JPEG" and out.size == src.size
            difference = np.abs(np.asarray(out, np.float32) - np.asarray(src.convert("RGB"), np.float32)).mean()
            assert difference < 8  # same picture, a little lossier

    def test_quality_controls_the_size(self, photo_folder, tmp_path):
        fine = compress_folder(photo_folder, tmp_path / "q2", quality=2, progress=False)
        coarse = compress_folder(photo_folder, tmp_path / "q20", quality=20, progress=False)
        assert coarse.bytes_after < fine.bytes_after

    @pytest.mark.parametrize("source", ["jpg", "png"])  # ffmpeg writes 4:2:0 and 4:4:4 (1x2 sampled) JPEGs
    @pytest.mark.parametrize("size", [(480, 640), (203, 77), (1001, 33), (100, 17)])
    def test_outputs_have_a_restart_marker_per_mcu_row_so_crops_skip_the_rows_above(self, tmp_path, size, source):
        (tmp_path / "src").mkdir()
        photo(size).save(tmp_path / "src" / f"a.{source}", **({"quality": 95} if source == "jpg" else {}))
        compress_folder(tmp_path / "src", tmp_path / "dst", progress=False)
        data = (tmp_path / "dst" / "a.jpg").read_bytes()
        middle = size[0] // 2
        copy, top, rows = row_window(data, middle, middle + 1, context=True)
        assert 0 < top <= middle < top + rows <= size[0] and rows <= 3 * 16  # the rows around it only
        whole, part = simplejpeg.decode_jpeg(data), simplejpeg.decode_jpeg(copy, strict=False)
        np.testing.assert_array_equal(part[middle - top], whole[middle])

    @pytest.mark.parametrize("size", [(100, 7), (17, 5), (40, 16), (33, 1)])
    def test_images_one_macroblock_wide_are_whole_jpegs_without_restart_markers(self, tmp_path, size):
        """ffmpeg numbers the restart markers of images at most 16 px wide out of sequence (a JPEG
        that libjpeg reports as corrupt): those are encoded again without."""
        (tmp_path / "src").mkdir()
        photo(size).save(tmp_path / "src" / "a.jpg", quality=95)
        assert compress_folder(tmp_path / "src", tmp_path / "dst", progress=False).failed == []
        data = (tmp_path / "dst" / "a.jpg").read_bytes()
        assert simplejpeg.decode_jpeg(data, strict=True).shape == (*size, 3)

    @pytest.mark.parametrize(
        ("name", "options"),
        [
            ("a.tif", {}),
            ("a.tiff", {"compression": "tiff_lzw"}),
            ("jpeg_inside.tif", {"compression": "jpeg"}),  # ffmpeg decodes it to black, with no error
            ("deflate.tif", {"compression": "tiff_adobe_deflate"}),
            ("packbits.tif", {"compression": "packbits"}),
            ("alpha.png", {}),
            ("pages.tif", {"save_all": True, "append_images": ["second page"]}),
            ("a.webp", {"quality": 95}),
            ("a.bmp", {}),
            ("a.ppm", {}),
            ("gray.pgm", {}),
            ("sixteen.png", {}),
            ("rotated.tif", {"tiffinfo": {274: 6}}),  # stored sideways: ffmpeg does not apply the TIFF tag
        ],
    )
    def test_every_format_scanned_is_compressed_upright(self, tmp_path, name, options):
        upright = photo((40, 64))
        (tmp_path / "src").mkdir()
        image = upright.convert("L") if name.endswith(".pgm") else upright
        if name == "sixteen.png":
            image = Image.fromarray(np.asarray(upright.convert("L"), np.uint16) * 257)  # 16-bit gray
        if name == "rotated.tif":
            image = upright.transpose(Image.Transpose.ROTATE_90)  # orientation 6 turns it back
        if name == "alpha.png":
            image = upright.convert("RGBA")  # opaque: dropping alpha keeps the picture
        if "append_images" in options:
            options = {**options, "append_images": [photo((40, 64)).transpose(Image.Transpose.FLIP_TOP_BOTTOM)]}
        image.save(tmp_path / "src" / name, **options)
        report = compress_folder(tmp_path / "src", tmp_path / "dst", progress=False)
        assert (report.done, report.failed) == (1, [])
        output = (tmp_path / "dst" / name).with_suffix(".jpg").read_bytes()
        pixels = simplejpeg.decode_jpeg(output, strict=True)
        expected = np.asarray(upright.convert("L").convert("RGB") if "gray" in name or "sixteen" in name else upright)
        assert pixels.shape == (40, 64, 3) and np.abs(pixels.astype(np.int16) - expected).mean() < 8

    def test_an_image_that_ffmpeg_cannot_read_but_pillow_can_is_compressed_from_pillow_s_pixels(
        self, tmp_path, monkeypatch
    ):
        """tests/data/arithmetic_coded_rotated.jpg: 70x52 stored, EXIF orientation 6, arithmetic-coded
        (``jpegtran -arithmetic -copy all``), which libjpeg-turbo reads and ffmpeg does not."""
        (tmp_path / "src" / "a").mkdir(parents=True)
        source = tmp_path / "src" / "a" / "arithmetic.jpg"
        shutil.copy(Path(__file__).parent / "data" / "arithmetic_coded_rotated.jpg", source)
        inputs = []
        run_ffmpeg = gpuload.writing.compress._run_ffmpeg
        monkeypatch.setattr(
            gpuload.writing.compress,
            "_run_ffmpeg",
            lambda command, data: inputs.append(command) or run_ffmpeg(command, data),
        )
        report = compress_folder(tmp_path / "src", tmp_path / "dst", progress=False, workers=1)
        assert (report.done, report.failed) == (1, [])
        assert len(inputs) == 1 and "rawvideo" in inputs[0]  # its pixels at once: ffmpeg is not asked to read it
        output = (tmp_path / "dst" / "a" / "arithmetic.jpg").read_bytes()
        pixels = simplejpeg.decode_jpeg(output, strict=True)
        upright = decode_image(source).permute(1, 2, 0).numpy()
        assert pixels.shape == upright.shape == (70, 52, 3)
        assert np.abs(pixels.astype(np.int16) - upright).mean() < 4
        assert row_window(output, 40, 41)[1] > 0  # restart markers, as for every output

    def test_a_file_name_with_a_percent_pattern_is_that_file_not_a_numbered_sequence(self, tmp_path):
        """ffmpeg reads ``img%d.jpg`` as the pattern of img1.jpg, img2.jpg...: each output must be
        its own source's picture."""
        (tmp_path / "src" / "a").mkdir(parents=True)
        photo((40, 60)).save(tmp_path / "src" / "a" / "img%d.jpg", quality=95)
        photo((30, 20)).transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(tmp_path / "src" / "a" / "img1.jpg")
        report = compress_folder(tmp_path / "src", tmp_path / "dst", progress=False)
        assert (report.done, report.failed) == (2, [])
        with Image.open(tmp_path / "dst" / "a" / "img%d.jpg") as image:
            assert image.size == (60, 40)

    def test_an_output_of_another_size_than_its_source_is_reported_not_kept(self, photo_folder, tmp_path, monkeypatch):
        monkeypatch.setattr(gpuload.writing.compress, "_decoded_size", lambda data: (3, 2))
        report = compress_folder(photo_folder, tmp_path / "q", progress=False)
        assert report.done == 0 and len(report.failed) == 20
        assert {reason for _, reason in report.failed} == {"ffmpeg wrote a 2x3 JPEG for this 64x48 image"}

    def test_an_output_that_does_not_decode_is_reported_not_kept(self, photo_folder, tmp_path, monkeypatch):
        monkeypatch.setattr(gpuload.writing.compress, "_decoded_size", lambda data: None)
        report = compress_folder(photo_folder, tmp_path / "q", progress=False)
        assert report.done == 0 and len(report.failed) == 20
        assert {reason for _, reason in report.failed} == {"ffmpeg wrote a JPEG that libjpeg-turbo reports as corrupt"}
        assert relative_files(tmp_path / "q") == []

    @pytest.mark.parametrize("kind", sorted(ODD_KINDS))
    def test_odd_images_become_upright_rgb_jpegs(self, tmp_path, kind):
        expected = write_odd_image(tmp_path / "src" / ODD_KINDS[kind], kind)
        report = compress_folder(tmp_path / "src", tmp_path / "dst", progress=False)
        assert report.failed == [] and report.done == 1
        output = tmp_path / "dst" / (ODD_KINDS[kind].rsplit(".", 1)[0] + ".jpg")
        with Image.open(output) as image:
            assert image.format == "JPEG" and image.size == expected.size
            difference = np.abs(np.asarray(image.convert("RGB"), np.float32) - np.asarray(expected, np.float32)).mean()
            assert difference < 6

    def test_rerun_skips_what_is_done(self, photo_folder, tmp_path):
        first = compress_folder(photo_folder, tmp_path / "q", progress=False)
        (tmp_path / "q" / "face" / "0001.jpg").unlink()
        again = compress_folder(photo_folder, tmp_path / "q", progress=False)
        assert (again.done, again.skipped) == (1, 19)
        assert again.bytes_after == first.bytes_after

    def test_bad_files_are_reported_and_do_not_stop_the_run(self, photo_folder, photo_copy, tmp_path):
        write_bad_file(photo_copy / "face", "notes.jpg")
        write_bad_file(photo_copy / "face", "truncated.jpg")
        report = compress_folder(photo_copy, tmp_path / "q", progress=False)
        failed = dict(report.failed)
        assert sorted(failed) == [str(photo_copy / "face" / name) for name in ("notes.jpg", "truncated.jpg")]
        assert all(message.strip() for message in failed.values())
        assert report.done == 20
        assert relative_files(tmp_path / "q") == relative_files(photo_folder)

    def test_what_is_not_a_regular_file_is_reported_never_opened(self, photo_folder, tmp_path, make_not_a_file):
        src = Path(shutil.copytree(photo_folder, tmp_path / "src"))
        for kind in NOT_FILES:
            make_not_a_file(src / "collar" / f"{kind}.jpg", kind)
        report = compress_folder(src, tmp_path / "dst", progress=False)
        assert report.done == 20 and dict(report.failed) == {
            str(
                src / "collar" / f"{kind}.jpg"
            ): f"not a regular file ({name}): not opened; images must be regular files"
            for kind, name in NOT_FILES.items()
        }

    @pytest.mark.parametrize(
        "name", ["truncated.jpg", "truncated_eoi.jpg", "corrupt.jpg", "extraneous.jpg", "corrupt_mpo.jpg"]
    )
    def test_a_damaged_jpeg_is_reported_not_passed_on_with_grey_blocks(self, tmp_path, name):
        path = write_bad_file(tmp_path / "src", name)
        report = compress_folder(tmp_path / "src", tmp_path / "dst", progress=False)
        assert report.done == 0 and report.failed == [(str(path), report.failed[0][1])]
        assert report.failed[0][1].startswith("truncated or corrupt JPEG (libjpeg: ")
        assert relative_files(tmp_path / "dst") == []

    @pytest.mark.parametrize("error", [ZeroDivisionError, MemoryError])
    def test_a_bug_is_not_reported_as_a_damaged_file(self, photo_folder, tmp_path, monkeypatch, error):
        def broken(path, data=None):
            raise error("a bug, not a damaged file")

        monkeypatch.setattr(gpuload.writing.compress, "check_image", broken)
        with pytest.raises(error, match="a bug"):
            compress_folder(photo_folder, tmp_path / "q", progress=False)


class TestStrict:
    def test_stops_at_the_first_failure_naming_the_file_and_the_reason(self, photo_copy, tmp_path):
        write_bad_file(photo_copy / "background", "notes.jpg")  # first in sorted order: nothing is encoded after it
        with pytest.raises(CompressError, match=r"background/notes.jpg: not an image") as caught:
            compress_folder(photo_copy, tmp_path / "q", strict=True, workers=1, progress=False)
        assert caught.value.path == str(photo_copy / "background" / "notes.jpg")
        assert len(relative_files(tmp_path / "q")) < 20

    def test_an_output_that_is_not_ours_stops_a_strict_run_before_any_encoding(self, photo_folder, tmp_path):
        (tmp_path / "q" / "face").mkdir(parents=True)
        (tmp_path / "q" / "face" / "0002.jpg").write_text("mine")
        with pytest.raises(CompressError, match="face/0002.jpg exists and was not written by gpuload compress"):
            compress_folder(photo_folder, tmp_path / "q", strict=True, progress=False)
        assert relative_files(tmp_path / "q") == ["face/0002.jpg"]


class TestResume:
    """A rerun redoes everything not known to be finished and never replaces a file it did not write."""

    def test_a_file_at_an_output_path_that_we_did_not_write_is_kept_and_reported(self, photo_folder, tmp_path):
        (tmp_path / "q" / "face").mkdir(parents=True)
        (tmp_path / "q" / "face" / "0002.jpg").write_bytes(b"")  # e.g. a crash of another tool, or the user's
        report = compress_folder(photo_folder, tmp_path / "q", progress=False)
        assert (report.done, report.skipped) == (19, 0)
        assert report.failed == [
            (
                str(photo_folder / "face" / "0002.jpg"),
                f"{tmp_path / 'q' / 'face' / '0002.jpg'} exists and was not written by gpuload compress "
                f"(it is not in .gpuload-compress.jsonl); move it away or choose another DST",
            )
        ]
        assert (tmp_path / "q" / "face" / "0002.jpg").read_bytes() == b""

    def test_an_output_whose_bytes_did_not_all_reach_the_disk_is_redone(self, photo_folder, tmp_path):
        compress_folder(photo_folder, tmp_path / "q", progress=False)
        output = tmp_path / "q" / "face" / "0002.jpg"
        output.chmod(0o644)
        output.write_bytes(output.read_bytes()[:100])  # what a power cut can leave of an unsynced write
        report = compress_folder(photo_folder, tmp_path / "q", progress=False)
        assert (report.done, report.skipped) == (1, 19)
        decode_image(output)

    @pytest.mark.parametrize("change", ["source", "quality"])
    def test_a_changed_source_or_quality_is_redone(self, photo_copy, tmp_path, change):
        compress_folder(photo_copy, tmp_path / "q", progress=False)
        if change == "source":
            source = photo_copy / "face" / "0002.jpg"
            shutil.copy(photo_copy / "face" / "0003.jpg", source)
            os.utime(source, ns=(1, 1))
        report = compress_folder(photo_copy, tmp_path / "q", quality=5 if change == "quality" else 3, progress=False)
        assert report.done == (1 if change == "source" else 20)

    def test_a_journal_line_torn_by_a_crash_does_not_swallow_the_next_one(self, photo_folder, tmp_path):
        """A power cut or a full disk can leave the journal's last line cut short: the next run's
        first line must not be glued onto it (and that output then refused as not ours)."""
        compress_folder(photo_folder, tmp_path / "q", progress=False)
        journal = tmp_path / "q" / gpuload.writing.compress.JOURNAL_NAME
        lines = journal.read_text().splitlines(keepends=True)
        last = json.loads(lines[-1])["target"]
        journal.write_text("".join(lines[:-1]) + lines[-1][:-40])  # torn, no newline
        (tmp_path / "q" / last).unlink()  # that output was never renamed into place
        assert compress_folder(photo_folder, tmp_path / "q", progress=False).done == 1
        again = compress_folder(photo_folder, tmp_path / "q", progress=False)
        assert (again.done, again.skipped, again.failed) == (0, 20, [])

    def test_outputs_of_a_version_without_restart_markers_are_redone_not_refused(self, photo_folder, tmp_path):
        compress_folder(photo_folder, tmp_path / "q", progress=False)
        journal = tmp_path / "q" / gpuload.writing.compress.JOURNAL_NAME
        old = [json.loads(line) for line in journal.read_text().splitlines()]
        for record in old:  # as compress wrote them before: no restart markers, no such key
            del record["restart_markers"]
            output = tmp_path / "q" / record["target"]
            output.write_bytes(simplejpeg.encode_jpeg(simplejpeg.decode_jpeg(output.read_bytes()), 90))
            record["size"] = output.stat().st_size
        journal.write_text("".join(json.dumps(record) + "\n" for record in old))
        report = compress_folder(photo_folder, tmp_path / "q", progress=False)
        assert (report.done, report.skipped, report.failed) == (20, 0, [])
        assert all(b"\xff\xdd" in path.read_bytes() for path in (tmp_path / "q").rglob("*.jpg"))

    def test_after_kill_9_a_rerun_removes_the_temporary_files_and_finishes(self, photo_folder, tmp_path):
        dst = tmp_path / "q"
        code = KILLED_COMPRESS.format(src=str(photo_folder), dst=str(dst))
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert result.returncode == -9, result.stderr[-2000:]
        partials = [path for path in dst.rglob(".*.gpuload-tmp")]
        assert partials  # the kill left a temporary file
        report = compress_folder(photo_folder, dst, progress=False)
        assert report.done + report.skipped == 20 and report.failed == []
        assert not any(path.exists() for path in partials)
        assert not list(dst.rglob(".*.gpuload-tmp"))
        for path in dst.rglob("*.jpg"):
            decode_image(path)


KILLED_COMPRESS = """
import os, signal
import gpuload.writing.compress as compress
calls = []
real = os.replace
def replace(source, target):
    calls.append(1)
    if len(calls) == 5:  # output written, flushed and recorded; killed before its rename
        os.kill(os.getpid(), signal.SIGKILL)
    return real(source, target)
compress.os.replace = replace
compress.compress_folder({src!r}, {dst!r}, workers=1, progress=False)
"""


class TestFullDisk:
    def test_a_full_disk_stops_the_run_with_an_error(self, photo_folder, tmp_path, monkeypatch):
        real = os.fsync
        calls = []

        def fsync(fd):
            calls.append(1)
            if len(calls) == 4:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(fd)

        monkeypatch.setattr(gpuload.writing.compress.os, "fsync", fsync)
        with pytest.raises(
            OSError,
            match=r"not enough disk space to write .*\.jpg: it needs [0-9,]+ bytes \([0-9.]+ KB\) and its disk has "
            r"[0-9,]+ bytes \([0-9.]+ [KMGT]B\) free; free space there and run again \(what is finished is kept\), or "
            r"choose another DST$",
        ):
            compress_folder(photo_folder, tmp_path / "q", workers=1, progress=False)
        monkeypatch.setattr(gpuload.writing.compress.os, "fsync", real)
        assert not list((tmp_path / "q").rglob(".*.gpuload-tmp"))
        report = compress_folder(photo_folder, tmp_path / "q", progress=False)  # once space is free again
        assert report.done + report.skipped == 20 and report.failed == []

    def test_no_free_inode_is_not_called_a_lack_of_space(self, photo_folder, tmp_path, monkeypatch):
        real = Path.mkdir

        def mkdir(self, *args, **kwargs):  # the first output folder: a new folder needs an inode
            if self.name == "background":
                raise OSError(errno.ENOSPC, "No space left on device", str(self))
            return real(self, *args, **kwargs)

        class Statvfs:
            f_bavail, f_frsize, f_files, f_favail = 12_800, 4096, 1000, 0

        monkeypatch.setattr(Path, "mkdir", mkdir)
        monkeypatch.setattr(gpuload.writing.files.os, "statvfs", lambda path: Statvfs())
        with pytest.raises(OSError) as caught:
            compress_folder(photo_folder, tmp_path / "q", workers=1, progress=False)
        assert caught.value.errno == errno.ENOSPC and str(caught.value) == (
            f"[Errno 28] no free inode left to write {tmp_path / 'q' / 'background' / '0000.jpg'} (its disk has "
            "52,428,800 bytes (52.4 MB) free, but all its 1,000 inodes are taken: each file or folder takes one, "
            "whatever its size); delete files there and run again (what is finished is kept), or choose another DST"
        )


class TestLockAndLinks:
    def test_a_second_run_on_the_same_dst_fails_at_once(self, photo_folder, tmp_path):
        from gpuload.writing.files import OutputLock

        with OutputLock(tmp_path / "q"), pytest.raises(BusyError, match="another gpuload run is writing"):
            compress_folder(photo_folder, tmp_path / "q", progress=False)

    def test_a_link_in_src_to_dst_does_not_compress_the_outputs_again(self, photo_copy, tmp_path):
        dst = tmp_path / "dst"
        (photo_copy / "link").symlink_to(dst, target_is_directory=True)
        for _ in range(3):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = compress_folder(photo_copy, dst, progress=False)
        assert not report.failed
        assert sorted(path.relative_to(dst).parts[0] for path in dst.rglob("*.jpg")) == sorted(
            path.relative_to(photo_copy).parts[0] for path in photo_copy.rglob("*.jpg") if "link" not in path.parts
        )

    def test_symlink_loops_are_walked_once(self, photo_copy, tmp_path):
        (photo_copy / "face" / "up").symlink_to(photo_copy)
        (photo_copy / "collar" / "sideways").symlink_to(photo_copy / "face")
        result = {}
        thread = threading.Thread(
            target=lambda: result.update(report=compress_folder(photo_copy, tmp_path / "q", progress=False)),
            daemon=True,
        )
        with pytest.warns(UserWarning, match="already scanned"):
            thread.start()
            thread.join(60)
        assert not thread.is_alive()
        assert result["report"].done == 20

    def test_two_sources_with_one_output_name(self, tmp_path):
        write_odd_image(tmp_path / "src" / "a.png", "palette")
        shutil.copy(tmp_path / "src" / "a.png", tmp_path / "src" / "a.jpg")
        report = compress_folder(tmp_path / "src", tmp_path / "dst", progress=False)
        assert report.failed == [
            (
                str(tmp_path / "src" / "a.png"),
                f"its output {tmp_path / 'dst' / 'a.jpg'} is also the output of {tmp_path / 'src' / 'a.jpg'}",
            )
        ]


class TestArguments:
    @pytest.mark.parametrize("quality", [0, 32, 2.5])
    def test_quality_range(self, photo_folder, tmp_path, quality):
        with pytest.raises(ValueError, match="quality must be an integer from 1"):
            compress_folder(photo_folder, tmp_path / "q", quality=quality, progress=False)

    @pytest.mark.parametrize("inside", [False, True])
    def test_a_dataset_is_not_a_dst_nor_holds_one(self, photo_folder, built_dataset, inside):
        """Class folders (or a lock file) written into a dataset would be files gpuload did not write
        there: its --overwrite would then refuse it."""
        before = sorted(path.name for path in built_dataset.iterdir())
        dst = built_dataset / "sub" if inside else built_dataset
        where = f"lies inside {built_dataset}," if inside else "is"
        with pytest.raises(UsageError, match=f"DST {dst} {where} a gpuload dataset; choose another DST"):
            compress_folder(photo_folder, dst, progress=False)
        assert sorted(path.name for path in built_dataset.iterdir()) == before

    def test_dst_inside_src(self, photo_folder):
        with pytest.raises(UsageError, match="is inside SRC"):
            compress_folder(photo_folder, photo_folder / "q", progress=False)

    @pytest.mark.parametrize("dst", [".", "photos/..", "photos", "photos/face/../."])
    def test_dst_overlapping_src_however_spelled(self, photo_copy, monkeypatch, dst):
        monkeypatch.chdir(photo_copy.parent)
        with pytest.raises(UsageError, match="(contains|is) SRC"):
            compress_folder("photos", dst, progress=False)
        assert not list(photo_copy.parent.rglob(".gpuload-compress.jsonl"))

    def test_missing_src(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="is not a folder"):
            compress_folder(tmp_path / "nope", tmp_path / "q", progress=False)

    def test_folder_without_images(self, tmp_path):
        (tmp_path / "src").mkdir()
        (tmp_path / "src" / "a.txt").write_text("x")
        with pytest.raises(FileNotFoundError, match="holds no image"):
            compress_folder(tmp_path / "src", tmp_path / "q", progress=False)

    def test_missing_ffmpeg_says_how_to_get_one(self, monkeypatch):
        import imageio_ffmpeg

        def none():
            raise RuntimeError("no ffmpeg")

        monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", none)
        monkeypatch.setattr(gpuload.writing.compress.shutil, "which", lambda name: None)
        with pytest.raises(FileNotFoundError, match=r"pip install imageio-ffmpeg .*apt-get install ffmpeg"):
            find_ffmpeg()

    @pytest.mark.parametrize("kind", ["missing", "not executable"])
    def test_an_ffmpeg_named_by_imageio_ffmpeg_exe_that_cannot_run_is_named(
        self, photo_folder, tmp_path, monkeypatch, kind
    ):
        fake = tmp_path / "ffmpeg"
        if kind == "not executable":
            fake.write_text("#!/bin/sh\n")
            fake.chmod(0o644)
        monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(fake))
        with pytest.raises(
            FileNotFoundError, match=f"^{re.escape(str(fake))} is not an executable ffmpeg .*IMAGEIO_FFMPEG_EXE"
        ):
            compress_folder(photo_folder, tmp_path / "q", progress=False)
        assert not (tmp_path / "q").exists()


def test_summary_line():
    report = CompressReport(
        done=3, skipped=1, failed=[("a", "b")], bytes_before=4_000_000, bytes_after=1_000_000, seconds=2
    )
    assert report.summary() == "3 done, 1 skipped, 1 failed: 4 MB -> 1 MB (4.0x smaller) in 2.0 s"


def test_ffmpeg_is_real():
    import subprocess

    version = subprocess.run([find_ffmpeg(), "-version"], capture_output=True, text=True, check=True).stdout
    assert version.startswith("ffmpeg version")
