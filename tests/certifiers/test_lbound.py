"""The L-bound (Campbell et al., Theorem 3) against closed forms.

Oracle: a "probit tree" on 2-D inputs, f = [1 − a, a·(1 − b), a·b] with a = Φ((x₀ − c₀)/τ) and
b = Φ((x₁ − c₁)/τ) (τ = 0: the hard tree of two halfspaces). The noise coordinates are independent
and E[Φ((t + δ)/τ)] = Φ(t/√(τ² + σ²)) for δ ~ N(0, σ²), so its Gaussian average G is the same
tree at τ' = √(τ² + σ²), in closed form. With two classes it is f = [1 − a, a]; for τ = 0 that is
the halfspace, where G_A = Φ(d/σ) and the L-bound is σ√(π/2)(2Φ(d/σ) − 1).
"""

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from smoothcert import Gaussian, SmoothcertError, Smoothed
from smoothcert.certifiers.lbound import certify_lbound, lbound_heuristic
from smoothcert.smoothing.engine import BatchedVotes
from smoothcert.stats.margins import lbound_radius, lipschitz_constant, margin, margin_lower_bound

CENTER = (0.0, 0.0)  # (c₀, c₁)


def tree_probs(x0, x1, tau, classes=3):
    """The probit tree's probabilities (..., classes) in float64 (NumPy); τ = 0 is hard."""
    x0, x1 = np.asarray(x0, dtype=np.float64), np.asarray(x1, dtype=np.float64)
    a = norm.cdf((x0 - CENTER[0]) / tau) if tau > 0 else (x0 > CENTER[0]).astype(np.float64)
    if classes == 2:
        return np.stack([1 - a, a], axis=-1)
    b = norm.cdf((x1 - CENTER[1]) / tau) if tau > 0 else (x1 > CENTER[1]).astype(np.float64)
    return np.stack([1 - a, a * (1 - b), a * b], axis=-1)


def gaussian_average(x0, x1, tau, sigma, classes=3):
    """G = f ∗ N(0, σ²I) in closed form: the tree at √(τ² + σ²)."""
    return tree_probs(x0, x1, math.hypot(tau, sigma), classes)


class ProbitTree(torch.nn.Module):
    """The probit tree as a model: logits log f (float64 when soft), so softmax(logits) = f."""

    input_shape = (1, 1, 2)

    def __init__(self, tau, classes=3):
        super().__init__()
        self.tau, self.classes = tau, classes

    def forward(self, x):
        z = x.flatten(1).double() - torch.tensor(CENTER, dtype=torch.float64)
        if self.tau > 0:
            a, b = torch.special.ndtr(z[:, 0] / self.tau), torch.special.ndtr(z[:, 1] / self.tau)
        else:
            a, b = (z[:, 0] > 0).double(), (z[:, 1] > 0).double()
        p = [1 - a, a] if self.classes == 2 else [1 - a, a * (1 - b), a * b]
        logits = torch.stack(p, dim=1).log()  # hard: 0 and −inf, exact in float32 (faster)
        return logits if self.tau > 0 else logits.float()


def smoothed(tau, sigma, classes=3):
    return Smoothed(ProbitTree(tau, classes), Gaussian(sigma), num_classes=classes)


def point(x0, x1=0.25):
    return torch.tensor([x0, x1], dtype=torch.float32).reshape(1, 1, 2)


def exact_lbound(x0, x1, tau, sigma, classes=3):
    p = np.sort(gaussian_average(x0, x1, tau, sigma, classes))[::-1]
    return sigma * math.sqrt(math.pi / 2) * (p[0] - p[1]), p[0] - p[1]


# --------------------------------------------------------------------------- the bound itself
def test_lbound_of_a_halfspace_never_exceeds_the_distance_and_is_tight_at_the_boundary():
    # G_A = Φ(d/σ); the exact robustness radius of G's top class is d itself.
    sigma = 0.5
    d = np.geomspace(1e-4, 3.0, 200)
    r = np.array([lbound_radius(2 * norm.cdf(t / sigma) - 1, sigma) for t in d])
    assert np.all(r <= d * (1 + 1e-12))
    assert r[0] / d[0] > 0.9999  # tight as d → 0: the constant √(2/π)/σ cannot be lowered
    assert lipschitz_constant(sigma) == pytest.approx(math.sqrt(2 / math.pi) / sigma, rel=1e-15)
    assert lbound_radius(-0.1, sigma) == 0.0


def test_margin_lower_bound_formulas():
    p, n, alpha = np.array([0.7, 0.2, 0.1]), 1000, 0.01
    assert margin(p, 0) == (1, pytest.approx(0.5))
    assert margin_lower_bound(p, 0, n, alpha, "pairwise") == pytest.approx(
        0.5 - math.sqrt(2 * math.log(2 / alpha) / n), rel=1e-14)
    assert margin_lower_bound(p, 0, n, alpha, "top") == pytest.approx(
        2 * (0.7 - math.sqrt(math.log(1 / alpha) / (2 * n))) - 1, rel=1e-14)
    assert margin_lower_bound(p, 0, n, alpha, "none") == pytest.approx(0.5)
    with pytest.raises(SmoothcertError, match="pairwise, top, none"):
        margin_lower_bound(p, 0, n, alpha, "bernstein")


@pytest.mark.parametrize("x0", [0.05, 0.3, 0.8])
def test_top_class_of_the_closed_form_average_is_constant_within_the_lbound(x0):
    """Lipschitz sanity on the 3-class hard tree: on a dense polar grid around x, the nearest
    point where G's argmax changes lies beyond the L-bound — and within twice it (not vacuous)."""
    sigma, x1 = 0.5, 0.1
    radius, _ = exact_lbound(x0, x1, 0.0, sigma)
    top = int(np.argmax(gaussian_average(x0, x1, 0.0, sigma)))
    angles = np.linspace(0, 2 * np.pi, 1440, endpoint=False)
    rho = np.concatenate([np.linspace(0, 2 * radius, 801), [radius * (1 - 1e-9)]])
    g = gaussian_average(x0 + rho[:, None] * np.cos(angles), x1 + rho[:, None] * np.sin(angles),
                         0.0, sigma)
    changed = (g.argmax(axis=-1) != top).any(axis=1)
    assert changed.any() and rho[changed].min() >= radius


# --------------------------------------------------------------------------- Monte Carlo
def test_soft_scores_match_votes_on_a_hard_model_and_the_closed_form_on_a_soft_one():
    engine, x, sigma = BatchedVotes(), point(0.2), 0.5
    hard = ProbitTree(0.0)
    votes = engine.votes(hard, x, Gaussian(sigma), 1001, 3, 100, torch.Generator().manual_seed(4))
    soft = engine.soft_scores(hard, x, Gaussian(sigma), 1001, 3, 100,
                              torch.Generator().manual_seed(4))
    assert soft.dtype == torch.float64 and torch.equal(soft * 1001, votes.double())
    n = 100_000  # each entry has standard deviation ≤ ½/√n ≈ 0.0016; tolerance 5 of them
    for tau in (0.0, 0.3):
        est = engine.soft_scores(ProbitTree(tau), x, Gaussian(sigma), n, 3, 10_000,
                                 torch.Generator().manual_seed(5)).numpy()
        assert est.sum() == pytest.approx(1.0, abs=1e-12)
        assert np.abs(est - gaussian_average(0.2, 0.25, tau, sigma)).max() < 0.008


@pytest.mark.parametrize("classes,tau,bound,x0,x1", [
    (2, 0.0, "pairwise", 0.4, 0.25), (3, 0.0, "pairwise", 0.4, 0.25),
    (3, 0.3, "pairwise", 0.4, 0.25), (3, 0.3, "top", 0.75, 1.0),  # "top" needs G_A > ½
])
def test_confidence_lbound_is_below_and_close_to_the_exact_value(classes, tau, bound, x0, x1):
    sigma, n, alpha = 0.5, 100_000, 0.001
    exact_radius, exact_gap = exact_lbound(x0, x1, tau, sigma, classes)
    if classes == 2 and tau == 0:  # the halfspace: σ√(π/2)(2Φ(d/σ) − 1)
        assert exact_radius == pytest.approx(
            sigma * math.sqrt(math.pi / 2) * (2 * norm.cdf(x0 / sigma) - 1), rel=1e-12)
    cert = certify_lbound(smoothed(tau, sigma, classes), point(x0, x1), n, alpha, 10_000,
                          torch.Generator().manual_seed(6), bound=bound)
    assert cert.guarantee == "confidence" and not cert.abstained and cert.n0 == 0
    assert cert.prediction == int(np.argmax(gaussian_average(x0, x1, tau, sigma, classes)))
    assert cert.gap_lower <= exact_gap and cert.radius <= exact_radius
    assert cert.radius == pytest.approx(lbound_radius(cert.gap_lower, sigma), rel=1e-15)
    # the price of the confidence bound: Hoeffding's width plus the sampling error (5 sd)
    width = math.sqrt(2 * math.log((classes - 1) / alpha) / n) if bound == "pairwise" else (
        2 * math.sqrt(math.log(1 / alpha) / (2 * n)))
    slack = width + 5 * 2 * 0.5 / math.sqrt(n) + (
        exact_gap - (2 * np.max(gaussian_average(x0, x1, tau, sigma, classes)) - 1)
        if bound == "top" else 0.0)
    assert cert.gap_lower > exact_gap - slack
    plain = certify_lbound(smoothed(tau, sigma, classes), point(x0, x1), n, alpha, 10_000,
                           torch.Generator().manual_seed(6), bound="none")
    assert plain.guarantee == "heuristic"
    assert plain.radius == pytest.approx(exact_radius, abs=5 * 0.5 / math.sqrt(n))


@pytest.mark.parametrize("bound", ["pairwise", "top", "none"])
def test_rate_of_overclaimed_margins_over_20000_trials(bound):
    """P(gap_lower > exact margin) ≤ α for the confidence bounds; the plug-in estimate ("none")
    over-claims about half the time, which shows the test can fail. The n softmax outputs
    f(x + δᵢ) of each trial are simulated with the closed-form tree (the engine's own draws are
    checked above); x is near a corner, where the 3 classes compete."""
    sigma, x0, x1, n, alpha, trials = 0.5, 0.3, 0.05, 50, 0.1, 20_000
    _, exact_gap = exact_lbound(x0, x1, 0.0, sigma)
    top = int(np.argmax(tree_probs(x0, x1, 0.0)))  # the clean prediction, as certify_lbound
    delta = np.random.default_rng(0).normal(0.0, sigma, size=(trials, n, 2))
    p_mean = tree_probs(x0 + delta[..., 0], x1 + delta[..., 1], 0.0).mean(axis=1)
    gaps = np.array([margin_lower_bound(p, top, n, alpha, bound) for p in p_mean])
    rate = np.mean(gaps > exact_gap)
    if bound == "none":
        assert rate > 0.3
    else:
        assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / trials)


def test_lbound_abstains_when_the_clean_class_is_not_the_top_of_the_average():
    # at x = (0.02, 0.0) the clean hard tree says class 1, but G = [0.48, 0.26, 0.26]
    sigma, x = 0.5, point(0.02, 0.0)
    g_avg = gaussian_average(0.02, 0.0, 0.0, sigma)
    assert g_avg.argmax() == 0
    model = smoothed(0.0, sigma)
    cert = certify_lbound(model, x, 20_000, 0.001, 5000, torch.Generator().manual_seed(7))
    assert cert.abstained and cert.prediction is None and cert.radius == 0.0
    assert cert.gap_lower < 0 and cert.runner_up == 0
    drawn = certify_lbound(model, x, 20_000, 0.001, 5000, torch.Generator().manual_seed(7),
                           n0=1000)
    assert not drawn.abstained and drawn.prediction == 0 and drawn.n0 == 1000
    assert 0 < drawn.radius <= exact_lbound(0.02, 0.0, 0.0, sigma)[0]


# --------------------------------------------------------------------------- the heuristic
@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("x0", [0.125, 0.5, -0.25])
def test_heuristic_is_exact_when_the_model_is_a_gaussian_average(classes, x0):
    """The tree at τ = σ IS the Gaussian average at σ of the hard tree: the heuristic then
    equals the closed-form L-bound of that average, up to float64 rounding."""
    sigma, x1 = 0.5, 0.25
    cert = lbound_heuristic(smoothed(sigma, sigma, classes), point(x0, x1))
    radius, gap = exact_lbound(x0, x1, 0.0, sigma, classes)
    assert cert.guarantee == "heuristic" and cert.n == 0 and cert.bound == "model"
    assert cert.alpha is None
    assert cert.radius == pytest.approx(radius, rel=1e-12)
    assert cert.gap_lower == pytest.approx(gap, rel=1e-12)
    assert cert.prediction == int(np.argmax(gaussian_average(x0, x1, 0.0, sigma, classes)))


def test_heuristic_abstains_only_on_a_tie():
    cert = lbound_heuristic(smoothed(0.5, 0.5, 2), point(0.0))
    assert cert.abstained and cert.radius == 0.0 and cert.prediction is None


def test_lbound_refuses_noise_other_than_gaussian():
    class Laplace:  # any noise object without the Gaussian's Lipschitz constant
        norm = "l1"

    model = Smoothed(ProbitTree(0.0), Laplace(), num_classes=3)
    with pytest.raises(SmoothcertError, match="needs Gaussian noise"):
        lbound_heuristic(model, point(0.2))
    with pytest.raises(SmoothcertError, match="needs Gaussian noise"):
        certify_lbound(model, point(0.2), 10, 0.01, 10)
