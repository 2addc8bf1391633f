from gpuload import MemmapImageDataset
from gpuload.demo import run_demo


def test_demo_runs_the_whole_job_and_reports_each_step(tmp_path, capsys):
    out = run_demo(tmp_path, images=10, size=(24, 32))
    printed = capsys.readouterr().out
    for step in ("1/5 sample", "2/5 compress", "3/5 build-memmap", "4/5 verify: OK", "5/5 read back"):
        assert step in printed
    assert "1/5 sample: 10 photos of 32x24 in 5 classes, " in printed and " KB, made from " in printed  # width x height
    assert len(MemmapImageDataset(out)) == 10


def test_temporary_workdir_is_removed(capsys):
    out = run_demo(images=5, size=(12, 16))
    assert not out.exists()


def test_too_few_images_is_a_usage_error(capsys):
    from gpuload.cli import main

    assert main(["demo", "--images", "3"]) == 2
    assert "images must be at least 5 (one per class), got 3" in capsys.readouterr().err
