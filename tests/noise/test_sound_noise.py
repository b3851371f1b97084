"""The sound discrete Gaussian (Voráček & Hein 2023): its thresholds against the authors'
formula, its sampler against the exact pmf (χ² and moments, also with the exact path forced),
exact noisy inputs on the grid, refused off-grid inputs, and the paper's kind of toy
counterexample: float smoothing certifies a radius that an input 0.78 away violates, the
discrete noise's certificate holds there."""

import math
import time

import mpmath
import numpy as np
import pytest
import torch
from scipy.stats import beta, chi2, norm
from torch import nn

from conftest import write_checkpoint
from smoothcert.cli.app import main
from smoothcert.errors import SmoothcertError
from smoothcert.noise import discrete_gaussian as sound_noise
from smoothcert.noise.base import NOISES
from smoothcert.noise.discrete_gaussian import DiscreteGaussian, _Table, clip_units, pmf, threshold
from smoothcert.noise.gaussian import Gaussian
from smoothcert.smoothing.smoothed import Smoothed


def offsets(sigma, shape, seed):
    noise = DiscreteGaussian(sigma)
    return sound_noise.draw_offsets(noise.table, shape, torch.Generator().manual_seed(seed),
                                    torch.device("cpu"))


@pytest.mark.parametrize("sigma", [0.12, 0.25, 0.5, 1.0])
def test_thresholds_match_the_authors_float_formula(sigma):
    """vvoracek/Sound-Randomized-Smoothing certifier.py (symbolic=False): k = max(1, int(6σ)),
    thresholds ceil(norm.cdf((2i+1)/510, scale=σ)·2⁶⁰) for i = −255(k+1) … 255(k+1) − 1, then
    the sentinel 2⁶⁰. Ours are exact floors; the authors' float64 ones agree to float error."""
    k = clip_units(sigma)
    assert k == max(1, int(6 * sigma))
    table = _Table.of(sigma)
    assert len(table.high) == 2 * (k + 1) * 255  # the authors' list, less its sentinel
    q = 2 ** 60
    for i in list(range(-255 * (k + 1), 255 * (k + 1), 37)) + [-1, 0, 255 * (k + 1) - 1]:
        authors = math.ceil(norm.cdf((2 * i + 1) / 510, scale=sigma) * q)
        assert abs(threshold(sigma, i, 60) - authors) <= q * 2e-15 + 1, i


def pooled_counts(values, probs, minimum=20.0):
    """Observed and expected counts over bins of consecutive values, each expecting ≥ minimum."""
    keys = sorted(probs)
    observed = dict(zip(*np.unique(values, return_counts=True)))
    bins, obs, exp = [], 0, 0.0
    for key in keys:
        obs, exp = obs + observed.get(key, 0), exp + probs[key] * len(values)
        if exp >= minimum:
            bins.append((obs, exp))
            obs, exp = 0, 0.0
    last_obs, last_exp = bins.pop()
    bins.append((last_obs + obs, last_exp + exp))
    return np.array([b[0] for b in bins]), np.array([b[1] for b in bins])


def chi_square_pvalue(values, sigma):
    observed, expected = pooled_counts(values, pmf(sigma))
    stat = ((observed - expected) ** 2 / expected).sum()
    return chi2.sf(stat, len(observed) - 1)


@pytest.mark.parametrize("sigma", [0.25, 1.0])
def test_sampler_matches_the_exact_pmf(sigma):
    """χ² goodness of fit of 400,000 draws against Φ((2j+1)/510σ) − Φ((2j−1)/510σ): p ≥ 10⁻⁴
    (fixed seed; a level a correct sampler fails once in 10⁴ seeds)."""
    c = offsets(sigma, (500, 800), seed=1).flatten().numpy()
    assert chi_square_pvalue(c, sigma) >= 1e-4
    limit = 255 * (clip_units(sigma) + 1)
    assert c.min() >= -limit and c.max() <= limit


def test_sampler_moments():
    """Mean 0 and variance Σ_j P(j)(j/255)² of the exact pmf, within 4 standard errors."""
    sigma = 0.5
    c = offsets(sigma, (400, 1000), seed=2).double().flatten() / 255
    var = sound_noise.variance(sigma)
    assert abs(float(c.mean())) < 4 * math.sqrt(var / c.numel())
    assert abs(float(c.var()) - var) < 4 * var * math.sqrt(2 / c.numel())
    assert var == pytest.approx(sigma ** 2 + 1 / (12 * 255 ** 2), rel=1e-4)


def test_the_exact_path_when_forced(monkeypatch):
    """With 10 first bits (1,020 thresholds in 1,024 values) nearly every draw ties with a
    threshold's first bits and is decided by the lazily drawn bits: the draws still fit the pmf."""
    monkeypatch.setattr(sound_noise, "HIGH_BITS", 10)
    monkeypatch.setattr(sound_noise, "BUCKET_BITS", 4)
    _Table.of.cache_clear(), sound_noise._tables_on.cache_clear()
    try:
        table = _Table.of(0.25)
        assert len(set(table.high)) > 200  # ties happen: the exact path is exercised
        c = offsets(0.25, (100, 500), seed=3).flatten().numpy()
        assert chi_square_pvalue(c, 0.25) >= 1e-4
    finally:
        _Table.of.cache_clear(), sound_noise._tables_on.cache_clear()


def test_exact_counts_against_mpmath():
    """U's first 31 bits equal to a threshold's: the count of thresholds ≤ U (with U's next 31
    bits drawn from the generator) is the exact one, computed with mpmath at 200 bits."""
    sigma = 0.5
    table = _Table.of(sigma)
    picks = list(range(0, len(table.high), 97))
    highs = [table.high[i] for i in picks]
    generator = torch.Generator().manual_seed(4)  # the same words as _count_exactly draws:
    words = torch.randint(0, 2 ** 31, (len(highs),),
                          generator=torch.Generator().manual_seed(4)).tolist()
    counts = sound_noise._count_exactly(table, highs, generator, torch.device("cpu"))
    limit = table.limit
    with mpmath.workprec(200):
        cdf = [mpmath.ncdf(mpmath.mpf(2 * i + 1) / (510 * mpmath.mpf(sigma)))
               for i in range(-limit, limit)]
        for h, w, count in zip(highs, words, counts):
            u_low = mpmath.mpf(h * 2 ** 31 + w) / 2 ** 62
            u_high = mpmath.mpf(h * 2 ** 31 + w + 1) / 2 ** 62
            assert sum(1 for t in cdf if t <= u_low) == count
            assert sum(1 for t in cdf if t < u_high) == count  # U's interval straddles none


def test_noisy_inputs_are_exact_grid_values_and_shift_with_the_input():
    """clip(m + c)/255 in float32: the same draws at m and m + 7 differ by 7/255 exactly (where
    not clipped), so the noisy input is a function of x + ε alone."""
    noise = DiscreteGaussian(0.5)
    x = torch.arange(0, 256, 4, dtype=torch.float32).reshape(1, 8, 8) / 255
    x2 = (torch.arange(0, 256, 4, dtype=torch.float32).reshape(1, 8, 8) + 7).clamp(max=255) / 255
    a = noise.perturb(x.expand(300, 1, 8, 8), torch.Generator().manual_seed(5))
    b = noise.perturb(x2.expand(300, 1, 8, 8), torch.Generator().manual_seed(5))
    ints_a, ints_b = torch.round(a * 255), torch.round(b * 255)
    assert torch.equal(a, ints_a / 255) and torch.equal(b, ints_b / 255)
    k = clip_units(0.5)
    assert ints_a.min() >= -255 * k and ints_a.max() <= 255 * (k + 1)
    shift = (torch.round(x2 * 255) - torch.round(x * 255)).expand_as(a)
    inside = (ints_a > -255 * k) & (ints_b < 255 * (k + 1))
    assert torch.equal((ints_b - ints_a)[inside], shift[inside])


def test_off_grid_inputs_are_refused_and_the_quantized_noise_rounds_them():
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    x = torch.full((1, 2, 2), 0.5)  # 127.5/255
    smoothed = Smoothed(model, DiscreteGaussian(0.25), num_classes=2)
    with pytest.raises(SmoothcertError, match="8-bit grid.*discrete-gaussian-quantized"):
        smoothed.certify(x, 10, 20, 0.001, 10, torch.Generator().manual_seed(0))
    quantized = Smoothed(model, NOISES["discrete-gaussian-quantized"](0.25), num_classes=2)
    cert = quantized.certify(x, 10, 20, 0.001, 10, torch.Generator().manual_seed(0))
    assert cert.n == 20
    with pytest.raises(SmoothcertError, match="one σ"):
        DiscreteGaussian(torch.tensor([0.25, 0.5]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_grid_value_is_accepted_and_one_ulp_off_is_refused(dtype):
    """The check compares with k/255 rounded once (a CPU division); it once compared with
    m / 255 on x's device, which CUDA computes as m · (1/255) and which refused 8-bit images
    (found on an H200). Here each of the 256 values passes, and its neighbours one ulp away
    fail, so any other rounding of the grid would fail this test."""
    noise = DiscreteGaussian(0.25)
    grid = torch.arange(256, dtype=torch.float64).div(255).to(dtype)
    assert torch.equal(noise.grid_points(grid), torch.arange(256, dtype=torch.int32))
    for direction in (-1.0, 2.0):
        nudged = torch.nextafter(grid[1:-1], torch.tensor(direction, dtype=dtype))
        for value in nudged[::17]:
            with pytest.raises(SmoothcertError, match="1 of 1 values"):
                noise.grid_points(value.reshape(1))


class BitProbe(nn.Module):
    """Class 0 if some coordinate of the input is not a multiple of 2⁻²⁹, else class 1.

    At x₀ = 0 the float noisy input is δ itself, and about 1.6% of N(0, 0.25) coordinates are
    below 2⁻⁶ with bits finer than 2⁻²⁹, so with 400 coordinates class 0 has p ≈ 0.998. At
    x₁ = 10/255 (float32 ulp 2⁻²⁸) every fl(x₁ + δ) is a multiple of 2⁻²⁹, so the base
    classifier says 1 on *every* draw — the floating-point rounding tells the two points apart.
    """

    def forward(self, z):
        scaled = z.flatten(1) * 2.0 ** 29  # exact: a power of two
        fine = (scaled != torch.round(scaled)).any(dim=1)
        return torch.stack([fine, ~fine], dim=1).float()


def test_toy_counterexample_float_is_false_discrete_is_sound():
    x0 = torch.zeros(1, 20, 20)
    x1 = torch.full((1, 20, 20), 10.0) / 255
    distance = float((x1 - x0).norm())
    assert distance == pytest.approx(0.784, abs=1e-3)
    sigma, n0, n, alpha = 0.5, 100, 10_000, 0.001

    unsound = Smoothed(BitProbe(), Gaussian(sigma), num_classes=2)
    cert = unsound.certify(x0, n0, n, alpha, 1000, torch.Generator().manual_seed(6))
    assert cert.prediction == 0 and cert.radius > 1.2 > distance
    votes = unsound.engine.votes(BitProbe(), x1, Gaussian(sigma), 2000, 2, 1000,
                                 torch.Generator().manual_seed(7))
    assert votes.tolist() == [0, 2000]  # g(x₁) = 1 for sure, 0.78 inside a "radius" of > 1.2

    sound = Smoothed(BitProbe(), DiscreteGaussian(sigma), num_classes=2)
    cert = sound.certify(x0, n0, n, alpha, 1000, torch.Generator().manual_seed(6))
    assert cert.prediction == 0 and cert.radius > distance  # a certificate that reaches x₁ …
    votes = sound.engine.votes(BitProbe(), x1, DiscreteGaussian(sigma), 2000, 2, 1000,
                               torch.Generator().manual_seed(7))
    assert votes[0] > 1900  # … and holds there: g(x₁) = 0 too


@pytest.mark.parametrize(("top", "n", "alpha"), [
    (99_990, 100_000, 0.001), (90_000, 100_000, 0.001), (6_000, 10_000, 0.01), (100, 100, 0.001),
])
def test_radius_is_the_authors_r1(top, n, alpha):
    """The authors' r1 = σ·norm.ppf(proportion_confint(top, n, alpha=2α, method="beta")[0]);
    statsmodels' "beta" lower bound is scipy's beta.ppf(α, top, n − top + 1)."""
    from smoothcert.stats import clopper_pearson_lower
    sigma = 0.5
    authors = sigma * norm.ppf(beta.ppf(alpha, top, n - top + 1))
    ours = DiscreteGaussian(sigma).radius(clopper_pearson_lower(top, n, alpha))
    assert ours == pytest.approx(authors, rel=1e-12)


# --------------------------------------------------------------------------- σ's bound
@pytest.mark.parametrize("sigma", [1e30, 1000.0, sound_noise.MAX_SIGMA * (1 + 1e-9)])
def test_a_sigma_beyond_the_bound_is_refused_before_the_table(sigma):
    """Step 13, item 5.1: σ = 1000 built a table for minutes and σ = 1e30 never ended; the
    bound is refused at once, by the noise and by the table's helpers."""
    started = time.perf_counter()
    for make in (DiscreteGaussian, NOISES["discrete-gaussian-quantized"], _Table.of, pmf,
                 sound_noise.variance):
        with pytest.raises(SmoothcertError, match=r"takes sigma <= 16, got .*: its exact "
                                                  r"sampler builds a table"):
            make(sigma)
    assert time.perf_counter() - started < 0.5
    assert DiscreteGaussian.max_sigma == sound_noise.MAX_SIGMA == 16.0


def test_the_cli_refuses_a_huge_sigma_in_one_line_and_writes_nothing(tmp_path, capsys):
    checkpoint = write_checkpoint(tmp_path / "ck.pt")
    out = tmp_path / "x.tsv"
    code = main(["certify", str(checkpoint), "--noise", "discrete-gaussian-quantized",
                 "--sigma", "1e30", "--n0", "20", "--n", "200", "--max", "1", "--device", "cpu",
                 "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "takes sigma <= 16" in err[0]
    assert not out.exists()
