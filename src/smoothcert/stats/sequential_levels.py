"""The sequential certification procedure at a grid of radii, driven by hit counts.

:func:`grid` and :func:`thresholds` turn radii into the thresholds p_j = Φ(r_j / σ);
:func:`certify_levels` is a generator that asks for draws at the looks of a
:class:`~smoothcert.stats.sequential_tests.SequentialTest`, receives the hits, and returns a
:class:`SequentialOutcome`: the largest threshold below p_A it could assert, sound at level α
whatever the stopping (see :mod:`smoothcert.stats.sequential_tests` for why). :func:`run_levels`
drives it with a function that draws. The sampling itself (the model, the noise, the batches) is
not here.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Generator
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from ..errors import SmoothcertError, check_positive_finite, check_probability
from .sequential_tests import SequentialTest, _count


# --------------------------------------------------------------------------- the grid
def grid(radii, sigma) -> tuple[np.ndarray, np.ndarray]:
    """The sorted grid radii (0 included) and their thresholds p_j = Φ(r_j / σ), both float64.

    ``radii`` is a non-empty array-like of finite radii ≥ 0 (L2, pixel units, same units as σ);
    duplicates are merged and 0.0 is prepended when absent, so thresholds[0] = ½ and certifying
    level 0 asserts p_A > ½, i.e. that ĉ_A is the smoothed classifier's class g(x). The input is
    certified at radius r_j iff p_A > p_j is asserted. For r_j/σ ≳ 8.3 the threshold rounds to
    1.0 in float64 and that grid point can never be certified.
    """
    sigma = check_positive_finite("sigma", sigma)
    r = np.asarray(radii, dtype=np.float64).ravel()
    if r.size == 0 or not np.all(np.isfinite(r)) or np.any(r < 0):
        raise SmoothcertError(f"radii must be finite numbers >= 0, at least one; got {radii!r}")
    r = np.union1d(r, [0.0])  # sorted, unique, with 0
    with np.errstate(over="ignore"):  # r/σ beyond float64 is inf, Φ(inf) = 1: never certified
        return r, norm.cdf(r / sigma)


def thresholds(radii, sigma) -> np.ndarray:
    """The thresholds p_j = Φ(r_j / σ) of :func:`grid` (sorted, 0.0 included): float64 array."""
    return grid(radii, sigma)[1]


# --------------------------------------------------------------------------- the procedure
@dataclass(frozen=True)
class SequentialOutcome:
    """What :func:`certify_levels` decided for one input.

    ``level`` indexes the thresholds: the largest j with p_A > thresholds[j] asserted, or −1 when
    nothing is certified (abstain: not even p_A > ½ at the grid's radius 0). ``draws`` (t) and
    ``hits`` (k) count the estimation draws used and the hits of ĉ_A among them. ``p_lower`` is the
    largest and ``p_upper`` the smallest bound over the looks taken; both are (1−α) bounds on p_A,
    simultaneous over looks, and ``level`` is the largest j with thresholds[j] < p_lower.
    ``stopped`` says why sampling stopped: "all" (every grid point certified), "n_max" (the draw
    budget is spent), "unreachable" (no later look can certify the next threshold even if every
    remaining draw is a hit) or "futile" (not even hits at rate p_upper would certify the next
    threshold by n_max).
    """

    level: int
    draws: int
    hits: int
    p_lower: float
    p_upper: float
    stopped: str


def certify_levels(
    test: SequentialTest, thresholds, alpha: float, n_max: int, selection=None
) -> Generator[int, int, SequentialOutcome]:
    """Sequentially certify the largest grid threshold below p_A; a generator driven by hits.

    It yields the number of ADDITIONAL draws it wants (an int > 0, the gap to the next of
    ``test.looks(n_max)``) and receives, through ``send``, the hits of ĉ_A among those draws; it
    returns (``StopIteration.value``) a :class:`SequentialOutcome`. ``thresholds`` is a
    non-decreasing 1-D array of values in [0, 1] (from :func:`thresholds`); ``alpha`` in (0, 1).
    ``selection`` = (hits of ĉ_A, n0) from the selection draws lets the test aim
    (:meth:`SequentialTest.given_selection`).

    At each look, with k hits in t draws:
      1. p_lower ← max(p_lower, L(k, t)), p_upper ← min(p_upper, U(k, t));
      2. level ← the largest j with thresholds[j] < p_lower (strict), −1 if none;
      3. stop if (a) level is the last grid point, (b) t = n_max, (c) no later look s could
         certify the next threshold even with all s − t further draws hits (deterministic), or
         (d) futility: with the remaining n_max − t draws hitting at rate p_upper, the bound at
         n_max, L(k + p_upper·(n_max − t), n_max), would still not pass the next threshold (in
         particular whenever p_upper < the next threshold).

    Guarantee: whatever the stopping, with probability ≥ 1 − α over the draws, level = −1 or
    thresholds[level] < p_A, i.e. the returned grid radius does not exceed the true radius
    σ Φ⁻¹(p_A) — no false certificate. Reason: a false certificate needs some look with
    L(k_t, t) > p_A, which has probability ≤ α by the test's simultaneous validity; stopping only
    removes looks. Rule (d) therefore never costs soundness, only power: since p_A ≤ p_upper with
    probability ≥ 1 − α, the hits that running on to n_max would add are, on average, no more
    than the projection assumes, so an input stopped by (d) would rarely have been certified at
    the next threshold by n_max; what it gives up is that chance, not a guarantee.
    """
    test, thr, alpha, n_max = _checked(test, thresholds, alpha, n_max)
    if selection is not None:
        test = test.given_selection(*selection, thr, alpha, n_max)
    looks = test.looks(n_max)
    k = t = 0
    p_lower, p_upper = 0.0, 1.0
    for look in looks:
        hits = _hits((yield look - t), look - t)
        k, t = k + hits, look
        p_lower = max(p_lower, test.lower(k, t, alpha, n_max))  # 1.
        p_upper = min(p_upper, test.upper(k, t, alpha, n_max))
        level = int(np.searchsorted(thr, p_lower, side="left")) - 1  # 2. #{j: thr_j < p_lower} − 1
        stopped = _stop_reason(test, thr, level, k, t, alpha, n_max, p_upper)  # 3.
        if stopped:
            return SequentialOutcome(level, t, k, p_lower, p_upper, stopped)
    raise AssertionError("unreachable: the last look is n_max")  # pragma: no cover


def run_levels(
    test: SequentialTest, thresholds, alpha: float, n_max: int, draw_hits: Callable[[int], int],
    selection=None,
) -> SequentialOutcome:
    """Drive :func:`certify_levels` with ``draw_hits(m)``: the hits of ĉ_A among m fresh draws."""
    proc = certify_levels(test, thresholds, alpha, n_max, selection)
    m = next(proc)
    try:
        while True:
            m = proc.send(draw_hits(m))
    except StopIteration as stop:
        return stop.value


def _stop_reason(test, thr, level, k, t, alpha, n_max, p_upper) -> str | None:
    """Rules (a)–(d) of :func:`certify_levels`; None to keep sampling."""
    if level == len(thr) - 1:
        return "all"
    if t == n_max:
        return "n_max"
    later = np.array([s for s in test.looks(n_max) if s > t])
    best = test.lower(k + later - t, later, alpha, n_max)  # every further draw a hit
    if np.max(best) <= thr[level + 1]:
        return "unreachable"
    if test.futile(k, t, thr[level + 1], alpha, n_max, p_upper):  # (d)
        return "futile"
    return None

def _checked(test, thresholds, alpha, n_max):
    if not isinstance(test, SequentialTest):
        raise SmoothcertError(
            f"test must be a SequentialTest, e.g. SEQUENTIAL_TESTS['union'](); got {test!r}"
        )
    thr = np.asarray(thresholds, dtype=np.float64)
    if thr.ndim != 1 or thr.size == 0 or np.any(np.diff(thr) < 0) or not (
        np.all(thr >= 0) and np.all(thr <= 1)
    ):
        raise SmoothcertError(
            f"thresholds must be a non-empty sorted 1-D array in [0, 1], got {thresholds!r}"
        )
    alpha = check_probability("alpha", alpha)
    n_max = _count("n_max", n_max)
    test.looks(n_max)  # raises when n_max is below the first look
    return test, thr, alpha, n_max


def _hits(hits, m: int) -> int:
    if isinstance(hits, bool) or not isinstance(hits, numbers.Integral) or not 0 <= hits <= m:
        raise SmoothcertError(f"send the hits among the {m} draws asked for (0..{m}); got {hits!r}")
    return int(hits)
