"""The certificates of ablation smoothing (Levine & Feizi), torch-free: exact integer and rational
arithmetic on vote counts.

Patches (NeurIPS 2020, "(De)Randomized Smoothing for Certifiable Defense against Patch Attacks";
authors' ``utils_band.py`` / ``utils_block.py: predict_and_certify``). The smoothed classifier
counts, over every one of the n band (or block) positions, the classes the base classifier votes
for (softmax >= θ: several or none per position), and predicts the class with the most votes,
the lowest class index among equal counts (the authors' stable sort). A patch of side m meets at
most Δ = m + b − 1 bands of width b (column smoothing) or Δ = (m + b − 1)² blocks of side b (block
smoothing), wrapping around included, and only the votes of those positions can change: each
may lose the top class one vote and give any other class one. So the prediction cannot change
when nA − nB > 2Δ, or when nA − nB = 2Δ and the predicted class's index is below the
runner-up's (the tie then still goes to it), with nA, nB the top and runner-up counts in the
authors' order. Deterministic: no sampling, no α; the certificate holds with certainty.

ℓ0 (AAAI 2020, "Robustness Certificates for Sparse Adversarial Attacks by Randomized Ablation",
Theorem 1; authors' ``randomizedAblation/utils.py: population_radius_for_majority``). The base
classifier sees k of the d pixels, drawn uniformly without replacement (every channel of a kept
pixel). If x and x' differ in at most ρ pixels, every class's probability moves by at most
Δ(ρ) = 1 − C(d − ρ, k)/C(d, k) (the chance that a kept pixel is a changed one), so g(x') = c
when p_c(x) − Δ(ρ) > ½; with p_lower a (1 − α) lower bound on p_c(x) the certificate holds with
probability ≥ 1 − α. We follow the authors' code, which produced the published numbers:
the comparison is written 1.5 − p_lower < C(d − ρ, k)/C(d, k) (strict), with the ratio of the
exact integers correctly rounded to a float, and the radius is the largest such ρ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import SmoothcertError

PATCH_MODES = ("column", "block")


@dataclass(frozen=True)
class TopTwo:
    """The predicted class and the runner-up of a count vector, in the authors' order (counts
    descending, class index ascending among equal counts), and their counts."""

    top: int
    runner_up: int
    count: int
    runner_up_count: int


def top_two(counts) -> TopTwo:
    """:class:`TopTwo` of ``counts`` (one per class, at least 2): a stable sort of −counts."""
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 1 or counts.shape[0] < 2:
        raise SmoothcertError(f"counts must be one vector of at least 2 classes, got "
                              f"{counts.shape}")
    order = np.argsort(-counts, kind="stable")
    a, b = int(order[0]), int(order[1])
    return TopTwo(a, b, int(counts[a]), int(counts[b]))


def patch_delta(mode: str, m: int, size: int) -> int:
    """Δ: how many band (column) or block positions of width/side ``size`` a patch of side ``m``
    meets, wrapping around included: m + b − 1, or (m + b − 1)²."""
    if mode not in PATCH_MODES:
        raise SmoothcertError(f"patch mode must be one of {PATCH_MODES}, got {mode!r}")
    span = m + size - 1
    return span if mode == "column" else span * span


def patch_certified(t: TopTwo, delta: int) -> bool:
    """Whether the prediction of :class:`TopTwo` ``t`` survives any change of ``delta``
    positions' votes: nA − nB > 2Δ, or = 2Δ with the predicted class's index the lower."""
    gap = t.count - t.runner_up_count
    return gap > 2 * delta or (gap == 2 * delta and t.top < t.runner_up)


def patch_radius(t: TopTwo, mode: str, size: int, largest: int) -> int:
    """The largest patch side m in 1..``largest`` (the image's shorter side) certified for
    :class:`TopTwo` ``t`` (:func:`patch_certified` with Δ = :func:`patch_delta`); 0 when even
    m = 1 is not. Δ grows with m, so the certified sides are 1..radius."""
    radius = 0
    while radius < largest and patch_certified(t, patch_delta(mode, radius + 1, size)):
        radius += 1
    return radius


def l0_kept_ratio(d: int, keep: int, rho: int) -> float:
    """C(d − ρ, k)/C(d, k): the chance that none of ``keep`` = k pixels drawn without
    replacement from d is one of ρ given pixels (exact integers, correctly rounded)."""
    return math.comb(d - rho, keep) / math.comb(d, keep)


def l0_delta(d: int, keep: int, rho: int) -> float:
    """Δ(ρ) = 1 − C(d − ρ, k)/C(d, k): the largest change of any class's probability when ρ of the
    d pixels change (Levine & Feizi, AAAI 2020, Theorem 1)."""
    return 1.0 - l0_kept_ratio(d, keep, rho)


def l0_certified(p_lower: float, d: int, keep: int, rho: int) -> bool:
    """Whether ρ changed pixels are certified: p_lower − Δ(ρ) > ½, in the authors' form
    1.5 − p_lower < C(d − ρ, k)/C(d, k)."""
    return 1.5 - p_lower < l0_kept_ratio(d, keep, rho)


def l0_radius(p_lower: float, d: int, keep: int) -> int | None:
    """The largest number ρ of pixels certified at ``p_lower`` for d pixels of which ``keep``
    are kept (:func:`l0_certified`), or None when not even ρ = 0 is (p_lower <= ½: no class
    is certified at x itself). Bisection: Δ(ρ) grows with ρ, and ρ = d − k + 1 never holds
    (no ablation then misses every changed pixel)."""
    if not 0 < keep <= d:
        raise SmoothcertError(f"keep must be in 1..d = {d}, got {keep}")
    if not l0_certified(p_lower, d, keep, 0):
        return None
    low, high = 0, d - keep + 1  # certified at low, not at high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if l0_certified(p_lower, d, keep, mid) else (low, mid)
    return low
