"""The dual certificates of radial smoothing (stats/radial_dual.py): Cohen's radius where P is
the Gaussian, the Gaussian DSRS module's radius where Q is its ball, and for the generalized
Gaussian an independent Monte Carlo oracle of the worst classifier that certifies our radius,
refuses a radius 3 % larger, and catches an unsound certificate (Cohen's radius for this P)."""

import math

import numpy as np
import pytest
from scipy import special, stats

from smoothcert.stats.dsrs import dsrs_radius
from smoothcert.stats.radial_dual import (
    Problem,
    RadialLaw,
    certified_radius,
    lipschitz,
    lower_bound,
    p_level_radius,
)

TOL = 1e-4  # the walk stops on a step below 1e-4 (s units): the radius is at most ~1e-4 short


@pytest.mark.parametrize("p", [0.51, 0.6, 0.9, 0.99, 0.999, 0.999999])
def test_the_gaussian_radius_is_cohens(p):
    r = certified_radius(Problem(RadialLaw(784, 0)), p)
    assert stats.norm.ppf(p) - 5 * TOL <= r <= stats.norm.ppf(p)  # never above: sound


@pytest.mark.parametrize("th", [0.5, 0.9])
@pytest.mark.parametrize("p,q", [(0.9, 0.95), (0.99, 0.999), (0.7, 0.8), (0.9, 0.5)])
def test_the_gaussian_ball_agrees_with_the_dsrs_module(p, q, th):
    """Two independent computations of the same certificate (halfspace integrals there, the
    dual over radii here) agree to 1e-4 relative (the DSRS module's margins cost it ~1e-7)."""
    cut = math.sqrt(2 * special.gammaincinv(784 / 2, th))
    ours = certified_radius(Problem(RadialLaw(784, 0), RadialLaw(784, 0, cut=cut)), p, q)
    assert ours == pytest.approx(dsrs_radius(p, q, 1.0, 784, th), rel=1e-4, abs=5 * TOL)


def test_the_level_radius_inverts_the_log_density():
    level = np.array([-1e4, -1e3, -100.0, 0.0, 50.0])
    s = p_level_radius(level, 380)
    np.testing.assert_allclose(-2 * 380 * np.log(s) - s * s / 2, level, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(p_level_radius(level[:3], 0), np.sqrt(-2 * level[:3]))


def worst_mass(d, k, p, r, samples=4_000_000, seed=0):
    """P_δ of the Neyman–Pearson set {p_δ/p < t}, P(set) = p, by Monte Carlo (s units):
    u ~ P through its radius (√χ²_m) and angle ((1 + cos)/2 ~ Beta), the set's threshold the
    p-quantile of L = log p_δ(u) − log p(u), and P_δ(set) = E_P[e^L; L < t]. Shares no code
    with the module: only the density."""
    rng = np.random.default_rng(seed)
    rho = np.sqrt(rng.chisquare(d - 2 * k, samples))
    cos = 2 * rng.beta((d - 1) / 2, (d - 1) / 2, samples) - 1
    shifted = np.sqrt(np.maximum(rho ** 2 - 2 * r * rho * cos + r * r, 1e-300))
    log_l = (-2 * k * np.log(shifted) - shifted ** 2 / 2) - (-2 * k * np.log(rho) - rho ** 2 / 2)
    t = np.quantile(log_l, p)
    return float(np.mean(np.where(log_l < t, np.exp(np.minimum(log_l, 50)), 0.0)))


@pytest.mark.parametrize("d,k,p", [(784, 380, 0.9), (64, 16, 0.99)])
def test_the_generalized_gaussian_radius_against_monte_carlo(d, k, p):
    """At our radius the worst classifier keeps P_δ-mass ½ (Monte Carlo, 4e6 draws: standard
    error ~3e-4, the tolerance 2e-3 is ~6 of them); 3 % further it falls well below ½ (the
    radius is tight); and Cohen's radius σΦ⁻¹(p), unsound for this P at d = 784, is caught."""
    r = certified_radius(Problem(RadialLaw(d, k)), p)
    assert worst_mass(d, k, p, r) >= 0.5 - 2e-3
    assert worst_mass(d, k, p, 1.03 * r) < 0.5 - 2e-3
    if d == 784:  # the control: Cohen's radius in s units, σ = s·√(m/d)
        cohen = stats.norm.ppf(p) * math.sqrt(d / (d - 2 * k))
        assert cohen > r and worst_mass(d, k, p, cohen) < 0.5 - 5e-3


def test_the_dual_bound_holds_below_the_radius_and_the_walk_needs_no_monotonicity():
    """D(r) > ½ on a grid below the radius; the Lipschitz constant is ½E|∂₁ log p| (the
    Gaussian's is φ(0): the slope of Φ(Φ⁻¹(p) − r) at ½)."""
    problem = Problem(RadialLaw(784, 380))
    r = certified_radius(problem, 0.99)
    assert all(lower_bound(problem, x, 0.99) > 0.5 for x in np.linspace(0.01, r, 7))
    assert lipschitz(784, 0) == pytest.approx(1 / math.sqrt(2 * math.pi), rel=1e-12)
    assert certified_radius(problem, 0.5) == 0.0


def test_q_of_another_scale_certifies_at_least_neyman_pearson():
    p_law = RadialLaw(784, 380)
    np_radius = certified_radius(Problem(p_law), 0.99)
    both = certified_radius(Problem(p_law, RadialLaw(784, 380, c=0.8)), 0.99, 0.999)
    assert both > np_radius * 1.05
    # q below what the Neyman–Pearson set already has under Q: Q adds nothing
    assert certified_radius(Problem(p_law, RadialLaw(784, 380, c=0.8)), 0.99, 0.5) == \
        pytest.approx(np_radius, abs=TOL)
