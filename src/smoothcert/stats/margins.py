r"""The L-bound: Campbell, Finlay & Oberman, "Adversarial Boot Camp: label free certified robustness
in one epoch" (arXiv 2010.02508), Theorem 3 and its proof in Appendix C.

Let f: ℝᵈ → [0, 1]^C output class probabilities (a softmax) and let

    G(x) = (f ∗ N(0, σ²I))(x) = E_δ[f(x + δ)],   δ ~ N(0, σ²I),

be its Gaussian average, the *soft* smoothed classifier (the paper's f^smooth). With
G(x)₍₁₎ ≥ G(x)₍₂₎ its two largest entries, Theorem 3 (rank k = 1) says that a perturbation e
which changes G's top class has

    ‖e‖₂ ≥ σ·√(π/2)·(G(x)₍₁₎ − G(x)₍₂₎).                                   (paper, eq. 7)

Why, with the margin made explicit. For any h: ℝᵈ → [−1, 1], the Gaussian average ĥ = h ∗ N has
u·∇ĥ(x) = E[h(x + δ)⟨δ, u⟩]/σ² ≤ E|⟨δ, u⟩|/σ² = √(2/π)/σ for every unit vector u (Salman et al.
2019, Lemma 1). The margin G_A − G_B between the top class A and any other class B is the
Gaussian average of f_A − f_B ∈ [−1, 1], so it is L-Lipschitz with L = √(2/π)/σ
(:func:`lipschitz_constant`) and stays positive while ‖e‖ < (G_A − G_B)(x)/L; taking the nearest
B gives eq. 7. (The paper's proof applies L to single components; for [0, 1]-valued components
the tight constant is L/2, and both arguments give the same radius.) The bound is tight at a
boundary: for a halfspace f at distance d, G_A = Φ(d/σ) and σ√(π/2)(2Φ(d/σ) − 1) → d as d → 0.

The radius certifies G, the soft classifier, exactly — not the hard smoothed classifier g of
Cohen et al., and not f. Computing it needs G(x), which is known only in three ways: a closed
form, a Monte Carlo estimate (then :func:`margin_lower_bound` keeps it valid with probability
≥ 1−α), or the assumption that a model *is* G (the paper's heuristic for HeatSmoothing models).
The certifiers using each live in ``certify/deterministic.py``.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import SmoothcertError, check_count, check_positive_finite, check_probability

BOUNDS = ("pairwise", "top", "none")
"""How :func:`margin_lower_bound` turns a Monte Carlo estimate of G(x) into a margin bound."""


def lipschitz_constant(sigma: float) -> float:
    """L = √(2/π)/σ: the L2 Lipschitz constant of the Gaussian average (at noise level σ, pixel
    units) of any function with values in [−1, 1] — here the margin G_A − G_B."""
    return math.sqrt(2.0 / math.pi) / check_positive_finite("sigma", sigma)


def lbound_radius(gap: float, sigma: float) -> float:
    """The L-bound σ·√(π/2)·gap (eq. 7), in pixel units: no perturbation of smaller L2 norm changes
    the top class of G when ``gap`` ≤ G_A(x) − max_{B≠A} G_B(x). 0 when ``gap`` ≤ 0."""
    return max(float(gap), 0.0) / lipschitz_constant(sigma)


def margin(p, top: int) -> tuple[int, float]:
    """(B, p_top − p_B) for the largest entry p_B of ``p`` (C,) other than ``top``."""
    p = _probabilities(p)
    others = p.copy()
    others[top] = -np.inf
    runner_up = int(np.argmax(others))
    return runner_up, float(p[top] - p[runner_up])


def margin_lower_bound(p_mean, top: int, n: int, alpha: float, bound: str = "pairwise") -> float:
    r"""A lower confidence bound on the margin m = G_A(x) − max_{B≠A} G_B(x) of class A = ``top``
    from ``p_mean`` (C,), the mean of softmax f(x + δᵢ) over n i.i.d. draws δᵢ ~ N(0, σ²I).

    ``top`` must not depend on these n draws (take it from the clean input or from separate
    selection draws). Then, with probability ≥ 1−α over the draws, m ≥ the returned value, for:

    - ``"pairwise"`` (Hoeffding on each margin, union bound over the C − 1 other classes): for each
      B, f_A(x+δᵢ) − f_B(x+δᵢ) ∈ [−1, 1], so P(mean − (G_A − G_B) ≥ t) ≤ exp(−n t²/2); with
      t = √(2·ln((C−1)/α)/n) all C − 1 bounds hold at once with probability ≥ 1−α, and
      m ≥ p̄_A − max_{B≠A} p̄_B − t.
    - ``"top"`` (Hoeffding on G_A alone, no union bound): f_A ∈ [0, 1] gives
      G_A ≥ p̄_A − √(ln(1/α)/(2n)); since the entries of G sum to 1, G_B ≤ 1 − G_A for every B,
      so m ≥ 2·(p̄_A − √(ln(1/α)/(2n))) − 1. Better than ``"pairwise"`` for many classes and
      p̄_A near 1; useless when p̄_A ≤ ½.
    - ``"none"``: the plug-in estimate p̄_A − max_{B≠A} p̄_B, with **no** guarantee: the paper's
      L-bound for stochastically averaged models (authors' ``test_statistics.py --is-cohen``,
      100 draws). Reported for comparison with the paper's tables only.

    Hoeffding's inequality is exact for every n (no asymptotics). The value may be negative.
    """
    p = _probabilities(p_mean)
    check_count("n", n), check_probability("alpha", alpha)
    _, estimate = margin(p, top)
    if bound == "pairwise":
        return estimate - math.sqrt(2.0 * math.log((len(p) - 1) / alpha) / n)
    if bound == "top":
        return 2.0 * (float(p[top]) - math.sqrt(math.log(1.0 / alpha) / (2.0 * n))) - 1.0
    if bound == "none":
        return estimate
    raise SmoothcertError(f"bound must be one of {', '.join(BOUNDS)}, got {bound!r}")


def _probabilities(p) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or p.size < 2:
        raise SmoothcertError(
            f"class probabilities must have shape (C,) with C >= 2, got {p.shape}"
        )
    return p
