"""gpuload.transforms.functional: each op's pixels against torchvision's functional op on real photos."""

import math

import pytest
import torch
from test_augment import photo_tensor
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from gpuload import UsageError
from gpuload.transforms import functional
from gpuload.transforms.functional import OPS, affine, affine_matrices, apply_op, apply_ops, op_codes

SIZES = [(224, 224), (176, 176), (131, 257), (300, 200)]
GEOMETRIC = {"shear_x": [0.3, -0.99], "shear_y": [0.2, -0.5], "translate_x": [10, -32], "translate_y": [7, -20]}
GEOMETRIC["rotate"] = [30.0, -45.0, 90.0, 135.0]
COLOUR = {
    "brightness": [0.1, 1.5, 1.99],
    "color": [0.1, 0.567, 1.7],
    "contrast": [0.2, 1.9],
    "sharpness": [0.1, 1.99],
    "posterize": [0, 1, 4, 6, 8],
    "solarize": [0.0, 128.0, 191.25, 255.0],
    "autocontrast": [0.0],
    "equalize": [0.0],
    "invert": [0.0],
}
FILLS = [None, (124.0, 116.0, 104.0)]


def torchvision_op(image: torch.Tensor, name: str, value: float, interpolation: str = "nearest", fill=None):
    """What torchvision's policies call for op ``name`` with functional argument ``value``
    (``_AutoAugmentBase._apply_image_or_video_transform``)."""
    fill = None if fill is None else list(fill)
    geometry = {"interpolation": interpolation, "fill": fill}
    if name == "shear_x":
        shear = [math.degrees(math.atan(value)), 0.0]
        return F.affine(image, angle=0.0, translate=[0, 0], scale=1.0, shear=shear, center=[0, 0], **geometry)
    if name == "shear_y":
        shear = [0.0, math.degrees(math.atan(value))]
        return F.affine(image, angle=0.0, translate=[0, 0], scale=1.0, shear=shear, center=[0, 0], **geometry)
    if name in ("translate_x", "translate_y"):
        translate = [int(value), 0] if name == "translate_x" else [0, int(value)]
        return F.affine(image, angle=0.0, translate=translate, scale=1.0, shear=[0.0, 0.0], **geometry)
    if name == "rotate":
        return F.rotate(image, value, **geometry)
    adjust = {
        "brightness": F.adjust_brightness,
        "color": F.adjust_saturation,
        "contrast": F.adjust_contrast,
        "sharpness": F.adjust_sharpness,
    }
    if name in adjust:
        return adjust[name](image, value)
    if name == "posterize":
        return F.posterize(image, int(value))
    if name == "solarize":
        return F.solarize(image, value)
    return {"autocontrast": F.autocontrast, "equalize": F.equalize, "invert": F.invert}[name](image)


def differing(first: torch.Tensor, second: torch.Tensor) -> tuple[int, float]:
    """The largest difference in grey levels, and the share of values that differ."""
    gap = (first.int() - second.int()).abs()
    return int(gap.max()), float((gap > 0).float().mean())


class TestParity:
    """Each op equals torchvision's functional op on the same uint8 image, pixel for pixel (eager, on the
    CPU: the same float32 formulas, truncations and roundings)."""

    @pytest.mark.parametrize("size", SIZES)
    @pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
    @pytest.mark.parametrize("fill", FILLS)
    @pytest.mark.parametrize("name", sorted(GEOMETRIC))
    def test_geometric_ops(self, size, interpolation, fill, name):
        image = photo_tensor(*size)
        for value in GEOMETRIC[name]:
            ours = apply_op(image[None], name, value, interpolation=interpolation, fill=fill)[0]
            assert differing(ours, torchvision_op(image, name, value, interpolation, fill)) == (0, 0.0), value

    @pytest.mark.parametrize("size", SIZES)
    @pytest.mark.parametrize("name", sorted(COLOUR))
    def test_colour_ops(self, size, name):
        image = photo_tensor(*size)
        for value in COLOUR[name]:
            assert torch.equal(apply_op(image[None], name, value)[0], torchvision_op(image, name, value)), value

    def test_sharpness_of_an_image_two_pixels_high_is_the_image(self):
        image = photo_tensor(2, 40)
        assert torch.equal(apply_op(image[None], "sharpness", 0.2)[0], F.adjust_sharpness(image, 0.2)) and torch.equal(
            apply_op(image[None], "sharpness", 0.2)[0], image
        )

    def test_equalize_and_autocontrast_of_a_flat_image_leave_it(self):
        image = torch.full((1, 3, 8, 8), 77, dtype=torch.uint8)
        for name in ("equalize", "autocontrast"):
            assert torch.equal(apply_op(image, name), image)
            assert torch.equal(torchvision_op(image[0], name, 0.0), image[0])


class TestBatch:
    @pytest.mark.parametrize("branchless", [False, True], ids=["grouped", "branchless"])
    def test_each_sample_gets_its_own_op_and_value_as_if_alone(self, branchless, monkeypatch):
        """A batch of every op with its own value: each sample as torchvision's op on it alone, whether the
        samples of each op are computed apart (eager on a CPU) or all ops on all samples in one branchless
        pass (on a GPU and under ``torch.compile``; forced here eagerly)."""
        monkeypatch.setattr(functional, "_traced", lambda: branchless)
        images = torch.stack([photo_tensor(96, 128), photo_tensor(96, 128).flip(2)] * 8)[: len(OPS) - 1]
        names = [name for name in OPS if name != "solarize_add"]
        values = [0.0, 0.3, -0.4, 11, -9, 33.0, 1.4, 0.3, 1.8, 0.2, 3, 140.0, 0.0, 0.0, 0.0]
        out = apply_ops(images, torch.tensor(op_codes(names)), torch.tensor(values), fill=(10.0, 20.0, 30.0))
        for sample, image, name, value in zip(out, images, names, values):
            expected = image if name == "identity" else torchvision_op(image, name, value, fill=(10.0, 20.0, 30.0))
            assert torch.equal(sample, expected), name

    @pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
    def test_the_output_keeps_the_layout_and_a_float_batch_stays_float(self, layout):
        images = photo_tensor(40, 60)[None].repeat(3, 1, 1, 1).contiguous(memory_format=layout)
        ops, values = torch.tensor(op_codes(["rotate", "equalize", "color"])), torch.tensor([20.0, 0.0, 0.5])
        out = apply_ops(images, ops, values)
        assert out.dtype == torch.uint8 and out.is_contiguous(memory_format=layout)
        floats = apply_ops(images.float(), ops, values)
        assert floats.dtype == torch.float32 and torch.equal(floats.to(torch.uint8), out)

    def test_solarize_add_adds_below_128_and_saturates(self):
        images = torch.tensor([0, 100, 127, 128, 250], dtype=torch.uint8).view(1, 1, 1, 5).expand(1, 3, 1, 5)
        assert apply_op(images, "solarize_add", 30.0)[0, 0, 0].tolist() == [30, 130, 157, 128, 250]
        assert apply_op(images, "solarize_add", 200.0)[0, 0, 0].tolist() == [200, 255, 255, 128, 250]


class TestMasks:
    @pytest.mark.parametrize(
        "name, value", [("rotate", 30.0), ("shear_x", 0.5), ("translate_y", -13), ("shear_y", 0.2)]
    )
    @pytest.mark.parametrize("branchless", [False, True], ids=["grouped", "branchless"])
    def test_masks_follow_the_geometry_by_their_nearest_pixel(self, name, value, branchless, monkeypatch):
        """torchvision moves a ``tv_tensors.Mask`` with the same affine, nearest, its fill 0."""
        monkeypatch.setattr(functional, "_traced", lambda: branchless)
        image = photo_tensor(64, 80)
        masks = (photo_tensor(64, 80)[0] // 64).to(torch.int64)[None]  # 4 classes
        out, moved = apply_op(image[None], name, value, interpolation="bilinear", masks=masks)
        expected = torchvision_op(tv_tensors.Mask(masks), name, value)
        assert torch.equal(moved, expected.as_subclass(torch.Tensor)) and moved.dtype == torch.int64
        assert out.shape == (1, 3, 64, 80)

    def test_an_ignore_index_fills_the_masks_and_colour_ops_leave_them(self):
        masks = torch.ones((2, 1, 16, 16), dtype=torch.uint8)
        images = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
        ops = torch.tensor(op_codes(["translate_x", "equalize"]))
        _, moved = apply_ops(images, ops, torch.tensor([5.0, 0.0]), masks=masks, mask_fill=255)
        assert moved.shape == masks.shape and moved.dtype == torch.uint8
        assert (moved[0, 0, :, :5] == 255).all() and (moved[0, 0, :, 5:] == 1).all()
        assert torch.equal(moved[1], masks[1])


def test_affine_matrices_are_torchvisions():
    from torchvision.transforms.v2.functional._geometry import _get_inverse_affine_matrix

    cases = [(30.0, (3.0, -2.0), (10.0, 0.0), (0.0, 0.0)), (-70.0, (0.0, 5.0), (0.0, -20.0), (-12.0, -8.0))]
    for angle, translate, shear, centre in cases:
        one = torch.ones(1)
        ours = affine_matrices(
            angle=one * angle,
            translate=(one * translate[0], one * translate[1]),
            shear=(one * shear[0], one * shear[1]),
            centre=(one * centre[0], one * centre[1]),
        )
        theirs = _get_inverse_affine_matrix(list(centre), angle, list(translate), 1.0, list(shear))
        torch.testing.assert_close(ours.view(-1), torch.tensor(theirs, dtype=torch.float32))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: apply_op(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), "rotate", 1.0), r"RGB images \[B, 3, H, W\]"),
        (lambda: apply_op(torch.zeros(2, 3, 4, 4, dtype=torch.int32), "rotate", 1.0), "uint8 images"),
        (lambda: apply_op(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), "spin", 1.0), "unknown op 'spin'"),
        (
            lambda: apply_op(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), "rotate", interpolation="cubic"),
            "interpolation",
        ),
        (lambda: apply_op(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), "rotate", fill=(1, 2)), "fill must be one value"),
        (
            lambda: apply_ops(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.zeros(3), torch.zeros(2)),
            r"ops must be one per sample, \[2\], got \[3\]",
        ),
        (
            lambda: apply_op(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), "rotate", masks=torch.zeros(2, 5, 4)),
            r"masks must be \[B, H, W\]",
        ),
        (  # two channels of masks: torch's "shape is invalid" from the reshape before the shared check
            lambda: apply_op(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), "rotate", masks=torch.zeros(2, 2, 4, 4)),
            r"masks must be \[B, H, W\] or \[B, 1, H, W\] beside images \[2, 3, 4, 4\], got \[2, 2, 4, 4\]",
        ),
    ],
)
def test_bad_input(call, message):
    with pytest.raises(UsageError, match=message):
        call()


def test_affine_pads_with_the_fill_and_keeps_whole_numbers():
    pixels = torch.arange(16.0).view(1, 1, 4, 4)
    zero = torch.zeros(1)
    matrix = affine_matrices(angle=zero + 10, translate=(zero, zero), shear=(zero, zero), centre=(zero, zero))
    out, _ = affine(pixels, matrix, interpolation="bilinear", fill=100.0)
    assert torch.equal(out, out.round()) and out.max() <= 100
