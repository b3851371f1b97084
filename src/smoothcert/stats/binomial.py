"""The statistics behind the certificates, in float64 with SciPy.

All bounds here are exact (not asymptotic): they hold for every n.
"""

from __future__ import annotations

import numpy as np
from scipy import special
from scipy.stats import beta, binomtest

from ..errors import SmoothcertError, check_count, check_probability

# The ufunc behind ``beta.ppf`` (SciPy >= 1.11: Boost's beta quantile), called directly: the
# same float64 results without scipy.stats' argument handling (~35 µs a call, which the
# sequential tests paid per look: benchmarks/clopper_pearson.py). Older SciPy: beta.ppf.
_BETA_PPF = getattr(special._ufuncs, "_beta_ppf", None) or (lambda q, a, b: beta.ppf(q, a, b))


def clopper_pearson_lower(k, n, alpha):
    """One-sided (1−α) Clopper–Pearson lower confidence bound on a binomial proportion.

    With k successes out of n trials, P(p ≥ bound) ≥ 1−α over the draw of k, whatever the true p.
    The bound is the α-quantile of Beta(k, n−k+1); by convention it is 0 when k = 0, and when
    k = n it is α^(1/n) in closed form. Vectorised over array-like k and n (broadcast); returns a
    float for scalar inputs and a float64 array otherwise. This equals the lower end of the
    two-sided interval at level 1−2α, which is what Cohen et al.'s code computes.

    Counts must be whole numbers with 0 ≤ k ≤ n and α a number in (0, 1): anything else (k > n,
    a NaN, α = 2) is one :class:`SmoothcertError` line, not a bound of 0 or NaN.
    """
    check_probability("alpha", alpha)
    k, n = np.broadcast_arrays(_counts(k, "k"), _counts(n, "n"))
    above = k > n
    if above.any() if k.ndim else above:  # a 0-d array's .any() costs more than the rest
        raise SmoothcertError(f"k must be at most n (successes among n trials), got k = "
                              f"{k[above].flat[0]:g} with n = {n[above].flat[0]:g}")
    bound = np.zeros(k.shape, dtype=np.float64)
    inner = (k > 0) & (k < n)
    bound[inner] = _BETA_PPF(alpha, k[inner], n[inner] - k[inner] + 1)  # = beta.ppf (above)
    full = (k == n) & (n > 0)
    bound[full] = np.power(alpha, 1.0 / n[full])
    return float(bound) if bound.ndim == 0 else bound


def binomial_pvalue(top: int, runner_up: int) -> float:
    """Two-sided exact binomial test p-value of ``top`` successes in ``top + runner_up`` at p = ½.

    PREDICT (Cohen et al., Alg. 1) returns the top class only when this p-value is ≤ α; then the
    probability of returning a class other than the smoothed classifier's g(x) is at most α.
    Both counts are integers ≥ 0 (numpy's too), else one :class:`SmoothcertError` line.
    """
    total = check_count("top", top, minimum=0) + check_count("runner_up", runner_up, minimum=0)
    if total == 0:
        return 1.0
    return float(binomtest(int(top), total, 0.5).pvalue)


def _counts(values, name: str) -> np.ndarray:
    """``values`` as float64 counts: whole numbers ≥ 0 (ints, or floats that are whole), else
    one SmoothcertError line naming ``name``."""
    if isinstance(values, (int, np.integer)) and not isinstance(values, bool) and values >= 0:
        return np.asarray(values, dtype=np.float64)  # one count: the common case, at once
    given = np.asarray(values)
    counts = given.astype(np.float64) if given.dtype.kind in "iuf" else np.asarray(np.nan)
    if not ((counts >= 0) & (counts == np.floor(counts)) & np.isfinite(counts)).all():
        raise SmoothcertError(f"{name} must be whole numbers >= 0 (counts), got "
                              f"{' '.join(repr(values).split())[:40]}")
    return counts
