from pathlib import Path

import pytest
from torchvision.datasets import ImageFolder

from gpuload.store.scan import scan_image_folder


def test_matches_imagefolder(photo_copy):
    (photo_copy / "face" / "readme.txt").write_text("not an image")
    (photo_copy / "face" / "nested").mkdir()
    (photo_copy / "face" / "nested" / "UPPER.JPEG").write_bytes((photo_copy / "face" / "0000.jpg").read_bytes())
    index = scan_image_folder(photo_copy)
    reference = ImageFolder(str(photo_copy))
    assert index.classes == reference.classes
    assert index.class_to_idx == reference.class_to_idx
    assert [(str(photo_copy / path), label) for path, label in index.samples] == reference.samples
    assert ("face/nested/UPPER.JPEG", index.class_to_idx["face"]) in index.samples


def test_folder_without_class_folders_is_one_class(tmp_path, photo_folder):
    flat = tmp_path / "flat"
    flat.mkdir()
    for number, source in enumerate(sorted(photo_folder.rglob("*.jpg"))[:3]):
        (flat / f"{number}.jpg").write_bytes(source.read_bytes())
    index = scan_image_folder(flat)
    assert index.classes == ["flat"]
    assert index.samples == [("0.jpg", 0), ("1.jpg", 0), ("2.jpg", 0)]
    assert index.root == flat


def test_empty_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no image and no class folder; supported extensions are: .jpg"):
        scan_image_folder(tmp_path)


def test_class_without_images_is_named(photo_copy):
    (photo_copy / "empty_class").mkdir()
    with pytest.raises(FileNotFoundError, match="no valid file for the classes empty_class"):
        scan_image_folder(photo_copy)


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        scan_image_folder(tmp_path / "nope")


def test_file_instead_of_folder(tmp_path):
    (tmp_path / "file.jpg").touch()
    with pytest.raises(NotADirectoryError, match="is not a folder"):
        scan_image_folder(tmp_path / "file.jpg")


def test_relative_root_is_made_absolute(photo_folder, monkeypatch):
    monkeypatch.chdir(photo_folder.parent)
    index = scan_image_folder(Path(photo_folder.name))
    assert index.root == photo_folder and index.root.is_absolute()
