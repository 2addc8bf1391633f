import argparse
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import write_bad_file
from PIL import Image

import gpuload
import gpuload.cli
import gpuload.writing.compress
import gpuload.writing.decode
from gpuload.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class TestBuildMemmap:
    @pytest.mark.parametrize(
        "command", [("build-memmap", ""), ("compress", "", "out"), ("build-memmap", "src", "--out", " ")]
    )
    def test_an_empty_path_is_refused_not_taken_for_this_folder(self, capsys, tmp_path, monkeypatch, command):
        monkeypatch.chdir(tmp_path)
        (tmp_path / "src").mkdir()
        with pytest.raises(SystemExit) as exited:  # argparse's usage error
            main(list(command))
        err = capsys.readouterr().err
        assert exited.value.code == 2 and "a path is empty" in err and "unset shell variable" in err
        assert sorted(path.name for path in tmp_path.iterdir()) == ["src"]

    def test_an_empty_out_folder_gets_advice_that_does_not_loop(self, capsys, photo_folder, tmp_path):
        (tmp_path / "made-ahead").mkdir()
        for extra in ((), ("--overwrite",)):
            code, _, err = run(capsys, "build-memmap", str(photo_folder), "--out", str(tmp_path / "made-ahead"), *extra)
            assert code == 2 and "already exists as an empty folder" in err and "rmdir" in err
        assert list((tmp_path / "made-ahead").iterdir()) == []

    def test_builds_and_prints_a_summary(self, capsys, photo_copy):
        write_bad_file(photo_copy / "face", "empty.jpg")
        code, out, _ = run(
            capsys, "build-memmap", str(photo_copy), "--size", "32x24", "--resize", "stretch", "--workers", "1"
        )
        assert code == 0
        assert f"built {photo_copy}.memmap: 20 images of 32x24 (" in out
        assert "1 skipped" in out and "skipped: face/empty.jpg: empty file (0 bytes)" in out

    def test_the_jpeg_order_and_its_seed(self, capsys, photo_folder, tmp_path):
        for name, options in (("source", ["--order", "source"]), ("seeded", ["--seed", "3"])):
            code, _, _ = run(capsys, "build-memmap", str(photo_folder), "--format", "jpeg", "--out",
                             str(tmp_path / name), *options)  # fmt: skip
            assert code == 0
        assert gpuload.MemmapImageDataset(tmp_path / "source").manifest.order == {}
        assert gpuload.MemmapImageDataset(tmp_path / "seeded").manifest.order["shuffled"] == 3
        code, _, err = run(capsys, "build-memmap", str(photo_folder), "--order", "source", "--out", str(tmp_path / "r"))
        assert code == 2 and "order applies only to format='jpeg'" in err

    @pytest.mark.parametrize("format", ["raw", "jpeg"])
    def test_a_named_pipe_among_the_photos_is_skipped_not_waited_for(self, capsys, photo_copy, make_not_a_file, format):
        make_not_a_file(photo_copy / "face" / "pipe.jpg", "fifo")
        code, out, _ = run(capsys, "build-memmap", str(photo_copy), "--format", format, "--workers", "1")
        assert code == 0 and "1 skipped" in out
        assert "skipped: face/pipe.jpg: not a regular file (a named pipe): not opened" in out

    def test_known_errors_are_one_line_with_exit_code_2(self, capsys, tmp_path):
        code, out, err = run(capsys, "build-memmap", str(tmp_path / "nope"))
        assert code == 2 and out == ""
        assert (
            err
            == f"gpuload: error: {tmp_path / 'nope'} does not exist; pass an image folder, a metadata table, tar shards "
            "or Parquet files\n"
        )

    def test_existing_out(self, capsys, photo_folder, tmp_path):
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "notes.txt").write_text("mine")
        code, _, err = run(capsys, "build-memmap", str(photo_folder), "--out", str(tmp_path / "out"))
        assert code == 2 and "already exists; pass overwrite=True (--overwrite)" in err
        assert (tmp_path / "out" / "notes.txt").read_text() == "mine"

    def test_out_holding_src_is_refused_and_the_photos_are_kept(self, capsys, photo_copy, monkeypatch):
        monkeypatch.chdir(photo_copy.parent)
        before = sorted(photo_copy.rglob("*"))
        code, out, err = run(capsys, "build-memmap", "photos", "--out", ".", "--overwrite")
        assert code == 2 and out == ""
        assert err.startswith(f"gpuload: error: out ({photo_copy.parent}) contains src ({photo_copy})")
        assert err.count("\n") == 1
        assert sorted(photo_copy.rglob("*")) == before

    @pytest.mark.parametrize("error", [ZeroDivisionError, RuntimeError, ValueError])
    def test_an_internal_error_keeps_its_traceback(self, capsys, photo_folder, tmp_path, monkeypatch, error):
        def broken(*args):
            raise error("a bug, not a corrupt file")

        monkeypatch.setattr(gpuload.writing.decode, "_fit", broken)
        with pytest.raises(error, match="a bug"):
            main(["build-memmap", str(photo_folder), "--out", str(tmp_path / "out"), "--size", "8x8"])

    def test_warnings_are_one_line(self, capsys, photo_copy, tmp_path):
        (photo_copy / "face" / "up").symlink_to(photo_copy)
        code, _, err = run(capsys, "build-memmap", str(photo_copy), "--out", str(tmp_path / "out"))
        assert code == 0
        assert err.splitlines()[0] == (
            f"gpuload: warning: face/up leads to {photo_copy}, a folder already scanned "
            "(a symlink loop or a second link to it); its images are listed once"
        )

    @pytest.mark.parametrize("size", ["480", "0x5", "axb", "4x4x4"])
    def test_bad_size_is_a_usage_error(self, capsys, photo_folder, size):
        with pytest.raises(SystemExit) as exit_info:
            main(["build-memmap", str(photo_folder), "--size", size])
        assert exit_info.value.code == 2
        assert "expected WIDTHxHEIGHT" in capsys.readouterr().err


class TestMaxPixels:
    """Pillow's pixel limit (PIL.Image.MAX_IMAGE_PIXELS) raised from the command line, for the run only."""

    def test_build_memmap(self, capsys, photo_folder, tmp_path, monkeypatch):
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3000)  # below the photos' 3,072 pixels
        code, _, err = run(capsys, "build-memmap", str(photo_folder), "--out", str(tmp_path / "a"))
        assert code == 1 and "--max-pixels N on the command line" in err
        code, out, _ = run(
            capsys, "build-memmap", str(photo_folder), "--out", str(tmp_path / "b"), "--max-pixels", "3072"
        )
        assert code == 0 and "20 images" in out and "0 skipped" in out
        assert Image.MAX_IMAGE_PIXELS == 3000
        assert run(capsys, "verify", str(tmp_path / "b"), "--sources")[0] == 0  # with the build's limit

    def test_compress(self, capsys, photo_folder, tmp_path, monkeypatch):
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3000)
        code, out, _ = run(capsys, "compress", str(photo_folder), str(tmp_path / "q"), "--max-pixels", "3072")
        assert code == 0 and "20 done" in out and Image.MAX_IMAGE_PIXELS == 3000

    def test_verify_of_a_dataset_that_does_not_record_the_limit(self, capsys, photo_folder, tmp_path, monkeypatch):
        out = tmp_path / "old"
        assert run(capsys, "build-memmap", str(photo_folder), "--out", str(out), "--size", "32x24")[0] == 0
        (out / "manifest.json").chmod(0o644)
        manifest = json.loads((out / "manifest.json").read_text())
        del manifest["max_image_pixels"]
        (out / "manifest.json").write_text(json.dumps(manifest))
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3000)
        assert run(capsys, "verify", str(out), "--sources")[0] == 1
        assert run(capsys, "verify", str(out), "--sources", "--max-pixels", "3072")[0] == 0

    @pytest.mark.parametrize("value", ["0", "-5", "many"])
    def test_a_bad_limit_is_a_usage_error(self, capsys, photo_folder, value):
        with pytest.raises(SystemExit) as exit_info:
            main(["build-memmap", str(photo_folder), "--max-pixels", value])
        assert exit_info.value.code == 2
        assert "expected a positive number of pixels" in capsys.readouterr().err


class TestJpegFormat:
    def test_build_info_and_classes_from(self, capsys, photo_copy, built_dataset, tmp_path):
        code, out, _ = run(capsys, "build-memmap", str(photo_copy), "--out", str(tmp_path / "j"), "--format", "jpeg")
        assert code == 0 and "20 JPEGs at their own sizes (" in out
        code, out, _ = run(capsys, "info", str(tmp_path / "j"))
        assert code == 0 and "20 JPEGs, each at its own size" in out and "re-encoded at quality 90" in out
        (photo_copy / "extra").mkdir()
        (photo_copy / "extra" / "a.jpg").write_bytes((photo_copy / "face" / "0000.jpg").read_bytes())
        code, _, err = run(
            capsys, "build-memmap", str(photo_copy), "--out", str(tmp_path / "v"), "--classes-from", str(built_dataset)
        )
        assert code == 2 and "has class folders that are not in the given classes: extra" in err

    def test_classes_from_with_a_folder_of_images_and_no_class_folders(
        self, capsys, photo_folder, built_dataset, tmp_path
    ):
        flat = tmp_path / "val"
        flat.mkdir()
        (flat / "a.jpg").write_bytes((photo_folder / "face" / "0000.jpg").read_bytes())
        code, _, err = run(capsys, "build-memmap", str(flat), "--classes-from", str(built_dataset))
        assert code == 2 and err == (
            f"gpuload: error: {flat} holds 1 image and no class folder, so it would be one class named 'val', which "
            "is not in the given classes (background, collar, face, sleeve_left, sleeve_right); pass the folder that "
            "holds one folder per class, or name this folder after its class\n"
        )

    def test_classes_from_a_dataset_whose_classes_were_edited_is_refused(self, capsys, photo_folder, tmp_path):
        reference = tmp_path / "train"
        assert run(capsys, "build-memmap", str(photo_folder), "--out", str(reference))[0] == 0
        (reference / "manifest.json").chmod(0o644)
        manifest = json.loads((reference / "manifest.json").read_text())
        manifest["classes"][0], manifest["classes"][1] = manifest["classes"][1], manifest["classes"][0]
        (reference / "manifest.json").write_text(json.dumps(manifest))
        out = tmp_path / "val"
        code, _, err = run(
            capsys, "build-memmap", str(photo_folder), "--out", str(out), "--classes-from", str(reference)
        )
        assert code == 2 and "its manifest's classes were changed after its build" in err and not out.exists()

    def test_a_file_size_limit_is_one_line_not_a_traceback(self, photo_folder, tmp_path):
        import resource

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

        command = [sys.executable, "-m", "gpuload", "build-memmap", str(photo_folder), "--out", str(tmp_path / "o")]
        result = subprocess.run(command, capture_output=True, text=True, preexec_fn=limit, timeout=300)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.startswith("gpuload: error: [Errno 27] File too large")

    def test_size_with_jpeg_is_refused(self, capsys, photo_folder, tmp_path):
        code, _, err = run(
            capsys, "build-memmap", str(photo_folder), "--out", str(tmp_path / "j"), "--format", "jpeg", "--size", "8x8"
        )
        assert code == 2 and "size applies to format='raw'" in err

    def test_max_side_with_raw_says_it_applies_to_jpeg_only(self, capsys, photo_folder, tmp_path):
        code, _, err = run(
            capsys,
            "build-memmap",
            str(photo_folder),
            "--out",
            str(tmp_path / "r"),
            "--max-side",
            "100",
            "--format",
            "raw",
        )
        assert code == 2 and err == (
            "gpuload: error: max_side applies only to format='jpeg' (--format jpeg), got max_side=100 with "
            "format='raw'; a raw build stores every image at one size: give that size (--size WIDTHxHEIGHT) and leave "
            "max_side out\n"
        )
        assert not (tmp_path / "r").exists()

    @pytest.mark.parametrize("resize", ["crop", "pad", "stretch"])
    def test_resize_with_jpeg_is_refused_in_one_line(self, capsys, photo_folder, tmp_path, resize):
        out = tmp_path / "j"
        code, stdout, err = run(
            capsys, "build-memmap", str(photo_folder), "--out", str(out), "--format", "jpeg", "--resize", resize
        )
        assert code == 2 and stdout == "" and err.count("\n") == 1
        assert err.startswith("gpuload: error: resize applies only to format='raw' (--format raw)")
        assert not out.exists()


class TestInfoAndVerify:
    def test_info(self, capsys, built_dataset):
        code, out, _ = run(capsys, "info", str(built_dataset))
        assert code == 0
        assert "images:  20 images of 64x48 (raw uint8)" in out and "face          4" in out

    def test_info_json(self, capsys, built_dataset):
        code, out, _ = run(capsys, "info", str(built_dataset), "--json")
        assert code == 0 and json.loads(out)["images"] == 20

    def test_verify_ok(self, capsys, built_dataset):
        code, out, _ = run(capsys, "verify", str(built_dataset), "--sources", "3")
        assert code == 0 and ": OK; checked " in out

    def test_verify_all_sources(self, capsys, built_dataset):
        code, out, _ = run(capsys, "verify", str(built_dataset), "--sources")
        assert code == 0 and ": OK; checked " in out

    def test_verify_exits_1_on_problems(self, capsys, built_dataset, tmp_path):
        copy = Path(shutil.copytree(built_dataset, tmp_path / "copy"))
        (copy / "images.memmap").chmod(0o644)
        with open(copy / "images.memmap", "r+b") as file:
            file.write(b"\xff" * 16)  # damage image 0
        code, out, _ = run(capsys, "verify", str(copy))
        assert code == 1 and "problem: 1 image does not match its build checksum: 0 (" in out
        assert out.splitlines()[-1].startswith(f"{copy}: 1 problem; checked the manifest")

    def test_verify_of_a_dataset_whose_manifest_was_lost_exits_1(self, capsys, built_dataset, tmp_path):
        copy = Path(shutil.copytree(built_dataset, tmp_path / "copy"))
        (copy / "manifest.json").unlink()
        code, out, _ = run(capsys, "verify", str(copy))
        assert (
            code == 1
            and "manifest.json is missing" in out
            and out.splitlines()[-1].startswith(f"{copy}: 1 problem; checked the manifest")
        )

    @pytest.mark.parametrize(
        ("make", "message"),
        [
            (lambda path: None, "does not exist; pass the folder that build-memmap wrote"),
            (lambda path: path.write_text("notes"), "is not a folder; pass the folder that build-memmap wrote"),
            (lambda path: path.mkdir(), "is not a gpuload dataset: it holds none of the files build-memmap writes"),
        ],
        ids=["missing", "file", "other_folder"],
    )
    def test_verify_of_a_path_that_is_no_dataset_is_a_usage_error(self, capsys, tmp_path, make, message):
        path = tmp_path / "nope"
        make(path)
        code, out, err = run(capsys, "verify", str(path))
        assert code == 2 and out == ""
        assert err.startswith(f"gpuload: error: {path} {message}") and err.count("\n") == 1

    def test_info_on_a_non_dataset(self, capsys, tmp_path):
        code, _, err = run(capsys, "info", str(tmp_path))
        assert code == 2 and "is not a gpuload dataset" in err


class TestCompress:
    def test_prints_failures_and_summary(self, capsys, photo_copy, tmp_path):
        write_bad_file(photo_copy / "face", "notes.jpg")
        code, out, _ = run(capsys, "compress", str(photo_copy), str(tmp_path / "q"))
        assert code == 1
        assert f"failed: {photo_copy / 'face' / 'notes.jpg'}:" in out
        assert "20 done, 0 skipped, 1 failed" in out

    def test_strict_stops_with_one_line_on_stderr_and_exit_1(self, capsys, photo_copy, tmp_path):
        write_bad_file(photo_copy / "face", "notes.jpg")
        code, out, err = run(capsys, "compress", str(photo_copy), str(tmp_path / "q"), "--strict")
        assert code == 1 and "failed" not in out
        assert err.splitlines()[-1] == (  # after the progress bar
            f"gpuload: error: {photo_copy / 'face' / 'notes.jpg'}: not an image (Pillow cannot identify the format)"
        )

    def test_no_file_compressed_is_a_failure(self, capsys, tmp_path):
        for name in ("notes.jpg", "truncated.jpg"):
            write_bad_file(tmp_path / "src" / "a", name)
        code, out, _ = run(capsys, "compress", str(tmp_path / "src"), str(tmp_path / "q"))
        assert code == 1 and "0 done, 0 skipped, 2 failed" in out

    def test_a_full_disk_is_an_error_not_a_success(self, capsys, photo_folder, tmp_path, monkeypatch):
        def full(fd):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(gpuload.writing.compress.os, "fsync", full)
        code, _, err = run(capsys, "compress", str(photo_folder), str(tmp_path / "q"))
        assert code == 2 and err.splitlines()[-1].startswith(
            "gpuload: error: [Errno 28] not enough disk space to write "
        )
        assert err.splitlines()[-1].endswith(
            "free space there and run again (what is finished is kept), or choose another DST"
        )

    def test_bad_quality(self, capsys, photo_folder, tmp_path):
        code, _, err = run(capsys, "compress", str(photo_folder), str(tmp_path / "q"), "-q", "0")
        assert code == 2 and "quality must be an integer from 1 (best) to 31" in err


def test_module_entry_point(photo_folder):
    result = subprocess.run([sys.executable, "-m", "gpuload", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "build-memmap" in result.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["build-memmap", "--help"],
        ["build-memmap"],
        ["verify", "x", "--sources", "many"],
        ["nope"],
        ["push", "--help"],
        ["push", "x"],
        ["--version"],
        ["cache", "--help"],
        ["build-memmap", "s3://bucket/photos"],
    ],
)
def test_help_and_argument_errors_never_import_torch_nor_storage_clients(argv):
    code = textwrap.dedent(f"""
        import sys
        import gpuload
        from gpuload.cli import main
        try:
            main({argv!r})
        except SystemExit:
            pass
        heavy = ("torch", "numpy", "PIL", "tensordict", "torchvision", "fsspec", "s3fs", "obstore", "aiohttp", "botocore")
        heavy = sorted(name for name in heavy if name in sys.modules)
        print(heavy)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.splitlines()[-1] == "[]", result.stderr


def test_the_public_api_is_still_reachable_lazily():
    import gpuload

    assert {"DataLoader", "Normalize", "build_memmap", "GpuloadError"} <= set(dir(gpuload))
    for name in gpuload.__all__:
        assert getattr(gpuload, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        gpuload.nope  # noqa: B018


@pytest.mark.parametrize("command", ["info", "verify"])
def test_a_reader_that_stops_early_gets_no_traceback(built_dataset, command):
    """``gpuload info DATASET | head -1``: the pipe closes before the output is written."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before gpuload writes: every write fails with EPIPE
    result = subprocess.run(
        [sys.executable, "-m", "gpuload", command, str(built_dataset)], stdout=write, stderr=subprocess.PIPE, text=True
    )
    os.close(write)
    assert result.returncode == 141, result.stderr  # 128 + SIGPIPE, as a shell reports `yes | head -1`
    assert "Traceback" not in result.stderr and "Error" not in result.stderr, result.stderr


def test_a_broken_pipe_that_is_not_stdout_is_a_traceback(monkeypatch):
    """Only a reader of our output that went away is quiet; any other broken pipe is a bug to see."""

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(gpuload.cli, "_run_info", broken)
    with pytest.raises(BrokenPipeError):
        main(["info", "anything"])


class TestBasics:
    """What a newcomer meets first: the version, progress in logs, URLs, sizes, plurals, lock files."""

    def test_version(self, capsys):
        with pytest.raises(SystemExit) as exited:
            main(["--version"])
        assert exited.value.code == 0 and capsys.readouterr().out == f"gpuload {gpuload.__version__}\n"

    @pytest.mark.parametrize(("flag", "drawn"), [((), False), (("--quiet",), False), (("--progress",), True)])
    def test_progress_bars_only_on_a_terminal_unless_asked(self, capsys, photo_folder, tmp_path, flag, drawn):
        code, _, err = run(capsys, "build-memmap", str(photo_folder), "--out", str(tmp_path / "out"), *flag)
        assert code == 0 and ("build-memmap: 100%" in err) == drawn  # capsys's stderr is no terminal

    def test_quiet_draws_nothing_on_a_terminal(self, capsys, photo_folder, tmp_path, monkeypatch):
        monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
        assert gpuload.cli._progress(argparse.Namespace(progress=None))  # a terminal: drawn by default
        code, _, err = run(capsys, "compress", str(photo_folder), str(tmp_path / "q"), "--quiet")
        assert code == 0 and "%|" not in err

    @pytest.mark.parametrize(
        ("argv", "flag", "advice"),
        [
            (["build-memmap", "s3://bucket/photos"], "SRC", "build-memmap reads and writes local folders"),
            (["build-memmap", "src", "--out", "gs://bucket/x"], "--out", "build-memmap reads and writes local"),
            (["compress", "s3://bucket/photos", "q"], "SRC", "compress reads and writes local folders"),
            (["compress", "src", "https://host/q"], "DST", "compress reads and writes local folders"),
            (["bench", "s3://bucket/photos.memmap"], "DATASET", "bench measures a local dataset"),
        ],
    )
    def test_a_url_where_a_local_path_is_needed_is_one_line(self, capsys, tmp_path, monkeypatch, argv, flag, advice):
        monkeypatch.chdir(tmp_path)
        (tmp_path / "src").mkdir()
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and err.count("\n") == 1
        assert err.startswith(f"gpuload: error: {flag} of gpuload {argv[0]} is a local path, got the URL ")
        assert advice in err and sorted(os.listdir(tmp_path)) == ["src"]  # no ./s3:/bucket folder made

    def test_no_lock_file_is_left_after_a_run_done_or_failed(self, capsys, photo_copy, tmp_path):
        out = tmp_path / "out"
        assert run(capsys, "build-memmap", str(photo_copy), "--out", str(out / "ds"))[0] == 0
        assert run(capsys, "build-memmap", str(photo_copy), "--out", str(out / "ds"))[0] == 2  # exists: refused
        write_bad_file(photo_copy / "face", "notes.jpg")
        assert run(capsys, "compress", str(photo_copy), str(out / "q"))[0] == 1
        assert run(capsys, "build-memmap", str(photo_copy), "--out", str(out / "s"), "--strict")[0] == 1
        assert sorted(os.listdir(out)) == ["ds", "q"] and not list(photo_copy.parent.glob(".*.lock"))

    def test_one_is_singular_and_small_sizes_are_not_zero_gb(self, capsys, tmp_path):
        (tmp_path / "src" / "cat").mkdir(parents=True)
        Image.new("RGB", (64, 48), (200, 10, 10)).save(tmp_path / "src" / "cat" / "a.jpg")
        code, out, _ = run(capsys, "build-memmap", str(tmp_path / "src"), "--out", str(tmp_path / "ds"))
        assert code == 0 and re.match(rf"built {tmp_path / 'ds'}: 1 image of 64x48 \([\d.]+ KB\) in 1 class, ", out)
        code, out, _ = run(capsys, "info", str(tmp_path / "ds"))
        assert "images:  1 image of 64x48 (raw uint8), " in out and "GB" not in out

    def test_a_size_is_width_x_height_and_the_old_order_is_refused(self, capsys, photo_folder, tmp_path):
        code, out, err = run(capsys, "build-memmap", str(photo_folder), "--out", str(tmp_path / "a"), "--size", "32x24")
        assert code == 0 and "images of 32x24 (" in out
        assert gpuload.MemmapImageDataset(tmp_path / "a").image_shape == (3, 24, 32)
        code, _, err = run(capsys, "build-memmap", str(photo_folder), "--out", str(tmp_path / "b"), "--size", "24x32")
        assert code == 2 and err.count("\n") == 1 and not (tmp_path / "b").exists()
        assert err.startswith(
            "gpuload: error: --size 24x32 is WIDTHxHEIGHT (portrait: 24 wide, 32 high), and the photos of "
        ) and err.rstrip().endswith("pass --size 32x24, or '--size 24x32!' for portrait images of landscape photos")
        for size, shape in (("24x32!", (3, 32, 24)), ("16x16", (3, 16, 16))):  # kept as written; square: no doubt
            out_path = tmp_path / size.strip("!")
            assert run(capsys, "build-memmap", str(photo_folder), "--out", str(out_path), "--size", size)[0] == 0
            assert gpuload.MemmapImageDataset(out_path).image_shape == shape

    def test_size_help_says_width_x_height(self, capsys):
        with pytest.raises(SystemExit):
            main(["build-memmap", "--help"])
        assert "WIDTHxHEIGHT" in capsys.readouterr().out


class TestCompressContract:
    def test_exit_0_when_every_file_is_done(self, capsys, photo_folder, tmp_path):
        code, out, err = run(capsys, "compress", str(photo_folder), str(tmp_path / "q"))
        assert code == 0 and "20 done, 0 skipped, 0 failed" in out and "error" not in err
        assert run(capsys, "compress", str(photo_folder), str(tmp_path / "q"))[0] == 0  # all done earlier: skipped

    def test_exit_1_when_some_failed_with_a_line_on_stderr(self, capsys, photo_copy, tmp_path):
        write_bad_file(photo_copy / "face", "notes.jpg")
        code, out, err = run(capsys, "compress", str(photo_copy), str(tmp_path / "q"))
        assert code == 1 and "20 done, 0 skipped, 1 failed" in out
        assert err.splitlines()[-1].startswith("gpuload: error: 1 of 21 files failed (listed above); the others")
        assert len(list((tmp_path / "q").rglob("*.jpg"))) == 20  # kept

    def test_a_png_written_as_jpg_is_said_in_help_and_summary(self, capsys, photo_copy, tmp_path):
        Image.open(photo_copy / "face" / "0000.jpg").save(photo_copy / "face" / "drawing.png")
        code, out, _ = run(capsys, "compress", str(photo_copy), str(tmp_path / "q"))
        assert code == 0 and out.rstrip().endswith("; 1 PNG or other non-JPEG source written as .jpg")
        assert (tmp_path / "q" / "face" / "drawing.jpg").is_file()
        with pytest.raises(SystemExit):
            main(["compress", "--help"])
        assert "photo.png -> photo.jpg" in capsys.readouterr().out


class TestVerifySays:
    @pytest.mark.parametrize("fixture", ["built_dataset", "jpeg_dataset"])
    def test_what_it_checked_a_raw_and_a_jpeg_dataset_alike(self, capsys, request, photo_folder, fixture):
        dataset = request.getfixturevalue(fixture)
        code, out, _ = run(capsys, "verify", str(dataset), "--sources", "3")
        assert code == 0 and out.startswith(f"{dataset}: OK; checked the manifest and the ")
        assert ", 20 labels, 20 images against their build checksum" in out
        assert out.rstrip().endswith(f"3 of 20 sources in {photo_folder} taken again and compared exactly")

    @pytest.mark.parametrize("format", ["raw", "jpeg"])
    def test_a_changed_source_is_found_in_a_raw_and_a_jpeg_dataset(self, capsys, photo_copy, tmp_path, format):
        out = tmp_path / "ds"
        assert run(capsys, "build-memmap", str(photo_copy), "--out", str(out), "--format", format)[0] == 0
        Image.new("RGB", (64, 48), (0, 0, 255)).save(photo_copy / "face" / "0001.jpg")  # same size, other pixels
        code, stdout, _ = run(capsys, "verify", str(out), "--sources")
        assert (
            code == 1 and f"differs from its source {photo_copy / 'face' / '0001.jpg'} (mean pixel difference" in stdout
        )
        assert stdout.splitlines()[-1].startswith(f"{out}: 1 problem; checked ")

    def test_sources_that_moved_are_found_with_source_folder(self, capsys, photo_copy, tmp_path):
        out = tmp_path / "ds"
        assert run(capsys, "build-memmap", str(photo_copy), "--out", str(out), "--format", "jpeg")[0] == 0
        moved = photo_copy.rename(tmp_path / "moved")
        code, _, err = run(capsys, "verify", str(out), "--sources")
        assert code == 2 and err == (
            f"gpuload: error: {photo_copy}, the folder it was built from, is not a folder (moved or deleted?); pass "
            "the folder where the sources are now (--source-folder DIR, source_folder= in Python), or leave --sources out\n"
        )
        code, stdout, _ = run(capsys, "verify", str(out), "--sources", "--source-folder", str(moved))
        assert code == 0 and stdout.rstrip().endswith(f"20 of 20 sources in {moved} taken again and compared exactly")
        code, _, err = run(capsys, "verify", str(out), "--source-folder", str(moved))
        assert code == 2 and "pass sources too (--sources [N] with --source-folder)" in err


class TestCache:
    def filled(self, path: Path) -> Path:
        from gpuload.remote.cache import BlockCache

        cache = BlockCache(path, "1MB")
        space = cache.namespace("s3://bucket/photos.jpeg/data.memmap", "1", block_size=4)
        with cache.writing(space, 0):
            assert cache.put(space, 0, b"abcd")
        return path

    def test_info_and_clear(self, capsys, tmp_path):
        cache = self.filled(tmp_path / "cache")
        code, out, _ = run(capsys, "cache", "info", str(cache))
        assert code == 0 and out.splitlines()[:2] == [str(cache), "  held:    1 block, 4 bytes, of 1 object"]
        assert "s3://bucket/photos.jpeg/data.memmap  1 block, 4 bytes, last used " in out
        assert json.loads(run(capsys, "cache", "info", str(cache), "--json")[1])["blocks"] == 1
        code, out, _ = run(capsys, "cache", "clear", str(cache))
        assert code == 0 and out == f"cleared {cache}: 1 block removed (4 bytes)\n"
        assert (
            run(capsys, "cache", "info", str(cache))[1].splitlines()[1] == "  held:    0 blocks, 0 bytes, of 0 objects"
        )

    @pytest.mark.parametrize("action", ["info", "clear"])
    def test_a_folder_that_is_not_a_cache_is_one_line_and_untouched(self, capsys, tmp_path, action):
        (tmp_path / "photos").mkdir()
        (tmp_path / "photos" / "a.jpg").write_bytes(b"mine")
        code, out, err = run(capsys, "cache", action, str(tmp_path / "photos"))
        assert code == 2 and out == "" and err.count("\n") == 1 and "is not a gpuload cache" in err
        assert (tmp_path / "photos" / "a.jpg").read_bytes() == b"mine"
