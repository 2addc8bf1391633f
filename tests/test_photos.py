"""experiments/_photos.py: the experiments' photo set, real photographs at ImageNet-like sizes."""

from collections import Counter

import numpy as np
import pytest
from PIL import Image

from experiments._photos import SOURCES, imagenet_like_size, make_photo_set


def test_sizes_are_drawn_like_imagenets():
    sizes = [imagenet_like_size(np.random.default_rng(seed)) for seed in range(2000)]
    short = sorted(min(size) for size in sizes)
    assert 300 <= short[len(short) // 2] <= 400  # ImageNet's median image is 500x375
    assert Counter(sizes).most_common(1)[0][0] == (375, 500)  # landscape 4:3 above all
    assert sum(max(size) > 1000 for size in sizes) / len(sizes) > 0.02  # a few large
    assert all(0.45 <= width / height <= 2.05 for height, width in sizes)


def test_the_set_is_every_class_at_its_drawn_sizes_and_the_same_for_the_same_seed(tmp_path):
    first = make_photo_set(tmp_path / "a", 20, seed=1)
    again = make_photo_set(tmp_path / "b", 20, seed=1)
    files = sorted(path.relative_to(first) for path in first.rglob("*.jpg"))
    assert len(files) == 20 and {path.parent.name for path in files} == set(SOURCES)
    assert all((first / path).read_bytes() == (again / path).read_bytes() for path in files)
    with Image.open(first / files[0]) as image:
        assert image.mode == "RGB" and image.format == "JPEG"
    assert len({Image.open(first / path).size for path in files}) > 3
    assert not list(tmp_path.glob(".*"))  # no temporary folder left


def test_an_existing_destination_is_refused_and_kept(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "mine.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="already exists"):
        make_photo_set(tmp_path / "a", 20)
    assert (tmp_path / "a" / "mine.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="at least 10"):
        make_photo_set(tmp_path / "b", 5)
