import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
from conftest import SIZE, photo, write_bad_file, write_odd_image
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from gpuload import DatasetError, MemmapImageDataset, UsageError, build_memmap, decode_image
from gpuload.writing.jpeg import arithmetic_coded, frame_size, primary_image, row_window, scale_is_exact, store_jpeg


def block_means_gap(first: np.ndarray, second: np.ndarray) -> float:
    """Mean absolute difference of the 8x8 block means of two ``[H, W, 3]`` images."""
    height, width = (side // 8 * 8 for side in first.shape[:2])

    def means(image: np.ndarray) -> np.ndarray:
        return image[:height, :width].astype(np.float64).reshape(height // 8, 8, width // 8, 8, 3).mean(axis=(1, 3))

    return float(np.abs(means(first) - means(second)).mean())


class TestStoreJpeg:
    def test_a_baseline_rgb_jpeg_is_kept_byte_for_byte(self, photo_folder):
        path = photo_folder / "face" / "0000.jpg"
        stored = store_jpeg(path)
        assert stored.data == path.read_bytes() and stored.reencoded is None and stored.shape == SIZE

    @pytest.mark.parametrize(
        ("kind", "name", "reason"),
        [
            ("exif_rotated", "rotated.jpg", "exif_rotated"),
            ("cmyk", "cmyk.jpg", "not_rgb_or_gray"),
            ("palette", "palette.png", "not_jpeg"),
            ("sixteen_bit", "sixteen.png", "not_jpeg"),
        ],
    )
    def test_the_rest_is_re_encoded_upright_as_it_decodes(self, tmp_path, kind, name, reason):
        write_odd_image(tmp_path / name, kind)
        stored = store_jpeg(tmp_path / name, quality=95)
        assert stored.reencoded == reason
        pixels = simplejpeg.decode_jpeg(stored.data)
        assert pixels.shape[:2] == stored.shape
        expected = decode_image(tmp_path / name).permute(1, 2, 0).numpy()
        assert block_means_gap(pixels, expected) < 3  # the same picture, upright (JPEG keeps 8x8 means)

    def test_a_jpeg_that_only_pillow_reads_is_re_encoded_as_pillow_decodes_it(self):
        """Luma 2x2, blue 2x1, red 1x1: a valid JPEG that libjpeg-turbo cannot classify; stored as
        it was, no load could ever decode it."""
        path = Path(__file__).parent / "data" / "sampling_unknown_to_libjpeg_turbo.jpg"
        with pytest.raises(ValueError, match="subsampling"):
            simplejpeg.decode_jpeg(path.read_bytes())
        stored = store_jpeg(path, quality=95)
        assert stored.reencoded == "not_read_by_libjpeg_turbo" and stored.shape == (100, 64)
        reference = np.asarray(Image.open(path).convert("RGB"))
        assert block_means_gap(simplejpeg.decode_jpeg(stored.data), reference) < 2

    def test_a_progressive_jpeg_is_re_encoded(self, tmp_path):
        photo().save(tmp_path / "p.jpg", quality=90, progressive=True)
        assert store_jpeg(tmp_path / "p.jpg").reencoded == "progressive"

    def test_an_arithmetic_coded_jpeg_is_re_encoded(self):
        """tests/data/arithmetic_coded.jpg (64x48, ``jpegtran -arithmetic``): libjpeg-turbo reads it,
        but crops could not skip its rows, and ffmpeg cannot read it."""
        path = Path(__file__).parent / "data" / "arithmetic_coded.jpg"
        assert arithmetic_coded(path.read_bytes()) and row_window(path.read_bytes(), 20, 30, context=False) is None
        stored = store_jpeg(path, quality=95)
        assert stored.reencoded == "arithmetic_coded" and stored.shape == (48, 64)
        assert not arithmetic_coded(stored.data) and row_window(stored.data, 20, 30, context=False) is not None
        assert block_means_gap(simplejpeg.decode_jpeg(stored.data), simplejpeg.decode_jpeg(path.read_bytes())) < 2

    def test_a_grayscale_jpeg_is_kept(self, tmp_path):
        write_odd_image(tmp_path / "g.jpg", "grayscale")
        assert store_jpeg(tmp_path / "g.jpg").reencoded is None

    def test_an_image_longer_than_a_jpeg_can_be_is_a_decode_error_naming_the_way_out(self, tmp_path):
        from gpuload import DecodeError

        Image.new("RGB", (70_000, 8), (10, 200, 30)).save(tmp_path / "wide.png")
        with pytest.raises(DecodeError, match=r"70000x8 is larger than a JPEG can be .* --max-side 65500"):
            store_jpeg(tmp_path / "wide.png")
        assert store_jpeg(tmp_path / "wide.png", max_side=7000).shape == (1, 7000)

    def test_a_re_encoded_file_is_read_once(self, tmp_path, monkeypatch):
        """Decoded from the bytes its header was read from: one read, and no second look at a file
        that may have changed in between."""
        import gpuload.writing.decode
        import gpuload.writing.jpeg

        reads = []
        real = gpuload.writing.decode.read_bytes
        for module in (gpuload.writing.decode, gpuload.writing.jpeg):
            monkeypatch.setattr(module, "read_bytes", lambda path: reads.append(path) or real(path))
        photo((30, 40)).save(tmp_path / "a.png")
        assert store_jpeg(tmp_path / "a.png").reencoded == "not_jpeg" and len(reads) == 1

    def test_max_side_scales_down_keeping_the_aspect_ratio(self, tmp_path):
        photo((300, 400)).save(tmp_path / "big.jpg", quality=90)
        stored = store_jpeg(tmp_path / "big.jpg", max_side=200)
        assert stored.shape == (150, 200) and stored.reencoded == "larger_than_max_side"
        assert store_jpeg(tmp_path / "big.jpg", max_side=400).reencoded is None

    def test_reencoded_images_have_a_restart_marker_per_mcu_row_so_crops_skip_the_rows_above(self, tmp_path):
        photo((600, 800)).save(tmp_path / "big.jpg", quality=90)
        stored = store_jpeg(tmp_path / "big.jpg", max_side=400)
        assert stored.shape == (300, 400) and stored.reencoded == "larger_than_max_side"
        copy, top, declared = row_window(stored.data, 150, 160, context=True)
        assert top == 128 and declared == 48  # the MCU rows around 150-159 only
        np.testing.assert_array_equal(
            simplejpeg.decode_jpeg(copy, strict=False)[150 - top : 160 - top],
            simplejpeg.decode_jpeg(stored.data)[150:160],
        )

    @pytest.mark.parametrize(
        "name", ["truncated_eoi.jpg", "corrupt.jpg", "notes.jpg", "extraneous.jpg", "corrupt_mpo.jpg"]
    )
    def test_damaged_files_are_decode_errors_as_in_raw_builds(self, tmp_path, name):
        from gpuload import DecodeError

        with pytest.raises(DecodeError):
            store_jpeg(write_bad_file(tmp_path, name))

    @pytest.mark.parametrize("before", [b"\xff\xdb", b"\xff\xc4"])  # before the frame header, after it
    def test_stray_bytes_before_a_header_marker_are_damage_not_another_kind_of_jpeg(self, tmp_path, before):
        """libjpeg skips them, warning "Corrupt JPEG data: 3 extraneous bytes before marker", so its
        strict decode refuses the file: damaged, as in raw builds, not re-encoded as an
        arithmetic-coded JPEG or one that libjpeg-turbo cannot read."""
        from gpuload import DecodeError

        photo().save(tmp_path / "a.jpg", quality=90)
        data = (tmp_path / "a.jpg").read_bytes()
        position = data.index(before)
        data = data[:position] + b"\x00\x12\x34" + data[position:]
        (tmp_path / "a.jpg").write_bytes(data)
        assert frame_size(data) == SIZE and not arithmetic_coded(data)  # the header walk skips them, as libjpeg
        with pytest.raises(
            DecodeError,
            match=rf"truncated or corrupt JPEG \(libjpeg: Corrupt JPEG data: 3 extraneous bytes before marker 0x{before[1]:02x}\)",
        ):
            store_jpeg(tmp_path / "a.jpg")

    @pytest.mark.parametrize(("options", "reason"), [({}, None), ({"progressive": True}, "progressive")])
    def test_a_multi_picture_jpeg_is_its_first_picture(self, tmp_path, options, reason):
        """An MPO (a stereo pair, an Ultra HDR photo and its gain map) shows as its first picture, a
        JPEG: stored byte for byte up to its end (the bytes its picture index gives it) where it
        qualifies, else re-encoded for what it is."""
        other = photo((24, 32)).transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        photo().save(tmp_path / "a.jpg", "MPO", save_all=True, append_images=[other], quality=90, **options)
        with Image.open(tmp_path / "a.jpg") as image:
            assert image.format == "MPO"
            first = image.mpinfo[0xB002][0]["Size"]  # the primary picture's bytes, by the picture index
        stored = store_jpeg(tmp_path / "a.jpg")
        assert stored.reencoded == reason and stored.shape == SIZE
        if reason is None:
            assert stored.data == (tmp_path / "a.jpg").read_bytes()[:first]
        assert block_means_gap(simplejpeg.decode_jpeg(stored.data), np.asarray(photo())) < 3

    def test_the_first_picture_ends_at_its_own_end_marker(self, tmp_path):
        """Not at the end marker of a thumbnail in its EXIF, nor after the first of its scans."""
        thumbnail = io.BytesIO()
        photo((12, 16)).save(thumbnail, "JPEG")
        exif = Image.Exif()
        exif[0x010E] = "a" * 40
        photo().save(tmp_path / "p.jpg", quality=90, progressive=True, exif=exif.tobytes() + thumbnail.getvalue())
        data = (tmp_path / "p.jpg").read_bytes()
        assert data.count(b"\xff\xd9") == 2 and primary_image(data + data) == data
        assert primary_image(data[:-2]) == data[:-2]  # no end: as it is


class TestBuild:
    def test_files_manifest_and_footprint(self, photo_folder, jpeg_dataset):
        manifest = json.loads((jpeg_dataset / "manifest.json").read_text())
        assert manifest["storage"] == "jpeg" and manifest["image_shape"] is None and manifest["resize"] is None
        assert manifest["jpeg"] == {"quality": 90, "max_side": None, "reencoded": {}}
        sources = sum(path.stat().st_size for path in photo_folder.rglob("*.jpg"))
        assert manifest["files"]["data.memmap"] == sources  # the JPEGs as they were (none crossed a 4 MiB block)
        index = sum(size for name, size in manifest["files"].items() if name not in ("data.memmap", "meta.json"))
        paths = sum(len(str(path.relative_to(photo_folder))) for path in photo_folder.rglob("*.jpg"))
        assert index - paths == 48 * 20 + 8  # start and end, size, label, checksum, path offset: 48 bytes an image
        assert manifest["order"] == {"shuffled": 0, "block_size": 4 * 2**20}

    def test_plain_tensordict_opens_it_in_a_process_without_gpuload(self, jpeg_dataset):
        code = textwrap.dedent(f"""
            import sys
            from tensordict import TensorDict
            data = TensorDict.load_memmap({str(jpeg_dataset)!r})
            assert "gpuload" not in sys.modules
            print(sorted(data.keys()), list(data["offsets"].shape), data["shapes"].shape[0], data["checksums"].dtype)
        """)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        expected = "['checksums', 'data', 'labels', 'offsets', 'shapes'] [20, 2] 20 torch.int64"
        assert result.stdout.strip() == expected

    def test_mixed_sources_are_stored_and_counted(self, photo_copy, tmp_path):
        write_odd_image(photo_copy / "face" / "rotated.jpg", "exif_rotated")
        write_odd_image(photo_copy / "face" / "palette.png", "palette")
        write_odd_image(photo_copy / "face" / "stereo.jpg", "mpo")  # stored: its first picture is a baseline JPEG
        photo((200, 300)).save(photo_copy / "collar" / "big.jpg", quality=90)
        write_bad_file(photo_copy / "collar", "truncated_eoi.jpg")
        out = build_memmap(photo_copy, tmp_path / "out", format="jpeg", max_side=100, quality=80, progress=False)
        dataset = MemmapImageDataset(out)
        assert len(dataset) == 24 and [entry["path"] for entry in dataset.skipped] == ["collar/truncated_eoi.jpg"]
        assert dataset.manifest.jpeg == {
            "quality": 80,
            "max_side": 100,
            "reencoded": {"not_jpeg": 1, "exif_rotated": 1, "larger_than_max_side": 1},
        }

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"format": "png"}, "format must be one of raw, jpeg"),
            ({"format": "jpeg", "size": (8, 8)}, "size applies to format='raw'"),
            ({"max_side": 100}, r"max_side applies only to format='jpeg' \(--format jpeg\), got max_side=100"),
            ({"format": "jpeg", "max_side": 0}, "max_side must be a positive integer"),
            ({"format": "jpeg", "quality": 101}, "quality must be an integer from 1 to 100"),
        ],
    )
    def test_bad_arguments(self, photo_folder, tmp_path, kwargs, message):
        with pytest.raises(UsageError, match=message):
            build_memmap(photo_folder, tmp_path / "out", progress=False, **kwargs)
        assert not (tmp_path / "out").exists()

    def test_classes_of_another_dataset(self, photo_copy, built_dataset, tmp_path):
        import shutil

        shutil.rmtree(photo_copy / "collar")
        classes = MemmapImageDataset(built_dataset).classes
        with pytest.warns(UserWarning, match="1 of the given classes have no image in .*: collar; their labels"):
            out = build_memmap(photo_copy, tmp_path / "val", format="jpeg", classes=classes, progress=False)
        dataset = MemmapImageDataset(out)
        assert dataset.classes == classes and dataset.manifest.empty_classes == ["collar"]
        assert dataset.class_to_idx == MemmapImageDataset(built_dataset).class_to_idx


class TestDataset:
    def test_items_are_the_exact_decodes_of_the_sources(self, photo_folder, jpeg_dataset):
        dataset = MemmapImageDataset(jpeg_dataset)
        assert dataset.storage == "jpeg" and dataset.image_shape is None and len(dataset) == 20
        for index in (0, 7, 19):
            image, label = dataset[index]
            source, expected_label = dataset.samples[index]
            assert torch.equal(image, decode_image(source)) and label == expected_label
        assert dataset.data.shapes.tolist() == [list(SIZE)] * 20

    def test_damaged_bytes_are_caught_at_load_time_naming_the_image(self, jpeg_dataset, tmp_path):
        import shutil

        copy = shutil.copytree(jpeg_dataset, tmp_path / "copy.jpeg")
        data = copy / "data.memmap"
        data.chmod(0o644)
        raw = bytearray(data.read_bytes())
        start = int(MemmapImageDataset(copy).data.starts[3])
        raw[start + 700] ^= 0x10
        data.write_bytes(bytes(raw))
        dataset = MemmapImageDataset(copy)
        with pytest.raises(DatasetError, match=r"image 3 \(background/0003.jpg\) does not match its build checksum"):
            dataset[3]
        assert dataset[2][0].shape == (3, *SIZE)

    def test_a_data_file_cut_after_opening_names_the_image_it_cuts(self, jpeg_dataset, tmp_path):
        import shutil

        copy = shutil.copytree(jpeg_dataset, tmp_path / "copy.jpeg")
        (copy / "data.memmap").chmod(0o644)
        dataset = MemmapImageDataset(copy)
        last = int(dataset.data.starts.argmax())  # the image stored last (the images lie in a shuffled order)
        os.truncate(copy / "data.memmap", int(dataset.data.starts[last]) + 10)
        with pytest.raises(
            DatasetError, match=rf"image {last} \(.*\): .*data.memmap ends before byte \d+: the file was truncated"
        ):
            dataset[last]
        assert all(dataset[index][0].shape == (3, *SIZE) for index in range(20) if index != last)

    def test_pickles_as_its_path(self, jpeg_dataset):
        import pickle

        dataset = MemmapImageDataset(jpeg_dataset)
        copy = pickle.loads(pickle.dumps(dataset))
        assert torch.equal(copy[5][0], dataset[5][0])

    def test_the_stock_dataloader_serves_single_images(self, jpeg_dataset):
        loader = torch.utils.data.DataLoader(MemmapImageDataset(jpeg_dataset), batch_size=4)
        images, labels = next(iter(loader))  # all 48x64 here, so they stack
        assert images.shape == (4, 3, *SIZE) and labels.tolist() == [0, 0, 0, 0]

    def test_a_truncated_index_is_refused(self, jpeg_dataset, tmp_path):
        import shutil

        copy = shutil.copytree(jpeg_dataset, tmp_path / "copy.jpeg")
        offsets = copy / "offsets.memmap"
        offsets.chmod(0o644)
        values = np.fromfile(offsets, np.int64)
        values[5] = values[4]  # an image of 0 bytes
        values.tofile(offsets)
        with pytest.raises(DatasetError, match="offsets.memmap does not cut data.memmap into 20 images"):
            MemmapImageDataset(copy)


def test_a_gray_image_stored_as_it_was_decodes_to_rgb(tmp_path):
    write_odd_image(tmp_path / "src" / "gray.jpg", "grayscale")
    Image.open(tmp_path / "src" / "gray.jpg").convert("RGB").save(tmp_path / "src" / "rgb.jpg")
    dataset = MemmapImageDataset(build_memmap(tmp_path / "src", format="jpeg", progress=False))
    image, _ = dataset[0]
    assert image.shape[0] == 3 and torch.equal(image[0], image[1])


ENCODINGS = ["444", "422", "420", "440", "411", "Gray"]
# Pillow's restart markers: every MCU row, every 2 rows, every 7 MCUs (intervals that end inside rows)
RESTARTS = [{"restart_marker_rows": 1}, {"restart_marker_rows": 2}, {"restart_marker_blocks": 7}]


def encoded(size: tuple[int, int], encoding: str, restarts: dict | None = None) -> bytes:
    """grace_hopper at ``size``, as a JPEG with that chroma sampling (simplejpeg's names) and,
    with ``restarts`` (Pillow's options), restart markers."""
    pixels = np.ascontiguousarray(np.asarray(photo(size)))
    if restarts is None:
        return simplejpeg.encode_jpeg(pixels, quality=90, colorsubsampling=encoding)
    image = Image.fromarray(pixels).convert("L" if encoding == "Gray" else "RGB")
    subsampling = {"444": "4:4:4", "422": "4:2:2", "420": "4:2:0", "Gray": "4:4:4"}[encoding]
    image.save(buffer := io.BytesIO(), "JPEG", quality=90, subsampling=subsampling, **restarts)
    return buffer.getvalue()


def window_matches(data: bytes, rows: tuple[int, int], denominator: int, fast: bool, context: bool) -> int | None:
    """Decode the rows ``rows`` (at 1/``denominator``) of ``row_window``'s copy and check they are
    the whole decode's; returns the copy's first row (``None``: no copy)."""
    height, width = frame_size(data)
    first, last = rows[0] * denominator, min(height, rows[1] * denominator)
    window = row_window(data, first, last, context=context)
    if window is None:
        return None
    copy, top, declared = window
    assert top % 8 == 0 and top <= first and last <= top + declared <= height
    assert frame_size(copy) == (declared, width)
    if not (scale_is_exact(denominator, height, width) and scale_is_exact(denominator, declared, width)):
        return top  # a few pixels across: the decoder would take another scale (the crop decodes whole)
    options = {"colorspace": "RGB", "fastdct": fast, "fastupsample": fast, "min_width": -(-width // denominator)}
    whole = simplejpeg.decode_jpeg(data, min_height=-(-height // denominator), **options)
    part = simplejpeg.decode_jpeg(copy, min_height=-(-declared // denominator), strict=False, **options)
    assert part.shape == (-(-declared // denominator), whole.shape[1], 3)
    offset = top // denominator
    np.testing.assert_array_equal(
        part[rows[0] - offset : rows[1] - offset], whole[rows[0] : rows[1]], err_msg=f"rows {rows} at 1/{denominator}"
    )
    return top


class TestRowWindow:
    @settings(max_examples=150, deadline=None)
    @given(
        size=st.tuples(st.integers(17, 400), st.integers(1, 300)),
        encoding=st.sampled_from(ENCODINGS),
        restarts=st.sampled_from([None, *RESTARTS]),
        rows=st.tuples(st.floats(0, 1), st.floats(0, 1)),
        denominator=st.sampled_from([1, 2, 4, 8]),
        fast=st.booleans(),
    )
    def test_the_rows_asked_for_decode_to_the_pixels_of_the_whole_image(
        self, size, encoding, restarts, rows, denominator, fast
    ):
        if restarts is not None and encoding in ("440", "411"):
            encoding = "420"  # sampling Pillow does not write
        data = encoded(size, encoding, restarts)
        scaled = -(-size[0] // denominator)
        first = min(int(rows[0] * scaled), scaled - 1)
        last = first + 1 + int(rows[1] * (scaled - first - 1))
        for context in (True, False) if fast else (True,):  # accurate upsampling needs the context rows
            window_matches(data, (first, last), denominator, fast, context)

    @pytest.mark.parametrize("restarts", [None, *RESTARTS], ids=["no restarts", "rows=1", "rows=2", "blocks=7"])
    @pytest.mark.parametrize("encoding", ["444", "422", "420", "Gray"])
    def test_every_window_at_every_scale_decodes_as_the_whole_image(self, encoding, restarts):
        """Exhaustive on one image of odd size: every first row, at every scale, with and without the
        context rows that smooth upsampling reads. Without them, or with the copy's restart
        markers left unrenumbered, some rows differ."""
        data = encoded((203, 77), encoding, restarts)
        tops = set()
        for denominator in (1, 2, 4, 8):
            scaled = -(-203 // denominator)
            for first in range(scaled):
                for last in {first + 1, min(scaled, first + 9), scaled}:
                    for fast, context in ((False, True), (True, True), (True, False)):
                        tops.add(window_matches(data, (first, last), denominator, fast, context))
        if restarts is None:
            assert tops == {0, None}  # cut below only
        else:
            assert len(tops - {None, 0}) >= 1  # windows start below the top

    def test_the_scale_is_exact_where_the_pixels_are_those_of_that_scale(self):
        """Against Pillow's draft mode, which sets libjpeg's scale itself: where ``scale_is_exact``
        says so, simplejpeg asked for the size at 1/d gives Pillow's pixels at 1/d; elsewhere
        (images a few pixels across) TurboJPEG takes a larger scale, and some pixels differ."""
        compared, differing = 0, 0
        for denominator in (2, 4, 8):
            for height in range(1, 20):
                for width in range(1, 20):
                    data = encoded((height, width), "444")
                    size = (-(-height // denominator), -(-width // denominator))
                    with Image.open(io.BytesIO(data)) as image:
                        image.draft("RGB", (max(1, width // denominator), max(1, height // denominator)))
                        if image.size != size[::-1]:
                            continue  # Pillow chose another scale
                        reference = np.asarray(image.convert("RGB"))
                    pixels = simplejpeg.decode_jpeg(data, min_height=size[0], min_width=size[1])
                    if scale_is_exact(denominator, height, width):
                        np.testing.assert_array_equal(pixels, reference, err_msg=f"{height}x{width} at 1/{denominator}")
                        compared += 1
                    else:
                        differing += not np.array_equal(pixels, reference)
        assert compared > 500 and differing >= 1

    def test_many_restart_intervals_per_row_are_cut_below_only(self):
        """Finding and renumbering a marker per MCU in Python would cost more than the rows save."""
        data = encoded((200, 640), "420", {"restart_marker_blocks": 1})
        assert row_window(data, 100, 120)[1] == 0
        assert row_window(encoded((200, 640), "420", {"restart_marker_blocks": 20}), 100, 120)[1] > 0  # 2 per row

    def test_bad_rows_and_headers(self):
        data = encoded((200, 64), "420", {"restart_marker_rows": 1})
        for first, last in ((50, 50), (60, 50), (-1, 10), (200, 210)):
            with pytest.raises(ValueError, match="rows must satisfy"):
                row_window(data, first, last)
        frame = data.index(b"\xff\xc0")
        assert row_window(data[: frame + 11] + b"\x40" + data[frame + 12 :], 100, 120) is None  # a factor of 0
        second = data[:frame] + data[frame : frame + 19] + data[frame:]  # the frame header twice
        assert row_window(second, 100, 120) is None
        tail = data + encoded((32, 32), "420", {"restart_marker_rows": 1})  # a second JPEG after the end (MPF)
        copy, top, declared = row_window(tail, 150, 200)
        assert top > 0 and copy.count(b"\xff\xd9") == 1 and copy.endswith(b"\xff\xd9")
        np.testing.assert_array_equal(
            simplejpeg.decode_jpeg(copy, strict=False)[150 - top :], simplejpeg.decode_jpeg(data)[150:]
        )

    def test_only_single_scan_sequential_jpegs_are_cut(self):
        image = photo((200, 64))
        image.save(baseline := io.BytesIO(), "JPEG", quality=90)
        image.save(progressive := io.BytesIO(), "JPEG", quality=90, progressive=True)
        assert row_window(baseline.getvalue(), 40, 50) is not None
        assert row_window(progressive.getvalue(), 40, 50) is None
        assert row_window(baseline.getvalue(), 40, 190) is None  # nothing to save
        assert row_window(b"not a jpeg", 40, 50) is None
        data = baseline.getvalue()
        assert row_window(data[:20], 40, 50) is None  # a cut header
        assert frame_size(data) == (200, 64) and frame_size(progressive.getvalue()) == (200, 64)
        assert frame_size(data[:20]) is None and frame_size(b"not a jpeg") is None
        padded = data[:2] + b"\xff\x01\xff\xff\xff" + data[2:]  # a standalone marker, then fill bytes
        assert frame_size(padded) == (200, 64)
        copy, top, declared = row_window(padded, 40, 50)
        assert top == 0 and simplejpeg.decode_jpeg(copy, strict=False).shape == (declared, 64, 3)
        scan = data.index(b"\xff\xda")
        one_component = data[: scan + 4] + b"\x01" + data[scan + 5 :]  # a first scan of one component of three
        assert row_window(one_component, 40, 50) is None  # other scans follow it: left whole

    def test_restart_markers_out_of_place_leave_the_rows_above(self):
        """A window starts at a restart marker only where the markers are where the restart
        interval puts them, in sequence; otherwise it is cut below only."""
        data = encoded((200, 64), "420", {"restart_marker_rows": 1})
        copy, top, declared = row_window(data, 100, 120)
        assert (top, declared) == (80, 64) and copy.count(b"\xff\xd0") == 1  # RST0 in the copy, once
        markers = [found.start() for found in re.finditer(rb"\xff[\xd0-\xd7]", data)]
        assert len(markers) == 200 // 16  # one between every two of the 13 MCU rows
        swapped = bytearray(data)
        swapped[markers[6] + 1] = 0xD1  # RST6, inside the window, turned RST1
        assert row_window(bytes(swapped), 100, 120)[1] == 0
        missing = data[: markers[1]] + data[markers[1] + 2 :]  # RST1 gone
        assert row_window(missing, 100, 120)[1] == 0
        np.testing.assert_array_equal(  # both still decode right from the top
            simplejpeg.decode_jpeg(row_window(bytes(swapped), 100, 120)[0], strict=False)[:120],
            simplejpeg.decode_jpeg(bytes(swapped), strict=False)[:120],
        )
