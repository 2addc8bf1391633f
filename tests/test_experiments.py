"""The experiments' harness (experiments/_common.py) and the measurements of single experiments."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments import _common
from gpuload import MemmapImageDataset

ROOT = Path(__file__).resolve().parent.parent

# What a cloud GPU machine writes in the footer: longer than any figure is wide.
LONG_MACHINE = {
    "cpu": "Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz with a model name longer than any plot is wide, "
    "as a hypervisor may report it",
    "cores": 16,
    "gpu": "NVIDIA H100 80GB HBM3",
    "cuda": "13.0",
    "torch": "2.11.0+cu130",
    "date": "2026-11-26T10:00:00+00:00",
}


# Each experiment that draws, and the figures it draws.
PLOTTED = {
    "decode_costs": ["decode_costs"],
    "decoders": ["decoders"],
    "gpu_preprocess": ["gpu_preprocess"],
    "jpeg_quality": ["jpeg_quality", "jpeg_quality_crops"],
    "jpeg_store": ["jpeg_store"],
    "memmap_vs_folder": ["memmap_vs_folder"],
    "recipe": ["recipe"],
    "remote_loading": ["remote_loading"],
    "scale": ["scale"],
    "stock_breakdown": ["stock_breakdown"],
    "train_augment": ["train_augment"],
    "train_order": ["train_order", "train_order_trace"],
    "transfer_order": ["transfer_order"],
}


def _committed(name: str) -> dict:
    return json.loads((ROOT / "assets" / "results" / f"{name}.json").read_text())


def _inside(fig) -> None:
    """The footnote of a saved (closed) figure ends inside it and below every panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()  # closing the figure took its canvas
    footnote = [text.get_window_extent(renderer) for text in fig.texts if text.get_gid() == "footnote"]
    assert footnote
    for box in footnote:
        assert 0 <= box.x0 and box.x1 <= fig.bbox.x1 and 0 <= box.y0
    top = max(box.y1 for box in footnote)
    for axis in fig.axes:
        assert axis.get_tightbbox(renderer).y0 >= top, "a panel's labels run into the footnote"


class TestSaveFigure:
    @pytest.mark.parametrize("statistics", ["medians", "bars: medians of 3 timed epochs, whiskers: min-max " * 3])
    def test_a_long_machine_description_is_wrapped_inside_the_figure(self, tmp_path, monkeypatch, statistics):
        monkeypatch.setattr(_common, "ASSETS", tmp_path)
        fig, axes = _common.figure()
        axes[0][0].plot([1, 2], [1, 2])
        axes[0][0].set_xlabel("batch size (images)")
        path = _common.save_figure(fig, "long", {"machine": LONG_MACHINE}, statistics)
        assert path == tmp_path / "long.png" and path.is_file()
        _inside(fig)
        lines = [line for text in fig.texts if text.get_gid() == "footnote" for line in text.get_text().split("\n")]
        assert lines[0].startswith("Intel(R) Xeon(R) Platinum 8480+") and len(lines) >= 2
        assert all(text.get_fontsize() >= _common.MIN_FONT_PX for text in fig.texts)
        note = " ".join(lines)
        assert "GPU: NVIDIA H100 80GB HBM3 (CUDA 13.0)" in note and "torch 2.11.0+cu130" in note
        assert "2026-11-26" in note

    def test_a_short_machine_keeps_one_line(self, tmp_path, monkeypatch):
        monkeypatch.setattr(_common, "ASSETS", tmp_path)
        fig, _ = _common.figure()
        result = _committed("transfer_order")
        _common.save_figure(fig, "short", result, "medians")
        (footnote,) = [text for text in fig.texts if text.get_gid() == "footnote"]
        assert footnote.get_text() == (
            f"{result['machine']['cpu']}, 2 cores, GPU: none; torch {result['machine']['torch']}; "
            f"{result['machine']['date'][:10]}; medians"
        )

    def test_a_word_wider_than_the_figure_is_cut_short(self, tmp_path, monkeypatch):
        monkeypatch.setattr(_common, "ASSETS", tmp_path)
        fig, _ = _common.figure(size=(400, 300))
        machine = LONG_MACHINE | {"cpu": "X" * 200}
        _common.save_figure(fig, "cut", {"machine": machine}, "medians")
        _inside(fig)
        (footnote,) = [text for text in fig.texts if text.get_gid() == "footnote"]
        assert footnote.get_text().split("\n")[0].endswith("…")

    @pytest.mark.parametrize("experiment", sorted(PLOTTED))
    def test_a_committed_result_from_a_long_named_machine_is_drawn(self, experiment, tmp_path, monkeypatch):
        """memmap_vs_folder failed on an Intel Xeon VM: its footnote was wider than the figure, and so
        were the titles that name the device."""
        import importlib
        import shutil

        module = importlib.import_module(f"experiments.{experiment}")
        result = _committed(experiment)
        result["machine"] = result["machine"] | LONG_MACHINE
        named = f"cpu ({LONG_MACHINE['cpu']}, {LONG_MACHINE['cores']} cores)"
        for key in ("device_name", "cpu"):  # what the titles say
            if key in result:
                result[key] = named
        result["device_names"] = dict.fromkeys(result.get("device_names", ()), named)
        if experiment == "train_order":  # its trace figure too
            shutil.copytree(ROOT / "assets" / "traces", tmp_path / "traces")
        monkeypatch.setattr(_common, "ASSETS", tmp_path)
        module.plot(result)
        for name in PLOTTED[experiment]:
            assert (tmp_path / f"{name}.png").is_file(), name


class TestRunBench:
    """experiments.run's bench step keeps a report in which a contender failed, and never an earlier run's."""

    @pytest.fixture
    def bench_step(self, tmp_path, monkeypatch):
        import gpuload.cli

        monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")
        folder = tmp_path / "photos"
        folder.with_suffix(".memmap").mkdir()  # built: the step goes straight to gpuload bench
        folder.with_suffix(".jpeg").mkdir()
        monkeypatch.setattr(_common, "photo_folders", lambda workdir, count, size: (folder, folder))
        step = SimpleNamespace(run=None)  # a test sets run(json_path) -> exit code: gpuload bench's stand-in
        monkeypatch.setattr(gpuload.cli, "main", lambda argv: step.run(argv[argv.index("--json") + 1]))
        return step

    def test_a_failed_gpuload_contender_keeps_its_report(self, bench_step, tmp_path):
        from experiments.run import bench

        def run(path):
            Path(path).write_text(json.dumps({"results": {}, "failed": {"gpuload": "RuntimeError: broke"}}))
            return 1

        bench_step.run = run
        with pytest.raises(SystemExit, match="exited with 1"):
            bench(["--device", "cpu", "--workdir", str(tmp_path)])
        for name in ("bench_cpu", "bench_jpeg_cpu"):  # the raw and the jpeg dataset's
            report = json.loads((tmp_path / "results" / f"{name}.json").read_text())
            assert report["experiment"] == "bench" and report["failed"] == {"gpuload": "RuntimeError: broke"}

    def test_an_earlier_report_is_not_taken_for_this_one(self, bench_step, tmp_path):
        from experiments.run import bench

        (tmp_path / "results").mkdir()
        (tmp_path / "results" / "bench_cpu.json").write_text("{}")
        bench_step.run = lambda path: 2  # a usage error: nothing measured, nothing written
        with pytest.raises(SystemExit, match="exited with 2"):
            bench(["--device", "cpu", "--workdir", str(tmp_path)])
        assert not (tmp_path / "results" / "bench_cpu.json").exists()


class _Loader:
    """Batches of 4 random 32x32 images, each ``delay`` seconds in the making: a loader the training
    loop waits for (or not, with no delay)."""

    batch_size = 4

    def __init__(self, delay: float) -> None:
        import torch

        self.delay = delay
        self.batch = (torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8), torch.tensor([0, 1, 0, 1]))

    def __iter__(self):
        import time

        for _ in range(3):
            time.sleep(self.delay)
            yield self.batch


class TestTrainAugmentDataWait:
    """train_augment recorded a data-wait share of exactly 0.0 in all six runs: the profiler's events
    were read after its cycle had ended."""

    @staticmethod
    def _share(delay: float) -> dict:
        import torch

        from experiments.train_augment import train

        augment = torch.nn.Identity()
        return train(_Loader(delay), augment, classes=2, steps=3, device=torch.device("cpu"), compile_model=False)

    def test_a_slow_loader_is_waited_for(self):
        run = self._share(0.25)
        assert run["data_wait_share"] > 0.1
        assert run["data_wait_share"] * run["step_ms"] == pytest.approx(250, rel=0.2)  # ms waited per step: 0.25 s

    def test_an_instant_loader_is_not(self):
        # measured (not 0.0), and small: a few ms of a step on a busy 2-core machine (5.6 % once in CI)
        assert 0 < self._share(0.0)["data_wait_share"] < 0.2


class TestRemoteReads:
    """remote_reads drew 256 MiB of blocks with repeats from a 128 MiB object: neighbours merged, about 111 MiB
    fetched, and its rate divided 268 MB by the time."""

    @pytest.mark.parametrize("backend", ["obstore", "fsspec"])
    def test_each_block_is_fetched_once_and_the_bytes_fetched_are_counted(self, tmp_path, monkeypatch, backend):
        import random

        from servers import RangeHTTPServer, fake_aws_environment

        from experiments.remote_reads import read_blocks
        from gpuload.remote.store import Retry, open_store

        block, count = 4096, 32
        folder = tmp_path / "bench" / "ds"
        folder.mkdir(parents=True)
        (folder / "data.memmap").write_bytes(random.Random(0).randbytes(count * block))  # as large as what is read
        with RangeHTTPServer(tmp_path) as web:
            for name, value in fake_aws_environment(web.url).items():
                monkeypatch.setenv(name, value)
            store = open_store("s3://bench/ds", backend=backend, retry=Retry())
            run = read_blocks(store, "data.memmap", block, count, random.Random(1))
            ranges = [request.headers["Range"] for request in web.requests if request.method == "GET"]
        assert sorted(ranges) == sorted(f"bytes={i * block}-{(i + 1) * block - 1}" for i in range(count))  # once each
        assert run["bytes_fetched"] == count * block and run["requests"] == count and run["seconds"] > 0


class TestTraceFigure:
    """experiments/trace_figure.py on the GPU's trace: dozens of kernels named by whole C++ signatures."""

    def test_a_kernel_is_named_by_its_function(self):
        from experiments.trace_figure import MAX_LABEL, label_of

        kernel = {
            "cat": "kernel",
            "name": "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, T1, T2)",
        }
        assert label_of(kernel) == "vectorized_elementwise_kernel"
        assert label_of({"cat": "cpu_op", "name": "aten::copy_"}) == "copy_"
        anonymous = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, int)"
        assert label_of({"cat": "kernel", "name": anonymous}) == "cunn_SoftMaxForward"
        assert len(label_of({"cat": "kernel", "name": "void " + "x" * 200 + "(int)"})) == MAX_LABEL

    def test_the_gpu_trace_names_at_most_a_few_narrow_boxes_beside_its_panels(self, tmp_path, monkeypatch):
        from experiments import trace_figure

        figures = []
        monkeypatch.setattr(trace_figure, "save_figure", lambda fig, *args, **kwargs: figures.append(fig))
        trace = ROOT / "assets" / "traces" / "train_order_cuda_cuda_first.json.gz"
        trace_figure.plot_trace(trace, "trace", _committed("train_order_cuda"), "a caption")
        (fig,) = figures
        for axis in fig.axes:
            legend = axis.get_legend()
            assert legend is None or len(legend.get_texts()) <= trace_figure.LEGEND_BOXES + len(
                trace_figure.SHORT_MARKERS
            )
            entries = [text.get_text() for text in legend.get_texts()] if legend else []
            assert all(len(entry) <= trace_figure.MAX_LABEL or ":" in entry for entry in entries)


class TestScale:
    def test_every_step_runs_in_its_own_process_and_is_drawn(self, tmp_path, monkeypatch):
        """experiments.scale at a count CI affords: each step answers, the dataset's whole epoch is
        fetched at least once across the nodes, and the figure is drawn."""
        from experiments import scale

        monkeypatch.setattr(_common, "ASSETS", tmp_path / "assets")
        monkeypatch.setattr(_common, "RESULTS", tmp_path / "assets" / "results")
        scale.main(["--counts", "300", "--workdir", str(tmp_path / "work")])
        result = json.loads((tmp_path / "assets" / "results" / "scale.json").read_text())
        (row,) = result["rows"]
        assert row["images"] == 300
        assert row["build"]["images_per_second"] > 0 and row["build"]["first_image_s"] > 0
        assert len(row["first_image"]["runs"]) == 3 and row["first_image"]["page_cache"] == "as found"
        assert row["first_image"]["min_s"] <= row["first_image"]["seconds"] <= row["first_image"]["max_s"]
        assert not list((tmp_path / "work").glob("*first-image*"))  # the stopped builds left nothing
        # --first-image-only measures that row again and keeps the rest's machine (another run's numbers)
        path = tmp_path / "assets" / "results" / "scale.json"
        first_run = {**result["machine"], "cpu": "the first run's"}
        path.write_text(json.dumps({**result, "machine": first_run}))
        scale.main(["--first-image-only", "--counts", "300", "--workdir", str(tmp_path / "work")])
        again = json.loads(path.read_text())
        assert again["machine"] == first_run and again["rows"][0]["open"] == row["open"]
        assert again["rows"][0]["first_image"]["machine"]["cores"] >= 1
        assert again["rows"][0]["first_image"]["runs"] != row["first_image"]["runs"]
        assert row["open"]["seconds"] > 0 and row["open_url_warm"]["seconds"] > 0
        assert row["workers"]["worker_private_bytes"] > 0
        assert 1 <= row["orders"]["classes_block_shuffled_storage"] <= 30  # 300 images in 30 classes
        assert row["orders"]["fetched_over_dataset_4x8"] >= 1.0
        assert (tmp_path / "assets" / "scale.png").is_file()

    def test_first_image_only_refuses_counts_the_committed_result_has_not(self, tmp_path, monkeypatch):
        """``--first-image-only`` with counts not in the committed result measured nothing and rewrote the
        result anyway (its machine now this one); without a result it named an option scale.py lacks."""
        from experiments import scale

        results = tmp_path / "assets" / "results"
        monkeypatch.setattr(_common, "ASSETS", tmp_path / "assets")
        monkeypatch.setattr(_common, "RESULTS", results)
        argv = ["--first-image-only", "--counts", "7", "300", "--workdir", str(tmp_path / "work")]
        with pytest.raises(SystemExit, match="run python -m experiments.scale first") as error:
            scale.main(argv)
        assert "--device" not in str(error.value)
        results.mkdir(parents=True)
        committed = json.dumps({"experiment": "scale", "machine": {"cpu": "elsewhere"}, "rows": [{"images": 300}]})
        (results / "scale.json").write_text(committed)
        with pytest.raises(SystemExit, match=r"has no row of 7 images \(its rows: 300\); measure them first"):
            scale.main(argv)
        assert (results / "scale.json").read_text() == committed


class TestStockBreakdown:
    def test_every_step_of_the_stock_recipe_is_timed_on_real_photos(self, photo_folder):
        """Each step a stock worker does for a photo takes some time, per image (the photos are 48x64:
        the crop upsamples, the batch of 64 holds them all), and the decode outweighs the read."""
        from experiments import stock_breakdown

        paths = sorted(photo_folder.rglob("*.jpg")) * 4  # 80 photos: one full batch of 64
        rows = stock_breakdown.measure(paths, repeats=2)
        assert list(rows) == list(stock_breakdown.STEPS)
        for name, spread in rows.items():
            assert 0 < spread["min"] <= spread["median"] <= spread["max"], name
            assert len(spread["runs"]) == 2, name
        assert rows["decode"]["median"] > rows["read"]["median"]


class TestLadder:
    @pytest.mark.parametrize("name", ["memmap_vs_folder", "memmap_vs_folder_cuda"])
    def test_the_ladder_is_drawn_from_a_committed_result(self, name, tmp_path, monkeypatch):
        """Each rung's median at 640x480 per batch size, drawn from the committed result (a long-named
        machine's too), the figure named after the device."""
        from experiments import ladder

        monkeypatch.setattr(_common, "ASSETS", tmp_path)
        result = _committed(name)
        found = ladder.rates(result)
        assert sorted(found) == [16, 64, 256] and all(len(values) == len(ladder.RUNGS) for values in found.values())
        row = next(
            row
            for row in result["rows"]
            if (row["height"], row["batch_size"], row["contender"]) == (480, 16, "gpuload")
        )
        assert found[16][2] == row["images_per_second"]["median"]
        ladder.plot(dict(result, machine=dict(result["machine"], **LONG_MACHINE)))
        assert (tmp_path / ("ladder_cuda.png" if name.endswith("cuda") else "ladder.png")).is_file()


class TestSources:
    def test_every_source_is_built_and_loaded(self, tmp_path, monkeypatch):
        """experiments.sources at a count CI affords: the sources of the same photos, each built into both
        stores, those with fields loaded beside the folder's, holding the three numeric fields (and the
        others, like the folder, none)."""
        from experiments import sources

        monkeypatch.setattr(_common, "RESULTS", tmp_path / "assets" / "results")
        sources.main(["--quick", "--workdir", str(tmp_path / "work")])
        result = json.loads((tmp_path / "assets" / "results" / "sources.json").read_text())
        assert sorted(result["epoch_images_per_second"]) == sorted(("folder", *sources.FIELDS))
        for fmt in sources.FORMATS:
            builds = result["build_images_per_second"][fmt]
            assert sorted(builds) == sorted(sources.SOURCES + sources.FIELDS)
            assert all(stats["median"] > 0 for stats in builds.values())
        built = tmp_path / "work" / "sources-40" / "built"
        for name in sources.SOURCES:
            assert MemmapImageDataset(built / f"{name}.raw").manifest.field_specs == [], name
        for name in sources.FIELDS:
            specs = MemmapImageDataset(built / f"{name}.raw").manifest.field_specs
            assert [(spec.name, spec.dtype, spec.shape) for spec in specs] == [
                ("score", "float32", ()),
                ("box", "int64", (4,)),
                ("flag", "bool", ()),
            ], name


class TestUnreclaimableMemory:
    @pytest.mark.parametrize("shared", ["system", "tree"])
    def test_shared_pages_this_process_touches_are_counted(self, shared):
        import mmap

        with _common.UnreclaimableMemory(interval=0.005, shared=shared) as memory:
            pages = mmap.mmap(-1, 32 << 20)  # shared and anonymous: shmem, which no reclaim can drop
            pages.write(b"x" * (32 << 20))
            import time

            time.sleep(0.05)
            pages.close()
        assert memory.peak_bytes >= 32 << 20

    def test_the_tree_leaves_out_shared_memory_that_no_process_of_it_maps(self, tmp_path):
        """Another job's shared memory, here a file in /dev/shm this process writes but does not map, grows
        the machine's shared memory: counted by "system", not by "tree"."""
        import time
        from pathlib import Path

        shm = Path("/dev/shm")
        if not shm.is_dir():
            pytest.skip("needs /dev/shm")
        path = shm / f"gpuload-test-{tmp_path.name}"
        peaks = {}
        try:
            for shared in ("system", "tree"):
                path.unlink(missing_ok=True)
                with _common.UnreclaimableMemory(interval=0.005, shared=shared) as before:
                    time.sleep(0.05)  # the process's own memory
                with _common.UnreclaimableMemory(interval=0.005, shared=shared) as memory:
                    with path.open("wb") as file:  # a megabyte at a time: the process holds no copy
                        for _ in range(64):
                            file.write(b"x" * (1 << 20))
                    time.sleep(0.05)
                peaks[shared] = memory.peak_bytes - before.peak_bytes
        finally:
            path.unlink(missing_ok=True)
        # 64 MiB written; other jobs' shared memory comes and goes meanwhile on a shared machine: margins
        assert peaks["system"] >= 32 << 20 > (16 << 20) > peaks["tree"], peaks

    def test_an_unknown_kind_is_refused(self):
        with pytest.raises(ValueError, match="'system' or 'tree'"):
            _common.UnreclaimableMemory(shared="machine")
