"""gpuload/loading/pipeline.py: what the loader's producers do with a transform. (The ring, the producers
and the stream protocol are tested through the loader, in tests/test_loader.py.)"""

import pytest
import torch

from gpuload import DataLoader, ImageData
from gpuload.loading.pipeline import uses_cuda_graphs


def test_cuda_graphs_are_told_from_the_compiled_transform():
    identity = torch.nn.Identity()
    assert uses_cuda_graphs(torch.compile(identity, mode="reduce-overhead"))
    assert uses_cuda_graphs(torch.compile(identity, mode="max-autotune"))
    assert not uses_cuda_graphs(torch.compile(identity))
    assert not uses_cuda_graphs(identity) and not uses_cuda_graphs(abs)


@pytest.mark.parametrize("where", ["per_image", "transform"])
def test_a_stop_iteration_raised_in_a_batch_is_an_error_not_the_end_of_the_epoch(where):
    """A hook or transform that lets a StopIteration out (a next() on an exhausted iterator) would otherwise
    end the user's for loop early without a word: 2 batches of 8 served, the epoch reported done."""
    data = ImageData(images=torch.zeros((16, 3, 2, 2), dtype=torch.uint8), labels=torch.arange(16), batch_size=[16])
    calls = []

    def hook(images, generator=None):
        calls.append(1)
        if len(calls) == 3:
            raise StopIteration
        return images

    loader = DataLoader(data, batch_size=2, device="cpu", threads=1, **{where: hook})
    with pytest.raises(RuntimeError, match=f"^the loader's {where} raised StopIteration"):
        list(loader)
