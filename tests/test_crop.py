import shutil
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
from conftest import photo
from hypothesis import given, settings
from hypothesis import strategies as st
from test_augment import ks_statistic
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

import gpuload.loading.crop
from gpuload import DataLoader, DatasetError, MemmapImageDataset, UsageError, build_memmap, verify_memmap
from gpuload.loading.crop import (
    CenterCropDecode,
    RandomResizedCropDecode,
    counter_uniforms,
    decode_batch,
    decode_crops,
    scaled_window,
)


@pytest.fixture(scope="module")
def varied_jpegs(tmp_path_factory):
    """A jpeg dataset of 12 photos of several sizes, landscape and portrait, stored as they are;
    the last 6 with a restart marker per MCU row (as ``gpuload compress`` writes them)."""
    root = tmp_path_factory.mktemp("varied") / "photos"
    sizes = [(480, 640), (640, 480), (300, 301), (120, 900), (700, 200), (96, 128)] * 2
    for number, size in enumerate(sizes):
        (root / "a").mkdir(parents=True, exist_ok=True)
        restarts = {"restart_marker_rows": 1} if number >= 6 else {}
        photo(size).save(root / "a" / f"{number:02d}.jpg", quality=92, **restarts)
    return MemmapImageDataset(build_memmap(root, format="jpeg", progress=False))


def decoded(dataset, decode, indices, *, seed=0, epoch=0, fill=None) -> torch.Tensor:
    """The crops, decoded into a channels-last batch (the loader's layout), checked against a
    contiguous one; ``fill``: the batch holds that value before (a reused buffer)."""
    indices = torch.as_tensor(indices)
    outs = [
        torch.empty((len(indices), 3, *decode.size), dtype=torch.uint8),
        torch.empty((len(indices), *decode.size, 3), dtype=torch.uint8).permute(0, 3, 1, 2),
    ]
    for out in outs:
        if fill is not None:
            out.fill_(fill)
        decode_crops(dataset, indices, out, decode, seed=seed, epoch=epoch)
    assert torch.equal(*outs)
    return outs[1]


class TestCounterUniforms:
    @settings(max_examples=50, deadline=None)
    @given(
        seed=st.integers(0, 2**63 - 1),
        epoch=st.integers(0, 10**6),
        indices=st.lists(st.integers(0, 10**9), min_size=1, max_size=20),
    )
    def test_a_pure_function_of_seed_epoch_and_index(self, seed, epoch, indices):
        together = counter_uniforms(seed, epoch, torch.tensor(indices), 5)
        alone = torch.cat([counter_uniforms(seed, epoch, torch.tensor([index]), 5) for index in reversed(indices)])
        assert torch.equal(together, alone.flip(0))
        assert bool(((together >= 0) & (together < 1)).all())

    def test_uniform_and_independent_across_indices_epochs_and_seeds(self):
        draws = counter_uniforms(3, 0, torch.arange(20_000), 2)
        assert ks_statistic(draws[:, 0].float(), torch.rand(20_000, generator=torch.Generator().manual_seed(0))) < 0.02
        assert abs(float(torch.corrcoef(draws.T)[0, 1])) < 0.03
        assert not torch.equal(draws, counter_uniforms(3, 1, torch.arange(20_000), 2))
        assert not torch.equal(draws, counter_uniforms(4, 0, torch.arange(20_000), 2))


class TestScaledWindow:
    @settings(max_examples=300, deadline=None)
    @given(
        side=st.integers(1, 5000),
        denominator=st.sampled_from([1, 2, 4, 8]),
        data=st.data(),
    )
    def test_edges_move_by_less_than_a_scaled_pixel_then_at_most_half_of_one(self, side, denominator, data):
        start = data.draw(st.integers(0, side - 1))
        length = data.draw(st.integers(1, side - start))
        scaled = -(-side // denominator)
        first, last = scaled_window(start, length, denominator, scaled)
        assert 0 <= first < last <= scaled
        assert first * denominator <= start < (first + 1) * denominator
        end = start + length
        assert abs(last * denominator - end) <= denominator / 2 or last == first + 1 or last == scaled

    def test_the_box_of_the_review(self):
        """h=121, d=8, rows 7 to 109: the bottom edge lands at image row 112, not 120 (a ceil(h/d)/h grid)."""
        assert scaled_window(7, 103, 8, 16) == (0, 14)


class TestRandomResizedCropDecode:
    @pytest.mark.parametrize("height, width", [(480, 640), (100, 1000)])
    def test_box_distribution_equals_torchvision(self, height, width):
        shapes = torch.tensor([[height, width]]).expand(10_000, 2)
        ours, _ = RandomResizedCropDecode(224).draw(shapes, torch.arange(10_000), seed=1, epoch=0)
        torch.manual_seed(2)
        image = torch.empty(1, height, width)
        theirs = torch.tensor(
            [v2.RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(10_000)],
            dtype=torch.float64,
        )
        for statistic in (
            lambda b: b[:, 2] * b[:, 3],
            lambda b: torch.log(b[:, 3] / b[:, 2]),
            lambda b: b[:, 0],
            lambda b: b[:, 1],
        ):
            assert ks_statistic(statistic(ours).float(), statistic(theirs).float()) <= 0.05

    def test_exact_where_no_dct_scaling_applies(self, varied_jpegs):
        """Accurate decode, boxes under twice the output: torchvision's resized_crop of the full decode."""
        decode = RandomResizedCropDecode(200, fast=False, flip=False)
        indices = torch.arange(12)
        out = decoded(varied_jpegs, decode, indices)
        boxes, _ = decode.draw(varied_jpegs.data.shapes, indices, seed=0, epoch=0)
        for sample, box, index in zip(out, boxes.int().tolist(), range(12)):
            if box[2] < 400 or box[3] < 400:
                reference = F.resized_crop(varied_jpegs[index][0], *box, [200, 200], antialias=True)
                assert torch.equal(sample, reference)

    @pytest.mark.parametrize("fast", [False, True])
    def test_dct_scaling_and_fast_decoding_stay_close(self, varied_jpegs, fast, monkeypatch):
        """A box at least 2, 4 or 8 times the output is decoded at 1/2, 1/4 or 1/8 scale: libjpeg's
        DCT-domain reduction smooths a little differently from an antialiased resize."""
        scales = []
        real = gpuload.loading.crop.decode_jpeg_bytes
        monkeypatch.setattr(
            gpuload.loading.crop,
            "decode_jpeg_bytes",
            lambda *a, **k: scales.append(k.get("min_height")) or real(*a, **k),
        )
        decode = RandomResizedCropDecode(48, scale=(0.5, 1.0), fast=fast, flip=False)
        indices = torch.arange(12)
        out = decoded(varied_jpegs, decode, indices, seed=7)
        boxes, _ = decode.draw(varied_jpegs.data.shapes, indices, seed=7, epoch=0)
        gaps = [
            float(
                (sample.float() - F.resized_crop(varied_jpegs[i][0], *box, [48, 48], antialias=True).float())
                .abs()
                .mean()
            )
            for i, (sample, box) in enumerate(zip(out, boxes.int().tolist()))
        ]
        heights = varied_jpegs.data.shapes[:, 0].tolist()
        assert sum(scale < height for scale, height in zip(scales, heights)) >= 6  # most were decoded smaller
        assert np.mean(gaps) < 5 and max(gaps) < 10

    @pytest.mark.parametrize("fast", [False, True])
    @pytest.mark.parametrize("scale", [(0.08, 1.0), (0.5, 1.0)])
    def test_decoding_only_the_box_rows_gives_the_pixels_of_the_whole_decode(
        self, varied_jpegs, fast, scale, monkeypatch
    ):
        """Each image is decoded only down to its box's last row, and from its first where restart
        markers allow (at every DCT scale): the batch is the one a whole decode gives."""
        decode = RandomResizedCropDecode(48, scale=scale, fast=fast)
        windows = []
        real = gpuload.loading.crop.row_window
        monkeypatch.setattr(
            gpuload.loading.crop, "row_window", lambda *a, **k: windows.append(real(*a, **k)) or windows[-1]
        )
        cut = decoded(varied_jpegs, decode, range(12), seed=3)
        monkeypatch.setattr(gpuload.loading.crop, "row_window", lambda *a, **k: None)
        whole = decoded(varied_jpegs, decode, range(12), seed=3)
        assert sum(window is not None for window in windows) >= 4
        assert sum(window is not None and window[1] > 0 for window in windows) >= 2  # rows above skipped too
        assert torch.equal(cut, whole)

    @pytest.mark.parametrize("fast", [False, True])
    def test_boxes_on_mcu_row_edges_decode_as_the_whole_image(self, varied_jpegs, fast, monkeypatch):
        """Boxes whose first or last row is at an MCU row's edge, where a window without the rows
        that smooth chroma upsampling reads would change pixels (accurate mode)."""
        decode = RandomResizedCropDecode(48, fast=fast, flip=False)
        indices = torch.arange(6, 12).repeat_interleave(4)  # the images with restart markers
        tops = torch.tensor([32.0, 33.0, 47.0, 48.0]).repeat(6)
        boxes = torch.stack(
            [tops, torch.full_like(tops, 5.0), torch.full_like(tops, 50.0), torch.full_like(tops, 60.0)], 1
        )
        monkeypatch.setattr(decode, "draw", lambda *a, **k: (boxes, torch.zeros(len(boxes), dtype=torch.bool)))
        cut = decoded(varied_jpegs, decode, indices)
        monkeypatch.setattr(gpuload.loading.crop, "row_window", lambda *a, **k: None)
        assert torch.equal(cut, decoded(varied_jpegs, decode, indices))

    def test_a_window_of_a_few_rows_of_a_narrow_image_is_not_used_where_its_scale_would_change(
        self, tmp_path, monkeypatch
    ):
        """A 5 px wide image's last 5 rows at 1/4 scale ask for 2x2 pixels, which TurboJPEG decodes at
        3/8: the crop decodes the whole image there (at exactly 1/4), as without windows."""
        (tmp_path / "photos" / "a").mkdir(parents=True)
        photo((37, 5)).save(
            tmp_path / "photos" / "a" / "narrow.jpg", quality=90, subsampling="4:4:4", restart_marker_rows=1
        )
        dataset = MemmapImageDataset(build_memmap(tmp_path / "photos", format="jpeg", progress=False))
        decode = RandomResizedCropDecode(1, fast=True, flip=False)
        boxes = torch.tensor([[32.0, 0.0, 5.0, 5.0], [0.0, 0.0, 5.0, 5.0], [16.0, 0.0, 21.0, 5.0]])
        monkeypatch.setattr(decode, "draw", lambda *a, **k: (boxes, torch.zeros(3, dtype=torch.bool)))
        cut = decoded(dataset, decode, [0, 0, 0])
        monkeypatch.setattr(gpuload.loading.crop, "row_window", lambda *a, **k: None)
        assert torch.equal(cut, decoded(dataset, decode, [0, 0, 0]))

    def test_any_sampling_libjpeg_turbo_decodes_is_cropped(self, tmp_path):
        """A JPEG whose luma is sampled 1x4 (which simplejpeg's header reader cannot name) is stored
        as it is, cropped, and verified like any other."""
        (tmp_path / "photos" / "a").mkdir(parents=True)
        shutil.copy(Path(__file__).parent / "data" / "luma_sampled_1x4.jpg", tmp_path / "photos" / "a")
        dataset = MemmapImageDataset(build_memmap(tmp_path / "photos", format="jpeg", progress=False))
        whole = dataset[0][0]
        assert dataset.manifest.jpeg["reencoded"] == {} and tuple(whole.shape) == (3, 100, 64)
        decode = RandomResizedCropDecode(16, fast=False, flip=False)
        boxes, _ = decode.draw(dataset.data.shapes, torch.arange(1), seed=0, epoch=0)
        reference = F.resized_crop(whole, *boxes[0].int().tolist(), [16, 16], antialias=True)
        assert torch.equal(decoded(dataset, decode, [0])[0], reference)
        assert verify_memmap(dataset.path, progress=False) == []

    def test_flips_mirror_the_same_box_and_draws_depend_only_on_seed_epoch_index(self, varied_jpegs):
        plain = decoded(varied_jpegs, RandomResizedCropDecode(32, flip=False), range(12), seed=5)
        flipped = decoded(varied_jpegs, RandomResizedCropDecode(32), range(12), seed=5)
        mirrored = [torch.equal(a.flip(-1), b) for a, b in zip(plain, flipped)]
        assert all(m or torch.equal(a, b) for m, a, b in zip(mirrored, plain, flipped)) and 0 < sum(mirrored) < 12
        reversed_order = decoded(varied_jpegs, RandomResizedCropDecode(32), list(reversed(range(12))), seed=5)
        assert torch.equal(reversed_order.flip(0), flipped)
        assert not torch.equal(decoded(varied_jpegs, RandomResizedCropDecode(32), range(12), seed=5, epoch=1), flipped)

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"size": 0}, "size must be"),
            ({"size": 8, "scale": (1.0, 0.5)}, "scale must be"),
            ({"size": 8, "fast": 1}, "must be bools"),
        ],
    )
    def test_bad_arguments(self, kwargs, message):
        with pytest.raises(UsageError, match=message):
            RandomResizedCropDecode(**kwargs)


class TestCenterCropDecode:
    @pytest.mark.parametrize("size", [224, (224, 160), (700, 700)])
    def test_exactly_torchvision_resize_and_centre_crop(self, varied_jpegs, size):
        decode = CenterCropDecode(size)
        out = decoded(varied_jpegs, decode, range(12))
        side = round(min(decode.size) / (224 / 256))
        for index, sample in enumerate(out):
            reference = v2.CenterCrop(decode.size)(v2.Resize(side, antialias=True)(varied_jpegs[index][0]))
            assert torch.equal(sample, reference)

    def test_an_image_at_the_output_size_is_decoded_whole_and_padding_is_zero_in_a_reused_batch(self, varied_jpegs):
        """``ratio=1`` and the image's own size: the image decoded straight into the batch, exactly;
        smaller images are padded with zeros even where the batch held other pixels before."""
        out = decoded(varied_jpegs, CenterCropDecode((480, 640), ratio=1.0), range(12), fill=7)
        for index, sample in enumerate(out):
            image = varied_jpegs[index][0]
            if tuple(image.shape[1:]) == (480, 640):
                assert torch.equal(sample, image)
            else:
                reference = v2.CenterCrop((480, 640))(v2.Resize(480, antialias=True)(image))
                assert torch.equal(sample, reference)

    def test_fast_decodes_with_libjpeg_turbos_fast_dct_and_upsampling(self, varied_jpegs):
        out = decoded(varied_jpegs, CenterCropDecode((480, 640), ratio=1.0, fast=True), range(12))
        for index, sample in enumerate(out):
            if tuple(varied_jpegs.data.shapes[index].tolist()) == (480, 640):
                data = varied_jpegs.read_jpeg(index)
                fast = simplejpeg.decode_jpeg(data, fastdct=True, fastupsample=True)
                assert torch.equal(sample.permute(1, 2, 0), torch.from_numpy(fast))
                assert not torch.equal(sample, varied_jpegs[index][0])  # not the exact decode
                assert (sample.float() - varied_jpegs[index][0].float()).abs().mean() < 2  # about 1.4 here

    @pytest.mark.parametrize(
        "kwargs, message",
        [({"ratio": 1.5}, r"ratio must be in \(0, 1\]"), ({"fast": 1}, "fast and gpu must be bools")],
    )
    def test_bad_arguments(self, kwargs, message):
        with pytest.raises(UsageError, match=message):
            CenterCropDecode(224, **kwargs)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def gpu_decoded(dataset, index: int) -> torch.Tensor:
    """Image ``index`` as the GPU decode path decodes it (nvJPEG through TorchCodec), back on the CPU."""
    from torchcodec.decoders import decode_jpeg

    return decode_jpeg(dataset.read_jpeg(index), mode="RGB", device="cuda").cpu()


def mean_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().mean())


@pytest.mark.parametrize("device", DEVICES)
class TestDecodeBatch:
    """The GPU decode path (nvJPEG on CUDA), and its CPU fallback, which runs the same batched crop."""

    def test_random_crops_match_torchvision_on_the_same_decoded_pixels(self, varied_jpegs, device):
        """The crop's arithmetic alone (float16 matrix products on CUDA): against torchvision's crop of
        the pixels this device's decoder gives (nvJPEG's on CUDA); the decoders are compared below."""
        decode = RandomResizedCropDecode(40, gpu=True)
        indices = torch.arange(12)
        out = decode_batch(varied_jpegs, indices, decode, seed=3, epoch=0, device=torch.device(device)).cpu()
        boxes, flips = decode.draw(varied_jpegs.data.shapes, indices, seed=3, epoch=0)
        for index, (sample, box, flip) in enumerate(zip(out, boxes.int().tolist(), flips.tolist())):
            image = gpu_decoded(varied_jpegs, index) if device == "cuda" else varied_jpegs[index][0]
            reference = F.resized_crop(image, *box, [40, 40], antialias=True)
            difference = mean_difference(sample, reference.flip(-1) if flip else reference)
            assert difference <= 0.6, f"image {index}: mean difference {difference:.3f}"

    def test_evaluation_matches_torchvision_on_the_same_decoded_pixels(self, varied_jpegs, device):
        decode = CenterCropDecode(64, gpu=True)
        out = decode_batch(varied_jpegs, torch.arange(12), decode, seed=0, epoch=0, device=torch.device(device)).cpu()
        side = round(64 / (224 / 256))
        for index, sample in enumerate(out):
            image = gpu_decoded(varied_jpegs, index) if device == "cuda" else varied_jpegs[index][0]
            reference = v2.CenterCrop(64)(v2.Resize(side, antialias=True)(image))
            difference = mean_difference(sample, reference)
            assert difference <= 0.6, f"image {index}: mean difference {difference:.3f}"

    def test_the_batch_is_channels_last_in_the_batchs_order(self, varied_jpegs, device):
        decode = CenterCropDecode(32)
        indices = torch.tensor([5, 0, 11, 3, 0])  # mixed sizes, out of order, a repeat
        out = decode_batch(varied_jpegs, indices, decode, seed=0, epoch=0, device=torch.device(device))
        assert out.shape == (5, 3, 32, 32) and out.is_contiguous(memory_format=torch.channels_last)
        for row, index in enumerate(indices.tolist()):
            alone = decode_batch(
                varied_jpegs, torch.tensor([index]), decode, seed=0, epoch=0, device=torch.device(device)
            )
            # In a batch an image is padded to its chunk's largest: the matrix products change shape, and
            # their sums may round to the other side of a half (cuBLAS in float16 most of all).
            assert_nearly_equal(out[row], alone[0])

    def test_memory_is_bounded_by_the_budgets_whatever_the_sizes(self, varied_jpegs, device, monkeypatch):
        """Each nvJPEG call holds at most its budget of decoded pixels, each resampling chunk its budget
        of padded float pixels (a single image may pass either): never a batch padded to its tallest
        and widest image."""
        chunks, calls = [], []
        real_resample, real_decoder = gpuload.loading.crop.resample, gpuload.loading.crop._batch_decoder

        def resample(pixels, weights_y, weights_x):
            chunks.append((tuple(pixels.shape), pixels.numel() * pixels.element_size()))
            return real_resample(pixels, weights_y, weights_x)

        def batch_decoder(device):
            decoder = real_decoder(device)
            return lambda blobs, names: (
                calls.append(sum(image.numel() for image in decoder(blobs, names))) or decoder(blobs, names)
            )

        monkeypatch.setattr(gpuload.loading.crop, "resample", resample)
        monkeypatch.setattr(gpuload.loading.crop, "_batch_decoder", batch_decoder)
        decode, indices = RandomResizedCropDecode(24), torch.arange(12)
        itemsize = 2 if device == "cuda" else 4  # float16 on CUDA
        chunk_budget, decode_budget = 3 * 480 * 640 * itemsize, 3 * 480 * 640 * 2
        out = decode_batch(
            varied_jpegs, indices, decode, seed=1, epoch=0, device=torch.device(device),
            decode_bytes=decode_budget, chunk_bytes=chunk_budget,
        )  # fmt: skip
        sizes = varied_jpegs.data.shapes.tolist()
        largest = max(3 * height * width for height, width in sizes)
        assert len(calls) > 1 and all(held <= max(decode_budget, largest) for held in calls)
        assert len(chunks) > 1 and all(held <= max(chunk_budget, largest * itemsize) for _, held in chunks)
        assert sum(shape[0] for shape, _ in chunks) == 12
        calls.clear()
        whole = decode_batch(varied_jpegs, indices, decode, seed=1, epoch=0, device=torch.device(device))
        assert len(calls) == 1  # the whole batch in one decoder call
        assert_nearly_equal(out, whole)  # the budgets change nothing but memory (and the products' shapes)

    def test_a_decoder_that_refuses_an_image_has_it_decoded_on_the_cpu_with_a_warning(
        self, varied_jpegs, device, monkeypatch
    ):
        refused = varied_jpegs.read_jpeg(4)
        real_decoder = gpuload.loading.crop._batch_decoder

        def batch_decoder(device):
            decoder = real_decoder(device)

            def refusing(blobs, names):
                if any(blob == refused for blob in blobs):
                    raise RuntimeError("nvjpegDecode failed: unknown chroma subsampling\nmore lines")
                return decoder(blobs, names)

            return refusing

        expected = decode_batch(varied_jpegs, torch.arange(12), CenterCropDecode(32), seed=0, epoch=0,
                                device=torch.device(device))  # fmt: skip
        libjpeg = decode_batch(varied_jpegs, torch.tensor([4]), CenterCropDecode(32), seed=0, epoch=0,
                               device=torch.device("cpu"))  # fmt: skip
        monkeypatch.setattr(gpuload.loading.crop, "_batch_decoder", batch_decoder)
        with pytest.warns(RuntimeWarning) as warned:
            out = decode_batch(varied_jpegs, torch.arange(12), CenterCropDecode(32), seed=0, epoch=0,
                               device=torch.device(device))  # fmt: skip
        assert [str(warning.message) for warning in warned] == [
            f"the GPU decoder refused {varied_jpegs.describe(4)} (nvjpegDecode failed: unknown chroma subsampling); "
            "decoded by libjpeg-turbo on the CPU instead"
        ]
        others = [row for row in range(12) if row != 4]
        assert_nearly_equal(out[others], expected[others])
        assert mean_difference(out[4].cpu(), libjpeg[0]) <= 0.6  # libjpeg-turbo's pixels, resampled on the device

    def test_a_decode_of_another_size_than_recorded_is_an_error_not_a_transposed_image(
        self, varied_jpegs, device, monkeypatch
    ):
        """TorchCodec applies an EXIF orientation, libjpeg-turbo does not: a disagreement is reported."""
        real_decoder = gpuload.loading.crop._batch_decoder
        monkeypatch.setattr(
            gpuload.loading.crop,
            "_batch_decoder",
            lambda device: lambda blobs, names: [image.transpose(1, 2) for image in real_decoder(device)(blobs, names)],
        )
        with pytest.raises(DatasetError, match=r"image 0 .*decodes to 480x640 where its recorded size is 640x480"):
            decode_batch(varied_jpegs, torch.tensor([0]), CenterCropDecode(32), seed=0, epoch=0,
                         device=torch.device(device))  # fmt: skip

    def test_autocast_to_bfloat16_does_not_reach_the_resampler(self, varied_jpegs, device):
        """bfloat16 holds whole numbers only up to 256 and its products are off by several grey levels:
        a training loop's autocast must not change the crops."""
        decode = RandomResizedCropDecode(40)
        plain = decode_batch(varied_jpegs, torch.arange(12), decode, seed=3, epoch=0, device=torch.device(device))
        with torch.autocast(device, dtype=torch.bfloat16):
            autocast = decode_batch(
                varied_jpegs, torch.arange(12), decode, seed=3, epoch=0, device=torch.device(device)
            )
        assert torch.equal(plain, autocast)

    def test_the_loader_serves_them_on_cuda_and_refuses_them_elsewhere(self, varied_jpegs, device):
        def loader():
            return DataLoader(varied_jpegs, batch_size=5, shuffle=True, seed=1, device=device,
                              decode=RandomResizedCropDecode(24, gpu=True))  # fmt: skip

        if device == "cpu":  # it would quietly run the padded batch path, 14x slower than gpu=False
            with pytest.raises(UsageError, match="gpu=True decodes on a CUDA device.*use gpu=False"):
                loader()
            return
        shapes = [(images.shape, images.device.type, labels.device.type) for images, labels in loader()]
        assert shapes[0] == ((5, 3, 24, 24), device, device) and len(shapes) == 3


def assert_nearly_equal(a: torch.Tensor, b: torch.Tensor, most: float | None = None) -> None:
    """uint8 pixels at most 1 apart, and at least a share ``most`` of them equal (99 % on the CPU's float32,
    95 % on CUDA's float16 products by default)."""
    most = most if most is not None else (0.95 if a.is_cuda else 0.99)
    difference = (a.int() - b.int()).abs()
    equal = float((difference == 0).float().mean())
    assert int(difference.max()) <= 1 and equal >= most, f"max difference {int(difference.max())}, {equal:.2%} equal"


@pytest.mark.cuda
class TestGpuDecodeOnCuda:
    """What only a GPU shows: nvJPEG through TorchCodec, in the loader's threads, on their streams."""

    @pytest.fixture(autouse=True)
    def torchcodec(self):
        pytest.importorskip("torchcodec.decoders", reason="pip install 'gpuload[cuda]'")

    def test_nvjpeg_decodes_as_libjpeg_turbo_does_within_a_bound(self, varied_jpegs):
        """nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's: the decoders' own difference,
        apart from the crop's arithmetic (tested above on nvJPEG's own pixels). Measured on an H200
        (TorchCodec 0.17.0): 0.58 grey levels a pixel on 640x480, up to 1.94 on 96x128, where edges
        (and chroma edges, which the two upsample differently) are a larger share of the pixels (crops
        decoded at a reduced DCT scale are bounded at 5 against torchvision's, above)."""
        differences = [mean_difference(gpu_decoded(varied_jpegs, i), varied_jpegs[i][0]) for i in range(12)]
        assert max(differences) <= 2.5, f"mean differences per image: {[round(d, 3) for d in differences]}"

    def test_batches_through_the_loader_match_the_cpu_decode_of_the_same_draws(self, varied_jpegs):
        decode = RandomResizedCropDecode(32, gpu=True)
        loader = DataLoader(varied_jpegs, batch_size=5, shuffle=True, seed=1, device="cuda", decode=decode)
        assert loader.threads == 2 and loader._ahead == loader.prefetch
        order = epoch_order_of(loader)
        served = torch.cat([images.cpu() for images, _ in loader])
        reference = decode_batch(
            varied_jpegs, order[: len(served)], decode, seed=1, epoch=0, device=torch.device("cpu")
        )
        assert served.shape == reference.shape
        difference = mean_difference(served, reference)
        assert difference <= 1.5, f"mean difference {difference:.3f}"  # nvJPEG's decode, float16: see above

    def test_the_ring_holds_pinned_labels_only(self, varied_jpegs):
        loader = DataLoader(varied_jpegs, batch_size=4, device="cuda", decode=CenterCropDecode(32, gpu=True))
        iterator = iter(loader)
        ring = iterator._pipeline.ring
        next(iterator)
        assert all(slot.images is None and slot.labels.is_pinned() for slot in ring.slots)

    def test_no_host_synchronisation_of_ours_in_the_batch_path(self, varied_jpegs, monkeypatch):
        """The draws are made on the CPU from the recorded sizes and sent once, pinned and non-blocking.
        TorchCodec synchronises its own stream inside its op (0.17: before and after nvJPEG's batched
        call), which this mode does not see; the decoder is called outside the debug mode here."""
        real_decoder = gpuload.loading.crop._batch_decoder

        def batch_decoder(device):
            decoder = real_decoder(device)

            def unwatched(blobs, names):
                torch.cuda.set_sync_debug_mode(0)
                try:
                    return decoder(blobs, names)
                finally:
                    torch.cuda.set_sync_debug_mode("error")

            return unwatched

        monkeypatch.setattr(gpuload.loading.crop, "_batch_decoder", batch_decoder)
        decode = RandomResizedCropDecode(32, gpu=True)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = decode_batch(varied_jpegs, torch.arange(12), decode, seed=0, epoch=0, device=torch.device("cuda"))
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert out.is_contiguous(memory_format=torch.channels_last) and out.shape == (12, 3, 32, 32)


def epoch_order_of(loader: DataLoader) -> torch.Tensor:
    """The indices the loader's next epoch visits on this rank."""
    from gpuload.loading.order import epoch_order

    return epoch_order(len(loader._labels), epoch=loader.epoch, seed=loader.seed, shuffle=loader.shuffle)


def test_a_centre_crop_ratio_that_would_resize_beyond_any_image_is_refused():
    with pytest.raises(UsageError, match=r"ratio=1e-09 would resize the shorter side"):
        CenterCropDecode(4, ratio=1e-9)


def test_a_raw_crop_with_a_degenerate_ratio_range_serves_one_pixel_boxes(built_dataset):
    decode = RandomResizedCropDecode(4, ratio=(1e-9, 1e-9))
    loader = DataLoader(MemmapImageDataset(built_dataset), batch_size=4, device="cpu", decode=decode)
    assert next(iter(loader))[0].shape == (4, 3, 4, 4)


class TestChunks:
    @settings(max_examples=100, deadline=None)
    @given(
        sizes=st.lists(st.sampled_from([(2, 3), (5, 5), (40, 30), (7, 1), (40, 31)]), min_size=1, max_size=30),
        budget=st.integers(1, 20_000),
    )
    def test_resampling_chunks_padded_within_the_budget_cover_every_image(self, sizes, budget):
        sizes = sorted(sizes)
        chunks = gpuload.loading.crop._chunks(sizes, budget, 2)
        assert [start for start, _ in chunks] == [0, *[end for _, end in chunks[:-1]]] and chunks[-1][1] == len(sizes)
        for start, end in chunks:
            height, width = max(h for h, _ in sizes[start:end]), max(w for _, w in sizes[start:end])
            padded = (end - start) * height * width
            own = sum(h * w for h, w in sizes[start:end])
            assert end - start == 1 or (padded * 3 * 2 <= budget and padded <= 2 * own)

    @settings(max_examples=100, deadline=None)
    @given(
        sizes=st.lists(st.sampled_from([(2, 3), (5, 5), (40, 30), (7, 1)]), min_size=1, max_size=30),
        budget=st.integers(1, 20_000),
    )
    def test_decoder_calls_within_the_budget_cover_every_image(self, sizes, budget):
        calls = gpuload.loading.crop._decode_calls(sizes, budget)
        assert [start for start, _ in calls] == [0, *[end for _, end in calls[:-1]]] and calls[-1][1] == len(sizes)
        for start, end in calls:
            held = sum(3 * h * w for h, w in sizes[start:end])
            assert end - start == 1 or held <= budget
            assert end == len(sizes) or held + 3 * sizes[end][0] * sizes[end][1] > budget  # as many as fit
