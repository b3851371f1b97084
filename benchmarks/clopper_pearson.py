"""Clopper–Pearson bounds: ``smoothcert.stats.clopper_pearson_lower`` (the ufunc behind SciPy's
``beta.ppf``, called directly) against ``scipy.stats.beta.ppf`` itself, per scalar call (as the
sequential tests and the sequential certifier call it, one look at a time) and on one array
of 100,000 bounds; the ratio is measured in one run, interleaved over rounds (median).

    python benchmarks/clopper_pearson.py [--calls 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import scipy
import torch
from common import print_environment
from scipy.stats import beta

from smoothcert.stats import clopper_pearson_lower


def scipy_bound(k, n, alpha):
    """The textbook form: beta.ppf(α, k, n − k + 1) (0 < k < n here)."""
    return beta.ppf(alpha, k, n - k + 1)


def per_call(bound, cases, alpha: float) -> float:
    tic = time.perf_counter()
    for k, n in cases:
        bound(k, n, alpha)
    return (time.perf_counter() - tic) / len(cases)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    n = rng.integers(2, 100_000, args.calls)
    k = rng.integers(1, n)  # 0 < k < n: the bounds beta.ppf computes
    cases = [(int(a), int(b)) for a, b in zip(k, n)]
    ours, theirs, ours_array, theirs_array = [], [], [], []
    big_n = rng.integers(2, 100_000, 100_000).astype(np.float64)
    big_k = rng.integers(1, big_n).astype(np.float64)
    for _ in range(args.rounds):
        theirs.append(per_call(scipy_bound, cases, 0.001))
        ours.append(per_call(clopper_pearson_lower, cases, 0.001))
        for out, f in ((theirs_array, scipy_bound), (ours_array, clopper_pearson_lower)):
            tic = time.perf_counter()
            f(big_k, big_n, 0.001)
            out.append(time.perf_counter() - tic)
    assert np.array_equal(clopper_pearson_lower(big_k, big_n, 0.001),
                          scipy_bound(big_k, big_n, 0.001))  # the same numbers, bit for bit
    print_environment(torch.device("cpu"))
    print(f"scipy: {scipy.__version__}; {args.calls} scalar calls, {len(big_k)} in one array, "
          f"median of {args.rounds} rounds")
    for what, a, b in (("per scalar call", theirs, ours), ("one array", theirs_array,
                                                           ours_array)):
        t, o = statistics.median(a), statistics.median(b)
        print(f"| {what} | beta.ppf {t * 1e6:.2f} µs | clopper_pearson_lower {o * 1e6:.2f} µs "
              f"| {t / o:.1f}× |")


if __name__ == "__main__":
    main()
