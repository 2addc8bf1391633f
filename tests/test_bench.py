import json
import shutil

import pytest

from gpuload import MemmapImageDataset
from gpuload.bench import bench_rows, format_bench, gather_limit, run_bench
from gpuload.cli import main


def test_all_contenders_measured_on_the_cpu(built_dataset):
    report = run_bench(built_dataset, batch_size=4, device="cpu", epochs=2, max_batches=2, progress=False)
    results = report["results"]
    assert set(results) == {"limit_gather", "limit_gather_split", "gpuload", "collate", "image_folder"}
    for result in results.values():
        assert len(result["runs"]) == 2  # every contender timed over the same number of epochs
        assert result["min"] <= result["images_per_second"] <= result["max"] and result["min"] > 0
        assert result["gigabytes_per_second"] == pytest.approx(result["images_per_second"] * 3 * 48 * 64 / 1e9)
    assert report["images"] == 20 and report["batches_per_epoch"] == 5 and report["sources_present"]
    table = format_bench(report)
    assert "gpuload.DataLoader" in table and "ImageFolder" in table and report["machine_line"] in table


def test_augmentation_contenders(built_dataset):
    report = run_bench(built_dataset, batch_size=4, device="cpu", epochs=1, max_batches=2, augment=16, progress=False)
    croppers = ("gpuload_crop", "gpuload_augment", "image_folder_augment")
    assert set(croppers) <= set(report["results"])
    assert all(report["results"][name]["images_per_second"] > 0 for name in croppers)
    table = format_bench(report)
    assert "RandomResizedCrop after the copy" in table and "crop in the loader's threads" in table
    assert "decode_jpeg" in table  # the stock contender decodes with torchvision's libjpeg-turbo, not Pillow


def test_a_jpeg_dataset_is_measured_cropped_at_decode_time(jpeg_dataset):
    report = run_bench(jpeg_dataset, batch_size=4, device="cpu", epochs=2, max_batches=2, augment=16, progress=False)
    results = report["results"]
    assert set(results) == {"limit_decode", "gpuload_decode", "gpuload_decode_exact", "image_folder_augment"}
    assert report["format"] == "jpeg" and report["image_shape"] == [3, 16, 16]
    assert all(result["min"] > 0 for result in results.values())
    assert results["gpuload_decode"]["gigabytes_per_second"] == pytest.approx(
        results["gpuload_decode"]["images_per_second"] * 3 * 16 * 16 / 1e9
    )
    table = format_bench(report)
    assert (
        "20 jpeg images decoded to crops of 16x16 uint8 RGB" in table
        and "RandomResizedCropDecode" in table
        and "whole decode" in table
    )
    assert report["stock_loader_reads"] == "the sources" and report["reencoded"] == {}  # stored as they were


def test_on_a_store_of_re_encoded_images_the_stock_loader_decodes_the_same_jpegs(photo_folder, tmp_path):
    """--max-side 24: gpuload decodes 18x24 JPEGs; ImageFolder would decode the 48x64 sources."""
    from gpuload import build_memmap

    store = build_memmap(photo_folder, tmp_path / "small.jpeg", format="jpeg", max_side=24, progress=False)
    report = run_bench(store, batch_size=4, device="cpu", epochs=1, max_batches=2, augment=16, progress=False)
    assert set(report["results"]) == {"limit_decode", "gpuload_decode", "gpuload_decode_exact", "stored_jpegs_augment"}
    assert report["results"]["stored_jpegs_augment"]["images_per_second"] > 0
    assert report["stock_loader_reads"] == "the stored JPEGs" and report["reencoded"] == {"larger_than_max_side": 20}
    table = format_bench(report)
    row = next(line for line in table.splitlines() if line.startswith("gpuload.DataLoader, RandomResizedCropDecode"))
    assert "stored JPEGs + decode_jpeg + v2 RandomResizedCrop, workers" in table and row.endswith("x")  # x stock
    assert table.splitlines()[-1] == (
        "(the stock loader decodes the stored JPEGs, as gpuload does, not the sources: the build re-encoded images "
        "(20 larger_than_max_side))"
    )


def test_the_stock_loaders_workers_stop_after_their_turn(built_dataset, monkeypatch):
    """Persistent workers of one contender must not run beside the next one."""
    import multiprocessing

    import gpuload.bench

    children, timed = [], gpuload.bench._timed
    monkeypatch.setattr(
        gpuload.bench,
        "_timed",
        lambda run, device: children.append(multiprocessing.active_children()) or timed(run, device),
    )
    run_bench(built_dataset, batch_size=4, device="cpu", epochs=1, max_batches=2, augment=16, progress=False)
    assert len(children) == 16 and children[-2] == []  # image_folder_augment starts with image_folder's workers gone
    assert len(children[-1]) == 2  # its own, persistent across its epochs


@pytest.mark.parametrize(
    ("batch_size", "max_batches", "timed"),
    [(4, None, 20), (6, None, 18), (4, 2, 8), (4, 99, 20)],  # 20 images: whole batches of the epoch, or the cap's
)
def test_every_contender_times_the_same_number_of_images(built_dataset, monkeypatch, batch_size, max_batches, timed):
    """The stock loaders were timed on the first 10 batches and gpuload on the whole epoch."""
    import gpuload.bench

    served, real = [], gpuload.bench._timed

    def spy(run, device):
        seconds, images = real(run, device)
        served.append(images)
        return seconds, images

    monkeypatch.setattr(gpuload.bench, "_timed", spy)
    report = run_bench(
        built_dataset,
        batch_size=batch_size,
        device="cpu",
        epochs=1,
        max_batches=max_batches,
        augment=16,
        progress=False,
    )
    assert len(served) == 2 * len(report["results"]) == 16  # warm-up and one epoch each, every contender
    assert served == [timed] * 16 and report["timed_images"] == timed


def test_on_a_jpeg_dataset_every_contender_times_the_same_number_of_images(jpeg_dataset, monkeypatch):
    import gpuload.bench

    served, real = [], gpuload.bench._timed
    monkeypatch.setattr(gpuload.bench, "_timed", lambda run, device: served.append(real(run, device)) or served[-1])
    report = run_bench(jpeg_dataset, batch_size=6, device="cpu", epochs=1, augment=16, progress=False)
    assert len(report["results"]) == 4 and [images for _, images in served] == [18] * 8  # the decode limit too


class TestAFailingContender:
    """One contender's failure is recorded in one line and the others are still measured."""

    @staticmethod
    def _fail(monkeypatch, name: str) -> None:
        import gpuload.bench

        def fail(*args, **kwargs):
            raise RuntimeError("the disk went away\nsecond line")

        monkeypatch.setattr(gpuload.bench, name, fail)

    def test_the_others_are_measured_and_the_table_shows_it(self, built_dataset, monkeypatch):
        self._fail(monkeypatch, "_Folder")
        report = run_bench(built_dataset, batch_size=4, device="cpu", epochs=1, max_batches=2, progress=False)
        assert report["failed"] == {"image_folder": "RuntimeError: the disk went away"}
        assert set(report["results"]) == {"limit_gather", "limit_gather_split", "gpuload", "collate"}
        assert all(result["images_per_second"] > 0 for result in report["results"].values())
        row = next(row for row in bench_rows(report) if row["name"] == "image_folder")
        assert row["error"] == "RuntimeError: the disk went away" and row["images_per_second"] is None
        assert next(row for row in bench_rows(report) if row["name"] == "gpuload")["x_stock"] is None
        table = format_bench(report)
        line = next(line for line in table.splitlines() if line.startswith("torch DataLoader + ImageFolder"))
        assert line.endswith("failed: RuntimeError: the disk went away")

    def test_without_a_limit_no_share_of_it(self, built_dataset, monkeypatch):
        self._fail(monkeypatch, "_GatherLimit")
        report = run_bench(built_dataset, batch_size=4, device="cpu", epochs=1, max_batches=2, progress=False)
        assert set(report["failed"]) == {"limit_gather", "limit_gather_split"}
        assert gather_limit(report) is None
        assert all(row["of_limit"] is None for row in bench_rows(report))
        assert "gpuload.DataLoader" in format_bench(report)

    def test_a_failure_while_iterating_is_caught_too(self, built_dataset, monkeypatch):
        import gpuload.bench

        def drain(loader):
            if isinstance(loader, gpuload.DataLoader):
                raise OSError("read failed")
            return sum(len(batch) for batch, _ in loader)

        monkeypatch.setattr(gpuload.bench, "_drain", drain)
        report = run_bench(built_dataset, batch_size=4, device="cpu", epochs=1, max_batches=2, progress=False)
        assert report["failed"] == {"gpuload": "OSError: read failed"}
        assert {"collate", "image_folder", "limit_gather"} <= set(report["results"])

    def test_the_cli_exits_1_when_gpuloads_own_contender_failed(self, built_dataset, monkeypatch, capsys, tmp_path):
        import gpuload.bench

        real = gpuload.bench.DataLoader

        def loader(*args, **kwargs):
            raise RuntimeError("gpuload broke")

        monkeypatch.setattr(gpuload.bench, "DataLoader", loader)
        out = tmp_path / "bench.json"
        argv = ["bench", str(built_dataset), "--batch-size", "4", "--device", "cpu", "--epochs", "1"]
        assert main([*argv, "--max-batches", "2", "--json", str(out)]) == 1
        printed = capsys.readouterr()
        assert "failed: RuntimeError: gpuload broke" in printed.out
        assert printed.err.endswith("\ngpuload bench: 1 contender failed (gpuload): its numbers are missing\n")
        assert json.loads(out.read_text())["failed"] == {"gpuload": "RuntimeError: gpuload broke"}  # still written
        monkeypatch.setattr(gpuload.bench, "DataLoader", real)
        self._fail(monkeypatch, "_Folder")
        assert main([*argv, "--max-batches", "2"]) == 0  # a stock contender's failure: said, not fatal
        assert capsys.readouterr().err.endswith(
            "\ngpuload bench: 1 contender failed (image_folder): its numbers are missing\n"
        )


def test_without_sources_the_folder_contender_is_left_out(photo_copy, tmp_path):
    from gpuload import build_memmap

    built = build_memmap(photo_copy, tmp_path / "copy.memmap", progress=False)
    shutil.rmtree(photo_copy)
    report = run_bench(built, batch_size=4, device="cpu", epochs=1, progress=False)
    assert "image_folder" not in report["results"] and not report["sources_present"]
    assert "not there any more" in format_bench(report)


def test_fewer_images_than_a_batch(built_dataset):
    with pytest.raises(ValueError, match="fewer than one batch"):
        run_bench(built_dataset, batch_size=64, device="cpu", progress=False)


@pytest.mark.parametrize(
    "argv",
    [
        ["--batch-size", "0"],
        ["--epochs", "0"],
        ["--batch-size", "1000"],
        ["--device", "mps"],
        ["--device", "tpu"],  # not even a device torch knows
        ["--augment", "0"],
        ["--max-batches", "0"],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(built_dataset, capsys, argv):
    assert main(["bench", str(built_dataset), *argv]) == 2
    error = capsys.readouterr().err
    assert error.startswith("gpuload: error: ") and error.count("\n") == 1 and "Traceback" not in error


def test_the_stock_loader_reads_only_the_sources_the_build_kept(photo_copy, tmp_path):
    from gpuload import build_memmap

    (photo_copy / "face" / "broken.jpg").write_bytes(b"not a jpeg")
    built = build_memmap(photo_copy, tmp_path / "kept.memmap", progress=False)
    report = run_bench(built, batch_size=4, device="cpu", epochs=1, max_batches=2, progress=False)
    assert report["results"]["image_folder"]["images_per_second"] > 0


def test_cli_prints_the_table_and_writes_json(built_dataset, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert (
        main(["bench", str(built_dataset), "--batch-size", "4", "--device", "cpu", "--epochs", "1", "--json", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "limit: index_select" in printed and "of limit" in printed
    assert '"gpuload"' in out.read_text()


def test_the_gather_limit_gathers_in_the_files_order_as_the_loader_does(built_dataset):
    """A raw dataset is channels-last on disk: a limit gathering into a channel-first buffer would
    transpose every pixel and measure something slower than the loader it bounds."""
    from gpuload.bench import _Epoch, _GatherLimit

    limit = _GatherLimit(MemmapImageDataset(built_dataset), 4, _Epoch(20, None, 20), split=False)
    assert limit.source.shape == (20, 48, 64, 3) and limit.source.is_contiguous()
    assert limit.buffer.shape == (4, 48, 64, 3)


def test_a_json_path_in_a_missing_folder_is_refused_before_measuring(built_dataset, tmp_path, capsys, monkeypatch):
    import gpuload.bench

    monkeypatch.setattr(gpuload.bench, "run_bench", None)  # measuring would fail the test
    code = main(["bench", str(built_dataset), "--json", str(tmp_path / "missing" / "bench.json")])
    assert code == 2 and "its folder" in capsys.readouterr().err


def test_each_figure_shows_its_spread_and_short_epochs_are_said(built_dataset, capsys):
    """A small dataset: the table gives each contender's min-max over the epochs, and a warning says
    the rates are too short to trust (one such run read a limit of 295 images/s below a loader's 4,992)."""
    from gpuload.bench import short_epochs

    report = run_bench(built_dataset, batch_size=4, device="cpu", epochs=2, max_batches=2, progress=False)
    table = format_bench(report)
    assert "min-max of the epochs" in table.splitlines()[2]
    gpuload_row = next(line for line in table.splitlines() if line.startswith("gpuload.DataLoader"))
    low, high = report["results"]["gpuload"]["min"], report["results"]["gpuload"]["max"]
    assert f"{low:,.0f}-{high:,.0f}" in gpuload_row
    warning = short_epochs(report)
    assert warning.startswith(f"the timed epochs of {report['timed_images']} images lasted ")
    assert "too short for steady rates" in warning and "images or more (or a larger --max-batches)" in warning
    assert short_epochs({**report, "timed_images": 10**9}) is None  # long epochs: no warning


def test_the_command_warns_on_a_small_dataset(built_dataset, capsys):
    assert main(["bench", str(built_dataset), "--batch-size", "4", "--epochs", "1", "--max-batches", "2"]) in (0, 1)
    assert "gpuload: warning: the timed epochs of " in capsys.readouterr().err
