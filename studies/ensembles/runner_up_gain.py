"""Where the runner-up's bound pays: CERTIFY against ``--certifier runner-up`` on vote counts
with many classes, computed from the library's bounds (no model, no sampling).

For K classes, a top class with probability p_A and the rest of the mass either on one other
class ("one") or spread evenly over the K − 1 others ("spread"), the counts of n estimation draws
are taken at their expectations (rounded down; the top class keeps the remainder), and each
certifier's radius computed from them at level α:

* CERTIFY: σ·Φ⁻¹(p_lower), p_lower the Clopper–Pearson lower bound at α;
* runner-up: σ/2·(Φ⁻¹(p_lower) − Φ⁻¹(p_upper)), p_lower at α/2 and every other class's upper
  bound at α/(2(K − 1)) (``smoothcert.certifiers.runner_up.runner_up_certificate``).

Both at the same counts, so the table shows what each bound makes of one typical draw, not an
average over draws. Writes the markdown table to stdout.

    python studies/ensembles/runner_up_gain.py [--n 100000] [--alpha 0.001] [--sigma 0.25]
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.stats import norm

from smoothcert.certifiers.runner_up import runner_up_certificate
from smoothcert.stats import clopper_pearson_lower

CLASSES = (10, 100, 1000)
P_A = (0.3, 0.5, 0.7, 0.9)


def expected_counts(k: int, p_a: float, n: int, spread: bool) -> np.ndarray:
    counts = np.zeros(k, dtype=np.int64)
    rest = n - int(p_a * n)
    if spread:
        counts[1:] = rest // (k - 1)
    else:
        counts[1] = rest
    counts[0] = n - counts[1:].sum()
    return counts


def radii(counts: np.ndarray, n: int, alpha: float, sigma: float) -> tuple[float, float]:
    p_lower = clopper_pearson_lower(int(counts[0]), n, alpha)
    certify = sigma * float(norm.ppf(p_lower)) if p_lower > 0.5 else 0.0
    return certify, runner_up_certificate(0, counts, alpha, sigma).radius


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--alpha", type=float, default=0.001)
    p.add_argument("--sigma", type=float, default=0.25)
    args = p.parse_args()
    print(f"n = {args.n:,}, α = {args.alpha}, σ = {args.sigma}; radius (0: abstains)\n")
    print("| classes | p_A | rest | CERTIFY | runner-up | runner-up / CERTIFY |")
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    for k in CLASSES:
        for p_a in P_A:
            for spread in (False, True):
                counts = expected_counts(k, p_a, args.n, spread)
                certify, runner_up = radii(counts, args.n, args.alpha, args.sigma)
                ratio = f"{runner_up / certify:.3f}" if certify > 0 else "—"
                print(f"| {k} | {p_a} | {'spread' if spread else 'one'} | {certify:.4f} | "
                      f"{runner_up:.4f} | {ratio} |")


if __name__ == "__main__":
    main()
