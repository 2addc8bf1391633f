"""gpuload/loading/pipeline.py: what the loader's producers do with a transform. (The ring, the producers
and the stream protocol are tested through the loader, in tests/test_loader.py.)"""

import torch

from gpuload.loading.pipeline import uses_cuda_graphs


def test_cuda_graphs_are_told_from_the_compiled_transform():
    identity = torch.nn.Identity()
    assert uses_cuda_graphs(torch.compile(identity, mode="reduce-overhead"))
    assert uses_cuda_graphs(torch.compile(identity, mode="max-autotune"))
    assert not uses_cuda_graphs(torch.compile(identity))
    assert not uses_cuda_graphs(identity) and not uses_cuda_graphs(abs)
