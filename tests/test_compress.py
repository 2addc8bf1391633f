import shutil

import numpy as np
import pytest
from conftest import ODD_KINDS, write_bad_file, write_odd_image
from PIL import Image

import gpuload.store.compress
from gpuload import CompressReport, compress_folder, find_ffmpeg


def relative_files(root):
    return sorted(path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file())


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

    def test_bad_files_are_reported_and_do_not_stop_the_run(self, photo_copy, tmp_path):
        write_bad_file(photo_copy / "face", "notes.jpg")
        write_bad_file(photo_copy / "face", "truncated.jpg")
        report = compress_folder(photo_copy, tmp_path / "q", progress=False)
        failed = dict(report.failed)
        assert str(photo_copy / "face" / "notes.jpg") in failed
        assert all(message.strip() for message in failed.values())
        assert report.done >= 20
        assert not any(".tmp-" in name for name in relative_files(tmp_path / "q"))

    def test_strict_raises_after_the_run(self, photo_copy, tmp_path):
        write_bad_file(photo_copy / "face", "notes.jpg")
        with pytest.raises(RuntimeError, match="1 files failed to compress; first: .*notes.jpg"):
            compress_folder(photo_copy, tmp_path / "q", strict=True, progress=False)
        assert len(list((tmp_path / "q").rglob("*.jpg"))) == 20

    def test_two_sources_with_one_output_name(self, tmp_path):
        write_odd_image(tmp_path / "src" / "a.png", "palette")
        shutil.copy(tmp_path / "src" / "a.png", tmp_path / "src" / "a.jpg")
        report = compress_folder(tmp_path / "src", tmp_path / "dst", progress=False)
        assert report.failed == [(str(tmp_path / "src" / "a.png"), "its output a.jpg is also the output of a.jpg")]


class TestArguments:
    @pytest.mark.parametrize("quality", [0, 32, 2.5])
    def test_quality_range(self, photo_folder, tmp_path, quality):
        with pytest.raises(ValueError, match="quality must be an integer from 1"):
            compress_folder(photo_folder, tmp_path / "q", quality=quality, progress=False)

    def test_dst_inside_src(self, photo_folder):
        with pytest.raises(ValueError, match="must not be inside src"):
            compress_folder(photo_folder, photo_folder / "q", progress=False)

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
        monkeypatch.setattr(gpuload.store.compress.shutil, "which", lambda name: None)
        with pytest.raises(FileNotFoundError, match=r"pip install imageio-ffmpeg .*apt-get install ffmpeg"):
            find_ffmpeg()


def test_summary_line():
    report = CompressReport(
        done=3, skipped=1, failed=[("a", "b")], bytes_before=4_000_000, bytes_after=1_000_000, seconds=2
    )
    assert report.summary() == "3 done, 1 skipped, 1 failed: 4.0 MB -> 1.0 MB (4.0x smaller) in 2.0 s"


def test_ffmpeg_is_real():
    import subprocess

    version = subprocess.run([find_ffmpeg(), "-version"], capture_output=True, text=True, check=True).stdout
    assert version.startswith("ffmpeg version")
