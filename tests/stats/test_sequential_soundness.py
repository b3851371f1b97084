"""False certificates of every sequential test at the boundary, simulated: p_A exactly at a grid
threshold, 10,000 trials per test, counted against α with an exact binomial test — and an
unsound control (Clopper–Pearson at the full α at every look, no union bound) that the same
check must reject, so that it has the power to see a broken test.

A trial draws the selection (which may aim the test: ``given_selection``), then the hits at
EVERY look up to n_max, and counts as false if any look's lower bound passes p_A. The procedure
(:func:`certify_levels`) certifies only below the bound of a look it took, so its rate is at
most this one whatever its stopping rules; the procedure itself runs at the boundary too."""

from collections import defaultdict

import numpy as np
import pytest
from scipy.stats import binomtest, norm

from smoothcert.stats.sequential_levels import run_levels
from smoothcert.stats.sequential_tests import (
    SEQUENTIAL_TESTS,
    ScheduledUnion,
    TargetedFinal,
    geometric_looks,
)

TRIALS = 10_000
ALPHA = 0.05  # large enough that 10,000 trials see a rate above α (α = 0.001 would need 10⁶)
N0, N_MAX = 100, 5_000
THRESHOLDS = norm.cdf(np.array([0.0, 0.5, 1.0]))  # radii 0, σ/2, σ
P_A = THRESHOLDS[2]  # certifying radius σ asserts p_A > Φ(1): false at this p_A
# Every registered test with its defaults, and targeted-final with its slice at n_max and its
# patient futility for every aim (here Φ(1) is 0.31 of the reach of n_max: no slice by default).
TESTS = {**{name: SEQUENTIAL_TESTS[name]() for name in SEQUENTIAL_TESTS},
         "targeted-final, slice at every aim": TargetedFinal(final_reach=0.0)}


def any_look_passes(test, seed: int) -> int:
    """Trials in which some look's lower bound exceeds p_A (all looks taken, no stopping)."""
    rng = np.random.default_rng(seed)
    groups = defaultdict(int)  # the aimed tests: trials per distinct test
    for hits in rng.binomial(N0, P_A, size=TRIALS):
        groups[test.given_selection(int(hits), N0, THRESHOLDS, ALPHA, N_MAX)] += 1
    false = 0
    for aimed, trials in groups.items():
        k, t, passed = np.zeros(trials, dtype=np.int64), 0, np.zeros(trials, dtype=bool)
        for look in aimed.looks(N_MAX):
            k, t = k + rng.binomial(look - t, P_A, size=trials), look
            passed |= np.asarray(aimed.lower(k, np.full(trials, t), ALPHA, N_MAX)) > P_A
        false += int(passed.sum())
    return false


def unsound_control() -> ScheduledUnion:
    """Clopper–Pearson at the full α at each of the union test's looks: the levels sum to K·α."""
    looks = geometric_looks(100, 1.25, N_MAX)
    return ScheduledUnion(schedule=looks, levels=(ALPHA,) * len(looks))


def exceeds_alpha(false: int) -> float:
    """p-value of H0: rate ≤ α, one-sided exact binomial test."""
    return binomtest(false, TRIALS, ALPHA, alternative="greater").pvalue


@pytest.mark.parametrize("name", sorted(TESTS))
def test_false_certificate_rate_is_at_most_alpha(name):
    false = any_look_passes(TESTS[name], seed=11)
    assert exceeds_alpha(false) > 1e-3, false  # level 10⁻³, fixed seed


def test_the_unsound_control_fails_the_same_check():
    false = any_look_passes(unsound_control(), seed=11)
    assert exceeds_alpha(false) < 1e-6, false


@pytest.mark.parametrize("name", sorted(TESTS))
def test_the_procedure_at_the_boundary(name):
    """certify_levels itself, selection and stopping included: 400 trials at p_A = Φ(1)."""
    rng, test, trials = np.random.default_rng(12), TESTS[name], 400
    false = sum(run_levels(test, THRESHOLDS, ALPHA, N_MAX, lambda m: int(rng.binomial(m, P_A)),
                           (int(rng.binomial(N0, P_A)), N0)).level >= 2 for _ in range(trials))
    assert binomtest(false, trials, ALPHA, alternative="greater").pvalue > 1e-3, false
