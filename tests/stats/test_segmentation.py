"""Fischer et al.'s per-pixel certificates (``stats/segmentation.py``): the authors' decisions
(tests/fixtures/segmentation-smoothing/, their ``certify`` with statsmodels' Holm and
Bonferroni), exact binomial tails, Holm against its adjusted-p-value form, and the family-wise
error under the worst null with an uncorrected control."""

import json
from fractions import Fraction
from math import comb
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

from smoothcert.errors import SmoothcertError
from smoothcert.stats.segmentation import (
    bonferroni_reject,
    certify_pixels,
    holm_reject,
    pixel_pvalues,
    segmentation_radius,
)

GOLDEN = json.loads((Path(__file__).parents[1] / "fixtures" / "segmentation-smoothing"
                     / "golden.json").read_text())
CASES = {case["name"]: case for case in GOLDEN["cases"]}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("correction", ["holm", "bonferroni"])
def test_certified_pixels_are_the_authors(name, correction):
    case = CASES[name]
    sel, est = np.array(case["selection"]), np.array(case["estimation"])
    c = certify_pixels(sel, est, case["tau"], case["alpha"], correction)
    assert c.prediction(-1).tolist() == case[correction]  # classes and abstentions, exactly
    assert c.n == case["n"]
    # the same tail from another SciPy version: the last bits may differ (the fixture script
    # keeps every p-value 1e-9 away from every threshold, so the decisions cannot)
    np.testing.assert_allclose(c.pvalues, case["pvalues"], rtol=1e-9, atol=1e-300)
    assert segmentation_radius(case["sigma"], case["tau"]) == pytest.approx(case["radius"],
                                                                            rel=1e-12)


def test_the_fixture_has_pixels_holm_certifies_and_bonferroni_does_not():
    case = CASES["holm-beats-bonferroni"]
    holm, bonf = np.array(case["holm"]) >= 0, np.array(case["bonferroni"]) >= 0
    assert (holm.sum(), bonf.sum()) == (18, 15) and not (bonf & ~holm).any()
    ties = CASES["ties-and-edges"]
    # selection ties go to the lowest class: pixels 1 and 2 select 1 and 0 (whose estimation
    # votes are 0: abstain), not 2 and 1 (which got every estimation vote)
    assert ties["holm"][:3] == [0, -1, -1]


def test_pvalues_are_the_exact_binomial_tail():
    n, tau = 12, Fraction(3, 4)
    exact = [float(sum(comb(n, k) * tau**k * (1 - tau)**(n - k) for k in range(v, n + 1)))
             for v in range(n + 1)]
    np.testing.assert_allclose(pixel_pvalues(np.arange(n + 1), n, 0.75), exact, rtol=1e-12)
    assert pixel_pvalues([0], n, 0.75)[0] == 1.0


def holm_by_adjusted_pvalues(p, alpha):
    """Holm as adjusted p-values: p̃_(j) = max_{i ≤ j} min(1, (m − i + 1) p_(i)) ≤ α."""
    order = np.argsort(p)
    m = len(p)
    adjusted = np.maximum.accumulate(np.minimum(1, (m - np.arange(m)) * p[order]))
    reject = np.zeros(m, dtype=bool)
    reject[order] = adjusted <= alpha
    return reject


def test_holm_is_its_adjusted_pvalue_form_and_contains_bonferroni():
    rng = np.random.default_rng(0)
    for _ in range(200):
        m = int(rng.integers(1, 40))
        p = np.where(rng.random(m) < 0.5, rng.random(m) * 0.01, rng.random(m))
        holm, bonf = holm_reject(p, 0.05), bonferroni_reject(p, 0.05)
        assert (holm == holm_by_adjusted_pvalues(p, 0.05)).all()
        assert not (bonf & ~holm).any()
        perm = rng.permutation(m)
        assert (holm_reject(p[perm], 0.05) == holm[perm]).all()


def test_tied_pvalues_share_a_decision_and_holm_stops_at_the_first_failure():
    # thresholds α/3, α/2, α/1 = 0.01, 0.015, 0.03: 0.02 fails α/2 and so does its twin,
    # though the second would pass α/1 alone; the step-down stops at the first failure
    p = np.array([0.02, 0.001, 0.02])
    assert holm_reject(p, 0.03).tolist() == [False, True, False]
    # a p-value equal to its threshold is rejected (statsmodels' <=): 0.015 / 3 == 0.005
    assert holm_reject(np.array([0.005, 0.005, 0.005]), 0.015).tolist() == [True] * 3
    assert bonferroni_reject(np.array([0.005, 0.005, 0.005]), 0.015).tolist() == [True] * 3
    assert holm_reject(np.array([0.0051, 0.0051]), 0.01).tolist() == [False, False]


def test_family_wise_error_under_the_worst_null_and_an_uncorrected_control():
    """Every pixel at p = τ exactly (each H0 true, at its boundary): the chance that an image
    certifies any pixel is ≤ α for both corrections; testing each pixel at α alone (no
    correction) is caught. 2000 images of 64 pixels, fixed generator; tolerance 3 binomial
    standard errors at α."""
    rng = np.random.default_rng(5)
    images, m, n, tau, alpha = 2000, 64, 100, 0.75, 0.05
    votes = rng.binomial(n, tau, size=(images, m))
    p = pixel_pvalues(votes, n, tau)
    tol = 3 * np.sqrt(alpha * (1 - alpha) / images)
    for reject in (holm_reject, bonferroni_reject):
        fwer = np.mean([reject(row, alpha).any() for row in p])
        assert fwer <= alpha + tol, (reject.__name__, fwer)
    uncorrected = np.mean((p <= alpha).any(axis=1))
    assert uncorrected > alpha + tol and uncorrected > 0.5


def test_bad_inputs_are_one_line():
    sel, est = np.array([[3, 0]]), np.array([[9, 1]])
    with pytest.raises(SmoothcertError, match="tau"):
        certify_pixels(sel, est, 0.4, 0.01)
    with pytest.raises(SmoothcertError, match="correction"):
        certify_pixels(sel, est, 0.75, 0.01, "fdr")
    with pytest.raises(SmoothcertError, match="alpha"):
        certify_pixels(sel, est, 0.75, 1.0)
    with pytest.raises(SmoothcertError, match="differ in shape"):
        certify_pixels(np.array([[3, 0, 0]]), est, 0.75, 0.01)
    with pytest.raises(SmoothcertError, match="same n"):
        certify_pixels(np.array([[3, 0], [0, 3]]), np.array([[9, 1], [5, 4]]), 0.75, 0.01)
    with pytest.raises(SmoothcertError, match="integers"):
        certify_pixels(sel.astype(float), est, 0.75, 0.01)
    with pytest.raises(SmoothcertError, match="p-values"):
        holm_reject(np.array([0.1, np.nan]), 0.05)


def test_radius_is_sigma_times_the_normal_quantile():
    assert segmentation_radius(0.25, 0.75) == 0.25 * norm.ppf(0.75)
    assert segmentation_radius(0.5, 0.5) == 0.0
    assert segmentation_radius(np.float32(0.25), np.float32(0.75)) == pytest.approx(
        0.25 * norm.ppf(0.75), rel=1e-6)  # numpy's numbers are numbers (float32 0.75: exact)


@pytest.mark.parametrize("sigma, tau, said", [
    (-1, 0.75, "sigma must be a positive finite number"),  # issue 45: radius −0.674
    (0.25, 0.4, r"tau must lie in \[0.5, 1\)"),  # issue 45: radius −0.063
    (0.0, 0.75, "sigma must be a positive"), (np.inf, 0.75, "sigma must be a positive"),
    ("0.25", 0.75, "sigma must be a positive"), (0.25, 1.0, "tau must lie"),
    (0.25, np.nan, "tau must lie"), (0.25, True, "tau must lie"), (0.25, "0.75", "tau must"),
])
def test_radius_refuses_a_sigma_or_tau_outside_its_range(sigma, tau, said):
    with pytest.raises(SmoothcertError, match=said) as error:
        segmentation_radius(sigma, tau)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("call, said", [
    (lambda: pixel_pvalues([3, 5], 10, 0.4), "tau must lie"),
    (lambda: pixel_pvalues([3, 5], 0, 0.75), "n must be an integer >= 1"),
    (lambda: pixel_pvalues([3.5], 10, 0.75), r"votes must lie in \[0, n = 10\]"),
    (lambda: pixel_pvalues([11], 10, 0.75), r"votes must lie in \[0, n = 10\]"),
    (lambda: holm_reject(np.array([0.01, 0.2]), 1.5), "alpha must lie strictly between"),
    (lambda: bonferroni_reject(np.array([0.01, 0.2]), 0.0), "alpha must lie strictly"),
])
def test_the_tests_refuse_what_is_no_level_or_count(call, said):
    """Before: τ = 0.4 gave p-values of another hypothesis, α = 1.5 rejected everything."""
    with pytest.raises(SmoothcertError, match=said):
        call()
