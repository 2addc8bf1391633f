import re

import pytest
import torch
from torch import nn
from torchvision.transforms import v2

from gpuload import IMAGENET_MEAN, IMAGENET_STD, Normalize


@pytest.fixture
def images():
    return torch.randint(0, 256, (2, 3, 16, 20), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def test_matches_torchvision_normalize(images):
    expected = v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)(images.float() / 255)
    out = Normalize(IMAGENET_MEAN, IMAGENET_STD)(images)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(Normalize(IMAGENET_MEAN, IMAGENET_STD)(images.float()), expected, rtol=1e-5, atol=1e-5)


def test_output_dtype_follows_the_module(images):
    normalize = Normalize(IMAGENET_MEAN, IMAGENET_STD).half()
    expected = v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)(images.float() / 255)
    for source in (images, images.float(), images.double()):
        out = normalize(source)
        assert out.dtype == torch.float16
        torch.testing.assert_close(out.float(), expected, rtol=2e-3, atol=4e-3)
    assert Normalize([0.5], [0.5]).to(torch.bfloat16)(images[:, :1]).dtype == torch.bfloat16


def test_channels_last(images):
    out = Normalize(IMAGENET_MEAN, IMAGENET_STD, memory_format=torch.channels_last)(images)
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, Normalize(IMAGENET_MEAN, IMAGENET_STD)(images))


def test_one_image_is_normalised_as_it_is_and_refused_only_where_channels_last_needs_a_batch(images):
    one = images[0]
    expected = Normalize(IMAGENET_MEAN, IMAGENET_STD)(images)[0]
    torch.testing.assert_close(Normalize(IMAGENET_MEAN, IMAGENET_STD)(one), expected)
    with pytest.raises(ValueError, match=r"takes a batch \[N, 3, H, W\], got shape \(3, .*images\[None\]"):
        Normalize(IMAGENET_MEAN, IMAGENET_STD, memory_format=torch.channels_last)(one)


@pytest.mark.parametrize("shape", [(4, 5), (2, 1, 4, 5), (1, 4, 5), (2, 4, 4, 5), (1, 2, 3, 4, 5), (2, 4, 5, 3)])
def test_shapes_that_are_not_three_channel_images_are_refused(shape):
    """Without the check, broadcasting turns [4, 5] into [1, 3, 4, 5] and one channel into three."""
    with pytest.raises(
        ValueError, match=rf"Normalize with 3 channels takes a batch \[N, 3, H, W\].*got shape {re.escape(str(shape))}"
    ):
        Normalize(IMAGENET_MEAN, IMAGENET_STD)(torch.zeros(shape, dtype=torch.uint8))


def test_a_channels_last_batch_is_read_as_it_lies_and_stays_channels_last(images, monkeypatch):
    """gpuload's batches are channels-last: the one addcmul reads the uint8 as it lies (no copy first)."""
    batch = images.contiguous(memory_format=torch.channels_last)
    seen, real = [], torch.addcmul
    monkeypatch.setattr(
        torch, "addcmul", lambda shift, pixels, scale: seen.append(pixels) or real(shift, pixels, scale)
    )
    out = Normalize(IMAGENET_MEAN, IMAGENET_STD)(batch)
    assert seen[0] is batch and out.is_contiguous(memory_format=torch.channels_last)


def test_scale_and_shift_are_buffers_in_the_state_dict():
    normalize = Normalize([0.5, 0.25], [0.5, 0.125])
    assert set(normalize.state_dict()) == {"scale", "shift"}
    assert normalize.scale.shape == (1, 2, 1, 1)
    assert "mean=[0.5, 0.25]" in repr(normalize)


@pytest.mark.parametrize(
    "mean, std, message",
    [([0.5, 0.5], [0.5], "same length"), ([0.5], [0.0], "positive"), ([[0.5]], [[0.5]], "1-D")],
)
def test_bad_arguments(mean, std, message):
    with pytest.raises(ValueError, match=message):
        Normalize(mean, std)


def test_compiles_without_graph_breaks(images):
    normalize = Normalize(IMAGENET_MEAN, IMAGENET_STD)
    explanation = torch._dynamo.explain(normalize)(images)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(normalize, fullgraph=True)
    torch.testing.assert_close(compiled(images), normalize(images))


def test_onnx_export_runs_the_same_in_onnx_runtime(images, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from torchvision.models import resnet18

    torch.manual_seed(0)
    model = nn.Sequential(Normalize(IMAGENET_MEAN, IMAGENET_STD), resnet18(num_classes=5)).eval()
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, (images,), path, input_names=["images"], dynamo=True)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inputs,) = session.get_inputs()
    assert inputs.type == "tensor(uint8)"
    (ours,) = session.run(None, {"images": images.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(ours), model(images), rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_half_on_cuda(images):
    normalize = Normalize(IMAGENET_MEAN, IMAGENET_STD).cuda().half()
    out = normalize(images.cuda())
    assert out.dtype == torch.float16 and out.is_cuda
    torch.testing.assert_close(out.float().cpu(), Normalize(IMAGENET_MEAN, IMAGENET_STD)(images), rtol=2e-3, atol=4e-3)
