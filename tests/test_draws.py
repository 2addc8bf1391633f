"""gpuload.transforms.draws: uniforms given or drawn, a uniform choice, and Gamma draws made from given uniforms."""

import pytest
import torch
from test_augment import ks_statistic

from gpuload import UsageError
from gpuload.transforms.draws import GAMMA_DRAWS, gamma, index, uniforms


class TestGamma:
    @pytest.mark.parametrize("alpha", [0.1, 0.2, 0.8, 1.0, 2.5, 7.0])
    def test_samples_are_distributed_as_torchs_gamma(self, alpha):
        """Against torch's own Gamma sampler, 20,000 each: the two-sample KS statistic below the 0.1 %
        critical value (1.95 * sqrt(2 / n))."""
        count = 20_000
        draws = torch.rand((count, GAMMA_DRAWS), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        ours = gamma(torch.full((count,), alpha, dtype=torch.float64), draws)
        theirs = torch._standard_gamma(
            torch.full((count,), alpha, dtype=torch.float64), generator=torch.Generator().manual_seed(1)
        )
        assert bool((ours >= 0).all()) and bool(torch.isfinite(ours).all())
        assert ks_statistic(ours, theirs) < 1.95 * (2 / count) ** 0.5

    def test_a_pure_function_of_the_uniforms_that_compiles_whole(self):
        draws = torch.rand((4, GAMMA_DRAWS), generator=torch.Generator().manual_seed(3))
        alphas = torch.tensor([0.2, 0.2, 1.0, 1.0], dtype=torch.float64)
        torch.compiler.reset()
        compiled = torch.compile(gamma, fullgraph=True)
        torch.manual_seed(0)
        first = compiled(alphas, draws)
        torch.manual_seed(1)
        assert torch.allclose(first, gamma(alphas, draws)) and torch.equal(gamma(alphas, draws), gamma(alphas, draws))

    def test_all_candidates_refused_gives_the_mode(self):
        """Uniforms that refuse every candidate (acceptance draws of 0: log 1 is above every log-ratio but the
        mode's): ``alpha - 1/3``, the method's centre, for a shape of at least 1, not a NaN."""
        draws = torch.full((1, GAMMA_DRAWS), 0.5, dtype=torch.float64)
        draws[:, 3::3] = 0.0
        assert torch.allclose(
            gamma(torch.tensor([2.0], dtype=torch.float64), draws), torch.tensor([2.0 - 1 / 3], dtype=torch.float64)
        )


def test_index_is_uniform_and_stays_in_range():
    assert index(torch.tensor([0.0, 0.2499, 0.25, 0.999999, 1.0]), 4).tolist() == [0, 0, 1, 3, 3]


def test_uniforms_given_are_checked_in_one_line():
    with pytest.raises(UsageError, match=r"uniform must be \[2, 3\] \(a row per sample\), got \[3, 3\]"):
        uniforms(2, 3, device=torch.device("cpu"), uniform=torch.zeros(3, 3))
    with pytest.raises(UsageError, match="uniform must hold 3 draws per sample, got 2"):
        uniforms(2, 3, device=torch.device("cpu"), uniform=torch.zeros(2, 2))


@pytest.mark.parametrize(
    "uniform, message",
    [
        ([[0.5, 0.5, 0.5]] * 2, r"uniform must be a tensor of \[2, 3\] uniforms in \[0, 1\), got list"),
        (torch.ones((2, 3), dtype=torch.int64), r"uniform must hold floats in \[0, 1\), got torch.int64"),
        (torch.ones((2, 3), dtype=torch.bool), r"uniform must hold floats in \[0, 1\), got torch.bool"),
        (torch.full((2, 3), float("nan")), r"uniform must hold floats in \[0, 1\), got nan"),
        (torch.tensor([[0.5, 0.5, 0.5], [0.5, -0.25, 0.5]]), r"uniform must hold floats in \[0, 1\), got -0.25"),
        (torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 7.0]]), r"uniform must hold floats in \[0, 1\), got 7.0"),
    ],
)
def test_uniforms_that_are_not_uniforms_are_refused(uniform, message):
    """Integers (``torch.randint``), booleans, NaN and values outside [0, 1] made every draw one value, or failed
    deep inside a crop; a CPU tensor's values are checked (a GPU tensor's would wait for the device)."""
    with pytest.raises(UsageError, match=message):
        uniforms(2, 3, device=torch.device("cpu"), uniform=uniform)


def test_uniforms_rounded_up_to_one_are_taken():
    """A float64 uniform below 1 can round to 1.0 in float32: taken, as :func:`index` takes it."""
    given = torch.tensor([[0.0, 1.0, 0.5]] * 2)
    assert torch.equal(uniforms(2, 3, device=torch.device("cpu"), uniform=given), given)
