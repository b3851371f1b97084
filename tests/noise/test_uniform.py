"""Uniform noise U[−λ, λ]^d, λ = √3·σ, and its L1 certificate 2λ(p − ½) (Yang et al. 2020)."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import binom

from conftest import Halfspace
from smoothcert import SmoothcertError, Smoothed, clopper_pearson_lower
from smoothcert.noise.base import NOISES
from smoothcert.noise.uniform import Uniform

SQRT3 = math.sqrt(3.0)


def test_l1_radius_is_the_closed_form_in_float64():
    p = np.array([0.5, 0.6, 0.75, 0.999])
    noise = Uniform(0.5)
    expected = 2 * (SQRT3 * 0.5) * (p - 0.5)
    np.testing.assert_allclose(noise.radius(p), expected, rtol=1e-15, atol=0)
    assert noise.radius(p).dtype == np.float64
    assert isinstance(noise.radius(0.75), float) and noise.radius(1.0) == pytest.approx(SQRT3 / 2)
    per_sample = Uniform(torch.tensor([0.25, 1.0]))
    np.testing.assert_allclose(per_sample.radius([0.75, 0.75]), 2 * SQRT3 * np.array([0.25, 1.0])
                               * 0.25, rtol=1e-7)
    assert noise.norm == "l1" and NOISES["uniform"] is Uniform
    assert Uniform(0.5).half_width == pytest.approx(SQRT3 * 0.5)


@pytest.mark.parametrize("draw", ["sample", "sample_"])
def test_draws_stay_in_the_cube_and_have_standard_deviation_sigma(draw):
    """10⁶ draws at σ = 0.3: every value in [−λ, λ]; the sample variance is within 5 standard
    errors of σ² (the SE of s² is σ²·√(0.8/N) for a uniform law, 0.09 % here), the mean within
    5·σ/√N of 0."""
    sigma, num = 0.3, 1_000_000
    noise, g = Uniform(sigma), torch.Generator().manual_seed(0)
    like = torch.empty(num, 1, dtype=torch.float64)
    eps = noise.sample(like, g) if draw == "sample" else noise.sample_(like, g)
    lam = SQRT3 * sigma
    assert eps.min() >= -lam and eps.max() <= lam
    assert eps.min() < -0.999 * lam and eps.max() > 0.999 * lam  # the whole cube is used
    var, se = float(eps.var()), sigma**2 * math.sqrt(0.8 / num)
    assert abs(var - sigma**2) < 5 * se
    assert abs(float(eps.mean())) < 5 * sigma / math.sqrt(num)


def test_per_sample_sigma_scales_each_row():
    sigma = torch.tensor([0.1, 1.0])
    g = torch.Generator().manual_seed(1)
    eps = Uniform(sigma).sample(torch.zeros(2, 50_000), g)
    lam = SQRT3 * sigma
    assert (eps.abs().max(dim=1).values <= lam).all()
    torch.testing.assert_close(eps.std(dim=1), sigma, rtol=0.02, atol=0)
    x = torch.zeros(2, 3)
    assert Uniform(sigma).perturb(x, g).shape == (2, 3)
    with pytest.raises(SmoothcertError, match="per-sample σ has 2 entries"):
        Uniform(sigma).sample(torch.zeros(3, 4), g)
    with pytest.raises(SmoothcertError, match="positive"):
        Uniform(-1.0)


def test_linear_oracle_l1_radius_approaches_the_distance_from_below():
    """f = [x₀ > 0]: under U[−λ, λ]² noise p_A = clip((d + λ)/(2λ), 0, 1) at x = (d, ·), so the
    exact L1 radius 2λ(p_A − ½) equals d, the L1 distance to the boundary."""
    sigma, d, n, alpha = 0.5, 0.3, 200_000, 0.001
    lam = SQRT3 * sigma
    p_a = min(max((d + lam) / (2 * lam), 0.0), 1.0)
    model = Smoothed(Halfspace((1.0, 0.0), input_shape=(1, 1, 2)), Uniform(sigma), num_classes=2)
    g = torch.Generator().manual_seed(2)
    cert = model.certify(torch.tensor([d, 0.3]).reshape(1, 1, 2), 100, n, alpha, 20_000, g)
    assert cert.prediction == 1 and cert.sigma == sigma
    # the count matches the closed-form p_A (exact binomial tail, two-sided 1e-4)
    assert binom.ppf(5e-5, n, p_a) <= cert.count <= binom.ppf(1 - 5e-5, n, p_a)
    assert cert.p_lower == clopper_pearson_lower(cert.count, n, alpha) <= p_a
    assert cert.radius == pytest.approx(2 * lam * (cert.p_lower - 0.5), rel=1e-12)
    assert d - 0.02 < cert.radius <= d


def test_uniform_certifier_is_registered_with_certify_columns():
    """The former ``uniform`` certifier is CERTIFY with uniform noise: its name still resolves."""
    from smoothcert.certifiers import CERTIFY_COLUMNS
    from smoothcert.runs import certifier_class
    from smoothcert.upgrade import certifier_spelling

    name, noise = certifier_spelling("uniform", None)
    assert noise == "uniform"
    assert certifier_class(name).columns == CERTIFY_COLUMNS and certifier_class(name).needs_n0
