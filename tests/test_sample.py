import hashlib

import numpy as np
import pytest
from PIL import Image

from gpuload import SAMPLE_CLASSES, make_sample_folder


def digests(root):
    return {
        path.relative_to(root): hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(root.rglob("*.jpg"))
    }


def test_writes_distinct_photos_per_class(tmp_path):
    root = make_sample_folder(tmp_path / "s", images_per_class=3, size=(30, 40))
    files = sorted(root.rglob("*.jpg"))
    assert len(files) == 3 * len(SAMPLE_CLASSES)
    assert sorted({path.parent.name for path in files}) == sorted(SAMPLE_CLASSES)
    pixels = [np.asarray(Image.open(path)) for path in files]
    assert all(image.shape == (30, 40, 3) for image in pixels)
    assert len({image.tobytes() for image in pixels}) == len(pixels)


def test_same_arguments_same_files(tmp_path):
    first = make_sample_folder(tmp_path / "a", images_per_class=2, size=(20, 20), classes=2)
    second = make_sample_folder(tmp_path / "b", images_per_class=2, size=(20, 20), classes=2)
    other_seed = make_sample_folder(tmp_path / "c", images_per_class=2, size=(20, 20), classes=2, seed=1)
    assert digests(first) == digests(second) != digests(other_seed)


def test_refuses_a_folder_with_files(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "x").touch()
    with pytest.raises(FileExistsError, match="already exists and is not an empty folder"):
        make_sample_folder(tmp_path / "s")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"classes": 0}, "classes must be between 1 and 5"),
        ({"images_per_class": 0}, "at least 1"),
        ({"size": (0, 4)}, "positive"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_sample_folder(tmp_path / "s", **kwargs)
