import json

import pytest

from gpuload.store.manifest import DIGESTED, FORMAT_VERSION, DatasetError, Manifest

FILES = {"images.memmap": 120, "labels.memmap": 16, "meta.json": 300}


def manifest(**changes) -> Manifest:
    fields = {
        "source": "/data/photos",
        "classes": ["cat", "dog"],
        "samples": [["cat/1.jpg", 0], ["dog/2.jpg", 1]],
        "checksums": ["0123456789abcdef", "fedcba9876543210"],
        "image_shape": [3, 4, 5],
        "resize": "crop",
        "files": FILES,
    }
    return Manifest(**{**fields, **changes})


def edit(tmp_path, name, value) -> None:
    """Change one field of the manifest in ``tmp_path`` as a user with an editor would."""
    path = tmp_path / "manifest.json"
    raw = json.loads(path.read_text())
    raw[name] = value
    path.write_text(json.dumps(raw))


def test_round_trip(tmp_path):
    written = manifest(skipped=[{"path": "cat/bad.jpg", "reason": "empty file (0 bytes)"}])
    path = written.write(tmp_path)
    assert path == tmp_path / "manifest.json"
    read = Manifest.read(tmp_path)
    assert read == written and set(read.digests) == set(DIGESTED)
    assert read.edited_fields() == []
    assert json.loads(path.read_text())["format"] == "gpuload.memmap"


def test_owned_paths(tmp_path):
    assert manifest().owned_paths() == {"manifest.json", *FILES}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"checksums": ["0123456789abcdef"]}, "1 checksums for 2 samples"),
        ({"samples": [["cat/1.jpg", 0], ["dog/2.jpg", 2]]}, r"a sample label is outside 0..1"),
        ({"classes": ["cat", "cat"]}, "a class name appears twice"),
        (
            {"files": {"images.memmap": 1}},
            r"files lists \[.images.memmap.\], not \[.images.memmap., .labels.memmap., .meta.json.\]",
        ),
    ],
)
def test_inconsistent_manifests_are_refused(tmp_path, changes, message):
    manifest(**changes).write(tmp_path)
    with pytest.raises(DatasetError, match=message):
        Manifest.read(tmp_path)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("classes", "cat,dog", "a non-empty list of class names"),
        ("classes", [], "a non-empty list of class names"),
        ("classes", ["cat", 7], "a non-empty list of class names"),
        ("samples", [["cat/1.jpg", "0"], ["dog/2.jpg", 1]], r"a non-empty list of \[path, label\] pairs"),
        ("samples", [["cat/1.jpg", True], ["dog/2.jpg", 1]], r"a non-empty list of \[path, label\] pairs"),
        ("samples", [["cat/1.jpg", -1], ["dog/2.jpg", 1]], r"a non-empty list of \[path, label\] pairs"),
        ("checksums", ["xyz", "fedcba9876543210"], "a list of 16-digit hex strings"),
        ("image_shape", [1, 4, 5], r"\[3, height, width\] with positive integers"),
        ("image_shape", [3, 4.0, 5], r"\[3, height, width\] with positive integers"),
        ("image_shape", [3, 0, 5], r"\[3, height, width\] with positive integers"),
        ("resize", "zoom", "one of crop, pad, stretch"),
        ("skipped", ["cat/bad.jpg"], r'a list of \{"path": ..., "reason": ...\}'),
        ("versions", ["2.14"], "an object of library versions"),
        ("files", {"images.memmap": "120"}, "an object of file sizes"),
        ("source", None, "a string"),
        ("storage", "parquet", '"raw"'),
        ("format_version", "2", "gpuload reads versions 1 and 2"),
    ],
)
def test_a_field_of_the_wrong_type_is_one_clear_error_naming_it(tmp_path, name, value, expected):
    manifest().write(tmp_path)
    edit(tmp_path, name, value)
    with pytest.raises(DatasetError, match=expected) as caught:
        Manifest.read(tmp_path)
    assert name in str(caught.value) or name == "format_version"
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("classes", ["dog", "cat"]),
        ("samples", [["cat/1.jpg", 1], ["dog/2.jpg", 0]]),
        ("checksums", ["fedcba9876543210", "0123456789abcdef"]),
        ("image_shape", [3, 5, 4]),
        ("resize", "pad"),
        ("files", {**FILES, "meta.json": 301}),
    ],
)
def test_every_field_that_gives_the_data_meaning_is_covered_by_a_digest(tmp_path, name, value):
    manifest().write(tmp_path)
    edit(tmp_path, name, value)
    assert Manifest.read(tmp_path).edited_fields() == [name]


def test_fields_that_do_not_change_the_data_may_be_edited(tmp_path):
    manifest().write(tmp_path)
    edit(tmp_path, "source", "/mnt/moved/photos")  # the photos moved: verify --sources still finds them
    assert Manifest.read(tmp_path).edited_fields() == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "is not valid JSON"),
        ('{"format": "something.else"}', "is not a gpuload manifest"),
        (json.dumps({"format": "gpuload.memmap", "format_version": FORMAT_VERSION + 1}), "upgrade gpuload or rebuild"),
        (
            json.dumps({"format": "gpuload.memmap", "format_version": FORMAT_VERSION, "colour": 1}),
            r"missing fields \[.*\] or unknown fields \['colour'\]",
        ),
    ],
)
def test_foreign_or_damaged_files_are_refused(tmp_path, text, message):
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(DatasetError, match=message):
        Manifest.read(tmp_path)


def test_removing_the_digests_does_not_hide_an_edit(tmp_path):
    manifest().write(tmp_path)
    edit(tmp_path, "classes", ["dog", "cat"])
    edit(tmp_path, "digests", {})
    assert Manifest.read(tmp_path).edited_fields() == list(DIGESTED)
