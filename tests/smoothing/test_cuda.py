"""What only a CUDA GPU runs: autocast in bf16 and fp16, torch.compile with Triton kernels, its
CUDA-graph modes, channels-last convolutions, and the sound noise's 8-bit grid on the device.

Skipped where no GPU is visible (the CPU suite runs the same code paths on the CPU: bf16 autocast,
channels-last, the grid check). On a GPU each test compares with what the float32 eager engine,
or a closed form, gives on the same draws: a halfspace at distance σ from x has p = Φ(1).
"""

from __future__ import annotations

import pytest
import torch

from conftest import Halfspace
from smoothcert.errors import SmoothcertError
from smoothcert.noise.discrete_gaussian import DiscreteGaussian, clip_units
from smoothcert.noise.gaussian import Gaussian
from smoothcert.smoothing.engine import COMPILE_MODES, BatchedVotes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

P = 0.8413447460685429  # Φ(1): the halfspace below at distance σ = 0.5
DRAWS = 30_000


def halfspace_votes(engine: BatchedVotes, batch: int = 4000, seed: int = 0) -> torch.Tensor:
    """Counts (2,) of the halfspace [x₀ > 0] at x₀ = 0.5 under N(0, 0.5²) on (1, 8, 8) inputs."""
    cuda = torch.device("cuda")
    w = torch.zeros(64)
    w[0] = 1.0
    model = Halfspace(w).to(cuda).eval()
    x = torch.zeros(1, 8, 8, device=cuda)
    x[0, 0, 0] = 0.5
    generator = torch.Generator(device=cuda).manual_seed(seed)
    return engine.votes(model, x, Gaussian(0.5), DRAWS, 2, batch, generator).cpu()


def within_sampling_error(counts: torch.Tensor) -> bool:
    """The share of class 1 within 5 standard errors of Φ(1) (a false alarm ~6e-7)."""
    return abs(int(counts[1]) / DRAWS - P) < 5 * (P * (1 - P) / DRAWS) ** 0.5


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_votes_have_the_halfspace_distribution(precision):
    counts = halfspace_votes(BatchedVotes(precision=precision))
    assert int(counts.sum()) == DRAWS and within_sampling_error(counts)


def test_channels_last_votes_have_the_halfspace_distribution():
    assert within_sampling_error(halfspace_votes(BatchedVotes(channels_last=True)))


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compiled_votes_are_the_eager_votes_on_the_same_draws(mode):
    # The same generator gives the same noise; a compiled kernel may round w·x otherwise, which
    # flips a vote only for a draw within float32 rounding of the hyperplane (~1e-7 of them).
    # A batch that does not divide the draws leaves a last, smaller batch: a graph mode must
    # replay or re-record for it, not return stale votes.
    eager = halfspace_votes(BatchedVotes(), batch=7000)
    compiled = halfspace_votes(BatchedVotes(compile=True, compile_mode=mode), batch=7000)
    assert int(compiled.sum()) == DRAWS
    assert (compiled - eager).abs().max() <= 2


def test_the_sound_noise_on_cuda_gives_exact_grid_values_that_shift_with_the_input():
    cuda = torch.device("cuda")
    noise = DiscreteGaussian(0.5)
    x = torch.arange(0, 256, 4, dtype=torch.float64).reshape(1, 8, 8).div(255).float()
    x2 = (torch.arange(0, 256, 4, dtype=torch.float64).reshape(1, 8, 8) + 7).clamp(max=255)
    x2 = x2.div(255).float()
    a = noise.perturb(x.to(cuda).expand(300, 1, 8, 8), torch.Generator(cuda).manual_seed(5))
    b = noise.perturb(x2.to(cuda).expand(300, 1, 8, 8), torch.Generator(cuda).manual_seed(5))
    ints_a, ints_b = torch.round(a * 255), torch.round(b * 255)
    assert torch.equal(a, ints_a / 255) and torch.equal(b, ints_b / 255)  # one function of m
    k = clip_units(0.5)
    inside = (ints_a > -255 * k) & (ints_b < 255 * (k + 1))
    shift = (torch.round(x2 * 255) - torch.round(x * 255)).to(cuda).expand_as(a)
    assert torch.equal((ints_b - ints_a)[inside], shift[inside])


def test_every_8_bit_value_is_accepted_on_cuda_and_one_ulp_off_is_refused():
    noise = DiscreteGaussian(0.25)
    grid = torch.arange(256, dtype=torch.float64).div(255).float().cuda()
    assert torch.equal(noise.grid_points(grid).cpu(), torch.arange(256, dtype=torch.int32))
    nudged = torch.nextafter(grid[1:-1], torch.tensor(2.0, device=grid.device))
    for value in nudged[::17]:
        with pytest.raises(SmoothcertError, match="1 of 1 values"):
            noise.grid_points(value.reshape(1))
