"""gpuload.loading.calls: what the loader's threads need to know of a user's function, and its StopIteration."""

import pytest
import torch

from gpuload.loading.calls import stop_iteration_as_error, takes_generator


def test_a_compiled_module_with_a_generator_gets_one(monkeypatch):
    """``torch.compile`` hides a module's ``forward`` behind ``(*args, **kwargs)``: the hook's signature is read
    from the module it wrapped, as the loader's ``transform=`` reads it (one helper for both)."""

    class Noise(torch.nn.Module):
        def forward(self, image, generator=None):
            return image

    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "1")  # wrapping only: nothing is compiled
    assert takes_generator(torch.compile(Noise())) and not takes_generator(torch.compile(torch.nn.Identity()))


def test_a_stop_iteration_out_of_a_users_function_is_an_error_naming_it():
    with pytest.raises(RuntimeError, match="the loader's per_image raised StopIteration") as caught:
        with stop_iteration_as_error("per_image"):
            next(iter([]))
    assert isinstance(caught.value.__cause__, StopIteration)
    with stop_iteration_as_error("transform"):
        pass  # nothing raised: nothing said
