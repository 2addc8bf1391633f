import errno
import os

import numpy as np
import pytest
import torch
from conftest import BAD_FILES, NOT_FILES, ODD_KINDS, SIZE, photo, write_bad_file, write_odd_image
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

import gpuload.writing.decode
from gpuload import GpuloadError
from gpuload.writing.decode import (
    RESIZE_MODES,
    DecodeError,
    _fit,
    check_image,
    check_target,
    decode_image,
    decode_into,
    exif_orientation,
    pixel_limit,
    read_bytes,
    read_size,
    upright_pixels,
)


def mean_abs_diff(tensor: torch.Tensor, image: Image.Image) -> float:
    expected = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)
    return (tensor.float() - expected.float()).abs().mean().item()


class TestBadFiles:
    @pytest.mark.parametrize("name", sorted(BAD_FILES))
    def test_raises_decode_error_naming_file_and_reason(self, tmp_path, name):
        path = write_bad_file(tmp_path, name)
        with pytest.raises(DecodeError, match=BAD_FILES[name]) as caught:
            decode_image(path)
        assert caught.value.path == str(path)
        assert str(path) in str(caught.value)

    def test_decompression_bomb_is_refused_before_decoding(self, tmp_path, monkeypatch):
        path = tmp_path / "big.jpg"
        photo().save(path)
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
        with pytest.raises(DecodeError, match="decompression bomb"):
            read_size(path)
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", SIZE[0] * SIZE[1] - 1)  # Pillow only warns here
        with pytest.warns(Image.DecompressionBombWarning), pytest.raises(DecodeError, match="MAX_IMAGE_PIXELS"):
            decode_image(path)

    def test_too_many_pixels_says_how_to_raise_the_limit_on_the_command_line_too(self, tmp_path, monkeypatch):
        path = tmp_path / "big.jpg"
        photo().save(path)
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3000)
        with pytest.warns(Image.DecompressionBombWarning), pytest.raises(DecodeError) as caught:
            read_size(path)
        assert str(caught.value) == (
            f"{path}: 64x48 = 3,072 pixels, more than PIL.Image.MAX_IMAGE_PIXELS = 3,000 (a possible decompression "
            "bomb); for trusted files, raise the limit: --max-pixels N on the command line, "
            "PIL.Image.MAX_IMAGE_PIXELS = N in Python"
        )
        with pixel_limit(3072):
            assert read_size(path) == SIZE
        assert Image.MAX_IMAGE_PIXELS == 3000  # put back

    def test_missing_file(self, tmp_path):
        with pytest.raises(DecodeError, match="cannot read"):
            decode_image(tmp_path / "nope.jpg")

    def test_decode_error_pickles(self, tmp_path):
        import pickle

        error = pickle.loads(pickle.dumps(DecodeError(tmp_path / "x.jpg", "empty file")))
        assert (error.path, error.reason) == (str(tmp_path / "x.jpg"), "empty file")


class TestOnlyDamageIsDamage:
    """Only what the decoders say about a file's bytes is a DecodeError; anything else propagates."""

    def test_a_bug_after_decoding_propagates_with_its_type(self, tmp_path, monkeypatch):
        photo().save(tmp_path / "a.jpg")
        monkeypatch.setattr(gpuload.writing.decode, "_fit", lambda *args: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            decode_image(tmp_path / "a.jpg", (10, 10))

    @pytest.mark.parametrize("error", [MemoryError, KeyboardInterrupt, RuntimeError])
    def test_errors_inside_the_decoder_that_are_not_damage_propagate(self, tmp_path, monkeypatch, error):
        photo().save(tmp_path / "a.png")

        def load(self):
            raise error("not the file's fault")

        monkeypatch.setattr(Image.Image, "load", load)
        with pytest.raises(error):
            decode_image(tmp_path / "a.png")

    def test_decode_errors_are_gpuload_errors_not_value_errors(self, tmp_path):
        with pytest.raises(GpuloadError) as caught:
            decode_image(write_bad_file(tmp_path, "corrupt.jpg"))
        assert not isinstance(caught.value, ValueError)

    @pytest.mark.parametrize("name", ["truncated_eoi.jpg", "corrupt.jpg", "extraneous.jpg", "corrupt_mpo.jpg"])
    def test_jpegs_that_pillow_accepts_with_grey_blocks_are_damaged(self, tmp_path, name):
        path = write_bad_file(tmp_path, name)
        Image.open(path).load()  # Pillow decodes it without a word
        with pytest.raises(
            DecodeError, match=r"truncated or corrupt JPEG \(libjpeg: (Corrupt JPEG data|Premature end)"
        ):
            decode_image(path, (24, 32))


class TestOddSizes:
    """Every valid image fits every target in every mode (a float rounding once made crop boxes negative)."""

    @settings(max_examples=300, deadline=None)
    @given(
        image_size=st.tuples(st.integers(1, 4000), st.integers(1, 4000)),
        target=st.sampled_from([(480, 640), (224, 224), (1, 1), (37, 1000), (1000, 37), (201, 382), (640, 480)]),
        resize=st.sampled_from(RESIZE_MODES),
    )
    def test_fit_gives_the_target_size(self, image_size, target, resize):
        width, height = image_size
        colour = torch.tensor([200, 100, 50], dtype=torch.uint8).view(3, 1, 1)
        out = _fit(colour.expand(3, height, width), target, resize)
        assert out.shape == (3, *target) and out.dtype == torch.uint8
        if resize != "pad":  # padding adds black borders; the rest keeps the one colour
            assert torch.equal(out, colour.expand(3, *target))

    @pytest.mark.parametrize("width, height", [(382, 201), (319, 505), (641, 479), (1, 1), (3000, 2)])
    @pytest.mark.parametrize("resize", RESIZE_MODES)
    def test_real_jpegs_of_odd_sizes_decode_at_the_target(self, tmp_path, width, height, resize):
        path = tmp_path / "odd.jpg"
        photo((height, width)).save(path, quality=90)
        assert decode_image(path, (480, 640), resize).shape == (3, 480, 640)


class TestModes:
    @pytest.mark.parametrize("kind", sorted(ODD_KINDS))
    def test_becomes_rgb_uint8_as_displayed(self, tmp_path, kind):
        expected = write_odd_image(tmp_path / ODD_KINDS[kind], kind)
        decoded = decode_image(tmp_path / ODD_KINDS[kind])
        assert decoded.dtype == torch.uint8
        assert decoded.shape == (3, expected.height, expected.width)
        assert mean_abs_diff(decoded, expected) < 1.5

    def test_sixteen_bit_keeps_the_high_byte(self, tmp_path):
        values = np.array([[0, 255, 256, 32768, 65535]], dtype=np.uint16)
        Image.fromarray(values).save(tmp_path / "ramp.png")
        decoded = decode_image(tmp_path / "ramp.png")
        assert decoded[:, 0].tolist() == [[0, 0, 1, 128, 255]] * 3

    def test_exif_rotation_swaps_the_reported_size(self, tmp_path):
        write_odd_image(tmp_path / "rotated.jpg", "exif_rotated")
        with Image.open(tmp_path / "rotated.jpg") as image:
            assert exif_orientation(image, tmp_path / "rotated.jpg") == 6
            assert image.size == (SIZE[0], SIZE[1])  # stored sideways: width is the display height
        assert read_size(tmp_path / "rotated.jpg") == SIZE

    def test_grayscale_has_three_equal_channels(self, tmp_path):
        write_odd_image(tmp_path / "gray.jpg", "grayscale")
        decoded = decode_image(tmp_path / "gray.jpg")
        assert torch.equal(decoded[0], decoded[1]) and torch.equal(decoded[1], decoded[2])


class TestResize:
    @pytest.fixture
    def wide(self, tmp_path):
        path = tmp_path / "wide.png"  # lossless, so pixels can be compared exactly
        image = photo((40, 80))
        image.save(path)
        return path, image

    @pytest.mark.parametrize("resize", ["crop", "pad", "stretch"])
    def test_every_mode_gives_the_target_size(self, wide, resize):
        assert decode_image(wide[0], (30, 30), resize).shape == (3, 30, 30)

    def test_crop_keeps_the_centre(self, wide):
        path, image = wide
        decoded = decode_image(path, (40, 40), "crop")
        assert mean_abs_diff(decoded, image.crop((20, 0, 60, 40))) == 0

    def test_pad_adds_black_borders_and_keeps_everything(self, wide):
        path, image = wide
        decoded = decode_image(path, (80, 80), "pad")
        assert decoded[:, :20].sum() == 0 and decoded[:, 60:].sum() == 0
        assert mean_abs_diff(decoded[:, 20:60], image) == 0

    def test_stretch_matches_pillow_resize(self, wide):
        path, image = wide
        decoded = decode_image(path, (40, 40), "stretch")
        assert mean_abs_diff(decoded, image.resize((40, 40), Image.Resampling.BILINEAR)) == 0

    def test_same_size_is_untouched(self, wide):
        path, image = wide
        assert mean_abs_diff(decode_image(path, (40, 80)), image) == 0

    def test_large_jpeg_is_decoded_at_reduced_scale_with_little_difference(self, tmp_path):
        path = tmp_path / "large.jpg"
        photo((600, 800)).save(path, quality=95)
        with Image.open(path) as image:
            full = image.convert("RGB").resize((160, 120), Image.Resampling.BILINEAR)
        with Image.open(path) as image:
            image.draft(None, (320, 240))  # twice the target
            assert image.size == (400, 300)  # Pillow picks a DCT scale of 1/2 for this request
            drafted = image.convert("RGB").resize((160, 120), Image.Resampling.BILINEAR)
        decoded = decode_image(path, (120, 160), "stretch")
        assert mean_abs_diff(decoded, drafted) < 0.01  # the same pixels but for the resize's rounding
        assert mean_abs_diff(decoded, full) < 1.0


class TestCheckTarget:
    @pytest.mark.parametrize("size", [(0, 10), (10,), (-1, 5), (1.5, 2), "480x640"])
    def test_rejects_bad_sizes(self, size):
        with pytest.raises(ValueError, match="size must be two positive integers"):
            check_target(size, "crop")

    def test_rejects_unknown_mode(self):
        with pytest.raises(ValueError, match="resize must be one of crop, pad, stretch"):
            check_target((1, 1), "zoom")

    def test_rejects_impossibly_large_targets(self):
        with pytest.raises(ValueError, match="more than PIL.Image.MAX_IMAGE_PIXELS"):
            check_target((100_000, 100_000), "crop")

    def test_the_size_in_the_message_is_width_x_height(self, monkeypatch):
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
        with pytest.raises(ValueError, match=r"^size 64x48 has 3,072 pixels per image, more than PIL"):
            check_target((48, 64), "crop")  # (height, width): 64 wide


class TestDecodeInto:
    @pytest.mark.parametrize(
        ("size", "kind"), [((60, 80), None), ((48, 64), "exif_rotated"), ((48, 64), "grayscale"), ((48, 64), "cmyk")]
    )
    @pytest.mark.parametrize("resize", ["crop", "pad", "stretch"])
    def test_writes_the_pixels_of_decode_image_channels_last(self, tmp_path, size, kind, resize):
        path = tmp_path / "a.jpg"
        if kind is None:
            photo(size).save(path, quality=90)
        else:
            write_odd_image(path, kind)
        out = np.full((30, 40, 3), 7, np.uint8)
        decode_into(path, out, resize)
        assert np.array_equal(out, decode_image(path, (30, 40), resize).permute(1, 2, 0).numpy())

    def test_an_upright_rgb_jpeg_of_the_target_size_is_decoded_straight_into_the_buffer(self, tmp_path, monkeypatch):
        """No transposition and no copy: libjpeg-turbo writes the pixels where they are stored."""
        photo((30, 40)).save(tmp_path / "a.jpg", quality=90)
        out = np.full((30, 40, 3), 7, np.uint8)
        buffers, real = [], gpuload.writing.decode.simplejpeg.decode_jpeg

        def decode_jpeg(*args, buffer=None, **kwargs):
            buffers.append(buffer)
            return real(*args, buffer=buffer, **kwargs)

        monkeypatch.setattr(gpuload.writing.decode.simplejpeg, "decode_jpeg", decode_jpeg)
        monkeypatch.setattr(gpuload.writing.decode.np, "copyto", None)  # any copy would fail
        decode_into(tmp_path / "a.jpg", out, "crop")
        assert len(buffers) == 1 and buffers[0] is out
        monkeypatch.undo()
        assert np.array_equal(out, decode_image(tmp_path / "a.jpg").permute(1, 2, 0).numpy())

    def test_a_damaged_jpeg_of_the_target_size_is_still_reported(self, tmp_path):
        path = write_bad_file(tmp_path, "corrupt.jpg")
        with pytest.raises(DecodeError, match="truncated or corrupt JPEG"):
            decode_into(path, np.zeros((*read_size(path), 3), np.uint8), "crop")

    def test_check_image_decodes_and_gives_the_stored_orientation_and_the_upright_size(self, tmp_path):
        write_odd_image(tmp_path / "rotated.jpg", "exif_rotated")
        assert check_image(tmp_path / "rotated.jpg") == (6, SIZE)
        data = (tmp_path / "rotated.jpg").read_bytes()
        assert check_image(tmp_path / "named-only.jpg", data) == (6, SIZE)  # the bytes given, not read again
        with pytest.raises(DecodeError, match="truncated or corrupt JPEG"):
            check_image(write_bad_file(tmp_path, "corrupt.jpg"))

    @pytest.mark.parametrize("orientation", range(1, 9))
    def test_a_tiff_orientation_is_applied_once(self, tmp_path, orientation):
        """Pillow turns a TIFF upright when it loads it (and gives its size upright): gpuload must not
        turn it again; ffmpeg does not apply the tag, so check_image still gives it for compress."""
        upright = photo((40, 64))
        upright.save(tmp_path / "tagged.tif", tiffinfo={274: orientation})
        with Image.open(tmp_path / "tagged.tif") as image:
            assert image.getexif().get(274) == orientation
            shown = np.asarray(ImageOps.exif_transpose(image).convert("RGB"))  # Pillow's reading of the tag
        decoded = decode_image(tmp_path / "tagged.tif").permute(1, 2, 0).numpy()
        np.testing.assert_array_equal(decoded, shown)
        assert read_size(tmp_path / "tagged.tif") == shown.shape[:2]
        assert check_image(tmp_path / "tagged.tif") == (orientation, shown.shape[:2])


@pytest.mark.parametrize("kind", ["exif_rotated", "palette"])
def test_upright_pixels_are_decode_image_s_in_height_width_channel_order(tmp_path, kind):
    write_odd_image(tmp_path / "a.png", kind) if kind == "palette" else write_odd_image(tmp_path / "a.jpg", kind)
    path = next(tmp_path.iterdir())
    pixels = upright_pixels(path)
    assert pixels.flags.c_contiguous and pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels, decode_image(path).permute(1, 2, 0).numpy())


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_is_shown_as_pillow_shows_it(tmp_path, orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    photo((40, 60)).save(tmp_path / "o.png", exif=exif.tobytes())  # lossless: the pixels can be compared exactly
    with Image.open(tmp_path / "o.png") as image:
        expected = ImageOps.exif_transpose(image).convert("RGB")
    assert mean_abs_diff(decode_image(tmp_path / "o.png"), expected) == 0


class TestBoundedWork:
    @pytest.mark.parametrize("width, height", [(4000, 2), (2, 4000), (20000, 1)])
    @pytest.mark.parametrize("resize", RESIZE_MODES)
    def test_never_resizes_more_pixels_than_the_image_or_the_target_has(
        self, tmp_path, monkeypatch, width, height, resize
    ):
        """A 1x20000 image cropped to 480x640 was first scaled to 640x12800000 pixels (a 2x4000 PNG took 8 s
        and 3.2 GB): only the part that is kept may be resized."""
        Image.fromarray(np.full((height, width, 3), 90, np.uint8)).save(tmp_path / "thin.png")
        sizes = []
        real = gpuload.writing.decode.resize_image
        monkeypatch.setattr(
            gpuload.writing.decode, "resize_image", lambda chw, size: sizes.append(size) or real(chw, size)
        )
        assert decode_image(tmp_path / "thin.png", (480, 640), resize).shape == (3, 480, 640)
        assert all(h * w <= 4 * 480 * 640 for h, w in sizes)


class TestEnvironmentErrors:
    @pytest.mark.parametrize("code", [errno.EMFILE, errno.ENOMEM, errno.ESTALE, errno.EINTR])
    def test_errors_of_the_machine_are_not_damaged_files(self, tmp_path, monkeypatch, code):
        photo().save(tmp_path / "a.jpg")

        def failing_open(*args, **kwargs):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr("builtins.open", failing_open)
        with pytest.raises(OSError) as caught:
            decode_image(tmp_path / "a.jpg")
        assert not isinstance(caught.value, DecodeError) and caught.value.errno == code

    @pytest.mark.parametrize("kind", sorted(NOT_FILES))
    def test_what_is_not_a_regular_file_is_reported_and_never_opened(self, tmp_path, make_not_a_file, kind):
        """A named pipe would block the open until a writer comes, /dev/zero would be read forever."""
        path = make_not_a_file(tmp_path / "a.jpg", kind)
        for read in (read_bytes, read_size, decode_image):
            with pytest.raises(DecodeError) as caught:
                read(path)
            assert str(caught.value) == (
                f"{path}: not a regular file ({NOT_FILES[kind]}): not opened; images must be regular files"
            )

    @pytest.mark.parametrize("make", ["missing", "folder", "unreadable"])
    def test_files_that_cannot_be_read_are_reported(self, tmp_path, make):
        path = tmp_path / "a.jpg"
        if make == "folder":
            path.mkdir()
        elif make == "unreadable":
            photo().save(path)
            path.chmod(0)
            if os.access(path, os.R_OK):  # root reads anything
                pytest.skip("running as root: the permission cannot be taken away")
        with pytest.raises(DecodeError, match="cannot read"):
            decode_image(path)
