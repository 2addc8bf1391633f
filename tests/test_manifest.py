import json

import pytest

from gpuload.format.manifest import DIGESTED, FORMAT_VERSION, DatasetError, Manifest

FILES = {
    "images.memmap": 120,
    "labels.memmap": 16,
    "checksums.memmap": 16,
    "paths.memmap": 18,
    "path_offsets.memmap": 24,
    "meta.json": 300,
}
TABLE = {
    name: "0123456789abcdef" for name in ("labels.memmap", "checksums.memmap", "paths.memmap", "path_offsets.memmap")
}
FILES_V3 = {"images.memmap": 120, "labels.memmap": 16, "meta.json": 300}
V3 = {  # what a manifest of format version 3 held of its images: each one's path, label and checksum
    "format_version": 3,
    "count": None,
    "table": {},
    "samples": [["cat/1.jpg", 0], ["dog/2.jpg", 1]],
    "checksums": ["0123456789abcdef", "fedcba9876543210"],
    "files": FILES_V3,
}


def manifest(**changes) -> Manifest:
    fields = {
        "source": "/data/photos",
        "classes": ["cat", "dog"],
        "count": 2,
        "table": TABLE,
        "image_shape": [3, 4, 5],
        "resize": "crop",
        "files": FILES,
        "layout": "channels_last",
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
        ({**V3, "checksums": ["0123456789abcdef"]}, "1 checksums for 2 samples"),
        ({**V3, "samples": [["cat/1.jpg", 0], ["dog/2.jpg", 2]]}, r"a sample label is outside 0..1"),
        ({"classes": ["cat", "cat"]}, "a class name appears twice"),
        (
            {"table": {"labels.memmap": "0123456789abcdef"}},
            r"table lists \['labels.memmap'\], not the files labels.memmap, checksums.memmap, paths.memmap, "
            r"path_offsets.memmap",
        ),
        (
            {"files": {"images.memmap": 1}},
            r"files lists \[.images.memmap.\], not \[.checksums.memmap., .images.memmap., .labels.memmap., .meta.json., "
            r".path_offsets.memmap., .paths.memmap.\]",
        ),
        (
            {**V3, "files": {"images.memmap": 1}},
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
        ("count", 0, "a positive number of images"),
        ("count", "2", "a positive number of images"),
        ("table", {"labels.memmap": "xyz"}, "an object of the table files' digests"),
        (
            "order",
            {"shuffled": "yes", "block_size": 4},
            r'an object \{"shuffled": seed, "block_size": bytes\}, or \{\}',
        ),
        ("image_shape", [1, 4, 5], r"\[3, height, width\] with positive integers"),
        ("image_shape", [3, 4.0, 5], r"\[3, height, width\] with positive integers"),
        ("image_shape", [3, 0, 5], r"\[3, height, width\] with positive integers"),
        ("resize", "zoom", "one of crop, pad, stretch"),
        ("max_image_pixels", "a lot", r"a number of pixels \(0: no limit\)"),
        ("skipped", ["cat/bad.jpg"], r'a list of \{"path": ..., "reason": ...\}'),
        ("versions", ["2.14"], "an object of library versions"),
        ("files", {"images.memmap": "120"}, "an object of file sizes"),
        ("source", None, "a string"),
        ("storage", "parquet", '"raw"'),
        ("format_version", "2", "gpuload reads versions 1 to 4"),
        ("layout", "planar", "one of channels_last, channels_first"),
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
        ("count", 3),
        ("table", {**TABLE, "paths.memmap": "fedcba9876543210"}),
        ("image_shape", [3, 5, 4]),
        ("resize", "pad"),
        ("files", {**FILES, "meta.json": 301}),
        ("layout", "channels_first"),
    ],
)
def test_every_field_that_gives_the_data_meaning_is_covered_by_a_digest(tmp_path, name, value):
    manifest().write(tmp_path)
    edit(tmp_path, name, value)
    assert Manifest.read(tmp_path).edited_fields() == [name]


@pytest.mark.parametrize(
    ("name", "value"),
    [("samples", [["cat/1.jpg", 1], ["dog/2.jpg", 0]]), ("checksums", ["fedcba9876543210", "0123456789abcdef"])],
)
def test_version_3_digests_its_samples_and_checksums(tmp_path, name, value):
    manifest(**V3).write(tmp_path)
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


@pytest.mark.parametrize(("storage", "layout"), [("raw", None), ("jpeg", "channels_last")])
def test_a_layout_that_does_not_fit_the_storage_is_refused(tmp_path, storage, layout):
    jpeg = {"image_shape": None, "resize": None, "jpeg": {"quality": 90, "max_side": None, "reencoded": {}}}
    arrays = {"data.memmap": 9, "offsets.memmap": 32, "shapes.memmap": 16, "labels.memmap": 16, "meta.json": 3}
    arrays |= {name: size for name, size in FILES.items() if name.startswith(("checksums", "path"))}
    changes = jpeg | {"files": arrays} if storage == "jpeg" else {}
    manifest(storage=storage, layout=layout, **changes).write(tmp_path)
    with pytest.raises(DatasetError, match=f"a {storage} dataset with layout {layout!r}"):
        Manifest.read(tmp_path)


class TestVersion2:
    """Manifests written before format version 3 have no ``layout``: their raw images are channel-first."""

    def written(self, tmp_path) -> dict:
        manifest(**{**V3, "format_version": 2}).write(tmp_path)
        return json.loads((tmp_path / "manifest.json").read_text())

    def test_is_written_and_read_without_a_layout_and_means_channel_first(self, tmp_path):
        raw = self.written(tmp_path)
        assert "layout" not in raw and "layout" not in raw["digests"]
        read = Manifest.read(tmp_path)
        assert read.layout == "channels_first" and read.edited_fields() == []
        assert read.array_shapes == {"images": (2, 3, 4, 5), "labels": (2,)}

    def test_a_layout_field_is_unknown_there(self, tmp_path):
        self.written(tmp_path)
        edit(tmp_path, "layout", "channels_last")
        with pytest.raises(DatasetError, match=r"unknown fields \['layout'\]"):
            Manifest.read(tmp_path)


def test_versions_3_and_4_store_raw_images_channels_last(tmp_path):
    manifest().write(tmp_path)
    assert Manifest.read(tmp_path).array_shapes == {"images": (2, 4, 5, 3), "labels": (2,)}
    assert FORMAT_VERSION == 4
    (tmp_path / "v3").mkdir()
    manifest(**V3).write(tmp_path / "v3")
    assert Manifest.read(tmp_path / "v3").array_shapes == {"images": (2, 4, 5, 3), "labels": (2,)}


class TestVersion4:
    """The images' paths, labels and checksums leave manifest.json for flat files (gpuload.format.table)."""

    def test_holds_no_list_per_image(self, tmp_path):
        manifest().write(tmp_path)
        raw = json.loads((tmp_path / "manifest.json").read_text())
        assert (
            "samples" not in raw and "checksums" not in raw and raw["count"] == 2 and len(Manifest.read(tmp_path)) == 2
        )

    @pytest.mark.parametrize("name", ["samples", "checksums"])
    def test_a_list_per_image_is_unknown_there(self, tmp_path, name):
        manifest().write(tmp_path)
        edit(tmp_path, name, V3[name])
        with pytest.raises(DatasetError, match=rf"unknown fields \['{name}'\]"):
            Manifest.read(tmp_path)

    def test_version_3_holds_no_count_or_table(self, tmp_path):
        manifest(**V3).write(tmp_path)
        raw = json.loads((tmp_path / "manifest.json").read_text())
        assert {"count", "table", "order"}.isdisjoint(raw) and len(Manifest.read(tmp_path)) == 2
