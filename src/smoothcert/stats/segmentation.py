"""Per-pixel certificates of a smoothed segmentation model (Fischer, Baader & Vechev, "Scalable
Certified Segmentation via Randomized Smoothing", ICML 2021; authors' code
eth-sri/segmentation-smoothing, ``code/multiclassify_utils.py``, ``certify``).

The smoothed segmenter. A base model f maps an image to a class per pixel; under Gaussian noise
δ ~ N(0, σ²I), pixel i's class probabilities are p_i(c; x) = P(f_i(x + δ) = c). The smoothed
segmenter answers, at pixel i, the class c with p_i(c; x) > τ (τ ≥ ½, so at most one), and
abstains where no class reaches τ.

The test. Per pixel, ĉ_i is the top class of ``n0`` selection draws (the authors' ``mode``: the
first n0 of their draws; ties to the lowest class), and n_i the votes for ĉ_i among ``n`` fresh
estimation draws. H0_i: p_i(ĉ_i) ≤ τ is tested by the one-sided exact binomial test,
p-value P(Bin(n, τ) ≥ n_i) (SciPy's ``binom_test(n_i, n, τ, alternative='greater')``, as the
authors). The H·W tests of an image are corrected together, at family-wise level α: Holm's
step-down (the authors' default, ``statsmodels``' ``multipletests(method='holm')``) or
Bonferroni (every p-value ≤ α/m). A rejected H0_i certifies pixel i with class ĉ_i; the other
pixels abstain.

The guarantee (family-wise, per image). Both corrections hold the family-wise error rate at α
under any dependence between the tests, and the selection draws are independent of the
estimation draws, so: with probability ≥ 1−α over the draws, *every* certified pixel i has
p_i(ĉ_i; x) > τ. Then Φ⁻¹ ∘ p_i(ĉ_i; ·) is 1/σ-Lipschitz (Salman et al. 2019), so
p_i(ĉ_i; x') > ½ for every x' with ‖x' − x‖₂ ≤ R = σΦ⁻¹(τ): each certified pixel's smoothed
class is ĉ_i on the whole ℓ2 ball of radius R, for all certified pixels at once
(:func:`segmentation_radius`). τ = ½ gives R = 0: the smoothed class at x itself.

Everything here is torch-free float64; vote counts arrive as arrays (pixels, classes).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom, norm

from ..errors import SmoothcertError, check_count, check_positive_finite, check_probability

CORRECTIONS = ("holm", "bonferroni")
"""The family-wise corrections over an image's pixels: Holm's step-down (the authors' default)
and Bonferroni (never certifies a pixel that Holm does not)."""


def pixel_pvalues(votes, n: int, tau: float) -> np.ndarray:
    """The one-sided exact binomial p-values of H0: p ≤ τ with ``votes`` successes of ``n``:
    P(Bin(n, τ) ≥ votes) = ``binom.sf(votes − 1, n, τ)`` (1 at votes = 0). Under H0 each is
    super-uniform: P(p-value ≤ t) ≤ t for every t. ``votes``: array-like of integers in
    [0, n]; ``n`` ≥ 1; τ in [½, 1) (:func:`check_tau`); returns float64 of the same shape."""
    n, tau = check_count("n", n), check_tau(tau)
    votes = np.asarray(votes)
    if votes.dtype.kind not in "iu" or np.any(votes < 0) or np.any(votes > n):
        raise SmoothcertError(f"votes must lie in [0, n = {n}]")
    return np.asarray(binom.sf(votes.astype(np.float64) - 1.0, n, tau), dtype=np.float64)


def bonferroni_reject(pvalues, alpha: float) -> np.ndarray:
    """Bonferroni over m tests: reject H0_i where p_i ≤ α/m (as statsmodels, ``<=``); the
    probability of rejecting any true H0 is ≤ α. Returns a bool array of ``pvalues``' shape
    (1-D); α in (0, 1)."""
    p, alpha = _as_pvalues(pvalues), check_probability("alpha", alpha)
    return p <= alpha / float(len(p))


def holm_reject(pvalues, alpha: float) -> np.ndarray:
    """Holm's (1979) step-down over m tests: with the p-values sorted p_(1) ≤ … ≤ p_(m),
    reject H0_(1) … H0_(k−1) where k is the first j with p_(j) > α/(m − j + 1) (all of them
    when there is none). The family-wise error is ≤ α under any dependence between the tests.
    Tied p-values get the same decision whatever their order (a tie that fails its
    threshold stops the steps before the next one). Returns a bool array of ``pvalues``'
    shape (1-D), in their order; the thresholds are computed as statsmodels does
    (α / (m − j + 1) in float64), so the decisions are its ``multipletests(method='holm')``;
    α in (0, 1)."""
    p, alpha = _as_pvalues(pvalues), check_probability("alpha", alpha)
    order = np.argsort(p, kind="stable")
    thresholds = alpha / np.arange(len(p), 0, -1, dtype=np.float64)
    fails = np.flatnonzero(p[order] > thresholds)
    steps = fails[0] if len(fails) else len(p)  # rejected: the first `steps` in sorted order
    reject = np.zeros(len(p), dtype=bool)
    reject[order[:steps]] = True
    return reject


def _as_pvalues(pvalues) -> np.ndarray:
    p = np.asarray(pvalues, dtype=np.float64)
    if p.ndim != 1 or np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise SmoothcertError("p-values must be a 1-D array of numbers in [0, 1]")
    return p


def segmentation_radius(sigma: float, tau: float) -> float:
    """R = σΦ⁻¹(τ) ≥ 0: the ℓ2 radius on which every certified pixel keeps its class (module
    doc); 0 at τ = ½. σ > 0 (finite) and τ in [½, 1) (:func:`check_tau`), else one
    :class:`SmoothcertError` line."""
    sigma, tau = check_positive_finite("sigma", sigma), check_tau(tau)
    return sigma * float(norm.ppf(tau))


@dataclass(frozen=True)
class PixelCertificates:
    """The certificates of one image's m pixels (row-major), at threshold ``tau`` and
    family-wise level ``alpha`` with ``correction``: with probability ≥ 1−α over the draws,
    every pixel with ``certified`` True has p(``classes``) > τ, so its smoothed class is
    ``classes`` on the ℓ2 ball of radius σΦ⁻¹(τ) (all such pixels at once). ``classes`` (m,)
    int64: each pixel's selected class (also where it abstains); ``votes`` (m,) int64: its
    votes among the ``n`` estimation draws; ``pvalues`` (m,) float64."""

    classes: np.ndarray
    votes: np.ndarray
    pvalues: np.ndarray
    certified: np.ndarray
    n: int
    tau: float
    alpha: float
    correction: str

    def prediction(self, abstain: int = -1) -> np.ndarray:
        """The certified class of every pixel, ``abstain`` where it abstains (int64, (m,))."""
        return np.where(self.certified, self.classes, abstain).astype(np.int64)


def check_tau(tau: float) -> float:
    """τ in [½, 1) (a number, numpy's too; not a bool): below ½ a pixel's class above τ need
    not be its smoothed class; at 1 no count can show p > τ."""
    real = isinstance(tau, numbers.Real) and not isinstance(tau, bool)
    if not (real and 0.5 <= tau < 1.0):
        raise SmoothcertError(f"tau must lie in [0.5, 1), got {tau!r}")
    return float(tau)


def certify_pixels(selection, estimation, tau: float, alpha: float,
                   correction: str = "holm") -> PixelCertificates:
    """Fischer et al.'s certificates from per-pixel vote counts: ``selection`` (m, K) the n0
    selection draws' votes, ``estimation`` (m, K) the n estimation draws' (every row sums to
    the same n ≥ 1). Per pixel ĉ = argmax of its selection votes (the lowest class on ties,
    as the authors' ``np.argmax``), its p-value from its estimation votes
    (:func:`pixel_pvalues`), then ``correction`` ("holm" or "bonferroni") at family-wise
    level α over the m pixels. Guarantee: :class:`PixelCertificates`."""
    selection, estimation = _check_counts(selection, estimation)
    tau, alpha = check_tau(tau), check_probability("alpha", alpha)
    if correction not in CORRECTIONS:
        raise SmoothcertError(f"correction must be one of {', '.join(CORRECTIONS)}, "
                              f"got {correction!r}")
    n = int(estimation[0].sum())
    classes = selection.argmax(axis=1).astype(np.int64)
    votes = estimation[np.arange(len(classes)), classes].astype(np.int64)
    pvalues = pixel_pvalues(votes, n, tau)
    reject = holm_reject if correction == "holm" else bonferroni_reject
    return PixelCertificates(classes, votes, pvalues, reject(pvalues, alpha), n, tau, alpha,
                             correction)


def _check_counts(selection, estimation) -> tuple[np.ndarray, np.ndarray]:
    """Both (m, K) non-negative integer counts, m ≥ 1, K ≥ 1, the estimation rows summing to
    one n ≥ 1."""
    arrays = []
    for name, counts in (("selection", selection), ("estimation", estimation)):
        a = np.asarray(counts)
        if a.ndim != 2 or 0 in a.shape or not np.issubdtype(a.dtype, np.integer) \
                or (a < 0).any():
            raise SmoothcertError(f"{name} counts must be a non-empty (pixels, classes) array "
                                  "of integers >= 0")
        arrays.append(a)
    if arrays[0].shape != arrays[1].shape:
        raise SmoothcertError(f"selection counts {arrays[0].shape} and estimation counts "
                              f"{arrays[1].shape} differ in shape")
    sums = arrays[1].sum(axis=1)
    if sums[0] < 1 or (sums != sums[0]).any():
        raise SmoothcertError("every pixel's estimation counts must sum to the same n >= 1")
    return arrays[0], arrays[1]
