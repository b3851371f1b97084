import numpy as np
import pytest
from scipy.stats import binomtest

from smoothcert import binomial_pvalue, clopper_pearson_lower


@pytest.mark.parametrize("alpha", [0.001, 0.01, 0.05, 0.2])
@pytest.mark.parametrize("n", [1, 2, 7, 100, 1000])
def test_clopper_pearson_matches_scipy_exact_interval(n, alpha):
    ks = sorted({0, 1, n // 3, n // 2, n - 1, n} & set(range(n + 1)))
    ours = clopper_pearson_lower(ks, n, alpha)
    for k, bound in zip(ks, ours):
        # the one-sided α bound is the lower end of the two-sided (1 − 2α) exact interval
        ref = binomtest(k, n).proportion_ci(confidence_level=1 - 2 * alpha, method="exact").low
        assert bound == pytest.approx(ref, abs=1e-12, rel=1e-10)


def test_clopper_pearson_edge_cases_and_types():
    assert clopper_pearson_lower(0, 10, 0.01) == 0.0
    assert clopper_pearson_lower(50, 50, 0.001) == pytest.approx(0.001 ** (1 / 50), rel=1e-15)
    assert isinstance(clopper_pearson_lower(3, 10, 0.05), float)
    arr = clopper_pearson_lower(np.array([[1, 2], [3, 4]]), 10, 0.05)
    assert arr.shape == (2, 2) and arr.dtype == np.float64
    assert np.all(np.diff(clopper_pearson_lower(np.arange(11), 10, 0.05)) > 0)  # monotone in k


def test_binomial_pvalue_matches_scipy():
    assert binomial_pvalue(60, 40) == pytest.approx(binomtest(60, 100, 0.5).pvalue, rel=1e-12)
    assert binomial_pvalue(0, 0) == 1.0
    assert binomial_pvalue(50, 50) == pytest.approx(1.0)
