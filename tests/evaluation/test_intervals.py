"""Paired bootstrap intervals: coverage against the truth, the normal-theory width, pairing by
idx, determinism, and the verdicts."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from smoothcert.errors import SmoothcertError
from smoothcert.evaluation.intervals import (
    Interval,
    acr_difference,
    certified_accuracy_difference,
    paired_bootstrap,
    verdict,
)
from smoothcert.runs.records import Records, read_records

HEADER = ("idx", "label", "predict", "radius", "correct", "time")


def write_records(path, rows):
    """A CERTIFY record file of (idx, label, predict, radius) rows."""
    lines = ["\t".join(HEADER)] + [
        f"{i}\t{y}\t{p}\t{r}\t{int(p == y)}\t1.0" for i, y, p, r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return read_records(path)


@pytest.mark.parametrize("level", [0.95, 0.8])
def test_coverage_of_a_known_mean_difference(level):
    """Paired normal data with mean difference 0.3: the interval covers 0.3 in ``level`` of 300
    fixed-seed repetitions, within 3.5 binomial standard deviations (plus 1 point for the
    percentile bootstrap's O(1/n) under-coverage at n = 200)."""
    rng = np.random.default_rng(12)
    reps, n, truth = 300, 200, 0.3
    hits = 0
    for rep in range(reps):
        a = rng.normal(size=n)
        b = a + truth + rng.normal(scale=0.5, size=n)
        hits += paired_bootstrap(a, b, resamples=500, seed=rep, level=level).covers(truth)
    tolerance = 3.5 * np.sqrt(reps * level * (1 - level)) + 0.01 * reps
    assert abs(hits - reps * level) <= tolerance, (hits, reps * level)


def test_width_matches_the_normal_theory_of_the_paired_mean():
    """For a mean, the bootstrap interval's half-width → z·sd(b − a)/√n: within 5% at n = 2,000
    with 10,000 resamples, and centred on the estimate. Strongly correlated columns (sd of each
    3, of the difference 0.2) show the pairing: resampling the columns apart would be ~20×
    wider."""
    rng = np.random.default_rng(3)
    a = rng.normal(scale=3.0, size=2000)
    b = a + 0.05 + rng.normal(scale=0.2, size=2000)
    interval = paired_bootstrap(a, b, resamples=10_000, seed=1)
    diff = b - a
    half = stats.norm.ppf(0.975) * diff.std(ddof=1) / np.sqrt(len(diff))
    assert interval.estimate == pytest.approx(diff.mean(), rel=1e-12)
    assert (interval.high - interval.low) / 2 == pytest.approx(half, rel=0.05)
    assert (interval.low + interval.high) / 2 == pytest.approx(interval.estimate, abs=0.1 * half)
    assert interval.count == 2000 and interval.resamples == 10_000 and interval.level == 0.95


def test_a_fixed_seed_gives_the_same_interval_and_another_seed_another():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(size=50)
    first = paired_bootstrap(a, b, resamples=1000, seed=7)
    assert paired_bootstrap(a, b, resamples=1000, seed=7) == first
    other = paired_bootstrap(a, b, resamples=1000, seed=8)
    assert other.estimate == first.estimate and (other.low, other.high) != (first.low, first.high)


def test_a_statistic_other_than_the_mean():
    a = np.arange(10.0)
    interval = paired_bootstrap(a, a + 2.0, np.median, resamples=200)
    assert interval.estimate == interval.low == interval.high == 2.0  # every resample: +2


def test_verdicts_decide_by_where_the_interval_lies():
    def interval(low, high):
        return Interval(estimate=(low + high) / 2, low=low, high=high, level=0.95,
                        resamples=1000, count=100)

    assert verdict(interval(-0.01, 0.2)) == "tie"
    assert verdict(interval(0.0, 0.2)) == "tie"  # a bound on 0 does not exclude it
    assert verdict(interval(0.01, 0.2)) == "supported"
    assert verdict(interval(-0.2, -0.01)) == "reversed"
    assert verdict(interval(-0.2, -0.01), claimed="less") == "supported"
    assert verdict(interval(0.01, 0.2), claimed="less") == "reversed"
    with pytest.raises(SmoothcertError, match="claimed must be one of"):
        verdict(interval(0.0, 1.0), claimed="bigger")


def test_acr_difference_pairs_rows_by_idx_on_the_common_examples(tmp_path):
    """Files in different orders, each with an example the other lacks: the difference is taken
    on idx 1-4 only, row by row. Certified radii (0 where wrong or abstained):
    first 1:0.5 2:0 (wrong) 3:1.0 4:0 (abstains); second 1:0.25 2:0.75 3:1.0 4:0.5.
    ACR difference = (2.5 − 1.5) / 4 = 0.25."""
    first = write_records(tmp_path / "a.tsv", [(3, 1, 1, 1.0), (1, 0, 0, 0.5), (9, 2, 2, 3.0),
                                                (2, 4, 5, 0.9), (4, 1, -1, 0.0)])
    second = write_records(tmp_path / "b.tsv", [(1, 0, 0, 0.25), (2, 4, 4, 0.75), (4, 1, 1, 0.5),
                                                 (3, 1, 1, 1.0), (7, 0, 0, 2.0)])
    interval = acr_difference(first, second, resamples=2000, seed=0)
    assert interval.count == 4
    assert interval.estimate == pytest.approx(0.25, rel=1e-12)
    # per-example differences −0.25, 0.75, 0, 0.5: every resampled mean lies in [−0.25, 0.75]
    assert -0.25 <= interval.low < 0.25 < interval.high <= 0.75
    # swapping the files negates the estimate exactly
    assert acr_difference(second, first, resamples=2000).estimate == pytest.approx(-0.25)


def test_certified_accuracy_difference_is_inclusive_at_r(tmp_path):
    """Certified sets (correct with radius ≥ r): r = 0.25: first {1, 3}, second {1, 2, 3, 4}
    → +0.5; r = 0.5: first {1, 3} (0.5 ≥ 0.5), second {2, 3, 4} → +0.25; r = 0.75: first {3},
    second {2, 3} (0.75 ≥ 0.75) → +0.25; r = 0.76: {3} and {3} → 0."""
    first = write_records(tmp_path / "a.tsv", [(1, 0, 0, 0.5), (2, 4, 5, 0.9), (3, 1, 1, 1.0),
                                                (4, 1, -1, 0.0)])
    second = write_records(tmp_path / "b.tsv", [(1, 0, 0, 0.25), (2, 4, 4, 0.75),
                                                 (3, 1, 1, 1.0), (4, 1, 1, 0.5)])
    for radius, expected in ((0.25, 0.5), (0.5, 0.25), (0.75, 0.25), (0.76, 0.0)):
        got = certified_accuracy_difference(first, second, radius, resamples=500)
        assert got.estimate == pytest.approx(expected, abs=1e-12), radius


def test_bad_inputs_are_refused_in_one_line(tmp_path):
    with pytest.raises(SmoothcertError, match="same length"):
        paired_bootstrap(np.zeros(3), np.zeros(4))
    with pytest.raises(SmoothcertError, match="resamples must be"):
        paired_bootstrap(np.zeros(3), np.ones(3), resamples=10)
    with pytest.raises(SmoothcertError, match="level must be"):
        paired_bootstrap(np.zeros(3), np.ones(3), level=95)
    with pytest.raises(SmoothcertError, match="finite"):
        paired_bootstrap(np.array([0.0, np.nan]), np.ones(2))
    first = write_records(tmp_path / "a.tsv", [(1, 0, 0, 0.5), (2, 0, 0, 0.5)])
    apart = write_records(tmp_path / "b.tsv", [(5, 0, 0, 0.5), (6, 0, 0, 0.5)])
    with pytest.raises(SmoothcertError, match="no example in common"):
        acr_difference(first, apart)
    columns = {"idx": np.array([1, 1]), "label": np.zeros(2, int), "predict": np.zeros(2, int),
               "radius": np.full(2, 0.5), "correct": np.ones(2, int)}
    twice = Records(path="c.tsv", columns_order=tuple(columns), data=columns)  # not via a file
    with pytest.raises(SmoothcertError, match="repeats an idx"):
        acr_difference(first, twice)
