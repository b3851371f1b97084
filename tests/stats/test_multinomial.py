"""Multinomial upper bounds (``stats/multinomial.py``): the authors' pooling and statsmodels'
Goodman intervals to the last digits (golden numbers from their code:
tests/fixtures/smoothing-multiscale/make_fixtures.py), the exact Clopper–Pearson family's
coverage, and the authors' two-group branch failing to bound the class that matters."""

import json
from pathlib import Path

import numpy as np
import pytest

from smoothcert.stats.multinomial import (
    authors_off_class_upper,
    class_upper_bounds,
    goodman_intervals,
    off_class_upper,
    pool_small_counts,
)

GOLDEN = json.loads((Path(__file__).parents[1] / "fixtures" / "smoothing-multiscale"
                     / "golden.json").read_text())


def test_pooling_is_the_authors_reduce_counts():
    for case in GOLDEN["pooling"]:
        assert pool_small_counts(case["counts"], case["c"]).tolist() == case["pooled"], case


def test_goodman_intervals_are_statsmodels():
    for case in GOLDEN["goodman"]:  # the same formula: agreement to rounding (1e-12)
        np.testing.assert_allclose(goodman_intervals(case["counts"], case["alpha"]),
                                   case["ci"], rtol=1e-12, atol=1e-14)


def test_goodman_refuses_what_statsmodels_refuses():
    for alpha in (0.0, 1.0):
        with pytest.raises(ValueError, match="alpha"):
            goodman_intervals([1, 2], alpha)
    with pytest.raises(ValueError, match=">= 0"):
        goodman_intervals([3, -1], 0.05)


def test_exact_upper_bounds_cover_every_class_at_once_at_the_stated_rate():
    """Bonferroni Clopper–Pearson over 4 classes at α = 0.1, 4000 multinomial draws of
    n = 60 (fixed generator): the rate of draws with any class above its bound is ≤ α within
    3 binomial standard deviations (and the bounds do not coincide with the point
    estimates: a control with p̂ as bound fails about half the time)."""
    rng = np.random.default_rng(7)
    p, alpha, trials = np.array([0.5, 0.3, 0.15, 0.05]), 0.1, 4000
    counts = rng.multinomial(60, p, size=trials)
    bounds = class_upper_bounds(counts, alpha)
    np.testing.assert_array_equal(bounds[3], class_upper_bounds(counts[3], alpha))
    missed = np.mean((bounds < p).any(axis=1))
    assert missed <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / trials)
    assert np.mean((counts / 60 < p).any(axis=1)) > 0.5  # the unsound control


def test_off_class_upper_is_the_largest_bound_of_the_other_classes():
    counts = np.array([900, 60, 40, 0])
    bounds = class_upper_bounds(counts, 0.01)
    assert off_class_upper(counts, 0, 0.01) == bounds[1] == bounds[1:].max()
    assert off_class_upper(counts, 1, 0.01) == bounds[0]
    assert bounds[3] == pytest.approx(1 - (0.01 / 4) ** (1 / 1000), rel=1e-12)
    assert class_upper_bounds([0, 5], 0.1)[1] == 1.0


def test_the_authors_two_group_branch_does_not_bound_the_selected_class():
    """A level that selected class 0 with votes 700 / 300: the authors' bound for an answer
    c = 1 is 1 − lower(700) ≈ 0.33, below the other class's 0.7 (it bounds c's own mass), so
    an earlier level at p0 = 0.8 would let class 0 through; the exact bound is ≥ 0.7."""
    counts = np.array([700, 300, 0, 0])
    theirs = authors_off_class_upper(counts, selected=0, c=1, alpha=0.001)
    assert theirs < 0.35 < 0.7
    assert off_class_upper(counts, 1, 0.001) > 0.7
