"""One-shot diffusion denoising (Carlini et al., ICLR 2023) against its formula.

A fake UNet whose output is a known constant c makes x̂₀ a closed form of x and ᾱ_t*:
ε-prediction x̂₀ = (x_t − √(1−ᾱ)·c)/√ᾱ, v-prediction √ᾱ·x_t − √(1−ᾱ)·c, sample-prediction c,
with x_t = √ᾱ·(2x − 1), then clamp to [−1, 1] and (x̂₀ + 1)/2. The schedule is Ho et al.'s
(1000 linear β from 1e-4 to 0.02), computed here in float64, not taken from diffusers.
"""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from smoothcert.denoisers import DiffusionDenoiser, one_shot_timestep
from smoothcert.errors import SmoothcertError

BETAS = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)
ALPHAS_CUMPROD = torch.cumprod(1 - BETAS, 0)


class ConstantUNet(nn.Module):
    """unet(x_t, t) = c in every output channel; records what it was called with."""

    def __init__(self, c, out_channels=3, wrap=True):
        super().__init__()
        self.c, self.out_channels, self.wrap, self.calls = c, out_channels, wrap, []

    def forward(self, x_t, t):
        self.calls.append((x_t.clone(), t.clone()))
        out = torch.full((x_t.shape[0], self.out_channels, *x_t.shape[2:]), float(self.c),
                         dtype=x_t.dtype)
        if self.out_channels > x_t.shape[1]:  # a learned variance: garbage the math must skip
            out[:, x_t.shape[1]:] = 1e6
        return SimpleNamespace(sample=out) if self.wrap else out


def scheduler(prediction_type="epsilon", alphas=ALPHAS_CUMPROD):
    return SimpleNamespace(alphas_cumprod=alphas,
                           config=SimpleNamespace(prediction_type=prediction_type))


def expected(x, c, alpha, kind):
    x64 = x.double()
    x_t = math.sqrt(alpha) * (2 * x64 - 1)
    x0 = {"epsilon": (x_t - math.sqrt(1 - alpha) * c) / math.sqrt(alpha),
          "v_prediction": math.sqrt(alpha) * x_t - math.sqrt(1 - alpha) * c,
          "sample": torch.full_like(x64, c)}[kind]
    return ((x0.clamp(-1, 1) + 1) / 2).float()


X = torch.rand(4, 3, 6, 6, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("kind", ["epsilon", "v_prediction", "sample"])
@pytest.mark.parametrize("c", [0.0, 0.3, -0.7])
def test_x0_is_the_formula_for_each_prediction_type(kind, c):
    unet = ConstantUNet(c)
    den = DiffusionDenoiser(unet, scheduler(kind), sigma=0.25)
    alpha = float(ALPHAS_CUMPROD[den.timestep])
    torch.testing.assert_close(den(X), expected(X, c, alpha, kind), rtol=0, atol=1e-6)
    x_t, t = unet.calls[-1]  # the UNet saw x_t = √ᾱ(2x − 1) at t*
    torch.testing.assert_close(x_t, (math.sqrt(alpha) * (2 * X.double() - 1)).float())
    assert t.tolist() == [den.timestep] * 4 and t.dtype == torch.long
    assert den.prediction_type == kind and den.sigma == 0.25


def test_with_c_zero_epsilon_prediction_returns_the_input():
    """ε̂ = 0: x̂₀ = x_t/√ᾱ = 2x − 1, so the denoiser is the identity on [0, 1]."""
    den = DiffusionDenoiser(ConstantUNet(0.0), scheduler(), sigma=0.5)
    torch.testing.assert_close(den(X), X, rtol=0, atol=1e-6)


def test_learned_variance_uses_the_first_c_channels():
    plain = DiffusionDenoiser(ConstantUNet(0.4), scheduler(), sigma=0.5)
    learned = DiffusionDenoiser(ConstantUNet(0.4, out_channels=6), scheduler(), sigma=0.5)
    torch.testing.assert_close(learned(X), plain(X), rtol=0, atol=0)
    bare = DiffusionDenoiser(ConstantUNet(0.4, wrap=False), scheduler(), sigma=0.5)
    torch.testing.assert_close(bare(X), plain(X), rtol=0, atol=0)  # a tensor, not .sample


def test_other_output_channels_are_refused():
    den = DiffusionDenoiser(ConstantUNet(0.0, out_channels=5), scheduler(), sigma=0.5)
    with pytest.raises(SmoothcertError, match="returns 5 channels for 3-channel inputs"):
        den(X)


def test_output_is_clipped_to_pixels():
    """A huge ε̂ drives x̂₀ far outside [−1, 1]: every pixel comes back exactly 0 or 1."""
    low = DiffusionDenoiser(ConstantUNet(1e3), scheduler(), sigma=0.5)(X)
    high = DiffusionDenoiser(ConstantUNet(-1e3), scheduler(), sigma=0.5)(X)
    assert torch.equal(low, torch.zeros_like(X)) and torch.equal(high, torch.ones_like(X))
    sample = DiffusionDenoiser(ConstantUNet(3.0), scheduler("sample"), sigma=0.5)(X)
    assert torch.equal(sample, torch.ones_like(X))


def test_unknown_prediction_type_is_refused():
    with pytest.raises(SmoothcertError, match="prediction_type 'x0'"):
        DiffusionDenoiser(ConstantUNet(0.0), scheduler("x0"), sigma=0.5)


# --------------------------------------------------------------------------- t*
SIGMAS = [0.05, 0.12, 0.25, 0.5, 1.0]


def brute_force(alphas, sigma):
    """argmin over t of |(1 − ᾱ_t)/ᾱ_t − 4σ²| by a plain loop (first on a tie)."""
    best, best_gap = None, math.inf
    for t, a in enumerate(alphas.tolist()):
        gap = abs((1 - a) / a - 4 * sigma * sigma)
        if gap < best_gap:
            best, best_gap = t, gap
    return best


@pytest.mark.parametrize("sigma", SIGMAS)
def test_timestep_is_the_brute_force_argmin(sigma):
    assert one_shot_timestep(ALPHAS_CUMPROD, sigma) == brute_force(ALPHAS_CUMPROD, sigma)
    assert one_shot_timestep(ALPHAS_CUMPROD.float().tolist(), sigma) == brute_force(
        ALPHAS_CUMPROD.float().double(), sigma)


@pytest.mark.parametrize("t", [0, 1, 57, 144, 400, 999])
def test_timestep_recovers_the_step_whose_noise_level_is_2_sigma(t):
    """σ = √((1 − ᾱ_t)/ᾱ_t)/2 is exactly step t's noise level on [0, 1]."""
    a = float(ALPHAS_CUMPROD[t])
    assert one_shot_timestep(ALPHAS_CUMPROD, math.sqrt((1 - a) / a) / 2) == t


@pytest.mark.parametrize("sigma", SIGMAS)
def test_timestep_is_carlini_et_al_s_first_crossing_or_the_step_before(sigma):
    """cifar10/certify.py: the first t ≥ 1 with √(1−ᾱ_t)/√ᾱ_t ≥ 2σ."""
    ratio = torch.sqrt((1 - ALPHAS_CUMPROD) / ALPHAS_CUMPROD)
    theirs = next(t for t in range(1, 1000) if ratio[t] >= 2 * sigma)
    assert one_shot_timestep(ALPHAS_CUMPROD, sigma) in (theirs - 1, theirs)


def test_timestep_grows_with_sigma_and_the_denoiser_reports_it():
    steps = [one_shot_timestep(ALPHAS_CUMPROD, s) for s in SIGMAS]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    den = DiffusionDenoiser(ConstantUNet(0.0), scheduler(), sigma=0.5)
    assert den.timestep == steps[SIGMAS.index(0.5)]
    assert den.with_sigma(1.0).timestep == steps[-1] and den.with_sigma(1.0).unet is den.unet


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan"), float("inf")])
def test_timestep_refuses_bad_sigma(bad):
    with pytest.raises(SmoothcertError, match="sigma must be a positive"):
        one_shot_timestep(ALPHAS_CUMPROD, bad)


def test_timestep_refuses_bad_schedules():
    for alphas in ([], [0.5, 0.0], [1.5]):
        with pytest.raises(SmoothcertError, match="alphas_cumprod"):
            one_shot_timestep(alphas, 0.5)
