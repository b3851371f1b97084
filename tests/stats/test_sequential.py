"""Sequential certification at a grid of radii: soundness by simulation, power, bounds, errors.

Soundness is checked at the decision boundary p_A = thresholds[j], where a false certificate
(returned level ≥ j) is most likely. A vectorised simulator draws trials × looks binomial
increments and evaluates the bounds at every look: the event "some look has L > p_A" contains the
false certificates of ANY stopping rule, so its rate bounding α checks the property the procedure
relies on, and the real generator is run on the same increments to check it matches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from scipy.special import betaln
from scipy.stats import binomtest, norm

from smoothcert.errors import SmoothcertError
from smoothcert.stats import clopper_pearson_lower
from smoothcert.stats.sequential_levels import (
    SequentialOutcome,
    certify_levels,
    grid,
    run_levels,
    thresholds,
)
from smoothcert.stats.sequential_tests import (
    SEQUENTIAL_TESTS,
    BetaMixture,
    FinalWeightedUnion,
    SequentialTest,
    Targeted,
    TargetedFinal,
    UnionBound,
    geometric_looks,
)

SIGMA = 0.25
RADII, THR = grid([0.25, 0.5, 0.75], SIGMA)  # p_j = Φ(0), Φ(1), Φ(2), Φ(3)
NAMES = sorted(SEQUENTIAL_TESTS)


def simulate(test, alpha, n_max, p, trials, rng):
    """Increments (trials, K) of hits at the K looks and the running max of the lower bound."""
    looks = np.array(test.looks(n_max))
    increments = rng.binomial(np.diff(looks, prepend=0), p, size=(trials, len(looks)))
    k = increments.cumsum(axis=1)
    lower = test.lower(k, np.broadcast_to(looks, k.shape), alpha, n_max)
    return increments, np.maximum.accumulate(lower, axis=1)


def replay(test, alpha, n_max, increments) -> SequentialOutcome:
    """The real generator, fed one trial's pre-drawn increments in order."""
    looks = test.looks(n_max)
    gaps = iter(np.diff(looks, prepend=0))
    feed = iter(increments)

    def draw_hits(m):
        assert m == next(gaps)  # it asks exactly for the gap to the next look
        return int(next(feed))

    return run_levels(test, THR, alpha, n_max, draw_hits)


def level_of(bound):
    """The largest j with thresholds[j] < bound, −1 if none (an oracle independent of the code)."""
    return np.sum(np.asarray(bound)[..., None] > THR, axis=-1) - 1


def check_stop(test, out: SequentialOutcome, alpha, n_max):
    """The outcome's stopping rule really held at its last look."""
    nxt = THR[min(out.level + 1, len(THR) - 1)]
    later = np.array([s for s in test.looks(n_max) if s > out.draws])
    held = {
        "all": out.level == len(THR) - 1,
        "n_max": out.draws == n_max,
        "unreachable": later.size and test.lower(out.hits + later - out.draws, later, alpha,
                                                 n_max).max() <= nxt,
        "futile": test.futile(out.hits, out.draws, nxt, alpha, n_max, out.p_upper),
    }
    if type(test).futile is SequentialTest.futile:  # the default rule (d), written out
        assert held["futile"] == (test.lower(math.floor(out.hits + out.p_upper * (
            n_max - out.draws)), n_max, alpha, n_max) <= nxt)
    assert held[out.stopped], out


def at_most_alpha(failures: int, trials: int, alpha: float) -> bool:
    """The exact binomial test does not reject "rate ≤ α" at level 0.001 (one-sided)."""
    return binomtest(failures, trials, alpha, alternative="greater").pvalue > 1e-3


@dataclass(frozen=True, kw_only=True)
class Uncorrected(SequentialTest):
    """Control: Clopper–Pearson at level α at EVERY look, no correction: not simultaneous."""

    first: int = 100
    ratio: float = 2.0

    def _lower(self, k, t, alpha, n_max):
        return np.asarray(clopper_pearson_lower(k, t, alpha))


# --------------------------------------------------------------------------- soundness
@pytest.mark.parametrize("j", [0, 2])  # p_A = ½ (abstain boundary) and p_A = Φ(2) (radius 0.5)
@pytest.mark.parametrize("name", NAMES)
def test_no_false_certificate_beyond_alpha_at_the_boundary(name, j):
    test, alpha, n_max, trials = SEQUENTIAL_TESTS[name](), 0.05, 20_000, 4_000
    rng = np.random.default_rng(1234 + j)
    increments, best = simulate(test, alpha, n_max, THR[j], trials, rng)
    false = int(np.sum(best[:, -1] > THR[j]))  # some look certified p_A > thresholds[j]
    assert at_most_alpha(false, trials, alpha), (false, trials)
    # the real procedure on the first 150 trials: the simulator's level at its stopping look
    for row, lower in zip(increments[:150], best[:150]):
        out = replay(test, alpha, n_max, row)
        i = test.looks(n_max).index(out.draws)
        # scalar and vectorised root finding may differ in the last bit
        assert out.hits == row[: i + 1].sum() and out.p_lower == pytest.approx(lower[i], rel=1e-12)
        assert out.level == level_of(lower[i]) <= level_of(lower[-1])
        check_stop(test, out, alpha, n_max)


def test_simulator_detects_an_invalid_procedure():
    """The soundness test can fail: uncorrected repeated looks (11 here) exceed α clearly."""
    test, alpha, trials = Uncorrected(), 0.05, 4_000
    _, best = simulate(test, alpha, 20_000, 0.5, trials, np.random.default_rng(1234))
    false = int(np.sum(best[:, -1] > 0.5))
    assert not at_most_alpha(false, trials, alpha), false


# --------------------------------------------------------------------------- power
@pytest.mark.parametrize("name", NAMES)
def test_all_hits_certify_the_whole_grid_at_the_first_sufficient_look(name):
    """p_A = 1: every draw a hit. Fixed-n CP at n_max = 1e5 certifies level 3 too (its bound
    α^(1/n) = 0.99993 > Φ(3)); the sequential test stops at the first look whose bound passes."""
    test, alpha, n_max = SEQUENTIAL_TESTS[name](), 0.001, 100_000
    out = run_levels(test, THR, alpha, n_max, lambda m: m)
    looks = np.array(test.looks(n_max))
    passing = looks[test.lower(looks, looks, alpha, n_max) > THR[-1]]
    assert clopper_pearson_lower(n_max, n_max, alpha) > THR[-1]
    assert (out.level, out.stopped, out.draws) == (3, "all", passing[0])
    assert out.draws < n_max / 5


@pytest.mark.parametrize("name", NAMES)
def test_clear_case_reaches_the_fixed_n_level_with_far_fewer_draws(name):
    """p_A = 0.999, n_max = 10⁴: fixed-n Clopper–Pearson certifies level 2 (radius 0.5) in
    ~99 % of runs (≤ 3 misses in 10⁴ are needed for level 3); so does the sequential test."""
    test, alpha, n_max, p = SEQUENTIAL_TESTS[name](), 0.001, 10_000, 0.999
    rng = np.random.default_rng(7)
    fixed = level_of(clopper_pearson_lower(rng.binomial(n_max, p, 200), n_max, alpha))
    assert np.mean(fixed == 2) > 0.95
    outs = [run_levels(test, THR, alpha, n_max, lambda m: int(rng.binomial(m, p)))
            for _ in range(60)]
    assert all(o.level >= 2 for o in outs)
    assert np.mean([o.draws for o in outs]) < n_max / 2
    for out in outs:
        check_stop(test, out, alpha, n_max)


@pytest.mark.parametrize("name", NAMES)
def test_low_p_abstains_quickly(name):
    test, rng = SEQUENTIAL_TESTS[name](), np.random.default_rng(3)
    outs = [run_levels(test, THR, 0.001, 100_000, lambda m: int(rng.binomial(m, 0.3)))
            for _ in range(100)]
    assert all(o.level == -1 and o.stopped == "futile" and o.draws <= 400 for o in outs)


# --------------------------------------------------------------------------- the bounds
@pytest.mark.parametrize("ratio", [1.25, 2.0])
def test_union_bound_is_clopper_pearson_at_alpha_over_k(ratio):
    test, alpha, n_max = UnionBound(ratio=ratio), 0.01, 100_000
    looks = test.looks(n_max)
    assert looks[0] == test.first and looks[-1] == n_max and np.all(np.diff(looks) > 0)
    assert len(looks) == {1.25: 32, 2.0: 11}[ratio]  # ⌈100·ratio^i⌉ < 1e5, then 1e5
    k = np.array([0, 1, 500, 99_000, n_max])
    ref = clopper_pearson_lower(k, n_max, alpha / len(looks))
    assert np.array_equal(test.lower(k, n_max, alpha, n_max), ref)
    t, level = looks[3], alpha / len(looks)
    assert test.upper(30, t, alpha, n_max) == 1 - clopper_pearson_lower(t - 30, t, level)
    with pytest.raises(SmoothcertError, match="only at its looks"):
        test.lower(5, looks[3] + 1, alpha, n_max)


def test_union_final_spends_half_of_alpha_at_n_max():
    test, alpha, n_max = SEQUENTIAL_TESTS["union-final"](), 0.001, 10_000
    looks = test.looks(n_max)
    early, last = test.levels(alpha, n_max)
    assert isinstance(test, FinalWeightedUnion) and len(looks) == 22  # ⌈100·1.25^i⌉ < 1e4, 1e4
    assert (last, early) == (alpha / 2, alpha / 2 / 21)
    assert early * (len(looks) - 1) + last == pytest.approx(alpha, rel=1e-12)
    k = np.array([0, 1, 5_000, 9_990, n_max])
    assert np.array_equal(test.lower(k, n_max, alpha, n_max),
                          clopper_pearson_lower(k, n_max, alpha / 2))
    t = looks[5]
    assert test.lower(t - 3, t, alpha, n_max) == clopper_pearson_lower(t - 3, t, early)
    assert test.upper(t - 3, t, alpha, n_max) == 1 - clopper_pearson_lower(3, t, early)
    # the reach at n_max, Φ⁻¹ of the bound after n_max hits: (α/2)^(1/n) → 3.171 (fixed-n
    # CERTIFY at α: 3.199), the equal split (α/22)^(1/n) → 3.090
    reach = {name: norm.ppf(SEQUENTIAL_TESTS[name]().lower(n_max, n_max, alpha, n_max))
             for name in ("union", "union-final")}
    assert reach["union"] == pytest.approx(3.0904, abs=1e-4)
    assert reach["union-final"] == pytest.approx(3.1709, abs=1e-4)


def test_union_final_keeps_more_of_the_fixed_n_certificates_at_the_reach_of_n():
    """p_A = 0.9995, n_max = n = 10⁴, radius 3σ (level 3), near the reach of n: Clopper–Pearson at
    n draws certifies it with ≤ 3 misses at α (P = 26 %), ≤ 2 at α/2 (12.5 %), ≤ 1 at α/22 (4 %).
    The equal split keeps almost none of fixed-n CERTIFY's certificates there (0.5 % of runs with
    this seed), the final-weighted split several times more (8.5 %); neither beats fixed n."""
    alpha, n_max, p, runs = 0.001, 10_000, 0.9995, 200
    rng = np.random.default_rng(11)
    fixed = np.mean(level_of(clopper_pearson_lower(rng.binomial(n_max, p, runs), n_max,
                                                   alpha)) == 3)
    rate = {}
    for name in ("union", "union-final"):
        test = SEQUENTIAL_TESTS[name]()
        outs = [run_levels(test, THR, alpha, n_max, lambda m: int(rng.binomial(m, p)))
                for _ in range(runs)]
        rate[name] = np.mean([o.level == 3 for o in outs])
    assert rate["union"] < 0.04 < rate["union-final"] and fixed > 0.2, (fixed, rate)
    assert rate["union-final"] >= rate["union"] + 0.04 and rate["union-final"] < fixed


def test_targeted_final_keeps_a_slice_of_alpha_for_n_max_near_its_reach():
    """The aimed schedule after 100 hits of 100. Aimed at Φ(3) (3σ, near the reach of n_max =
    10⁵ at α = 0.001, 3.2σ): w·α on the all-hit look of Φ(3), f·α added at n_max, the rest evenly
    over the 18 geometric looks, summing to α, and the patient futility. Aimed at Φ(2) (a 2σ
    grid, 0.63 of the reach): ``targeted``'s split and futility, no slice."""
    test, alpha, n_max = SEQUENTIAL_TESTS["targeted-final"](), 0.001, 100_000
    w, f = test.target_share, test.final_share
    assert isinstance(test, TargetedFinal) and f > 0 and w + f < 1
    fallback = geometric_looks(100, 1.5, n_max)
    for grid_thr, top, share, c in ((THR, 3, f, test.near_optimism),
                                    (THR[:3], 2, 0.0, test.optimism)):
        aimed = test.given_selection(100, 100, grid_thr, alpha, n_max)
        at = dict(zip(aimed.schedule, aimed.levels))
        star = math.ceil(math.log(w * alpha) / math.log(THR[top]))
        assert set(at) == {*fallback, star} and aimed.optimism == c
        assert sum(aimed.levels) == pytest.approx(alpha, rel=1e-12)
        even = alpha * (1 - w - share) / len(fallback)
        assert at[star] == pytest.approx(w * alpha + even * (star in fallback), rel=1e-12)
        assert at[n_max] == pytest.approx(share * alpha + even, rel=1e-12)
        assert at[fallback[1]] == pytest.approx(even, rel=1e-12)
    # targeted keeps no slice anywhere: n_max is one fallback look at α(1 − w)/K
    plain = SEQUENTIAL_TESTS["targeted"]().given_selection(100, 100, THR, alpha, n_max)
    assert plain.levels[-1] == pytest.approx(alpha * 0.4 / len(fallback), rel=1e-12)
    # without a selection the fallback looks are union-final's split with share f
    k = np.array([99_900, n_max])
    assert np.array_equal(test.lower(k, n_max, alpha, n_max),
                          UnionBound(ratio=1.5, final_share=f).lower(k, n_max, alpha, n_max))


def test_targeted_patient_splits_alpha_the_same_way_at_every_aim():
    """The default: w = 0.4 of α on the aimed all-hit look, f = 0.3 added at n_max, the rest
    evenly over the 18 geometric looks, and futility at p̂ + 2·SE, whatever the aim (Φ(3) near
    the reach of n_max = 10⁵ or Φ(2) on a 2σ grid): unlike ``targeted-final``, no input goes
    without the slice at n_max."""
    test, alpha, n_max = SEQUENTIAL_TESTS["targeted-patient"](), 0.001, 100_000
    assert (test.target_share, test.final_share, test.optimism) == (0.4, 0.3, 2.0)
    fallback = geometric_looks(100, 1.5, n_max)
    for grid_thr, top in ((THR, 3), (THR[:3], 2)):
        aimed = test.given_selection(100, 100, grid_thr, alpha, n_max)
        at = dict(zip(aimed.schedule, aimed.levels))
        star = math.ceil(math.log(0.4 * alpha) / math.log(THR[top]))
        even = alpha * 0.3 / len(fallback)
        assert aimed.optimism == 2.0 and sum(aimed.levels) == pytest.approx(alpha, rel=1e-12)
        assert at[star] == pytest.approx(0.4 * alpha + even * (star in fallback), rel=1e-12)
        assert at[n_max] == pytest.approx(0.3 * alpha + even, rel=1e-12)


def test_targeted_final_keeps_the_fixed_n_certificates_that_targeted_loses():
    """p_A = 0.9992, n_max = n = 10⁵, radius 3σ (Φ(3) = 0.99865), near the reach of n: fixed-n
    CERTIFY at α certifies it in ~98 % of runs (≤ 88 misses of 10⁵). ``targeted`` judges the
    look at n_max at α·0.4/18 and stops inputs one standard error short: it keeps ~60 % of those
    certificates; ``targeted-final`` (f·α more at n_max, c = 1.25) ~85-90 %, and so does the
    default ``targeted-patient`` (0.3·α at n_max, c = 2). Same seed, 40 runs each (simulated
    draws, the real procedure); the SE of each rate is ≤ 0.08."""
    alpha, n_max, p, runs = 0.001, 100_000, 0.9992, 40
    rng = np.random.default_rng(6)
    fixed = np.mean(level_of(clopper_pearson_lower(rng.binomial(n_max, p, 400), n_max,
                                                   alpha)) == 3)
    rate = {}
    for name in ("targeted", "targeted-final", "targeted-patient"):
        test = SEQUENTIAL_TESTS[name]()
        rate[name] = np.mean([run_levels(test, THR, alpha, n_max,
                                         lambda m: int(rng.binomial(m, p)),
                                         (int(rng.binomial(100, p)), 100)).level == 3
                              for _ in range(runs)])
    assert fixed > 0.9, fixed
    assert rate["targeted"] < 0.75, rate
    assert min(rate["targeted-final"], rate["targeted-patient"]) >= rate["targeted"] + 0.15, rate


def log_martingale(k, t, p, a=0.5, b=0.5):
    return betaln(a + k, b + t - k) - betaln(a, b) - k * np.log(p) - (t - k) * np.log1p(-p)


@pytest.mark.parametrize("ab", [(0.5, 0.5), (1.0, 1.0), (2.0, 0.3)])
def test_mixture_bounds_are_the_ends_of_the_martingale_set(ab):
    """L ≤ k/t ≤ U, and M_t = 1/α at the ends (to 1e-9 in log)."""
    test, alpha = BetaMixture(a=ab[0], b=ab[1]), 0.01
    k = np.array([0, 1, 7, 50, 99, 100, 4_990, 5_000])
    t = np.array([100, 100, 100, 100, 100, 100, 5_000, 5_000])
    lo, up = test.lower(k, t, alpha, 10_000), test.upper(k, t, alpha, 10_000)
    assert np.all((lo <= k / t) & (k / t <= up)) and np.all(lo < up)
    inner_lo, inner_up = lo[k > 0], up[k < t]
    m_lo = log_martingale(k[k > 0], t[k > 0], inner_lo, *ab)
    m_up = log_martingale(k[k < t], t[k < t], inner_up, *ab)
    # on the boundary, and not inside the set beyond rounding: U = 0.999999 is stored to 1e-16,
    # i.e. to 1e-10 relative in 1 − U, which moves log M by up to ~5e-11
    for m in (m_lo, m_up):
        assert np.all(np.abs(m + math.log(alpha)) < 1e-9)
    assert lo[k == 0].tolist() == [0.0] and up[k == t].tolist() == [1.0, 1.0]
    assert test.lower(7, 100, alpha, 10_000) == lo[2]  # scalar and vectorised paths agree


@pytest.mark.parametrize("name", NAMES)
def test_bounds_widen_as_alpha_shrinks(name):
    test, k, t = SEQUENTIAL_TESTS[name](), np.array([0, 10, 60, 99, 100]), 100
    lows = [test.lower(k, t, a, 1_000) for a in (0.2, 0.05, 0.01, 0.001)]
    ups = [test.upper(k, t, a, 1_000) for a in (0.2, 0.05, 0.01, 0.001)]
    assert np.all(np.diff(lows, axis=0)[:, 1:] < 0) and np.all(np.diff(ups, axis=0)[:, :-1] > 0)
    assert lows[0].dtype == np.float64 and isinstance(test.lower(3, 100, 0.05, 1_000), float)


def test_mixture_covers_at_every_t_simultaneously():
    """Anytime validity, not just at the looks: P(∃ t ≤ 300: p ∉ [L_t, U_t]) ≤ α."""
    test, alpha, trials, horizon = BetaMixture(), 0.1, 2_000, 300
    for p, seed in ((0.5, 11), (0.9, 12)):
        k = np.random.default_rng(seed).binomial(1, p, (trials, horizon)).cumsum(axis=1)
        t = np.broadcast_to(np.arange(1, horizon + 1), k.shape)
        missed = (test.lower(k, t, alpha, horizon) > p) | (test.upper(k, t, alpha, horizon) < p)
        assert at_most_alpha(int(np.sum(missed.any(axis=1))), trials, alpha)


# --------------------------------------------------------------------------- the procedure
def test_grid_and_thresholds():
    r, p = grid([0.5, 0.25, 0.5], 0.5)
    assert r.tolist() == [0.0, 0.25, 0.5] and p[0] == 0.5
    assert np.allclose(p, [0.5, 0.6914624612740131, 0.8413447460685429], rtol=1e-14)
    assert np.array_equal(thresholds([0.0, 1.0], 1.0), grid([1.0], 1.0)[1])


def test_looks_are_geometric_and_end_at_n_max():
    assert geometric_looks(100, 2.0, 1_000) == (100, 200, 400, 800, 1_000)
    assert geometric_looks(100, 1.5, 400) == (100, 150, 225, 338, 400)
    assert geometric_looks(100, 1.001, 103) == (100, 101, 102, 103)  # ceilings never repeat
    assert geometric_looks(100, 1.1, 130) == (100, 110, 121, 130)  # 100·1.1 = 110.00000000000001
    assert UnionBound(first=100).looks(100) == (100,)


def test_stopping_rules():
    test, alpha = UnionBound(first=100, ratio=2.0), 0.05  # looks 100, 200, 400, 800, … n_max
    # (c) unreachable: after 100 misses, even 100 hits leave Φ(0) = ½ out of reach at n_max = 200
    out = run_levels(test, THR, alpha, 200, lambda m: 0)
    assert (out.level, out.draws, out.stopped) == (-1, 100, "unreachable")
    # (b) the budget: p̂ = 0.53 at every look keeps ½ uncertified (L(424, 800) = 0.490) but
    # within reach of the projection at p_upper until n_max
    out = run_levels(test, THR, alpha, 800, lambda m: 53 * m // 100)
    assert (out.level, out.draws, out.hits, out.stopped) == (-1, 800, 424, "n_max")
    # (d) futility by projection: p̂ = ½ exactly — at t = 400, even hits at rate
    # p_upper = 0.567 for the last 400 draws leave L at n_max below ½
    out = run_levels(test, THR, alpha, 800, lambda m: m // 2)
    assert (out.level, out.draws, out.hits, out.stopped) == (-1, 400, 200, "futile")
    # (d) futility: 60 % hits; at t = 200, L = 0.506 certifies ½ and U = 0.689 < Φ(1) = 0.841
    out = run_levels(test, THR, alpha, 100_000, lambda m: 6 * m // 10)
    assert (out.level, out.draws, out.hits, out.stopped) == (0, 200, 120, "futile")
    assert out.p_upper < THR[1] and out.p_lower > THR[0]


def test_generator_protocol_and_hit_validation():
    proc = certify_levels(UnionBound(first=100, ratio=2.0), THR, 0.05, 1_000)  # K = 5 looks
    assert next(proc) == 100
    # 100 hits of 100: L = (0.05/5)^(1/100) = 0.955 certifies Φ(1) only; Φ(2) is within reach
    assert proc.send(100) == 100
    with pytest.raises(SmoothcertError, match="0..100"):
        proc.send(101)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: grid([], 0.25), "radii"),
        (lambda: grid([-0.1], 0.25), "radii"),
        (lambda: grid([float("nan")], 0.25), "radii"),
        (lambda: grid([0.5], 0.0), "sigma"),
        (lambda: grid([0.5], float("inf")), "sigma"),
        (lambda: UnionBound(ratio=1.0), "ratio"),
        (lambda: UnionBound(first=0), "first"),
        (lambda: UnionBound(final_share=1.5), "final_share"),
        (lambda: BetaMixture(a=0.0), "a must"),
        (lambda: UnionBound().looks(50), "first look"),
        (lambda: UnionBound().lower(5, 3, 0.05, 100), "0 <= k <= t"),
        (lambda: UnionBound().lower(1.5, 100, 0.05, 100), "integer counts"),
        (lambda: BetaMixture().upper(1, 100, 1.0, 100), "alpha"),
        (lambda: next(certify_levels(UnionBound(), THR, 0.0, 1_000)), "alpha"),
        (lambda: next(certify_levels(UnionBound(), THR, 0.05, 99)), "first look"),
        (lambda: next(certify_levels(UnionBound(), THR[::-1], 0.05, 1_000)), "sorted"),
        (lambda: next(certify_levels("union", THR, 0.05, 1_000)), "SequentialTest"),
        (lambda: SEQUENTIAL_TESTS["sprt"],
         "known: mixture, targeted, targeted-final, targeted-patient, union"),
        (lambda: Targeted(target_share=0.8, final_share=0.3), "final_share must be in"),
        (lambda: Targeted(final_share=-0.1), "final_share must be in"),
        (lambda: TargetedFinal(near_optimism=0.0), "near_optimism"),
        (lambda: TargetedFinal(final_reach=1.5), "final_reach"),
    ],
)
def test_validation_errors(call, match):
    with pytest.raises(SmoothcertError, match=match):
        call()
