"""Sequential (anytime-valid) certification at a grid of radii: the statistics.

CERTIFY (Cohen, Rosenfeld & Kolter, ICML 2019, Alg. 2) selects a class ĉ_A from n0 draws, counts
the hits k of ĉ_A among t fresh draws of f(x + δ), δ ~ N(0, σ²I), and certifies the L2 radius
r = σ Φ⁻¹(p_lower) where p_lower is a (1−α) lower confidence bound on p_A = P(f(x + δ) = ĉ_A).
Certified accuracy is reported on a grid of radii 0 = r_0 < r_1 < …, so per input we only need
the largest grid point j with p_A > p_j := Φ(r_j / σ). Deciding "p_A > p_j" takes far fewer draws
than estimating p_A to the precision a fixed n buys whenever p_A is not close to a grid threshold.

The procedure :func:`~.sequential_levels.certify_levels` draws in stages ("looks")
t_1 < t_2 < … < t_K = n_max and after each look compares a lower confidence bound L(k, t) with
the thresholds. Its soundness rests on ONE property of the bounds, which every
:class:`SequentialTest` provides:

    simultaneous validity   P_p( ∃ look t: L(k_t, t) > p ) ≤ α   for every p in [0, 1],

where k_t is the number of hits among the first t draws (and likewise for the upper bound U).
Because the bound holds at every look at once, the procedure may stop at any data-dependent time
(including the futility rule below) and keep the best bound seen so far: with probability ≥ 1−α
no look ever has L > p_A, so no threshold p_j ≥ p_A is ever certified (Horváth et al., "Boosting
randomized smoothing with variance reduced classifiers", ICLR 2022, use the same multi-stage
idea with a Bonferroni correction; Robbins 1970 and Howard et al. 2021 for confidence sequences).

Six procedures are registered in :data:`SEQUENTIAL_TESTS`:

- ``"union"`` — Clopper–Pearson bounds at level α/K at each of K geometric looks (Bonferroni);
- ``"union-final"`` — the same with half of α spent at the last look (n_max) and the other half
  split over the earlier ones, so a run to n_max loses little against fixed-n CERTIFY;
- ``"mixture"`` — the confidence sequence of a Beta(a, b)-mixture martingale (Robbins), valid at
  every t by Ville's inequality, evaluated at its own geometric looks;
- ``"targeted"`` — a union bound whose α is spent mostly on ONE look: the draws that an input
  with only hits needs to pass the grid threshold its selection draws point to; the rest of α
  on sparse geometric looks, and an optimistic futility rule (:class:`Targeted`);
- ``"targeted-final"`` — ``targeted`` with a slice of α kept for the look at n_max and a more
  patient futility rule for inputs aimed near the reach of n_max (:class:`TargetedFinal`);
- ``"targeted-patient"`` — ``targeted`` with less of α on the aimed look, 30% at n_max for every
  input and a patient futility rule (:class:`TargetedPatient`): the default of
  ``--certifier sequential``.

This module holds the tests; the procedure (:func:`~.sequential_levels.certify_levels`, a
generator that asks for a number of draws and receives the number of hits) and the grid are in
:mod:`.sequential_levels`. The sampling itself (the model, the noise, the batches) is in neither.
"""

from __future__ import annotations

import abc
import math
import numbers
from dataclasses import dataclass
from functools import lru_cache
from typing import final

import numpy as np
from scipy.special import betaln
from scipy.stats import norm

from ..errors import SmoothcertError, check_count, check_positive_finite, check_probability
from ..registry import Registry
from .binomial import clopper_pearson_lower

SEQUENTIAL_TESTS: Registry = Registry("sequential test")


# --------------------------------------------------------------------------- the tests
@lru_cache(maxsize=256)
def geometric_looks(first: int, ratio: float, n_max: int) -> tuple[int, ...]:
    """Looks ⌈first · ratio^i⌉ below n_max, then n_max: strictly increasing cumulative sizes."""
    if n_max < first:
        raise SmoothcertError(f"n_max must be >= the first look ({first} draws), got {n_max}")
    looks, i = [], 0
    while (size := math.ceil(first * ratio**i - 1e-9)) < n_max:  # 100 · 1.1 = 110.00000000000001
        if not looks or size > looks[-1]:
            looks.append(size)
        i += 1
    return (*looks, n_max)


class SequentialTest(abc.ABC):
    """Confidence bounds on a Bernoulli mean p that hold simultaneously over a set of looks.

    A subclass is a frozen dataclass with keyword options ``first`` (draws at the first look) and
    ``ratio`` (growth of the cumulative sample size between looks) and implements one hook,
    :meth:`_lower`. The public :meth:`lower` and :meth:`upper` validate and vectorise; the upper
    bound follows from the lower one by the symmetry p ↔ 1 − p, hits ↔ misses (:meth:`_mirror`).
    """

    first: int
    ratio: float

    def looks(self, n_max: int) -> tuple[int, ...]:
        """Strictly increasing cumulative sample sizes at which a decision may be taken; the last
        is n_max. Geometric: ⌈first · ratio^i⌉ for every i with that size below n_max."""
        return geometric_looks(self.first, self.ratio, _count("n_max", n_max))

    @final
    def lower(self, k, t, alpha: float, n_max: int):
        """Lower bound L(k, t) on p after k hits in t draws, t a look of :meth:`looks`(n_max).

        Simultaneous over the looks: P_p(∃ look t: L(k_t, t) > p) ≤ α for every p. Vectorised over
        array-like k and t (broadcast); a float for scalar inputs, a float64 array otherwise.
        """
        k, t, n_max = _counts(k, t, n_max)
        return _output(self._lower(k, t, check_probability("alpha", alpha), n_max))

    @final
    def upper(self, k, t, alpha: float, n_max: int):
        """Upper bound U(k, t) = 1 − L'(t − k, t) of the mirrored test: P_p(∃ look: U < p) ≤ α."""
        k, t, n_max = _counts(k, t, n_max)
        alpha = check_probability("alpha", alpha)
        return _output(1.0 - self._mirror()._lower(t - k, t, alpha, n_max))

    @abc.abstractmethod
    def _lower(self, k: np.ndarray, t: np.ndarray, alpha: float, n_max: int) -> np.ndarray:
        """The lower bound on validated int64 arrays k, t of one shape: a float64 array."""

    def _mirror(self) -> SequentialTest:
        """The test of 1 − p from the misses; itself for a test symmetric in hits and misses."""
        return self

    def given_selection(self, hits: int, n0: int, thresholds, alpha: float,
                        n_max: int) -> SequentialTest:
        """The test to run after the selection draws gave ĉ_A ``hits`` of ``n0``: itself here.

        The selection draws are independent of the estimation draws, so a test (its looks and
        how it spends α) chosen from them is still valid: this is where a test may aim. The
        first look must not depend on them (the first request holds both)."""
        return self

    def futile(self, k: int, t: int, target: float, alpha: float, n_max: int,
               p_upper: float) -> bool:
        """Rule (d) of :func:`~.sequential_levels.certify_levels`: True stops sampling before
        ``target`` (the next threshold) is certified. Any rule is sound (stopping only removes
        looks); it trades draws against the chance of certifying ``target`` by n_max. Here: even
        with every remaining draw hitting at rate p_upper (≥ p_A with probability ≥ 1−α) the
        bound at n_max would not pass ``target``."""
        projected = math.floor(k + p_upper * (n_max - t))
        return self.lower(projected, n_max, alpha, n_max) <= target


@SEQUENTIAL_TESTS.register("union")
@dataclass(frozen=True, kw_only=True)
class UnionBound(SequentialTest):
    """Clopper–Pearson at level α/K at each of K geometric looks; Bonferroni over the looks.

    The multi-stage test with a union bound (Horváth et al., ICLR 2022): the exact one-sided
    Clopper–Pearson bound (Clopper & Pearson 1934) at level α/K holds at each of the K looks with
    probability ≥ 1 − α/K, hence at all of them with probability ≥ 1 − α. The bound is defined
    only at the looks. At t = n_max it equals ``clopper_pearson_lower(k, n_max, α/K)`` (with
    ``final_share`` None; :class:`FinalWeightedUnion` splits α unevenly).
    """

    first: int = 100  # draws at the first look; p_A = 0.3 then abstains after 100-200 draws
    # Growth of the cumulative draws per look. Mean draws over 18 values of p_A in [0.2, 1]
    # (σ = 0.25, grid 0/.25/.5/.75, α = 0.001, n_max = 1e5, 60-150 runs each): ratio 1.15 → 21.2k,
    # 1.25 → 21.7k, 1.5 → 22.6k, 2 → 24.8k. A larger ratio overshoots the draws a decision needs;
    # a smaller one pays only log K in α/K, so draws keep falling slowly toward ratio 1 while the
    # looks (sampler round trips) grow as 1/log(ratio): 1.25 is within 2 % of the best tried
    # with 32 looks at n_max = 1e5 (1.15: 51 looks).
    ratio: float = 1.25

    # Share of α spent at the last look, t = n_max; the K − 1 earlier looks split the rest
    # evenly. None: every look gets α/K. (Any split of α over the looks is a valid union bound.)
    final_share: float | None = None

    def __post_init__(self):
        _check_schedule(self.first, self.ratio)
        if self.final_share is not None:
            check_probability("final_share", self.final_share)

    def levels(self, alpha: float, n_max: int) -> tuple[float, float]:
        """(level of each look before n_max, level of the look at n_max); they sum to α over
        the K looks."""
        k = len(self.looks(n_max))
        if self.final_share is None or k == 1:
            return alpha / k, alpha / k
        return alpha * (1.0 - self.final_share) / (k - 1), alpha * self.final_share

    def _lower(self, k, t, alpha, n_max):
        looks = self.looks(n_max)
        ordered = np.asarray(looks)  # ascending: a sorted search (np.isin sorts, per call)
        off = t[ordered[np.minimum(np.searchsorted(ordered, t), len(looks) - 1)] != t]
        if off.size:
            raise SmoothcertError(f"the union bound holds only at its looks {looks}; t={off[0]}")
        early, last = self.levels(alpha, n_max)
        bound = np.empty(k.shape, dtype=np.float64)
        at_last = t == n_max
        for where, level in ((~at_last, early), (at_last, last)):
            if where.any():
                bound[where] = clopper_pearson_lower(k[where], t[where], level)
        return bound


@SEQUENTIAL_TESTS.register("union-final")
@dataclass(frozen=True, kw_only=True)
class FinalWeightedUnion(UnionBound):
    """``union`` with half of α at the last look: Clopper–Pearson at α/2 at t = n_max and at
    α/(2(K−1)) at each earlier look.

    At n_max = n its bound is CERTIFY's at α/2 instead of α/K, so an input that needs all n draws
    loses little against fixed-n CERTIFY with the same budget (the reach σΦ⁻¹((α/2)^(1/n)) against
    σΦ⁻¹(α^(1/n))), while the early looks pay α/(2(K−1)) instead of α/K: a few per cent more
    draws for the inputs that stop early. Use it when the grid reaches near what n can certify.
    """

    final_share: float | None = 0.5


@SEQUENTIAL_TESTS.register("mixture")
@dataclass(frozen=True, kw_only=True)
class BetaMixture(SequentialTest):
    """The Beta(a, b)-mixture confidence sequence (Robbins 1970; Howard et al., AoS 2021).

    For every p, M_t(p) = B(a + k_t, b + t − k_t) / B(a, b) / (p^k_t (1 − p)^(t − k_t)) is a
    nonnegative martingale with M_0 = 1 under Bernoulli(p) draws (the Bayes factor of the mixture
    against p), so by Ville's inequality P_p(∃ t: M_t(p) ≥ 1/α) ≤ α. The set {p : M_t(p) < 1/α}
    is an interval containing k/t (the denominator is log-concave in p); its end points are the
    bounds, found by Newton's method in log p from the conservative side. The sequence is
    two-sided: the chance that EITHER end ever misses p is ≤ α, which is conservative for each
    side. It holds at every t, not only at the looks, so the looks only set how often the sampler
    stops to decide.
    """

    first: int = 100  # draws at the first look, as for "union"
    # Looks cost nothing statistically here, so draws fall as the ratio falls (same study as
    # "union": ratio 2 → 28.9k, 1.5 → 26.8k, 1.25 → 25.2k, 1.1 → 23.3k mean draws); 1.25 keeps
    # the looks, and the sampler's round trips, the same as "union".
    ratio: float = 1.25
    # The prior Beta(a, b) on p: Jeffreys, symmetric in hits and misses. Mass nearer p = 1
    # (b = 0.25 or 0.1) saved only 2-3 % of the draws in that study.
    a: float = 0.5
    b: float = 0.5

    def __post_init__(self):
        _check_schedule(self.first, self.ratio)
        check_positive_finite("a", self.a), check_positive_finite("b", self.b)

    def _mirror(self):
        return BetaMixture(first=self.first, ratio=self.ratio, a=self.b, b=self.a)

    def _lower(self, k, t, alpha, n_max):
        """inf{p : M_t(p) < 1/α}: the smallest p whose log likelihood ℓ(p) exceeds
        c = log B(a + k, b + t − k) − log B(a, b) + log α (as ℓ(p) − log M_t(p) = that B-term)."""
        k, t = k.astype(np.float64), t.astype(np.float64)
        c = betaln(self.a + k, self.b + t - k) - betaln(self.a, self.b) + math.log(alpha)
        bound = np.zeros(k.shape)  # k = 0: M_t(0) = B(a, b + t)/B(a, b) < 1, p = 0 is in the set
        some = k > 0
        bound[some] = np.exp(_newton_from_below(k[some], t[some], c[some]))
        return bound


def _newton_from_below(k, t, c, steps: int = 100) -> np.ndarray:
    """The root x ≤ log(k/t) of h(x) = k x + (t − k) log(1 − eˣ) − c, vectorised, from below.

    h is concave and increasing left of its maximum at log(k/t), where h > 0 (the mixture's
    marginal likelihood is below the maximum likelihood, and log α < 0). Newton's iterates for a
    concave increasing function started left of the root (here at c/k, where h ≤ k x − c = 0)
    increase monotonically to it and never pass it: every iterate is a conservative (smaller)
    lower bound. Convergence is quadratic; for k = t, h is linear and the start c/t is the root.
    """
    x = c / k
    for _ in range(steps):
        e = np.exp(x)
        h = k * x + (t - k) * np.log1p(-e) - c
        slope = k - (t - k) * e / (1.0 - e)
        step = np.where(h < 0, -h / slope, 0.0)  # h ≥ 0 only at the root, up to rounding
        x = x + step
        if np.all(step <= 1e-15 * np.maximum(1.0, np.abs(x))):
            break
    return x


@dataclass(frozen=True, kw_only=True)
class ScheduledUnion(SequentialTest):
    """Clopper–Pearson at level ``levels[i]`` at look ``schedule[i]``: the union bound with α
    split unevenly over arbitrary looks, valid at level Σ levels (the ``alpha`` passed to its
    bounds is not used: its levels were split from it). Built by :class:`Targeted` for one input;
    ``optimism`` (None: the default rule) sets its futility rule (:meth:`Targeted.futile`)."""

    schedule: tuple
    levels: tuple
    optimism: float | None = None
    first: int = 0  # unused: the looks are the schedule
    ratio: float = 2.0

    def looks(self, n_max: int) -> tuple[int, ...]:
        if self.schedule[-1] != n_max:
            raise SmoothcertError(f"this schedule ends at {self.schedule[-1]}, not n_max={n_max}")
        return self.schedule

    def _lower(self, k, t, alpha, n_max):
        at = {look: level for look, level in zip(self.schedule, self.levels)}
        off = [int(x) for x in np.unique(t) if int(x) not in at]
        if off:
            raise SmoothcertError(f"the scheduled union bound holds only at {self.schedule}; "
                                  f"t={off[0]}")
        bound = np.empty(k.shape, dtype=np.float64)  # the levels were split from α already
        for look in np.unique(t):
            where = t == look
            bound[where] = clopper_pearson_lower(k[where], t[where], at[int(look)])
        return bound

    def futile(self, k, t, target, alpha, n_max, p_upper):
        if self.optimism is None:
            return super().futile(k, t, target, alpha, n_max, p_upper)
        return Targeted.optimistic_futility(self, k, t, target, alpha, n_max, p_upper,
                                            self.optimism)


@SEQUENTIAL_TESTS.register("targeted")
@dataclass(frozen=True, kw_only=True)
class Targeted(SequentialTest):
    """A union bound aimed by the selection draws: most of α on the one look where an input
    with only hits passes the threshold the selection points to.

    Given ĉ_A's hits k₀ among the n0 selection draws (independent of the estimation draws, so
    the aim costs no validity), the target is the largest grid threshold p_j below the upper
    Clopper–Pearson bound of k₀/n0 at level ``aim`` (10%: "not ruled out"). Its look is
    t* = ⌈ln(w·α) / ln p_j⌉ at level w·α (w = ``target_share``): the fewest draws that can
    certify p_j with w·α, reached by an input whose draws all hit. The remaining (1 − w)·α is
    split evenly over geometric looks ``first``·``ratio``^i up to n_max, which certify the
    inputs whose aim was high or low. On the benchmark (σ = 0.25, α = 0.001, n_max = 10⁵)
    most inputs have p̂_A ≈ 1 and pay ~t* instead of the union test's 7,680 hits in a row at
    α/32 (grid to 3σ).

    Futility (``optimism`` c): stop when even a hit rate of p̂ + c·SE (capped by p_upper) on
    the remaining draws would leave the bound at n_max at or below the next threshold. It is
    bolder than the default rule, which projects at p_upper (a (1−α) bound): inputs whose p_A
    sits within a few standard errors above a threshold may stop short of it. That is the
    price: on 200 Fashion-MNIST images (σ = 0.25, n_max = 10⁵) ~1 point of certified accuracy
    at 3σ against fixed-n (simulated 0.94, measured 1.5), 0.25 at 2σ; :class:`TargetedFinal`
    keeps those. Soundness does not depend on it. ``final_share`` f (default 0) adds f·α at
    n_max, the fallback looks then share (1 − w − f)·α.
    """

    first: int = 100  # the first look; draws ≤ t* with α(1 − w)/K each before the target
    ratio: float = 1.5  # sparser than union's 1.25: these looks hold only (1 − w)·α
    target_share: float = 0.6  # w
    aim: float = 0.1
    optimism: float = 1.0
    # Share f of α added at the last look, n_max (as ``union-final``): an input that needs every
    # draw is judged nearly as fixed-n CERTIFY judges it. 0: n_max is one fallback look.
    final_share: float = 0.0

    def __post_init__(self):
        _check_schedule(self.first, self.ratio)
        check_probability("target_share", self.target_share), check_probability("aim", self.aim)
        check_positive_finite("optimism", self.optimism)
        if not (0.0 <= self.final_share <= 1.0 - self.target_share):
            raise SmoothcertError(f"final_share must be in [0, 1 - target_share = "
                                  f"{1.0 - self.target_share:g}], got {self.final_share!r}")

    def given_selection(self, hits, n0, thresholds, alpha, n_max):
        thr = np.asarray(thresholds, dtype=np.float64)
        reach = 1.0 if hits == n0 else float(1.0 - clopper_pearson_lower(n0 - hits, n0,
                                                                         self.aim))
        p = thr[max(0, int(np.searchsorted(thr, reach, side="left")) - 1)]
        final, optimism = self._final(p, alpha, n_max)
        fallback = self.looks(n_max)
        levels = dict.fromkeys(fallback, alpha * (1.0 - self.target_share - final) / len(fallback))
        levels[n_max] += alpha * final
        target = alpha * self.target_share
        look = math.ceil(math.log(target) / math.log(p)) if 0.5 < p < 1.0 else fallback[0]
        look = min(max(look, fallback[0]), n_max)
        levels[look] = levels.get(look, 0.0) + target
        schedule = tuple(sorted(levels))
        return ScheduledUnion(schedule=schedule, levels=tuple(levels[s] for s in schedule),
                              optimism=optimism)

    def _final(self, p: float, alpha: float, n_max: int) -> tuple[float, float]:
        """(share of α added at n_max, futility optimism) for an input aimed at threshold p."""
        return self.final_share, self.optimism

    def _lower(self, k, t, alpha, n_max):
        """Without a selection: the fallback looks with α split evenly (``union``'s bound), the
        final share at n_max (``union-final``'s split)."""
        return UnionBound(first=self.first, ratio=self.ratio,
                          final_share=self.final_share or None)._lower(k, t, alpha, n_max)

    def futile(self, k, t, target, alpha, n_max, p_upper):
        return self.optimistic_futility(self, k, t, target, alpha, n_max, p_upper,
                                        self.optimism)

    @staticmethod
    def optimistic_futility(test, k, t, target, alpha, n_max, p_upper, c) -> bool:
        p_hat = k / t
        se = math.sqrt(max(p_hat * (1 - p_hat), 1.0 / t) / t)
        rate = min(p_upper, p_hat + c * se)
        projected = math.floor(k + rate * (n_max - t))
        return test.lower(projected, n_max, alpha, n_max) <= target



@SEQUENTIAL_TESTS.register("targeted-final")
@dataclass(frozen=True, kw_only=True)
class TargetedFinal(Targeted):
    """``targeted`` that, for an input aimed near the reach of n_max, keeps a slice of α for the
    last look and a more patient futility rule (the default before ``targeted-patient``).

    Near the reach (the aimed radius σΦ⁻¹(p_j) at least ``final_reach`` of σΦ⁻¹(α^(1/n_max)),
    the largest radius n_max draws can certify), a trained model's p_A pile up just above the
    threshold, and fixed-n CERTIFY certifies many of them only with (nearly) all n draws. There
    α is split as w = ``target_share`` on the aimed look, f = ``final_share`` added at n_max, the
    rest evenly over the geometric looks (a valid union bound for any split fixed before the
    estimation draws), so an input that needs every draw is judged by Clopper–Pearson at ≥ f·α
    instead of α(1 − w)/K (K = 18 looks at n_max = 10⁵); and the futility rule (p̂ + c·SE,
    :meth:`Targeted.optimistic_futility`) uses c = ``near_optimism``, stopping fewer inputs that
    fixed-n would certify. Further from the reach (e.g. a 2σ grid's top at n_max = 10⁵), where
    few p_A sit near a threshold and the fallback looks certify most inputs, it is
    ``targeted`` itself: a slice there only thins the fallback looks' α (simulated: 108× → 98×
    fewer passes for f = 0.2, no accuracy gained).

    Chosen by simulation (``benchmarks/sequential_frontier.py --simulate``: the real procedure
    driven by binomial draws from the p̂_A of 200 Fashion-MNIST test images, LeNet σ = 0.25,
    α = 0.001, n_max = 10⁵, 12-16 repetitions): on a 3σ grid 13.6× fewer forward passes than
    fixed-n CERTIFY with an expected certified-accuracy loss of 0.21-0.25 points at the worst radius
    (``targeted`` 15.5× at 0.94; c = 1 instead of 1.25: 14.4× at 0.59); on a 2σ grid 108× at
    0.25 points, as ``targeted``. It is the fastest candidate within 0.5 points on both grids;
    none reaches 20× on the 3σ grid: a clairvoyant test that knows p_A, spends all of α on one
    look and needs only the expected hits reaches 20.2× on these images. On 500 images (every
    20th) and a σ = 0.5 model as well it loses more: 0.54-1.16 points on the 2σ grid, 0.64-0.80
    on the 3σ grid (simulated), so :class:`TargetedPatient` replaced it as the default.
    """

    final_share: float = 0.2  # f, for an aim near the reach only
    near_optimism: float = 1.25  # c for an aim near the reach; elsewhere ``optimism`` (1)
    # 3σ is 0.79 of the reach at α = 0.001, n_max = 10⁵ (3.8σ); 2σ is 0.52 of it
    final_reach: float = 0.7

    def __post_init__(self):
        super().__post_init__()
        check_positive_finite("near_optimism", self.near_optimism)
        if not (isinstance(self.final_reach, numbers.Real) and 0.0 <= self.final_reach <= 1.0):
            raise SmoothcertError(f"final_reach must be in [0, 1] (a fraction of the reach of "
                                  f"n_max), got {self.final_reach!r}")

    def _final(self, p, alpha, n_max):
        reach = norm.ppf(alpha ** (1.0 / n_max))
        if p > 0.5 and norm.ppf(p) >= self.final_reach * reach:
            return self.final_share, self.near_optimism
        return 0.0, self.optimism


@SEQUENTIAL_TESTS.register("targeted-patient")
@dataclass(frozen=True, kw_only=True)
class TargetedPatient(Targeted):
    """``targeted`` tuned to lose (almost) nothing against fixed-n CERTIFY at n = n_max: the
    default of ``--certifier sequential``.

    The split of α, fixed by the selection draws alone (so a valid union bound): w = 0.4 on the
    aimed look, f = 0.3 at n_max (an input that needs every draw is judged by Clopper–Pearson at
    0.3·α, as ``union-final`` judges it at α/2), the remaining 0.3 over the geometric looks; and
    the futility rule projects the hit rate at p̂ + 2·SE (``targeted``: 1 SE), so an input whose
    p_A sits a little above a threshold keeps drawing.

    Chosen by simulation (``benchmarks/sequential_frontier.py --simulate``: the real procedure
    driven by binomial draws from the p̂_A of fixed-n CERTIFY at n = 10⁵ on 500 Fashion-MNIST
    test images, α = 0.001, 10 repetitions), for LeNets at σ = 0.25 and σ = 0.5: the fastest
    candidate whose expected certified-accuracy loss stays within 0.5 points at every radius of
    a 3σ and a 2σ grid on both models (worst 0.28): 10.3-10.9× fewer forward passes than fixed-n
    on the 3σ grid, 28-33× on the 2σ grid. ``targeted`` (15.8-16.3×, 50-60×) and
    ``targeted-final`` lose up to 1.4 points there; ``union-final`` is as careful and slower.
    """

    target_share: float = 0.4
    final_share: float = 0.3
    optimism: float = 2.0


# --------------------------------------------------------------------------- validation
def _check_schedule(first, ratio) -> None:
    _count("first", first)
    ok = isinstance(ratio, numbers.Real) and math.isfinite(ratio) and ratio > 1
    if not ok:
        raise SmoothcertError(f"ratio must be a finite number > 1, got {ratio!r}")


def _count(name: str, value, minimum: int = 1) -> int:
    """:func:`check_count`, which also takes numpy integers here: counts come out of arrays."""
    return check_count(name, value.item() if isinstance(value, np.integer) else value, minimum)


def _counts(k, t, n_max):
    """k, t as int64 arrays of one shape with 0 ≤ k ≤ t and 1 ≤ t ≤ n_max."""
    n_max = _count("n_max", n_max)
    k, t = np.broadcast_arrays(np.asarray(k), np.asarray(t))
    for name, v in (("k", k), ("t", t)):
        if v.dtype.kind not in "iu" and not (v.dtype.kind == "f" and np.all(v == np.round(v))):
            raise SmoothcertError(f"{name} must hold integer counts, got dtype {v.dtype}")
    k, t = k.astype(np.int64), t.astype(np.int64)
    bad = (k < 0) | (k > t) | (t < 1) | (t > n_max)
    if np.any(bad):
        raise SmoothcertError(
            f"need 0 <= k <= t and 1 <= t <= n_max={n_max}; got k={k[bad][0]}, t={t[bad][0]}"
        )
    return k, t, n_max


def _output(bound: np.ndarray):
    return float(bound) if bound.ndim == 0 else bound
