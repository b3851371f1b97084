"""clopper_pearson_lower calls the ufunc behind scipy's beta.ppf directly: the same float64
numbers, bit for bit, on a spread of (k, n, α)."""

import numpy as np
from scipy.stats import beta

from smoothcert.stats import clopper_pearson_lower


def test_the_bound_is_beta_ppf_bit_for_bit():
    rng = np.random.default_rng(0)
    n = rng.integers(2, 10**6, 5000).astype(np.float64)
    k = np.floor(rng.random(5000) * (n - 1)) + 1
    for alpha in (1e-6, 1e-3, 0.05, 0.5):
        assert np.array_equal(clopper_pearson_lower(k, n, alpha), beta.ppf(alpha, k, n - k + 1))
    assert clopper_pearson_lower(0, 10, 0.01) == 0.0
    assert clopper_pearson_lower(10, 10, 0.01) == 0.01 ** 0.1
