import math

import numpy as np
import pytest
import torch
from conftest import photo
from torch import nn
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from gpuload import IMAGENET_MEAN, IMAGENET_STD, Normalize, RandomResizedCrop, UsageError
from gpuload.transforms.augment import _jitter, interpolation_weights, resample, resized_crop_params


def photo_tensor(height: int = 480, width: int = 640) -> torch.Tensor:
    """grace_hopper.jpg as a real photo of ``height x width``, uint8 [3, H, W]."""
    return torch.from_numpy(np.array(photo((height, width)))).permute(2, 0, 1).contiguous()


def ks_statistic(first: torch.Tensor, second: torch.Tensor) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs."""
    values = torch.cat([first, second]).sort().values
    cdf = [torch.searchsorted(sample.sort().values, values, right=True) / len(sample) for sample in (first, second)]
    return float((cdf[0] - cdf[1]).abs().max())


def apply_boxes(images: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """gpuload's resampling of given boxes (the module draws its own)."""
    top, left, height, width = boxes.unbind(1)
    weights_y = interpolation_weights(top, height / size, top, top + height, size, images.shape[2])
    weights_x = interpolation_weights(left, width / size, left, left + width, size, images.shape[3])
    out = torch.matmul(weights_y[:, None], torch.matmul(images.float(), weights_x.transpose(1, 2)[:, None]))
    return out.round().clamp(0, 255).to(torch.uint8)


def mad(first: torch.Tensor, second: torch.Tensor) -> float:
    return float((first.float() - second.float()).abs().mean())


class TestParameters:
    @pytest.mark.parametrize("height, width", [(480, 640), (100, 1000), (37, 29)])
    def test_distribution_equals_torchvision_get_params(self, height, width):
        """10,000 draws each; (100, 1000) is too wide for the ratio range, so the centre-crop fallback runs."""
        draws = 10_000
        ours = resized_crop_params(draws, height, width, generator=torch.Generator().manual_seed(0))
        torch.manual_seed(1)
        image = torch.empty(1, height, width)
        theirs = torch.tensor(
            [v2.RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(draws)],
            dtype=torch.float32,
        )
        for name, statistic in (
            ("area fraction", lambda boxes: boxes[:, 2] * boxes[:, 3] / (height * width)),
            ("log aspect ratio", lambda boxes: torch.log(boxes[:, 3] / boxes[:, 2])),
            ("top", lambda boxes: boxes[:, 0]),
            ("left", lambda boxes: boxes[:, 1]),
        ):
            assert ks_statistic(statistic(ours), statistic(theirs)) <= 0.05, name

    @pytest.mark.parametrize("seed", range(5))
    def test_boxes_are_whole_pixels_inside_the_image(self, seed):
        boxes = resized_crop_params(1000, 50, 70, generator=torch.Generator().manual_seed(seed))
        top, left, height, width = boxes.unbind(1)
        assert torch.equal(boxes, boxes.round())
        assert (top >= 0).all() and (left >= 0).all() and (height >= 1).all() and (width >= 1).all()
        assert (top + height <= 50).all() and (left + width <= 70).all()


class TestPixels:
    @pytest.mark.parametrize("height, width", [(480, 640), (640, 480), (300, 301)])
    def test_given_boxes_match_torchvision_resized_crop_with_antialias(self, height, width):
        image = photo_tensor(height, width)
        boxes = resized_crop_params(16, height, width, generator=torch.Generator().manual_seed(height))
        ours = apply_boxes(image[None].expand(16, -1, -1, -1), boxes, 224)
        for sample, box in zip(ours, boxes.int().tolist()):
            reference = F.resized_crop(image, *box, [224, 224], antialias=True)
            assert mad(sample, reference) <= 0.6
            if box[2] > 2 * 224:  # strong downscaling: without antialiasing the gap is several times larger
                assert mad(F.resized_crop(image, *box, [224, 224], antialias=False), reference) > 2 * mad(
                    sample, reference
                )

    @pytest.mark.parametrize("height, width", [(480, 640), (640, 480), (256, 256), (224, 900)])
    def test_eval_matches_resize_256_then_centre_crop_224(self, height, width):
        image = photo_tensor(height, width)
        ours = RandomResizedCrop(224, flip=True, brightness=0.5).eval()(image[None])[0]
        reference = v2.CenterCrop(224)(v2.Resize(256, antialias=True)(image))
        assert ours.shape == reference.shape == (3, 224, 224)
        assert mad(ours, reference) <= 0.6

    def test_the_module_draws_boxes_and_resamples_them_as_torchvision(self):
        """forward() itself, not a helper: its boxes are the first draws of its generator."""
        image = photo_tensor()
        out = RandomResizedCrop(224)(image[None].expand(8, -1, -1, -1), generator=torch.Generator().manual_seed(4))
        boxes = resized_crop_params(8, 480, 640, generator=torch.Generator().manual_seed(4))
        for sample, box in zip(out, boxes.int().tolist()):
            assert mad(sample, F.resized_crop(image, *box, [224, 224], antialias=True)) <= 0.6

    @pytest.mark.parametrize("size", [(320, 224), (224, 400), (600, 600)])
    def test_eval_of_a_size_larger_than_the_resized_image_pads_like_centre_crop(self, size):
        image = photo_tensor()
        ours = RandomResizedCrop(size, dtype=torch.float32).eval()(image[None])[0]
        assert not ours.isnan().any()
        reference = v2.CenterCrop(size)(v2.Resize(round(min(size) / (224 / 256)), antialias=True)(image))
        assert mad(ours, reference) <= 0.6

    def test_flip_mirrors_the_same_box(self):
        images = photo_tensor(120, 160)[None].repeat(32, 1, 1, 1)
        plain = RandomResizedCrop(64)(images, generator=torch.Generator().manual_seed(3))
        flipped = RandomResizedCrop(64, flip=True)(images, generator=torch.Generator().manual_seed(3))
        same = [torch.equal(a, b) for a, b in zip(plain, flipped)]
        mirrored = [torch.equal(a.flip(2), b) for a, b in zip(plain, flipped)]
        assert all(s or m for s, m in zip(same, mirrored)) and 4 < sum(mirrored) < 28

    def test_jitter_matches_torchvision_adjustments(self):
        images = photo_tensor(60, 80)[None].repeat(3, 1, 1, 1).float()
        factors = torch.tensor(
            [[0.6, 1.0, 1.4], [1.3, 0.7, 1.0], [0.5, 1.2, 1.6]]
        )  # [brightness, contrast, saturation]
        ours = _jitter(images, factors)
        for sample, (brightness, contrast, saturation) in zip(range(3), factors.T.tolist()):
            reference = images[sample] / 255
            reference = F.adjust_brightness(reference, brightness)
            reference = F.adjust_contrast(reference, contrast)
            reference = F.adjust_saturation(reference, saturation)
            torch.testing.assert_close(ours[sample] / 255, reference, atol=1e-4, rtol=1e-4)

    def test_the_crop_can_be_switched_off(self):
        images = photo_tensor(64, 48)[None].repeat(8, 1, 1, 1)
        augment = RandomResizedCrop(224, crop=False, flip=True, saturation=0.5)
        out = augment(images)
        assert out.shape == images.shape and not torch.equal(out, images)
        assert torch.equal(augment.eval()(images), images)  # already cropped at decode time: nothing to do

    def test_float_output_and_channels_last(self):
        images = photo_tensor(48, 64)[None].repeat(2, 1, 1, 1)
        out = RandomResizedCrop(16, dtype=torch.bfloat16, memory_format=torch.channels_last)(images)
        assert out.dtype == torch.bfloat16 and out.is_contiguous(memory_format=torch.channels_last)
        assert 0 <= float(out.min()) and float(out.max()) <= 255

    @pytest.mark.parametrize("crop", [True, False])
    def test_a_bfloat16_batch_is_computed_in_float32(self, crop):
        """bfloat16 holds 0..255 exactly, but its products are several grey levels off."""
        images = photo_tensor(48, 64)[None].repeat(4, 1, 1, 1).float()
        augment = RandomResizedCrop(24, crop=crop, brightness=0.3, contrast=0.3, saturation=0.3, dtype=torch.float32)
        reference = augment(images, generator=torch.Generator().manual_seed(1))
        ours = augment(images.bfloat16(), generator=torch.Generator().manual_seed(1))
        assert mad(ours, reference) <= 0.05

    def test_an_eager_cpu_batch_is_cropped_with_torchvisions_exact_pixels(self):
        """Each sample resized by torch's own antialiased uint8 resize: torchvision's resized_crop, exactly."""
        image = photo_tensor()
        images = torch.stack([image, image.flip(2), image.flip(1)]).repeat(3, 1, 1, 1)
        out = RandomResizedCrop(224, flip=True)(images, generator=torch.Generator().manual_seed(2))
        boxes = resized_crop_params(9, 480, 640, generator=(generator := torch.Generator().manual_seed(2)))
        flips = (torch.rand((9,), generator=generator) < 0.5).tolist()
        for sample, box, flip, source in zip(out, boxes.int().tolist(), flips, images):
            expected = F.resized_crop(source, *box, [224, 224], antialias=True)
            assert torch.equal(sample, expected.flip(2) if flip else expected)


@pytest.mark.parametrize("ratio", [(1e-9, 1e-9), (1e9, 1e9)])
def test_a_ratio_range_far_from_the_images_still_gives_a_box_inside_it(ratio):
    """torchvision falls back to the centre crop narrowed to the ratio: here to one pixel, not zero."""
    boxes = resized_crop_params(8, 48, 64, ratio=ratio, generator=torch.Generator().manual_seed(0))
    top, left, height, width = boxes.unbind(1)
    assert (height >= 1).all() and (width >= 1).all() and (top + height <= 48).all() and (left + width <= 64).all()
    out = RandomResizedCrop(4, ratio=ratio)(torch.zeros(2, 3, 48, 64, dtype=torch.uint8))
    assert out.shape == (2, 3, 4, 4)


def test_an_empty_image_is_refused():
    with pytest.raises(UsageError, match=r"images of at least 1x1 pixels, got \[2, 3, 0, 5\]"):
        RandomResizedCrop(4)(torch.zeros(2, 3, 0, 5, dtype=torch.uint8))


class TestLayout:
    """Every output is channels-last unless asked otherwise, whatever the path that made it."""

    @pytest.mark.parametrize("train", [True, False])
    @pytest.mark.parametrize("options", [{}, {"crop": False, "flip": True}, {"brightness": 0.2}])
    @pytest.mark.parametrize("memory_format", [torch.channels_last, torch.contiguous_format, torch.preserve_format])
    @pytest.mark.parametrize("compiled", [False, True])
    def test_output_layout(self, train, options, memory_format, compiled):
        images = photo_tensor(40, 56)[None].repeat(2, 1, 1, 1)
        images = images.contiguous(memory_format=torch.channels_last) if train else images
        augment = RandomResizedCrop(16, memory_format=memory_format, **options).train(train)
        if compiled:
            torch.compiler.reset()  # each case is a new module: no recompile limit across cases
        out = (torch.compile(augment, fullgraph=True) if compiled else augment)(images)
        if memory_format == torch.preserve_format:  # the input's: channels-last in train, NCHW in eval here
            memory_format = torch.channels_last if train else torch.contiguous_format
        assert out.is_contiguous(memory_format=memory_format) and out.dtype == torch.uint8
        assert out.is_contiguous() == (memory_format == torch.contiguous_format)

    def test_the_batched_resampler_reads_a_channels_last_batch_as_it_lies(self, monkeypatch):
        """Its first product reads [B, H, W*C], a view of the input: no copy of the (large) input first."""
        images = photo_tensor(40, 56)[None].repeat(2, 1, 1, 1).float().contiguous(memory_format=torch.channels_last)
        weights_y, weights_x = torch.rand(2, 8, 40), torch.rand(2, 8, 56)
        operands, real = [], torch.bmm
        monkeypatch.setattr(torch, "bmm", lambda first, second: operands.append(second) or real(first, second))
        resample(images, weights_y, weights_x)
        assert operands[0].data_ptr() == images.data_ptr() and operands[0].shape == (2, 40, 56 * 3)

    @pytest.mark.parametrize("layout", [torch.channels_last, torch.contiguous_format])
    def test_the_batched_resampler_takes_either_layout(self, layout):
        images = photo_tensor(40, 56)[None].repeat(3, 1, 1, 1).float().contiguous(memory_format=layout)
        boxes = resized_crop_params(3, 40, 56, generator=torch.Generator().manual_seed(0))
        top, left, height, width = boxes.unbind(1)
        weights_y = interpolation_weights(top, height / 16, top, top + height, 16, 40)
        weights_x = interpolation_weights(left, width / 12, left, left + width, 12, 56)
        expected = torch.matmul(
            weights_y[:, None], torch.matmul(images.contiguous(), weights_x.transpose(1, 2)[:, None])
        )
        torch.testing.assert_close(resample(images, weights_y, weights_x), expected, atol=1e-3, rtol=1e-4)


class TestRandomness:
    def test_each_sample_gets_its_own_box(self):
        images = photo_tensor(96, 128)[None].repeat(16, 1, 1, 1)
        out = RandomResizedCrop(32)(images)
        assert len({sample.numpy().tobytes() for sample in out}) == 16

    def test_torch_manual_seed_makes_it_reproducible(self):
        images = photo_tensor(96, 128)[None].repeat(4, 1, 1, 1)
        augment = RandomResizedCrop(32, flip=True, brightness=0.3, contrast=0.3, saturation=0.3)
        torch.manual_seed(7)
        first = augment(images)
        torch.manual_seed(7)
        assert torch.equal(augment(images), first)
        assert not torch.equal(augment(images), first)

    def test_a_generator_decides_alone(self):
        images = photo_tensor(96, 128)[None].repeat(4, 1, 1, 1)
        augment = RandomResizedCrop(32, flip=True, brightness=0.3)
        first = augment(images, generator=torch.Generator().manual_seed(5))
        torch.manual_seed(99)
        assert torch.equal(augment(images, generator=torch.Generator().manual_seed(5)), first)

    def test_eval_is_deterministic(self):
        images = photo_tensor(96, 128)[None].repeat(2, 1, 1, 1)
        augment = RandomResizedCrop(32, flip=True, brightness=0.9).eval()
        assert torch.equal(augment(images), augment(images))


class TestCompile:
    def test_no_graph_break_alone_and_before_normalize_and_a_model(self):
        images = torch.randint(0, 256, (2, 3, 40, 56), dtype=torch.uint8)
        augment = RandomResizedCrop(24, flip=True, brightness=0.2, contrast=0.2, saturation=0.2, dtype=torch.float32)
        model = nn.Sequential(augment, Normalize(IMAGENET_MEAN, IMAGENET_STD), nn.Conv2d(3, 4, 3), nn.Flatten())
        for module in (augment, model, model.eval()):
            explanation = torch._dynamo.explain(module)(images)
            assert explanation.graph_break_count == 0 and explanation.graph_count == 1

    def test_compiles_for_a_dynamic_batch_size(self):
        compiled = torch.compile(RandomResizedCrop(16, flip=True, brightness=0.2), fullgraph=True, dynamic=True)
        for batch in (2, 3, 5):
            assert compiled(torch.randint(0, 256, (batch, 3, 20, 30), dtype=torch.uint8)).shape == (batch, 3, 16, 16)

    def test_compiled_fullgraph_is_the_batched_resampler_and_close_to_eager(self):
        """Compiled, the module runs the batched resampler (one graph); eager on the CPU it resizes each
        sample with torch's resize: the same pixels within the tests' bounds."""
        images = photo_tensor(40, 56)[None].repeat(2, 1, 1, 1)
        augment = RandomResizedCrop(24, dtype=torch.float32).eval()
        compiled = torch.compile(augment, fullgraph=True)
        batched = resample(images.float(), *augment._eval_weights(40, 56, torch.device("cpu"), 2))
        torch.testing.assert_close(compiled(images), batched.contiguous(), atol=1e-3, rtol=1e-4)
        assert mad(compiled(images), augment(images)) <= 0.6
        augment.train()
        assert compiled(images).shape == (2, 3, 24, 24)  # recompiled for train mode, still one graph

    def test_eval_exports_to_onnx_and_runs_the_same_in_onnx_runtime(self, tmp_path, monkeypatch):
        onnxruntime = pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
        torch.manual_seed(0)
        model = nn.Sequential(
            RandomResizedCrop(24, flip=True, dtype=torch.float32),
            Normalize(IMAGENET_MEAN, IMAGENET_STD),
            nn.Conv2d(3, 2, 3),
        ).eval()
        images = photo_tensor(48, 64)[None].repeat(2, 1, 1, 1)
        path = tmp_path / "model.onnx"

        def per_sample(*args):
            raise AssertionError("the export traced the per-sample CPU path, not the batched resampler")

        with monkeypatch.context() as patch:  # exported, the module must take the batched resampler
            patch.setattr(RandomResizedCrop, "_crop_each", per_sample)
            torch.onnx.export(model, (images,), path, input_names=["images"], dynamo=True)
            traced = torch.export.export(model, (images,)).module()
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (ours,) = session.run(None, {"images": images.numpy()})
        with torch.no_grad():  # the exported graph is the batched resampler's, as torch.export traces it
            torch.testing.assert_close(torch.from_numpy(ours), traced(images), rtol=1e-4, atol=1e-4)
            assert mad(torch.from_numpy(ours), model(images)) <= 0.05  # eager resizes each sample on the CPU


class TestBadInput:
    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"size": 0}, "size must be a positive int"),
            ({"size": (224,)}, "size must be a positive int"),
            ({"size": 22.4}, "size must be a positive int"),
            ({"size": 8, "scale": (0.5, 0.1)}, r"scale must be \(min, max\) with 0.0 < min <= max <= 1.0"),
            ({"size": 8, "scale": (0.0, 1.0)}, "scale must be"),
            ({"size": 8, "ratio": (2.0, 1.0)}, "ratio must be"),
            ({"size": 8, "ratio": (1.0,)}, r"ratio must be \(min, max\)"),
            ({"size": 8, "brightness": -1}, "brightness must be a finite number >= 0"),
            ({"size": 8, "dtype": torch.int32}, "dtype must be torch.uint8 or a float dtype"),
            ({"size": 8, "flip": "yes"}, "must be bools"),
            (
                {"size": 8, "memory_format": True},
                "memory_format must be torch.channels_last, torch.contiguous_format or",
            ),
            ({"size": 8, "ratio": (1.0, float("inf"))}, "finite"),
            ({"size": 8, "brightness": float("nan")}, "brightness must be a finite number"),
            (
                {"size": 8, "eval_ratio": 1e-9},
                r"eval_ratio=1e-09 would resize the shorter side to 8,000,000,000 pixels",
            ),
        ],
    )
    def test_bad_arguments(self, kwargs, message):
        with pytest.raises(UsageError, match=message):
            RandomResizedCrop(**kwargs)

    @pytest.mark.parametrize(
        ("images", "message"),
        [
            (torch.zeros(3, 8, 8, dtype=torch.uint8), r"expected a batch of images \[B, C, H, W\], got \[3, 8, 8\]"),
            (torch.zeros(1, 3, 8, 8, dtype=torch.int64), "expected uint8 or float images"),
            (torch.zeros(1, 1, 8, 8, dtype=torch.uint8), "colour jitter needs 3 channels"),
        ],
    )
    def test_bad_images(self, images, message):
        with pytest.raises(UsageError, match=message):
            RandomResizedCrop(4, saturation=0.5)(images)


def test_the_resampler_keeps_its_dtype_under_autocast():
    """A training loop's torch.autocast(dtype=torch.bfloat16) would run the matrix products in bfloat16."""
    pixels = photo_tensor()[None].float()
    one = torch.ones(1)
    weights_y = interpolation_weights(0 * one, 480 / 96 * one, 0 * one, 480 * one, 96, 480)
    weights_x = interpolation_weights(0 * one, 640 / 128 * one, 0 * one, 640 * one, 128, 640)
    plain = resample(pixels, weights_y, weights_x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = resample(pixels, weights_y, weights_x)
    assert autocast.dtype == torch.float32 and torch.equal(plain, autocast)


@pytest.mark.cuda
class TestCuda:
    def test_half_precision_matches_torchvision_and_draws_on_the_device_without_a_sync(self):
        image = photo_tensor()
        augment = RandomResizedCrop(224).cuda()
        images = image[None].repeat(64, 1, 1, 1).cuda()
        generator = torch.Generator("cuda").manual_seed(0)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any host synchronisation inside raises
        try:
            out = augment(images, generator=generator)  # float16 matmuls on the GPU
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert out.shape == (64, 3, 224, 224) and out.is_cuda and out.dtype == torch.uint8
        boxes = resized_crop_params(64, 480, 640, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        for sample, box in zip(out.cpu(), boxes.int().tolist()):
            assert mad(sample, F.resized_crop(image, *box, [224, 224], antialias=True)) <= 0.6

    def test_autocast_to_bfloat16_changes_nothing(self):
        augment = RandomResizedCrop(224, flip=True).cuda()
        images = photo_tensor()[None].repeat(16, 1, 1, 1).cuda()
        plain = augment(images, generator=torch.Generator("cuda").manual_seed(0))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            autocast = augment(images, generator=torch.Generator("cuda").manual_seed(0))
        assert torch.equal(plain, autocast)

    def test_cuda_graphs(self):
        augment = RandomResizedCrop(64, flip=True, brightness=0.3, dtype=torch.float16).cuda()
        model = torch.compile(
            nn.Sequential(augment, Normalize(IMAGENET_MEAN, IMAGENET_STD).cuda().half()), mode="reduce-overhead"
        )
        images = torch.randint(0, 256, (8, 3, 120, 160), dtype=torch.uint8, device="cuda")
        outs = [model(images).clone() for _ in range(4)]
        assert all(out.shape == (8, 3, 64, 64) for out in outs)
        assert not torch.equal(outs[-1], outs[-2])  # fresh random draws under the replayed graph
        assert math.isfinite(float(outs[-1].float().sum()))
