"""The statistics behind the certificates, in float64 with SciPy.

All bounds here are exact (not asymptotic): they hold for every n.
"""

from __future__ import annotations

import numpy as np
from scipy import special
from scipy.stats import beta, binomtest

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
    """
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    k, n = np.broadcast_arrays(k, n)
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
    """
    total = int(top) + int(runner_up)
    if total == 0:
        return 1.0
    return float(binomtest(int(top), total, 0.5).pvalue)
