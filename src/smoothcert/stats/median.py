"""Percentile (median) smoothing of a regression model: certified intervals from order statistics
(Chiang, Curry, Abdelkader, Kumar, Dickerson & Goldstein, NeurIPS 2020, "Detection as
Regression: Certified Object Detection by Median Smoothing"; authors' code
Ping-C/CertifiedObjectDetection, ``utils/utils.py``: ``estimated_qu_ql``).

The smoothed model. One real output y = f(x + G), G ~ N(0, σ²I), with CDF F_x. Its p-th
percentile is h_p(x) = sup{y : F_x(y) ≤ p} = inf{y : F_x(y) > p} (the paper's definition; for a
continuous F_x the usual quantile F_x⁻¹(p)).

The percentile bound (the paper's). Φ⁻¹(F_x(y)) is 1/σ-Lipschitz in x for every y
(Salman et al. 2019), so for every ‖δ‖₂ ≤ ε

    h_{p_lower}(x) ≤ h_p(x + δ) ≤ h_{p_upper}(x),
    p_lower = Φ(Φ⁻¹(p) − ε/σ),   p_upper = Φ(Φ⁻¹(p) + ε/σ),

for any f (no continuity needed: {y : F_x(y) > p_upper} ⊂ {y : F_{x+δ}(y) > p}, and
F_x(y) ≤ p_lower ⇒ F_{x+δ}(y) ≤ p).

The estimate from n draws, sorted X_(1) ≤ … ≤ X_(n) (1-based order statistics):

* upper: k_upper is the smallest k in 1..n with P(Bin(n, p_upper) ≥ k) ≤ α_side. Then
  P(X_(k) < h_{p_upper}(x)) ≤ α_side: fewer than k draws fall below h_{p_upper}, each with
  probability F_x(h−) ≤ p_upper. No such k: k_upper = n + 1, the bound +inf.
* lower: k_lower is the largest k in 1..n with P(Bin(n, p_lower) ≤ k − 1) ≤ α_side. Then
  P(X_(k) > h_{p_lower}(x)) ≤ α_side (each draw is ≤ h_{p_lower} with probability
  F_x(h) ≥ p_lower). No such k: k_lower = 0, the bound −inf.

These are the paper's indices and the numbers the authors' ``estimated_qu_ql`` returns
(``q_u`` = k_upper, ``q_l`` = k_lower, their fall-backs n + 1 and 0 included; golden numbers in
tests/fixtures/median-smoothing/). Two differences from their code, both deliberate:

* their code reads ``detections_tensor[q]``, a 0-based index, i.e. X_(q+1): one place above
  the paper's index on both sides, which is conservative for the upper bound but NOT sound for
  the lower one (X_(k_lower + 1) can exceed h_{p_lower} with probability above α), and at
  q_u ∈ {n, n + 1} it indexes past the end; here X_(k) is the paper's 1-based statistic and an
  index outside 1..n is ±inf;
* their code fixes the percentile at ½ (Φ⁻¹(½) = 0); here it is any p in (0, 1).

They search k_upper from ⌈n·p_upper⌉ up and k_lower from ⌊n·p_lower⌋ down, and compare
1 − α with a CDF strictly; the full range and the tails compared with α here give the same
indices whenever α_side < ¼ and p_lower ≤ 1 − 1/n (a binomial reaches its mean with
probability above ¼ when np > 1: Greenberg & Mohri 2014), the paper's definition otherwise.

Which events α covers (``correction``): the authors' code (``cert_conf`` = 1 − α) gives each
one-sided bound of each output at each ε its own α_side = α ("none"): each bound holds with
probability ≥ 1 − α, one output's interval at one ε with ≥ 1 − 2α. "bonferroni" (the default
of the certifier) splits α over both sides of every output at every ε of the grid,
α_side = α / (2·D·E): with probability ≥ 1 − α over the n draws, every output's interval holds
at every ε at once.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.stats import binom, norm

from ..errors import SmoothcertError, check_positive_finite, check_probability

CORRECTIONS = ("bonferroni", "none")


@dataclass(frozen=True)
class OrderIndices:
    """The order statistics that bound the p-th percentile of the smoothed output at every x + δ,
    ‖δ‖₂ ≤ ε (ε/σ = ``eps_over_sigma``), from n draws at x: with probability ≥ 1 − ``alpha``
    over the draws X_(k_lower) ≤ h_{p_lower}(x), and with probability ≥ 1 − ``alpha``
    X_(k_upper) ≥ h_{p_upper}(x) (each side alone; ``alpha`` is one side's level).
    ``k_lower`` in 0..n (0: no order statistic does, the bound is −inf), ``k_upper`` in
    1..n + 1 (n + 1: +inf); both 1-based. ``k_median`` = ⌊p·n⌋ + 1, the empirical p-th
    percentile (inf{y : F_n(y) > p}; an estimate, no guarantee)."""

    n: int
    percentile: float
    eps_over_sigma: float
    alpha: float
    p_lower: float
    p_upper: float
    k_lower: int
    k_upper: int
    k_median: int


def _check(n, percentile, eps_over_sigma, alpha) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise SmoothcertError(f"median smoothing needs n >= 1 draws, got {n!r}")
    check_probability("median smoothing percentile", percentile)
    if not (_is_real(eps_over_sigma) and math.isfinite(eps_over_sigma) and eps_over_sigma >= 0):
        raise SmoothcertError(f"median smoothing eps/sigma must be a finite number >= 0, got "
                              f"{eps_over_sigma!r}")
    check_probability("median smoothing alpha", alpha)


def _is_real(value) -> bool:
    """A real number, not a bool (numpy's scalars count)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _first(holds, n: int, guess: float) -> int:
    """The smallest k in 1..n where ``holds(k)`` (false below it, true from it on), or n + 1
    where it never holds; found by walking from ``guess`` (a quantile's estimate: a few steps),
    so that the answer is the predicate's own, not SciPy's quantile search's."""
    k = int(min(max(guess, 1), n + 1)) if math.isfinite(guess) else n + 1
    while k <= n and not holds(k):
        k += 1
    while k > 1 and holds(k - 1):
        k -= 1
    return k


@lru_cache(maxsize=256)
def _indices(n: int, percentile: float, eps_over_sigma: float, alpha: float) -> OrderIndices:
    z = float(norm.ppf(percentile))
    p_lower = float(norm.cdf(z - eps_over_sigma))
    p_upper = float(norm.cdf(z + eps_over_sigma))
    # upper: P(Bin(n, p_upper) ≥ k) = sf(k − 1) ≤ α, a tail that falls as k grows: the first k
    k_upper = _first(lambda k: binom.sf(k - 1, n, p_upper) <= alpha, n,
                     float(binom.isf(alpha, n, p_upper)) + 1)
    # lower: P(Bin(n, p_lower) ≤ k − 1) = cdf(k − 1) ≤ α, which grows with k: the last k
    k_lower = _first(lambda k: binom.cdf(k - 1, n, p_lower) > alpha, n,
                     float(binom.ppf(alpha, n, p_lower)) + 1) - 1
    k_median = min(math.floor(percentile * n) + 1, n)
    return OrderIndices(n, percentile, eps_over_sigma, alpha, p_lower, p_upper, k_lower,
                        k_upper, k_median)


def order_indices(n: int, percentile: float, eps_over_sigma: float,
                  alpha: float) -> OrderIndices:
    """The paper's order-statistic indices (module doc) for n draws, the percentile p in (0, 1),
    the radius ε/σ ≥ 0 (in units of σ) and one side's failure probability α in (0, 1). Bad
    input is one :class:`SmoothcertError` line. Cached: a run asks the same few every input."""
    _check(n, percentile, eps_over_sigma, alpha)
    return _indices(int(n), float(percentile), float(eps_over_sigma), float(alpha))


def side_alpha(alpha: float, outputs: int, radii: int, correction: str) -> float:
    """One one-sided bound's level: α ("none", the authors') or α/(2·outputs·radii)
    ("bonferroni": every bound of every output at every radius at once within α)."""
    if correction == "none":
        return float(alpha)
    if correction == "bonferroni":
        return float(alpha) / (2 * outputs * radii)
    raise SmoothcertError(f"median smoothing correction must be one of "
                          f"{', '.join(CORRECTIONS)}, got {correction!r}")


@dataclass(frozen=True)
class MedianCertificate:
    """The certified intervals of D outputs at E radii from n draws at x.

    Guarantee (``correction`` "bonferroni"): with probability ≥ 1 − ``alpha`` over the draws,
    for every radius ε = ``eps[e]``, every output d and every ‖δ‖₂ ≤ ε, the smoothed
    ``percentile`` of output d at x + δ lies in [``lower[e, d]``, ``upper[e, d]``]
    (``correction`` "none": each one-sided bound alone with probability ≥ 1 − ``alpha``).
    ``median`` (D,): the empirical percentile at x (no guarantee). ``lower``/``upper`` (E, D),
    float64, −inf/+inf where no order statistic bounds the side. ``k_lower``/``k_upper`` (E,):
    the 1-based order statistics used; ``side_alpha``: one bound's level."""

    percentile: float
    eps: np.ndarray
    sigma: float
    alpha: float
    correction: str
    side_alpha: float
    median: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    k_lower: np.ndarray
    k_upper: np.ndarray


def _order_statistic(sorted_values: np.ndarray, k: int, empty: float) -> np.ndarray:
    """X_(k) of every column (1-based k), or ``empty`` (±inf) where k is outside 1..n."""
    n, d = sorted_values.shape
    if 1 <= k <= n:
        return sorted_values[k - 1].copy()
    return np.full(d, empty)


def certify_median(samples, eps, sigma: float, *, percentile: float = 0.5, alpha: float = 0.001,
                   correction: str = "bonferroni") -> MedianCertificate:
    """Certified percentile intervals (:class:`MedianCertificate`, its guarantee) from
    ``samples`` (n, D): the outputs f(x + δ_i), δ_i ~ N(0, σ²I) i.i.d., in any order (finite
    reals). ``eps``: the radii (ℓ2, input units; a number or a list, each finite and ≥ 0);
    ``sigma`` > 0 the noise's standard deviation; ``percentile`` p in (0, 1); ``alpha`` in
    (0, 1); ``correction`` one of :data:`CORRECTIONS`. Bad input is one
    :class:`SmoothcertError` line."""
    values, radii = _checked_samples(samples), _checked_radii(eps)
    sigma = check_positive_finite("median smoothing sigma", sigma)
    percentile = check_probability("median smoothing percentile", percentile)
    alpha = check_probability("median smoothing alpha", alpha)
    values = np.sort(values, axis=0)
    n, d = values.shape
    level = side_alpha(alpha, d, radii.size, correction)
    found = [order_indices(n, percentile, float(r) / sigma, level) for r in radii]
    lower = np.stack([_order_statistic(values, i.k_lower, -np.inf) for i in found])
    upper = np.stack([_order_statistic(values, i.k_upper, np.inf) for i in found])
    median_k = order_indices(n, percentile, 0.0, level).k_median
    return MedianCertificate(percentile, radii, sigma, alpha, correction,
                             level, values[median_k - 1].copy(), lower, upper,
                             np.array([i.k_lower for i in found]),
                             np.array([i.k_upper for i in found]))


def _checked_samples(samples) -> np.ndarray:
    """``samples`` as a float64 (n, D) array of finite numbers, n, D ≥ 1."""
    values = _numbers(samples, "samples")
    if values.ndim != 2 or values.shape[0] < 1 or values.shape[1] < 1:
        raise SmoothcertError(f"median smoothing needs samples of shape (n, D), got "
                              f"{values.shape}")
    if not np.isfinite(values).all():
        raise SmoothcertError("median smoothing needs finite outputs; some are NaN or inf")
    return values


def _checked_radii(eps) -> np.ndarray:
    """``eps`` as a non-empty float64 vector of finite radii ≥ 0."""
    radii = _numbers(eps, "eps").reshape(-1)
    if radii.size == 0:
        raise SmoothcertError("median smoothing needs at least one radius eps")
    if not (np.isfinite(radii) & (radii >= 0)).all():
        raise SmoothcertError(f"median smoothing radii eps must be finite numbers >= 0, got "
                              f"{radii.tolist()}")
    return radii


def _numbers(values, name: str) -> np.ndarray:
    """``values`` as a float64 array, when they are numbers (not text, bools or objects)."""
    try:
        array = np.asarray(values)
    except (TypeError, ValueError, RuntimeError):
        array = np.asarray(None)
    if array.dtype.kind not in "iuf":
        raise SmoothcertError(f"median smoothing {name} must be numbers (an array-like), got "
                              f"{type(values).__name__}")
    return array.astype(np.float64)
