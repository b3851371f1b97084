"""Median (percentile) smoothing's order statistics (``stats/median.py``): the authors' indices
exactly (golden numbers from their ``estimated_qu_ql``: tests/fixtures/median-smoothing/), the
intervals, bad input, and soundness on a linear model whose smoothed percentile is known in
closed form at every x + δ, with unsound controls the same test catches."""

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom, norm

from smoothcert.errors import SmoothcertError
from smoothcert.stats.median import certify_median, order_indices, side_alpha

GOLDEN = json.loads((Path(__file__).parents[1] / "fixtures" / "median-smoothing"
                     / "golden.json").read_text())


def test_indices_are_the_authors_estimated_qu_ql():
    assert GOLDEN["fields"] == ["n", "eps", "sigma", "percentile", "conf", "alpha", "q_u", "q_l"]
    for n, eps, sigma, p, _, alpha, q_u, q_l in GOLDEN["indices"]:  # 1620 cases, n ≤ 10000
        found = order_indices(n, p, eps / sigma, alpha)
        assert (found.k_upper, found.k_lower) == (q_u, q_l), (n, eps, sigma, p, alpha)


def test_the_authors_defaults_and_their_median():
    d = GOLDEN["defaults"]  # n 2000, eps 0.36, sigma 0.25, cert_conf 0.99999
    found = order_indices(d["n"], d["percentile"], d["eps"] / d["sigma"], d["alpha"])
    assert (found.k_lower, found.k_upper) == (d["q_l"], d["q_u"]) == (102, 1899)
    assert found.p_upper == pytest.approx(norm.cdf(0.36 / 0.25), rel=1e-15)
    for n, zero_based in GOLDEN["median"].items():  # their n // 2, 0-based: the same element
        assert order_indices(int(n), 0.5, 0.0, 0.01).k_median == zero_based + 1


def test_indices_outside_one_to_n_are_infinite_bounds():
    far = order_indices(50, 0.5, 4.0, 0.001)  # p_upper ≈ 1 − 3e-5: no order statistic bounds it
    assert (far.k_lower, far.k_upper) == (0, 51)
    samples = np.random.default_rng(0).normal(size=(50, 2))
    c = certify_median(samples, [0.5, 4.0], 1.0, alpha=0.001, correction="none")
    assert np.isneginf(c.lower[1]).all() and np.isposinf(c.upper[1]).all()
    assert np.isfinite(c.lower[0]).all() and np.isfinite(c.upper[0]).all()


def test_intervals_are_the_order_statistics_and_widen_with_eps():
    samples = np.random.default_rng(1).normal(size=(400, 3)) * [1.0, 2.0, 0.5]
    eps = [0.0, 0.1, 0.25, 0.5]
    c = certify_median(samples, eps, 0.5, percentile=0.25, alpha=0.01)
    assert c.side_alpha == side_alpha(0.01, 3, 4, "bonferroni") == 0.01 / 24
    ordered = np.sort(samples, axis=0)
    for e, radius in enumerate(eps):
        found = order_indices(400, 0.25, radius / 0.5, 0.01 / 24)
        assert (c.k_lower[e], c.k_upper[e]) == (found.k_lower, found.k_upper)
        assert (c.lower[e] == ordered[found.k_lower - 1]).all()
        assert (c.upper[e] == ordered[found.k_upper - 1]).all()
    assert (c.median == ordered[100]).all()  # ⌊0.25·400⌋ + 1 = 101st, 1-based
    assert (np.diff(c.lower, axis=0) <= 0).all() and (np.diff(c.upper, axis=0) >= 0).all()
    assert (c.lower <= c.median).all() and (c.median <= c.upper).all()
    order = np.random.default_rng(2).permutation(400)  # any order of the draws: the same
    again = certify_median(samples[order], eps, 0.5, percentile=0.25, alpha=0.01)
    assert (again.lower == c.lower).all() and (again.upper == c.upper).all()


@pytest.mark.parametrize("call, match", [
    (lambda: order_indices(0, 0.5, 0.1, 0.01), "n >= 1"),
    (lambda: order_indices(10, 1.0, 0.1, 0.01), "percentile"),
    (lambda: order_indices(10, 0.5, -0.1, 0.01), "eps/sigma"),
    (lambda: order_indices(10, 0.5, float("nan"), 0.01), "eps/sigma"),
    (lambda: order_indices(10, 0.5, 0.1, 0.0), "alpha"),
    (lambda: certify_median(np.zeros(10), [0.1], 1.0), "shape"),
    (lambda: certify_median([[0.0], [np.nan]], [0.1], 1.0), "finite"),
    (lambda: certify_median(np.zeros((5, 1)), [], 1.0), "at least one"),
    (lambda: certify_median(np.zeros((5, 1)), [0.1], 0.0), "sigma"),
    (lambda: certify_median(np.zeros((5, 1)), [0.1], 1.0, correction="holm"), "correction"),
    # issue 45: alpha = 2 returned bounds (Bonferroni's α/(2DE) fell inside (0, 1)), and the
    # others were a TypeError or a message in eps/sigma for a bad eps
    (lambda: certify_median(np.zeros((5, 2)), [0.1], 0.25, alpha=2.0), "alpha must lie"),
    (lambda: certify_median(np.zeros((5, 2)), [0.1], 0.25, alpha=1.0), "alpha must lie"),
    (lambda: certify_median(np.zeros((5, 2)), [0.1], 0.25, alpha=np.nan), "alpha must lie"),
    (lambda: certify_median(np.zeros((5, 2)), [0.1], 0.25, alpha="0.01"), "alpha must lie"),
    (lambda: certify_median(np.zeros((5, 2)), [0.1], "0.25"), "sigma must be a positive"),
    (lambda: certify_median(np.zeros((5, 2)), [0.1], np.inf), "sigma must be a positive"),
    (lambda: certify_median(np.zeros((5, 2)), [-0.1], 0.25), "radii eps must be finite"),
    (lambda: certify_median(np.zeros((5, 2)), [np.nan], 0.25), "radii eps must be finite"),
    (lambda: certify_median(np.zeros((5, 2)), "0.1", 0.25), "eps must be numbers"),
    (lambda: certify_median(np.zeros((5, 2)), [0.1], 0.25, percentile=1.5), "percentile"),
    (lambda: certify_median(np.zeros((5, 2)), [0.1], 0.25, percentile=None), "percentile"),
    (lambda: certify_median([["a", "b"]], [0.1], 0.25), "samples must be numbers"),
    (lambda: certify_median(np.zeros((5, 2)), [0.1], 0.25, correction=None), "correction"),
    (lambda: order_indices(10, "0.5", 0.1, 0.01), "percentile"),
    (lambda: order_indices(10, 0.5, "0.1", 0.01), "eps/sigma"),
])
def test_bad_input_is_one_line(call, match):
    with pytest.raises(SmoothcertError, match=match) as error:
        call()
    assert "\n" not in str(error.value)


def test_numbers_of_numpy_and_a_single_eps_are_numbers():
    """Checked, not narrowed: numpy scalars, integer outputs and one radius as a number."""
    samples = np.arange(40, dtype=np.int64).reshape(20, 2)
    one = certify_median(samples, np.float32(0.25), np.float64(0.5), alpha=np.float64(0.01))
    same = certify_median(samples.astype(float), [0.25], 0.5, alpha=0.01)
    assert one.eps.tolist() == [0.25] and (one.lower == same.lower).all()
    assert (one.upper == same.upper).all() and (one.median == same.median).all()


# Soundness. f(x) = W x + b under N(0, σ²I): output d of f(x + δ + G) is N(w_d·(x+δ) + b_d,
# σ²‖w_d‖²), so its p-th percentile at x + δ is w_d·(x+δ) + b_d + σ‖w_d‖Φ⁻¹(p), and over
# ‖δ‖₂ ≤ ε it ranges over ± ε‖w_d‖ around its value at x: the extremes of the ball, where
# the percentile bound is tight. A trial fails when some certified interval misses one of them.
SIGMA, N, TRIALS = 0.5, 20, 3000


def trials(seed, outputs, percentile, n=N):
    """TRIALS inputs: (samples (TRIALS, n, D), smoothed percentile at x (TRIALS, D), ‖w_d‖)."""
    g = np.random.default_rng(seed)
    w = g.normal(size=(outputs, 6))
    norms = np.linalg.norm(w, axis=1)
    centre = g.normal(size=(TRIALS, 6)) @ w.T + g.normal(size=outputs)
    samples = centre[:, None, :] + SIGMA * norms * g.normal(size=(TRIALS, n, outputs))
    return samples, centre + SIGMA * norms * norm.ppf(percentile), norms


def failures(lower, upper, truth, norms, eps):
    """Per trial: whether any interval (E, D) misses the true percentile's range on the ball."""
    low, high = truth[:, None, :] - eps[:, None] * norms, truth[:, None, :] + eps[:, None] * norms
    return ((lower > low) | (upper < high)).any(axis=(1, 2))


def tolerance(alpha):
    """The most failures TRIALS trials at rate α show but once in 10⁶ (a sound rate is ≤ α)."""
    return int(binom.ppf(1 - 1e-6, TRIALS, alpha))


def test_each_bound_fails_at_most_alpha_and_the_authors_0_based_lower_more():
    eps, alpha, p = np.array([0.125]), 0.05, 0.5  # ε/σ = 0.25: exact lower failure 0.0498
    samples, truth, norms = trials(3, 1, p)
    found = order_indices(N, p, eps[0] / SIGMA, alpha)
    ours = np.stack([certify_median(s, eps, SIGMA, percentile=p, alpha=alpha,
                                    correction="none").lower for s in samples])
    high = np.full_like(ours, np.inf)
    sound = failures(ours, high, truth, norms, eps).sum()
    ordered = np.sort(samples, axis=1)
    authors = ordered[:, None, found.k_lower]  # their detections_tensor[q_l]: X_(q_l + 1)
    unsound = failures(authors, high, truth, norms, eps).sum()
    exact = binom.cdf(found.k_lower - 1, N, found.p_lower)  # the sound rule's true rate
    assert exact <= alpha and abs(sound / TRIALS - exact) < 0.015, (sound, exact)
    assert sound <= tolerance(alpha) < unsound, (sound, unsound)  # 0.123: caught


@pytest.mark.parametrize("control", ["no eps shift", "no confidence"])
def test_upper_bound_is_sound_and_its_controls_are_not(control):
    eps, alpha, p, n = np.array([0.25]), 0.05, 0.75, 100  # k_upper 94 of 100: finite
    samples, truth, norms = trials(4, 1, p, n)
    found = order_indices(n, p, eps[0] / SIGMA, alpha)
    low = np.full((TRIALS, 1, 1), -np.inf)
    ours = np.stack([certify_median(s, eps, SIGMA, percentile=p, alpha=alpha,
                                    correction="none").upper for s in samples])
    assert np.isfinite(ours).all()
    sound = failures(low, ours, truth, norms, eps).sum()
    exact = binom.sf(found.k_upper - 1, n, found.p_upper)
    assert exact <= alpha and abs(sound / TRIALS - exact) < 0.015, (sound, exact)
    assert sound <= tolerance(alpha)
    if control == "no eps shift":  # a confidence bound on h_p(x), not on the ball
        k = order_indices(n, p, 0.0, alpha).k_upper
    else:  # the plug-in p_upper quantile, no binomial correction
        k = int(np.ceil(n * found.p_upper))
    unsound = np.sort(samples, axis=1)[:, None, k - 1]
    assert failures(low, unsound, truth, norms, eps).sum() > tolerance(alpha)


def test_bonferroni_holds_for_every_output_and_eps_at_once_and_none_does_not():
    eps, alpha, p = np.array([0.05, 0.125, 0.25]), 0.1, 0.5
    samples, truth, norms = trials(5, 4, p)
    rates = {}
    for correction in ("bonferroni", "none"):
        certs = [certify_median(s, eps, SIGMA, percentile=p, alpha=alpha,
                                correction=correction) for s in samples]
        lower, upper = np.stack([c.lower for c in certs]), np.stack([c.upper for c in certs])
        rates[correction] = failures(lower, upper, truth, norms, eps).sum()
    assert rates["bonferroni"] <= tolerance(alpha) < rates["none"], rates


def test_sound_for_integer_outputs_with_ties():
    """f = ⌊W x + b⌋ (integer outputs, many tied draws): with Z ~ N(m, s²) the percentile
    inf{y : P(⌊Z⌋ ≤ y) > p} is ⌊m + sΦ⁻¹(p)⌋, so over the ball it spans ⌊m ± ε‖w‖ + sΦ⁻¹(p)⌋."""
    eps, alpha, p = np.array([0.125, 0.25]), 0.05, 0.5
    samples, truth, norms = trials(6, 2, p)
    certs = [certify_median(np.floor(s), eps, SIGMA, percentile=p, alpha=alpha)
             for s in samples]
    lower, upper = np.stack([c.lower for c in certs]), np.stack([c.upper for c in certs])
    reach = eps[:, None] * norms
    low, high = np.floor(truth[:, None, :] - reach), np.floor(truth[:, None, :] + reach)
    assert np.isfinite(lower).all() and np.isfinite(upper).all()
    missed = ((lower > low) | (upper < high)).any(axis=(1, 2)).sum()
    assert missed <= tolerance(alpha), missed
