import os
import threading
import tracemalloc
from pathlib import Path

import pytest
from torchvision.datasets import ImageFolder

from gpuload import UsageError
from gpuload.sources.folder import scan_image_folder, walk_images


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


def scan_with_timeout(function, *args, seconds: float = 30):
    """Run ``function`` in a daemon thread; fail if it does not finish (the old walk never did)."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(value=function(*args)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{function.__name__} still running after {seconds} s"
    return result["value"]


class TestSymlinks:
    @pytest.fixture
    def looped(self, photo_copy):
        """Two loops: a link to the root inside a class, and a link to a sibling class that links back."""
        (photo_copy / "face" / "up").symlink_to(photo_copy)
        (photo_copy / "collar" / "sideways").symlink_to(photo_copy / "face")
        (photo_copy / "face" / "back").symlink_to(photo_copy / "collar")
        return photo_copy

    def test_each_real_folder_is_visited_once_and_the_loops_are_reported(self, looped):
        with pytest.warns(UserWarning) as caught:
            index = scan_with_timeout(scan_image_folder, looped)
        assert len(index.samples) == 20 and len(set(index.samples)) == 20
        assert sorted(link for link, _ in index.repeats) == ["collar/sideways", "face/back", "face/up"]
        assert all("a folder already scanned (a symlink loop or a second link to it)" in str(w.message) for w in caught)

    def test_a_link_to_a_new_folder_is_followed_like_imagefolder(self, photo_copy, tmp_path):
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "extra.jpg").write_bytes((photo_copy / "face" / "0000.jpg").read_bytes())
        (photo_copy / "face" / "more").symlink_to(outside)
        index = scan_image_folder(photo_copy)
        assert ("face/more/extra.jpg", index.class_to_idx["face"]) in index.samples
        assert [(str(photo_copy / path), label) for path, label in index.samples] == ImageFolder(
            str(photo_copy)
        ).samples

    def test_a_broken_link_is_listed_as_imagefolder_lists_it(self, photo_copy):
        """So that the build lists it as skipped instead of leaving it out unseen."""
        (photo_copy / "face" / "lost.jpg").symlink_to("/nonexistent/photo.jpg")
        index = scan_image_folder(photo_copy)
        assert ("face/lost.jpg", index.class_to_idx["face"]) in index.samples
        assert [(str(photo_copy / path), label) for path, label in index.samples] == ImageFolder(
            str(photo_copy)
        ).samples

    @pytest.mark.parametrize("where", ["top", "class"])
    def test_a_symlink_loop_that_leads_nowhere_is_skipped_with_a_warning(self, photo_copy, where):
        """``ln -s self self`` or two links to each other: their stat never ends (ELOOP)."""
        folder = photo_copy if where == "top" else photo_copy / "face"
        (folder / "self").symlink_to("self")
        (folder / "l1.jpg").symlink_to("l2.jpg")
        (folder / "l2.jpg").symlink_to("l1.jpg")
        with pytest.warns(UserWarning, match="leads nowhere: a symlink loop; skipped") as caught:
            index = scan_with_timeout(scan_image_folder, photo_copy)
        assert len(index.samples) == 20 and len(caught) == 3
        files, _ = walk_images(photo_copy)
        assert len(files) == 20

    def test_a_link_into_the_output_is_skipped(self, photo_copy, tmp_path):
        """compress SRC DST with a link in SRC to DST would compress its own outputs again."""
        output = tmp_path / "out"
        (output / "a").mkdir(parents=True)
        (output / "a" / "old.jpg").write_bytes((photo_copy / "face" / "0000.jpg").read_bytes())
        (photo_copy / "face" / "link").symlink_to(output)
        with pytest.warns(UserWarning, match=f"face/link leads to the output folder {output}; skipped"):
            files, _ = walk_images(photo_copy, exclude=output)
        assert len(files) == 20 and not any("old.jpg" in name for name in files)

    def test_walk_images_visits_each_folder_once(self, looped):
        with pytest.warns(UserWarning, match="already scanned"):
            files, repeats = scan_with_timeout(walk_images, looped)
        assert len(files) == 20 and len(repeats) == 3


class TestGivenClasses:
    def test_labels_follow_the_given_list(self, photo_copy):
        classes = ["sleeve_right", "face", "collar", "background", "sleeve_left", "hat"]
        with pytest.warns(UserWarning, match=r"^1 of the given classes have no image in .*photos: hat; their labels"):
            index = scan_image_folder(photo_copy, classes=classes)
        assert index.classes == classes and index.empty_classes == ["hat"]
        assert ("face/0000.jpg", 1) in index.samples and ("sleeve_right/0003.jpg", 0) in index.samples
        assert len(index.samples) == 20

    def test_a_class_folder_not_in_the_list_is_an_error(self, photo_copy):
        with pytest.raises(UsageError, match="has class folders that are not in the given classes: face, sleeve_left"):
            scan_image_folder(photo_copy, classes=["background", "collar", "sleeve_right"])

    @pytest.mark.parametrize("classes", [[], ["face", "face"], "face", ["face", ""]])
    def test_bad_lists(self, photo_copy, classes):
        with pytest.raises(UsageError, match="classes must be a list of distinct class names"):
            scan_image_folder(photo_copy, classes=classes)

    def test_a_folder_without_class_folders(self, tmp_path, photo_folder):
        flat = tmp_path / "face"
        flat.mkdir()
        (flat / "a.jpg").write_bytes((photo_folder / "face" / "0000.jpg").read_bytes())
        with pytest.warns(UserWarning) as caught:
            index = scan_image_folder(flat, classes=["collar", "face", "bag"])
        assert index.samples == [("a.jpg", 1)] and index.empty_classes == ["bag", "collar"]
        assert [str(warning.message) for warning in caught] == [
            f"2 of the given classes have no image in {flat}: bag, collar; their labels are kept"
        ]

    def test_a_folder_without_class_folders_named_after_no_given_class(self, tmp_path, photo_folder):
        """Not "class folders that are not in the given classes": it has none."""
        flat = tmp_path / "val"
        flat.mkdir()
        for name in ("a.jpg", "b.jpg"):
            (flat / name).write_bytes((photo_folder / "face" / "0000.jpg").read_bytes())
        with pytest.raises(UsageError) as caught:
            scan_image_folder(flat, classes=["collar", "face"])
        assert str(caught.value) == (
            f"{flat} holds 2 images and no class folder, so it would be one class named 'val', which is not in the "
            "given classes (collar, face); pass the folder that holds one folder per class, or name this folder "
            "after its class"
        )


class TestAtScale:
    """ImageNet's count (1.28M files) made the scan a stat per file and a list of every path in memory."""

    def test_a_plain_file_costs_no_status_lookup(self, photo_copy, monkeypatch):
        """Its type comes with its folder's listing; only a symlink is followed (to find a loop)."""
        looked_up = []

        class Entry:
            def __init__(self, entry):
                self._entry = entry

            def __getattr__(self, name):
                return getattr(self._entry, name)

            def stat(self, **options):
                looked_up.append(self._entry.name)
                return self._entry.stat(**options)

        real = os.scandir

        class Listing(list):
            def __enter__(self):
                return self

            def __exit__(self, *exc_info):
                pass

        def scandir(path):
            with real(path) as entries:
                return Listing(Entry(entry) for entry in entries)

        monkeypatch.setattr("gpuload.sources.folder.os.scandir", scandir)
        (photo_copy / "face" / "link.jpg").symlink_to(photo_copy / "face" / "0000.jpg")
        index = scan_image_folder(photo_copy)
        assert len(index.samples) == 21 and looked_up == ["link.jpg"]

    def test_memory_holds_one_folder_whatever_the_count(self, tmp_path, monkeypatch):
        """Ten times the folders of 100 images: the same peak, give or take the folders waiting (a path each)
        (the table's writer holds 256 rows here, a chunk smaller than either count)."""
        monkeypatch.setattr("gpuload.format.table._CHUNK", 256)

        def peak(folders: int) -> int:
            root = tmp_path / f"n{folders}"
            for folder in range(folders):
                (root / f"c{folder:03d}").mkdir(parents=True)
                for number in range(100):
                    (root / f"c{folder:03d}" / f"{number:03d}.jpg").touch()
            tracemalloc.start()
            index = scan_image_folder(root, into=tmp_path / f"table{folders}")
            found = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert len(index.samples) == 100 * folders and index.samples[-1] == (
                f"c{folders - 1:03d}/099.jpg",
                folders - 1,
            )
            return found

        small, large = peak(10), peak(100)
        assert large < small + 100 * 1000  # not a tuple per image for all 10,000 (several hundred KB)

    def test_the_samples_are_written_into_the_given_folder(self, photo_folder, tmp_path):
        index = scan_image_folder(photo_folder, into=tmp_path / "scan")
        assert sorted(path.name for path in (tmp_path / "scan").iterdir()) == [
            "checksums.memmap", "labels.memmap", "path_offsets.memmap", "paths.memmap",
        ]  # fmt: skip
        assert index.samples[0] == ("background/0000.jpg", 0)


@pytest.mark.parametrize(
    "names",
    [
        ["a/1.jpg", "a/b/2.jpg", "a-x/3.jpg", "a.y/4.jpg", "a b/5.jpg", "A/6.jpg"],  # names that sort before '/'
        ["c/z/1.jpg", "c/y/2.jpg", "c/1.jpg", "c/y/x/3.jpg", "c/y-1/4.jpg"],
    ],
)
def test_nested_folders_come_in_imagefolders_order(tmp_path, names):
    """torchvision sorts every folder's path as a string ('a-x' before 'a/b'): the walk gives the same order."""
    root = tmp_path / "root"
    for name in names:
        (root / "cls" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "cls" / name).touch()
    expected = [(str(Path(path)), label) for path, label in ImageFolder(str(root), loader=lambda path: None).samples]
    assert [(str(root / path), label) for path, label in scan_image_folder(root).samples] == expected
