import json

import pytest

from gpuload.store.manifest import FORMAT_VERSION, DatasetError, Manifest


def manifest(**changes) -> Manifest:
    fields = {
        "source": "/data/photos",
        "classes": ["cat", "dog"],
        "samples": [["cat/1.jpg", 0], ["dog/2.jpg", 1]],
        "checksums": ["0123456789abcdef", "fedcba9876543210"],
        "image_shape": [3, 4, 5],
        "resize": "crop",
    }
    return Manifest(**{**fields, **changes})


def test_round_trip(tmp_path):
    written = manifest(skipped=[{"path": "cat/bad.jpg", "reason": "empty file (0 bytes)"}])
    path = written.write(tmp_path)
    assert path == tmp_path / "manifest.json"
    assert Manifest.read(tmp_path) == written
    assert json.loads(path.read_text())["format"] == "gpuload.memmap"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"image_shape": [1, 4, 5]}, r"image_shape \[1, 4, 5\] is not \[3, height, width\]"),
        ({"checksums": ["0123456789abcdef"]}, "1 checksums for 2 samples"),
        ({"samples": [["cat/1.jpg", 0], ["dog/2.jpg", 2]]}, r"a sample label is outside 0..1"),
        ({"classes": []}, "no classes"),
    ],
)
def test_inconsistent_manifests_are_refused(tmp_path, changes, message):
    manifest(**changes).write(tmp_path)
    with pytest.raises(DatasetError, match=message):
        Manifest.read(tmp_path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "is not valid JSON"),
        ('{"format": "something.else"}', "is not a gpuload manifest"),
        (json.dumps({"format": "gpuload.memmap", "format_version": FORMAT_VERSION + 1}), "upgrade gpuload or rebuild"),
        (
            json.dumps({"format": "gpuload.memmap", "format_version": FORMAT_VERSION, "colour": 1}),
            "missing or unknown fields",
        ),
    ],
)
def test_foreign_or_damaged_files_are_refused(tmp_path, text, message):
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(DatasetError, match=message):
        Manifest.read(tmp_path)
