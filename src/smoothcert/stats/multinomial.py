"""Upper bounds on the classes of a multinomial vote: what a cascade's earlier levels need.

A cascade over σ (Jeong & Shin, NeurIPS 2023; ``certifiers/cascade.py``) that answers at a
later level must show that no *other* class than its answer reaches the level's threshold p0
at an earlier level anywhere in the ball: it needs an upper bound on max_{c' ≠ c} p_c' from the
earlier level's vote counts. Two bounds, in float64 with SciPy:

* :func:`class_upper_bounds` (the sound one, exact for every n): the one-sided
  Clopper–Pearson upper bound of every class at level α/K (K classes, Bonferroni), so that
  with probability ≥ 1−α *every* class's bound holds at once — whichever class c a later level
  answers with (the event does not depend on c). :func:`off_class_upper` takes the largest over
  the classes other than c.
* :func:`authors_off_class_upper` (the authors' code, ``third_party/core_mdds.py``,
  ``SmoothedConfidence.off_class_upper_radius``): the other classes pooled by
  :func:`pool_small_counts`, then Goodman's simultaneous intervals
  (:func:`goodman_intervals`, statsmodels' ``multinomial_proportions_confint(method=
  'goodman')``) at two-sided level 2α; with at most two groups after pooling, 1 − the
  Clopper–Pearson lower bound of the level's *own* selected class instead. Kept to reproduce
  their numbers (``tests/fixtures/smoothing-multiscale/``); it is not a sound bound:
  Goodman's intervals rest on a χ² approximation (coverage is not guaranteed for any finite
  n), and the two-group branch bounds the mass outside the level's selected class, which is
  no bound on the other classes when the answer c is not that class (a level with votes
  0.7 / 0.3 and p0 = 0.8 that selected the first class bounds the second, c, by ≈ 0.3 and
  the first, the one that matters, not at all: ``tests/stats/test_multinomial.py``).
"""

from __future__ import annotations

import numpy as np
from scipy.stats import chi2

from .binomial import clopper_pearson_lower

POOL_MIN = 5
"""The authors' pooling threshold: classes with fewer votes are summed into groups of at least
5 votes (the usual rule for Goodman's χ² approximation)."""


def goodman_intervals(counts, alpha: float) -> np.ndarray:
    """Goodman's (1965) simultaneous (1−α) intervals for the proportions of a multinomial with
    ``counts`` (K,), as ``statsmodels.stats.proportion.multinomial_proportions_confint(counts,
    alpha, method='goodman')``: with χ² = the (1 − α/K) quantile of χ²(1) and p̂ = counts/n,
    (2np̂ + χ² ∓ √(χ⁴ + 4np̂(1 − p̂)χ²)) / (2(χ² + n)). Returns (K, 2) float64 [lower, upper].
    Approximate: the joint coverage tends to ≥ 1−α as n grows (each count ≥ 5 is the rule of
    thumb), with no guarantee at a finite n."""
    counts = np.asarray(counts, dtype=np.float64)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if counts.ndim != 1 or (counts < 0).any():
        raise ValueError("counts must be a 1-D array of numbers >= 0")
    n, k = counts.sum(), len(counts)
    p = counts / n
    q = chi2.ppf(1 - alpha / k, 1)
    half = np.sqrt(q**2 + 4 * n * p * q * (1 - p))
    centre = 2 * n * p + q
    return np.stack([(centre - half), (centre + half)], axis=1) / (2 * (q + n))


def pool_small_counts(counts, c: int) -> np.ndarray:
    """The authors' ``_reduce_counts``: [n_c, then the other classes' counts in descending
    order], where each class with fewer than :data:`POOL_MIN` votes is summed with the next
    small ones into a group once the sum reaches it; a remainder below it joins the last entry
    (n_c itself when no other entry was made). Ties need no order: the groups' sums depend on
    the sorted values alone."""
    counts = np.asarray(counts, dtype=np.int64).copy()
    pooled, small = [int(counts[c])], 0
    counts[c] = 0
    for value in np.sort(counts)[::-1]:
        if value >= POOL_MIN:
            pooled.append(int(value))
            continue
        small += int(value)
        if small >= POOL_MIN:
            pooled.append(small)
            small = 0
    if small > 0:
        pooled[-1] += small
    return np.array(pooled, dtype=np.int64)


def authors_off_class_upper(counts, selected: int, c: int, alpha: float) -> float:
    """The authors' upper bound on the largest class other than ``c`` from one level's
    estimation ``counts``, ``selected`` being the class that level selected from its own n0
    draws (this module's doc: not sound; kept for their numbers). With the pooled counts r =
    :func:`pool_small_counts` (counts, c): 1 − Clopper–Pearson lower(counts[selected], n, α)
    when r has at most two entries, else the largest Goodman upper bound (at 2α) of r[1:]."""
    pooled = pool_small_counts(counts, c)
    if len(pooled) <= 2:
        n = int(np.asarray(counts).sum())
        return 1.0 - clopper_pearson_lower(int(counts[selected]), n, alpha)
    return float(goodman_intervals(pooled, 2 * alpha)[1:, 1].max())


def class_upper_bounds(counts, alpha: float) -> np.ndarray:
    """One-sided Clopper–Pearson upper bounds of every class of ``counts`` (K,), each at level
    α/K: with probability ≥ 1−α over the draws, p_c ≤ bound_c for every class c at once
    (Bonferroni; exact for every n). Count 0 gives 1 − (α/K)^(1/n); all n votes give 1.
    ``counts`` (..., K) gives the bounds of each row."""
    counts = np.asarray(counts, dtype=np.int64)
    n, k = counts.sum(axis=-1, keepdims=True), counts.shape[-1]
    return 1.0 - np.atleast_1d(clopper_pearson_lower(n - counts, n, alpha / k))


def off_class_upper(counts, c: int, alpha: float) -> float:
    """The largest of :func:`class_upper_bounds` (counts, α) over the classes other than ``c``:
    with probability ≥ 1−α, max_{c' ≠ c} p_c' is at most it, for every c at once."""
    bounds = class_upper_bounds(counts, alpha)
    return float(np.max(np.delete(bounds, c)))
