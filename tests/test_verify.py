import json
import shutil
from pathlib import Path

import pytest
from conftest import photo, write_odd_image
from PIL import Image, ImageOps

import gpuload.format.verify
import gpuload.writing.decode
from gpuload import MemmapImageDataset, UsageError, build_memmap
from gpuload.format.verify import describe_memmap, verify_memmap
from gpuload.writing.decode import pixel_limit


@pytest.fixture
def writable_copy(photo_copy, tmp_path) -> Path:
    """A dataset built from a copy of the photos, with writable files to damage."""
    out = build_memmap(photo_copy, tmp_path / "copy.memmap", progress=False)
    for file in out.iterdir():
        file.chmod(0o644)
    return out


def test_intact_dataset_has_no_problem(built_dataset):
    assert verify_memmap(built_dataset, sources=20, progress=False) == []


def test_flipped_byte_is_found_and_named(writable_copy):
    images = writable_copy / "images.memmap"
    data = bytearray(images.read_bytes())
    data[3 * 48 * 64 * 5 + 100] ^= 0xFF  # a byte of image 5
    images.write_bytes(bytes(data))
    problems = verify_memmap(writable_copy, progress=False)
    assert problems == ["1 image does not match its build checksum: 5 (collar/0001.jpg)"]


def test_pixels_lost_in_a_power_cut_are_found(writable_copy):
    """What an unsynced build can leave after a power cut: the file at full size, some pages zeros."""
    images = writable_copy / "images.memmap"
    data = bytearray(images.read_bytes())
    image_bytes = 3 * 48 * 64
    data[12 * image_bytes :] = bytes(len(data) - 12 * image_bytes)
    images.write_bytes(bytes(data))
    problems = verify_memmap(writable_copy, progress=False)
    assert len(problems) == 1 and problems[0].startswith("8 images do not match their build checksum: 12 (")


def test_an_edited_manifest_is_found(writable_copy):
    manifest = json.loads((writable_copy / "manifest.json").read_text())
    manifest["classes"] = list(reversed(manifest["classes"]))  # every label now names another class
    (writable_copy / "manifest.json").write_text(json.dumps(manifest))
    assert verify_memmap(writable_copy, progress=False) == [
        "manifest.json: the field 'classes' was changed after the build (its digest differs); rebuild the dataset"
    ]


def test_changed_labels_are_found(writable_copy):
    labels = writable_copy / "labels.memmap"
    data = bytearray(labels.read_bytes())
    data[0] = 9
    labels.write_bytes(bytes(data))
    problems = verify_memmap(writable_copy, progress=False)
    assert len(problems) == 1 and problems[0].endswith(
        "is damaged: labels.memmap differs from what was built; run gpuload verify, then rebuild the dataset"
    )


def test_changed_and_missing_sources_are_found(writable_copy, photo_copy):
    photo().rotate(90).save(photo_copy / "face" / "0002.jpg")
    (photo_copy / "face" / "0003.jpg").unlink()
    problems = verify_memmap(writable_copy, sources=20, progress=False)
    assert len(problems) == 2
    assert problems[0].startswith("image 10 differs from its source") and "face/0002.jpg" in problems[0]
    assert problems[1].startswith("source of image 11 cannot be decoded") and "face/0003.jpg" in problems[1]


@pytest.mark.parametrize("wrong", ["a class folder", "another folder of photos"])
def test_a_source_folder_that_holds_none_of_the_sources_is_one_error(built_dataset, photo_folder, tmp_path, wrong):
    """Not one "cannot be decoded" problem per image (a million lines for a million images): the folder is wrong."""
    folder = next(p for p in sorted(photo_folder.iterdir()) if p.is_dir()) if wrong == "a class folder" else tmp_path
    if wrong != "a class folder":
        photo().save(tmp_path / "0001.jpg")
    with pytest.raises(FileNotFoundError, match=rf"^none of the sources of {built_dataset} are in {folder} \(first "):
        verify_memmap(built_dataset, sources="all", source_folder=folder, progress=False)


def test_all_sources(built_dataset, monkeypatch):
    decoded = []
    real = gpuload.format.verify.decode_image
    monkeypatch.setattr(gpuload.format.verify, "decode_image", lambda *args: decoded.append(1) or real(*args))
    assert verify_memmap(built_dataset, sources="all", progress=False) == []
    assert len(decoded) == 20


@pytest.mark.parametrize("format", ["raw", "jpeg"])
def test_a_multi_picture_source_verifies_as_it_was_built(photo_copy, tmp_path, format):
    """An MPO is its first picture for the build (a jpeg build stores that picture's bytes) and for verify."""
    write_odd_image(photo_copy / "face" / "stereo.jpg", "mpo")
    out = build_memmap(photo_copy, tmp_path / "out", format=format, progress=False)
    assert len(MemmapImageDataset(out)) == 21
    assert verify_memmap(out, sources="all", progress=False) == []


@pytest.mark.parametrize("format", ["raw", "jpeg"])
def test_a_source_that_became_a_named_pipe_is_a_problem_never_opened(photo_copy, tmp_path, make_not_a_file, format):
    out = build_memmap(photo_copy, tmp_path / "out", format=format, progress=False)
    (photo_copy / "face" / "0002.jpg").unlink()
    make_not_a_file(photo_copy / "face" / "0002.jpg", "fifo")
    assert verify_memmap(out, sources="all", progress=False) == [
        f"source of image 10 cannot be decoded: {photo_copy / 'face' / '0002.jpg'}: not a regular file "
        "(a named pipe): not opened; images must be regular files"
    ]


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # over the limit of the moment
@pytest.mark.parametrize("options", [{"size": (24, 32)}, {"format": "jpeg", "max_side": 32}])  # every source decoded
def test_sources_are_decoded_with_the_pixel_limit_of_the_build(photo_folder, tmp_path, monkeypatch, options):
    """A build whose limit was raised (PIL.Image.MAX_IMAGE_PIXELS in Python, --max-pixels) recorded it:
    verify decodes its sources with it, whatever the limit is now; a manifest from before it was
    recorded uses the limit as it is now."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3000)  # below the photos' 3,072 pixels
    with pixel_limit(3072):
        out = build_memmap(photo_folder, tmp_path / "out", progress=False, **options)
    assert MemmapImageDataset(out).manifest.max_image_pixels == 3072
    assert verify_memmap(out, sources="all", progress=False) == []
    assert Image.MAX_IMAGE_PIXELS == 3000
    (out / "manifest.json").chmod(0o644)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["max_image_pixels"]  # as built before the limit was recorded
    (out / "manifest.json").write_text(json.dumps(manifest))
    problems = verify_memmap(out, sources="all", progress=False)
    assert len(problems) == 20 and "more than PIL.Image.MAX_IMAGE_PIXELS = 3,000" in problems[0]
    with pixel_limit(3072):
        assert verify_memmap(out, sources="all", progress=False) == []


@pytest.mark.parametrize("sources", [-1, "some", 1.5, True])
def test_bad_sources(built_dataset, sources):
    with pytest.raises(UsageError, match="sources must be a number of images to re-decode or 'all'"):
        verify_memmap(built_dataset, sources=sources, progress=False)


def test_a_bug_while_re_decoding_is_not_reported_as_a_damaged_source(built_dataset, monkeypatch):
    monkeypatch.setattr(gpuload.writing.decode, "_fit", lambda *args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        verify_memmap(built_dataset, sources=3, progress=False)


class TestNotADataset:
    """verify's problems are those of a dataset it checked: a path holding no dataset is refused."""

    def test_a_missing_path(self, tmp_path):
        with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'nope'} does not exist; pass the folder that"):
            verify_memmap(tmp_path / "nope", progress=False)

    def test_a_file(self, tmp_path):
        (tmp_path / "notes").write_text("mine")
        with pytest.raises(UsageError, match="notes is not a folder; pass the folder that build-memmap wrote"):
            verify_memmap(tmp_path / "notes", progress=False)

    def test_a_folder_with_no_dataset_file(self, tmp_path):
        (tmp_path / "meta.json").write_text("{}")
        with pytest.raises(
            UsageError, match="is not a gpuload dataset: it holds none of the files build-memmap writes"
        ):
            verify_memmap(tmp_path, progress=False)

    def test_a_dataset_whose_manifest_was_lost_is_a_problem(self, writable_copy):
        (writable_copy / "manifest.json").unlink()
        assert verify_memmap(writable_copy, progress=False) == [
            f"{writable_copy}: manifest.json is missing but files a build writes are there (the manifest was deleted, "
            "or the build never finished); if it is a gpuload dataset, delete it and build it again (--overwrite "
            "replaces only whole datasets)"
        ]

    def test_a_dataset_that_lost_its_manifest_and_labels_is_still_a_damaged_dataset(self, writable_copy):
        """An interrupted copy, say: any array a build writes makes the folder a (damaged) dataset."""
        for path in writable_copy.iterdir():
            if path.name != "images.memmap":
                path.unlink()
        assert verify_memmap(writable_copy, progress=False)[0].startswith(f"{writable_copy}: manifest.json is missing")

    def test_a_damaged_manifest_is_a_problem(self, writable_copy):
        (writable_copy / "manifest.json").write_text("{not json")
        problems = verify_memmap(writable_copy, progress=False)
        assert len(problems) == 1 and problems[0].startswith(f"{writable_copy / 'manifest.json'} is not valid JSON")


def test_describe(built_dataset, photo_folder):
    info = describe_memmap(built_dataset)
    assert info["images"] == 20 and info["image_shape"] == [3, 48, 64]
    assert info["classes"] == {"background": 4, "collar": 4, "face": 4, "sleeve_left": 4, "sleeve_right": 4}
    assert info["source"] == str(photo_folder) and info["skipped"] == 0
    assert info["bytes_on_disk"] > 20 * 3 * 48 * 64
    json.dumps(info)  # the CLI prints it as JSON


@pytest.mark.parametrize("format", ["raw", "jpeg"])
def test_number_fields_of_every_dtype_verify_clean(photo_copy, tmp_path, format):
    """verify reads ``fields/meta.json`` (plain tensordict's view of the numbers): a bool column, stored as
    uint8, an int vector and a float are each what it records, not a problem."""
    photos = sorted(path.relative_to(photo_copy).as_posix() for path in photo_copy.rglob("*.jpg"))
    rows = ["file_name,ok,box,score"] + [
        f'{name},{index % 2 == 0},"[1, {index}]",{index / 3}' for index, name in enumerate(photos)
    ]
    (photo_copy / "metadata.csv").write_text("\n".join(rows) + "\n")
    out = build_memmap(photo_copy, tmp_path / "fields.memmap", format=format, progress=False)
    assert verify_memmap(out, progress=False) == []


def test_verify_does_not_change_the_dataset(writable_copy):
    before = {path: path.read_bytes() for path in writable_copy.rglob("*") if path.is_file()}
    verify_memmap(writable_copy, sources=3, progress=False)
    assert {path: path.read_bytes() for path in writable_copy.rglob("*") if path.is_file()} == before
    shutil.rmtree(writable_copy)


class TestJpeg:
    def test_intact_with_every_source(self, jpeg_dataset):
        assert verify_memmap(jpeg_dataset, sources="all", progress=False) == []

    def test_re_encoded_images_are_compared_within_the_tolerance(self, photo_copy, tmp_path):
        from conftest import write_odd_image

        write_odd_image(photo_copy / "face" / "rotated.jpg", "exif_rotated")
        out = build_memmap(photo_copy, tmp_path / "out", format="jpeg", max_side=40, progress=False)
        assert verify_memmap(out, sources="all", progress=False) == []

    @pytest.mark.parametrize("sources", [0, "all"])
    def test_a_flipped_byte_is_found_and_listed_when_sources_are_compared_too(self, jpeg_dataset, tmp_path, sources):
        copy = Path(shutil.copytree(jpeg_dataset, tmp_path / "copy"))
        data = copy / "data.memmap"
        data.chmod(0o644)
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        data.write_bytes(bytes(raw))
        problems = verify_memmap(copy, sources=sources, progress=False)
        assert len(problems) == 1 and problems[0].startswith("1 image does not match its build checksum:")

    @pytest.mark.parametrize("decode", ["RandomResizedCropDecode", "CenterCropDecode", "decode_batch"])
    @pytest.mark.parametrize("height", [12, 2**24 + 24, 2**30], ids=["half", "huge", "overflowing"])
    def test_a_changed_size_in_the_index_is_found_and_refused_at_load_time(
        self, jpeg_dataset, tmp_path, decode, height
    ):
        import numpy as np
        import torch

        import gpuload
        from gpuload import DataLoader, DatasetError, MemmapImageDataset

        copy = Path(shutil.copytree(jpeg_dataset, tmp_path / "copy"))
        shapes = copy / "shapes.memmap"
        shapes.chmod(0o644)
        values = np.fromfile(shapes, np.int32).reshape(-1, 2)
        real = values[4].tolist()
        values[4, 0] = height  # image 4 recorded with another height
        values.tofile(shapes)
        problems = verify_memmap(copy, progress=False)
        assert problems[0] == (
            "shapes.memmap differs from what was built (its digest differs): each image's size is damaged; "
            "rebuild the dataset"
        )
        assert len(problems) == 2 and problems[1].startswith("1 image differs from its size in shapes.memmap: 4 (")
        if decode == "decode_batch":  # the batched path of gpu=True, on its CPU fallback
            from gpuload.loading.crop import decode_batch

            def load():
                dataset = MemmapImageDataset(copy)
                decoder = gpuload.RandomResizedCropDecode(8)
                return decode_batch(dataset, torch.arange(20), decoder, seed=0, epoch=0, device=torch.device("cpu"))
        else:
            loader = DataLoader(
                MemmapImageDataset(copy), batch_size=20, decode=getattr(gpuload, decode)(8), device="cpu"
            )

            def load():
                return next(iter(loader))

        with pytest.raises(
            DatasetError,
            match=rf"image 4 .* decodes to {real[1]}x{real[0]} where its recorded size is {real[1]}x{height}: shapes.memmap is damaged",
        ):
            load()
        assert torch.is_tensor(MemmapImageDataset(copy)[4][0])

    def test_describe(self, jpeg_dataset):
        info = describe_memmap(jpeg_dataset)
        assert info["storage"] == "jpeg" and info["image_shape"] is None and info["images"] == 20


# Every size from 1x1 to 9x9, and a few long thin ones: where JPEG's 8x8 blocks and 2x2 chroma
# subsampling lose the most.
TINY_SIZES = [(height, width) for height in range(1, 10) for width in range(1, 10)] + [(1, 40), (40, 1), (13, 11)]
# How a source reaches the jpeg store: kept as it is (baseline JPEG) or re-encoded at the build's quality.
TINY_KINDS = {
    "baseline": lambda image, path: image.save(path.with_suffix(".jpg"), quality=90),
    "progressive": lambda image, path: image.save(path.with_suffix(".jpg"), quality=90, progressive=True),
    "png": lambda image, path: image.save(path.with_suffix(".png")),
}


def write_tiny_sources(root: Path, sizes=TINY_SIZES, content=photo) -> Path:
    """One class per kind, one image of grace_hopper.jpg's content per size."""
    for kind, save in TINY_KINDS.items():
        (root / kind).mkdir(parents=True, exist_ok=True)
        for height, width in sizes:
            save(content((height, width)), root / kind / f"{height}x{width}")
    return root


@pytest.fixture(scope="module")
def tiny_sources(tmp_path_factory) -> Path:
    return write_tiny_sources(tmp_path_factory.mktemp("tiny") / "src")


class TestTinyImages:
    """A fresh build from any valid source passes verify --sources, and a swapped source is still found."""

    @pytest.mark.parametrize("quality", [90, 50, 100])
    def test_a_fresh_jpeg_build_of_tiny_images_passes_exactly(self, tiny_sources, tmp_path, quality, monkeypatch):
        out = build_memmap(tiny_sources, tmp_path / "out", format="jpeg", quality=quality, progress=False)
        reencoded = MemmapImageDataset(out).manifest.jpeg["reencoded"]
        assert reencoded == {"progressive": len(TINY_SIZES), "not_jpeg": len(TINY_SIZES)}
        monkeypatch.setattr(gpuload.format.verify, "decode_image", None)  # the same bytes: no pixel comparison
        assert verify_memmap(out, sources="all", progress=False) == []

    @pytest.mark.parametrize("max_side", [1, 3, 5, 7, 9])
    def test_images_scaled_down_to_a_tiny_max_side_pass(self, photo_folder, tmp_path, max_side):
        out = build_memmap(photo_folder, tmp_path / "out", format="jpeg", max_side=max_side, progress=False)
        assert verify_memmap(out, sources="all", progress=False) == []

    def test_a_fresh_raw_build_of_tiny_images_passes(self, tiny_sources, tmp_path):
        out = build_memmap(tiny_sources, tmp_path / "out", size=(5, 3), resize="stretch", progress=False)
        assert verify_memmap(out, sources="all", progress=False) == []

    @pytest.mark.parametrize("storage", ["jpeg", "raw"])
    def test_a_swapped_source_is_still_found(self, tmp_path, storage):
        sizes = [(1, 1), (3, 5), (7, 1), (9, 9), (48, 64)]
        src = write_tiny_sources(tmp_path / "src", sizes)
        format_options = {"format": "jpeg"} if storage == "jpeg" else {"size": (8, 8)}
        out = build_memmap(src, tmp_path / "out", progress=False, **format_options)
        write_tiny_sources(src, sizes, content=lambda size: ImageOps.invert(photo(size)))  # other photos, same names
        problems = verify_memmap(out, sources="all", progress=False)
        assert len(problems) == len(sizes) * len(TINY_KINDS)
        assert all(problem.startswith("image ") and " differs from its source " in problem for problem in problems)

    def test_a_slightly_changed_re_encoded_source_is_found(self, tmp_path):
        src = write_tiny_sources(tmp_path / "src", [(48, 64)])
        out = build_memmap(src, tmp_path / "out", format="jpeg", progress=False)
        with Image.open(src / "png" / "48x64.png") as image:
            edited = image.copy()
        edited.paste((255, 0, 0), (10, 10, 40, 40))  # a red box over a third of the photo
        edited.save(src / "png" / "48x64.png")
        problems = verify_memmap(out, sources="all", progress=False)
        assert len(problems) == 1 and "png/48x64.png (mean pixel difference" in problems[0]
