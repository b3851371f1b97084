"""Torch-free statistics behind the certificates, in float64 with NumPy and SciPy.

* :mod:`.binomial` — Clopper–Pearson bounds and the exact binomial test (Cohen et al.);
* :mod:`.sequential_tests` — confidence bounds valid over all looks of a sequential test;
* :mod:`.sequential_levels` — the grid of radii and the sequential procedure that certifies it;
* :mod:`.margins` — the L-bound's margin bounds (Campbell et al.; Hoeffding / Bonferroni).
* :mod:`.multinomial` — per-class upper bounds for a cascade's earlier levels (exact
  Clopper–Pearson; the authors' Goodman intervals, for their numbers);
* :mod:`.ablation` — the certificates of ablation smoothing on vote counts;
* :mod:`.median` — the order-statistic bounds of median smoothing (Chiang et al. 2020);
* :mod:`.segmentation` — per-pixel tests with Holm's or Bonferroni's correction (Fischer et
  al. 2021).
"""

from .binomial import binomial_pvalue, clopper_pearson_lower

__all__ = ["binomial_pvalue", "clopper_pearson_lower"]
