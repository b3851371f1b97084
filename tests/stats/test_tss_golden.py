"""TSS's resolvable certificates (``stats/tss.py``) against the authors' functions (golden
numbers from AI-secure/semantic-randomized-smoothing, ``semantic/transformers.py``, made by
tests/fixtures/tss/make_fixtures.py), their closed forms, and bad input.

Tolerances, from float64 (ε = 2⁻⁵²). Compared exactly: the uniform and exponential blur (the
same operations as theirs), translation (σ·Φ̄⁻¹(1 − p) and their σ·Φ⁻¹(p) agree to the bit on
the grid) and the contrast bisection (the same midpoints; every decision the same).
Elsewhere the two differ by how the arguments are rounded: theirs rounds 1 − p/2, ½ + p/2 and
2 − 2Φ(·) and then takes Φ⁻¹, which turns an error δ of a probability into δ/φ(z) (φ the normal
density at the quantile z); ours keeps exact arguments and lowers the one cancelling margin by
64 ulps. Each tolerance below is that propagation, with a few ulps to spare.
"""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

from smoothcert.errors import SmoothcertError
from smoothcert.stats.tss import (
    BLUR_DISTRIBUTIONS,
    blur_radius,
    brightness_radius,
    brightness_shift_bound,
    contrast_radius,
    contrast_range,
    translation_radius,
)

GOLDEN = json.loads((Path(__file__).parents[1] / "fixtures" / "tss" / "golden.json")
                    .read_text())
EPS = sys.float_info.epsilon
P_ABOVE_HALF = [0.5001, 0.6, 0.75, 0.9, 0.99, 0.999, 0.99999]


def rows(name):
    part = GOLDEN[name]
    return [dict(zip(part["fields"], row, strict=True)) for row in part["rows"]]


def chain_tolerance(p, b, log_k, sigma_k, sigma_b):
    """|ours − theirs| allowed for a brightness bound b > 0. Theirs rounds the argument of
    the first quantile z₁ = Φ⁻¹(1 − p/2) or Φ⁻¹(½ + p/2) (Δz₁ = ε/φ(z₁)); y = e^k·z₁ carries
    e^k·Δz₁ + ε·y, p_B = 2Φ̄(y) or 2Φ(y) − 1 then 2φ(y)·Δy + 4ε, z = Φ⁻¹(p_B) that over φ(z);
    the margin z² − t² carries 2z·Δz plus our 64-ulp lowering, and b = σ_b·f·√margin half the
    margin's error over √margin, plus a few ulps of the products."""
    factor = min(math.exp(-log_k), 1.0)
    margin = (b / (sigma_b * factor)) ** 2
    t2 = 0.0 if log_k == 0.0 else (log_k / sigma_k) ** 2
    z = math.sqrt(margin + t2)
    z1 = norm.isf(p / 2) if log_k >= 0 else norm.isf((1 - p) / 2)
    dy = math.exp(log_k) * (EPS / norm.pdf(z1) + EPS * z1)
    dz = (2 * norm.pdf(math.exp(log_k) * z1) * dy + 4 * EPS) / norm.pdf(z)
    dmargin = 2 * z * dz + 64 * EPS * (z * z + t2 + 1)
    return sigma_b * factor * dmargin / (2 * math.sqrt(margin)) + 4 * EPS * b


def test_fixture_is_the_authors_current_code():
    assert GOLDEN["repository"] == "AI-secure/semantic-randomized-smoothing"
    assert GOLDEN["commit"] == "76361d363ced8f1a3fd36ba1db8eac01d026f007"  # Aug 2022, after
    # 7a7df33 (Feb 2021), Bibi's fix of calc_b_bound
    sizes = {k: len(v["rows"]) for k, v in GOLDEN.items() if isinstance(v, dict)}
    assert sizes == {"brightness_b_bound": 370, "brightness_radius": 290, "contrast": 120,
                     "blur": 100, "translation": 27}


def test_brightness_shift_bound_is_their_calc_b_bound():
    certified = 0
    for row in rows("brightness_b_bound"):
        ours = brightness_shift_bound(row["p"], row["log_k"], row["sigma_k"], row["sigma_b"])
        theirs = row["b_bound"]
        assert (ours > 0) == (theirs > 0), row
        if theirs > 0:
            certified += 1
            tol = chain_tolerance(row["p"], theirs, row["log_k"], row["sigma_k"],
                                  row["sigma_b"])
            assert abs(ours - theirs) <= tol, (row, ours, ours - theirs, tol)
    assert certified == 142  # the others certify nothing in both (p ≤ ½, margin ≤ 0)


def test_brightness_radius_is_their_calc_radius():
    for row in rows("brightness_radius"):
        args = row["p"], row["sigma_k"], row["sigma_b"], row["k_low"], row["k_high"]
        ours, theirs = brightness_radius(*args), row["radius"]
        assert (ours > 0) == (theirs > 0), row
        if theirs > 0:
            ends = [math.log(row["k_low"]), math.log(row["k_high"])]
            tol = max(chain_tolerance(row["p"], theirs, k, row["sigma_k"], row["sigma_b"])
                      for k in ends)
            assert abs(ours - theirs) <= tol, (row, ours - theirs, tol)


@pytest.mark.parametrize("sigma_k", [0.0, 0.2, 1.0])
@pytest.mark.parametrize("sigma_b", [0.1, 0.2, 2.0])
def test_brightness_alone_is_cohen_in_one_dimension(sigma_k, sigma_b):
    for p in P_ABOVE_HALF:
        expected = sigma_b * norm.ppf(p)  # at contrast 1 the b-scale does not change
        assert brightness_radius(p, sigma_k, sigma_b) == pytest.approx(expected, rel=4 * EPS)
        assert brightness_shift_bound(p, 0.0, sigma_k, sigma_b) == brightness_radius(
            p, sigma_k, sigma_b, 1.0, 1.0)
    for p in [0.0, 0.3, 0.5]:
        assert brightness_radius(p, sigma_k, sigma_b) == 0.0


def test_brightness_bound_shrinks_with_the_contrast_on_each_side():
    """What the minimum over an interval's two ends (and the bisection) rely on."""
    logs = np.linspace(0.0, 1.5, 301)
    for sigma_k, sigma_b in [(0.2, 0.2), (0.3, 0.3), (1.0, 0.2), (0.05, 0.5)]:
        for p in P_ABOVE_HALF:
            for side in (1.0, -1.0):
                b = [brightness_shift_bound(p, side * k, sigma_k, sigma_b) for k in logs]
                assert np.all(np.diff(b) <= 0.0), (sigma_k, sigma_b, p, side)


def test_contrast_range_is_their_bisection_and_never_wider():
    eps = GOLDEN["contrast"]["eps"]
    for row in rows("contrast"):
        args = row["p"], row["sigma_k"], row["sigma_b"], row["k_low"], row["k_high"]
        lo, hi = contrast_range(*args, tol=eps)
        assert row["lo"] <= lo <= 1.0 <= hi <= row["hi"], row  # never wider than theirs
        assert (lo, hi) == (row["lo"], row["hi"]), row  # and the same arithmetic: equal
        assert contrast_radius(*args, tol=eps) == row["radius"] == min(1 - lo, hi - 1)
    wide = [r for r in rows("contrast") if r["radius"] > 0.1]
    assert len(wide) == 38  # the grid reaches far into both sides


def test_contrast_range_ends_are_verified_and_within_tol_of_the_boundary():
    tol = 1e-5
    for sigma_k, sigma_b in [(0.2, 0.2), (0.3, 0.3), (1.0, 0.2)]:
        for p in [0.6, 0.9, 0.999]:
            lo, hi = contrast_range(p, sigma_k, sigma_b, tol=tol)
            for end, limit in [(math.log(lo), math.log(0.1)), (math.log(hi), math.log(10.0))]:
                assert brightness_shift_bound(p, end, sigma_k, sigma_b) > tol
                beyond = end + math.copysign(2.01 * tol, limit)  # the bracket was ≤ tol wide
                if abs(beyond) < abs(limit):  # else the search reached the interval's end
                    assert brightness_shift_bound(p, beyond, sigma_k, sigma_b) <= tol


def test_blur_radius_is_their_calc_radius():
    seen = set()
    for row in rows("blur"):
        p, name, scale = row["p"], row["distribution"], row["scale"]
        ours, theirs = blur_radius(p, name, scale), max(row["radius"], 0.0)  # theirs: −0.0
        seen.add(name)
        if name != "folded-gaussian":
            assert ours == theirs, row  # the same operations
            continue
        # theirs rounds ½ + p/2 (½ ulp of 1) before Φ⁻¹; ours lowers 4 ulps of Φ⁻¹(½ + p/2)
        z = norm.isf((1 - p) / 2) if p > 0.5 else 0.0
        tol = scale * (EPS / norm.pdf(z) + 8 * EPS * z)
        assert abs(ours - theirs) <= tol, (row, ours - theirs, tol)
    assert seen == set(BLUR_DISTRIBUTIONS)


def test_blur_closed_forms():
    assert blur_radius(0.9, "uniform", 5.0) == 10.0  # 25·0.4
    assert blur_radius(0.75, "exponential", 10.0) == pytest.approx(10 * math.log(2), rel=EPS)
    p = 2 * norm.cdf(norm.ppf(0.75) + 1.5) - 1  # a shift of 1.5 σ of the folded Gaussian
    assert blur_radius(p, "folded-gaussian", 2.0) == pytest.approx(3.0, rel=1e-13)
    for name in BLUR_DISTRIBUTIONS:
        assert blur_radius(0.5, name, 3.0) == blur_radius(0.2, name, 3.0) == 0.0
    assert blur_radius(1.0, "uniform", 4.0) == 8.0
    assert math.isinf(blur_radius(1.0, "exponential", 4.0))
    assert math.isinf(blur_radius(1.0, "folded-gaussian", 4.0))


def test_translation_radius_is_their_calc_radius():
    for row in rows("translation"):
        ours, theirs = translation_radius(row["p"], row["sigma"]), row["radius"]
        assert ours == max(theirs, 0.0), row  # theirs is σΦ⁻¹(p) < 0 for p < ½
    assert translation_radius(norm.cdf(1.0), 3.0) == pytest.approx(3.0, rel=4 * EPS)
    assert math.isinf(translation_radius(1.0, 3.0))


def test_edges_the_authors_code_does_not_reach():
    # σ_k = 0 smooths no contrast: nothing certified away from 1 (theirs divides by zero)
    assert brightness_shift_bound(0.99, 0.1, 0.0, 0.2) == 0.0
    assert brightness_radius(0.99, 0.0, 0.2, 0.9, 1.0) == 0.0
    assert contrast_range(0.99, 0.0, 0.2) == (1.0, 1.0)
    # p = 1: every finite shift at every contrast
    assert math.isinf(brightness_shift_bound(1.0, 0.7, 0.2, 0.2))
    assert math.isinf(brightness_shift_bound(1.0, -0.7, 0.2, 0.2))
    lo, hi = contrast_range(1.0, 0.2, 0.2, 0.5, 2.0)
    assert 0.5 <= lo <= 0.5 * math.exp(1e-5) and 2.0 * math.exp(-1e-5) <= hi <= 2.0
    # a tol below the floats' spacing ends where the midpoints do, on the verified side
    lo, hi = contrast_range(0.9, 0.2, 0.2, tol=1e-300)
    assert brightness_shift_bound(0.9, math.log(hi), 0.2, 0.2) > 0
    assert brightness_shift_bound(0.9, math.log(lo), 0.2, 0.2) > 0
    assert contrast_range(0.9, 0.2, 0.2, 1.0, 1.0) == (1.0, 1.0)


BAD = [
    (brightness_shift_bound, (1.1, 0.0, 0.2, 0.2), "p_lower"),
    (brightness_shift_bound, (-0.1, 0.0, 0.2, 0.2), "p_lower"),
    (brightness_shift_bound, (math.nan, 0.0, 0.2, 0.2), "p_lower"),
    (brightness_shift_bound, ("0.9", 0.0, 0.2, 0.2), "p_lower"),
    (brightness_shift_bound, (True, 0.0, 0.2, 0.2), "p_lower"),
    (brightness_shift_bound, (0.9, math.inf, 0.2, 0.2), "log_k"),
    (brightness_shift_bound, (0.9, 0.0, -0.2, 0.2), "sigma_k"),
    (brightness_shift_bound, (0.9, 0.0, 0.2, 0.0), "sigma_b"),
    (brightness_shift_bound, (0.9, 0.0, 0.2, math.inf), "sigma_b"),
    (brightness_radius, (0.9, 0.2, 0.2, 0.0, 1.0), "contrast interval"),
    (brightness_radius, (0.9, 0.2, 0.2, 1.1, 1.2), "k_low"),
    (brightness_radius, (0.9, 0.2, 0.2, 0.8, 0.9), "contrast interval"),
    (brightness_radius, (0.9, 0.2, 0.2, 0.8, math.inf), "k_high"),
    (contrast_range, (0.9, 0.2, 0.2, 0.1, 10.0, 0.0), "tol"),
    (contrast_range, (0.9, -1.0, 0.2), "sigma_k"),
    (contrast_range, (0.4, 0.2, 0.2, 2.0, 10.0), "k_low"),
    (contrast_radius, (0.9, 0.2, -0.2), "sigma_b"),
    (blur_radius, (0.9, "gaussian", 2.0), "blur distribution"),
    (blur_radius, (0.9, "uniform", 0.0), "scale"),
    (blur_radius, (0.9, "exponential", -2.0), "scale"),
    (blur_radius, (2.0, "uniform", 2.0), "p_lower"),
    (translation_radius, (0.9, 0.0), "sigma"),
    (translation_radius, (0.9, math.nan), "sigma"),
    (translation_radius, (-1.0, 3.0), "p_lower"),
]


@pytest.mark.parametrize("function, args, named", BAD)
def test_bad_arguments_are_one_line_errors(function, args, named):
    with pytest.raises(SmoothcertError, match=named) as raised:
        function(*args)
    assert "\n" not in str(raised.value)
