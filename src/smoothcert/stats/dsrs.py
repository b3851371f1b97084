"""Double Sampling Randomized Smoothing (Li, Zhang, Xie & Li, ICML 2022, arXiv 2206.07912):
the ℓ2 certificate of a Gaussian P = N(0, σ²I) from two probabilities, p_A under P and q_A
under Q = P conditioned on ‖δ‖₂ ≤ T (the authors' thresholded Gaussian, ``gaussian-th``).

Work in units of σ (the radius scales with σ). T² = F⁻¹_{χ²_d}(th) for a percentile ``th``,
so P(‖δ‖ ≤ T) = th and Q's density is q = p·1{‖δ‖ ≤ T}/th. For a shift r·e₁ the smallest
P_r(f) over classifiers f with E_P f ≥ p and E_Q f ≥ q is reached (generalized Neyman–Pearson:
f = 1{p_r < λ₁p + λ₂q}, λ ≥ 0) by

    f* = 1{‖z‖ ≤ T, z₁ < a₂} + 1{‖z‖ > T, z₁ < a₁},   a₁ ≤ Φ⁻¹(p) ≤ a₂,

whose thresholds do not depend on r: with A(a) = P(‖δ‖ ≤ T, δ₁ < a) and B(a) = Φ(a) − A(a),
a₂ = max(Φ⁻¹(p), A⁻¹(q·th)) and a₁ = min(Φ⁻¹(p), B⁻¹(p − q·th)) (−∞ when p ≤ q·th).
When the halfspace of Neyman–Pearson already has Q-mass ≥ q, a₁ = a₂ = Φ⁻¹(p) and the value is
Cohen's Φ(Φ⁻¹(p) − r); otherwise it is larger. The value is

    R(r) = Φ(a₁ − r) + J(r, a₂) − J(r, a₁),   J(r, a) = ∫_{−T}^{min(a,T)} G(z) φ(z − r) dz,

G(z) = P(χ²_{d−1} ≤ T² − z²), one-dimensional integrals (composite 24-point Gauss–Legendre on
panels of length 1). The certificate holds at r when R(r') > ½ for every r' ≤ r.

Soundness (the guarantee the certifier relies on): every computed A, J is taken to be off by
at most ``INTEGRATION_MARGIN`` (1e-9; ``tests/stats/test_dsrs_golden.py`` measures the error
against scipy's adaptive quad below 1e-11 for d ≥ ``MIN_DIM`` = 8; smaller d is refused), and
every comparison is pushed by that margin to the conservative side: the thresholds are lower
bounds of a₁, a₂ (R increases in both), R is lowered by 2 margins. Between the radii where R
is evaluated (steps h), R is above the lower of its two ends minus h²·max|R''|/8 ≤ h²·4φ(1)/8
(|R''| ≤ ∫|φ''|), which is added to ½; so no monotonicity of R in r is assumed. The returned
radius is certified whenever p_A ≥ p and q_A ≥ q. It is never below Cohen's σΦ⁻¹(p) (which
needs no integral), and 0 when p ≤ ½. Cost: ~5 ms per certificate (d = 784 or 3072, one
CPU core), ~1 ms per (d, th) for the cached table of A.

The authors' algorithm (``algo/algo.py``: ``check``) also uses upper confidence bounds of p_A and
q_A; we use the lower ones only (a larger feasible set: sound, sometimes smaller radii). The
upper bounds add to the certificate only when q_A's upper bound is below the Q-mass of Cohen's
halfspace (a classifier less concentrated in the ball than a halfspace, where the lower bounds
alone give Cohen's radius) or q_lower·th > p_upper.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import optimize, special

from ..errors import SmoothcertError, check_in_range, check_positive_finite

INTEGRATION_MARGIN = 1e-9
# |R''(r)| ≤ ∫|φ''| = 4φ(1): the dip of R below its chord over a step h is at most h²·this
CURVATURE = 4.0 * math.exp(-0.5) / math.sqrt(2.0 * math.pi) / 8.0
TAIL = 12.0  # the standard normal's mass beyond 12 is below 2e-32
SEARCHES = ("precise", "grid")
# from d = 8 on the quadrature is within 1e-11 of adaptive quad (tests); below, G's edge
# singularity (T² − z²)^((d−1)/2) costs up to 3e-6 (d = 2), more than the margin
MIN_DIM = 8
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(24)


@functools.lru_cache(maxsize=256)
def ball(d: int, th: float) -> float:
    """T² (in σ² units) of the ball of P-mass ``th`` in ``d`` dimensions."""
    if d < MIN_DIM:
        raise SmoothcertError(f"DSRS needs an input dimension d >= {MIN_DIM}, got {d}")
    if not 0.0 < th < 1.0:
        raise SmoothcertError(f"the threshold percentile th must be in (0, 1), got {th}")
    return float(special.chdtri(d, 1.0 - th))


def _section(z: np.ndarray, d: int, t2: float) -> np.ndarray:
    """G(z) = P(χ²_{d−1} ≤ T² − z²): the ball's share of the hyperplane z₁ = z."""
    return special.chdtr(d - 1, np.maximum(t2 - z * z, 0.0))


def _nodes(low: float, high: float) -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss–Legendre nodes and weights on [low, high], panels of length ≤ 1."""
    panels = max(1, math.ceil(high - low))
    edges = np.linspace(low, high, panels + 1)
    half = np.diff(edges)[:, None] / 2.0
    z = (edges[:-1, None] + half) + half * _NODES[None, :]
    return z.ravel(), (half * _WEIGHTS[None, :]).ravel()


def section_integral(r, a: float, d: int, t2: float, low: float = -math.inf) -> np.ndarray:
    """J(r, a) = ∫_{max(−T, low)}^{min(a, T)} G(z) φ(z − r) dz for every r of ``r`` (1-D,
    σ units), its nodes within 12 of the r's (the Gaussian's mass beyond is < 2e-32)."""
    r = np.atleast_1d(np.asarray(r, dtype=np.float64))
    t = math.sqrt(t2)
    low = max(-t, low, float(r.min()) - TAIL)
    high = min(a, t, float(r.max()) + TAIL)
    if not high > low:
        return np.zeros_like(r)
    z, w = _nodes(low, high)
    g = w * _section(z, d, t2)
    dens = np.exp(-0.5 * (z[None, :] - r[:, None]) ** 2) / math.sqrt(2.0 * math.pi)
    return dens @ g


@functools.lru_cache(maxsize=256)
def _inner_table(d: int, th: float) -> tuple[np.ndarray, np.ndarray]:
    """A(a) = J(0, a) at unit-spaced edges from max(−T, −12) to min(T, 12) (cumulative)."""
    t = math.sqrt(ball(d, th))
    edges = np.append(np.arange(max(-t, -TAIL), min(t, TAIL), 1.0), min(t, TAIL))
    panels = [float(section_integral(0.0, hi, d, ball(d, th), low=lo)[0])
              for lo, hi in zip(edges[:-1], edges[1:])]
    return edges, np.concatenate([[0.0], np.cumsum(panels)])


def inner_mass(a: float, d: int, th: float) -> float:
    """A(a) = P(‖δ‖ ≤ T, δ₁ < a) (σ units): the cached table, then one panel to a."""
    edges, cumulative = _inner_table(d, th)
    if a <= edges[0]:
        return 0.0
    k = min(int(np.searchsorted(edges, a)) - 1, len(edges) - 2)
    top = min(a, edges[-1])
    part = section_integral(0.0, top, d, ball(d, th), low=float(edges[k]))[0]
    return float(cumulative[k] + part)


def _lower_root(f, target: float, t: float) -> float:
    """A point a ≤ the root of the increasing f (f(a) + margin ≤ target; −∞ when even f's
    infimum fails, T when f stays below): the root by Brent's method, then stepped down
    until the margin check passes."""
    low, high = -t - TAIL, t
    if f(low) + INTEGRATION_MARGIN > target:
        return -math.inf
    if f(high) + INTEGRATION_MARGIN <= target:
        return high
    a = optimize.brentq(lambda v: f(v) + INTEGRATION_MARGIN - target, low, high, xtol=1e-12)
    step = 1e-10
    while f(a) + INTEGRATION_MARGIN > target:
        a, step = a - step, step * 4.0
    return a


@functools.lru_cache(maxsize=65536)
def thresholds(p: float, q: float, d: int, th: float) -> tuple[float, float]:
    """Lower bounds (a₁, a₂) of the worst classifier's thresholds for E_P f ≥ p, E_Q f ≥ q
    (this module's doc; σ units, a₁ may be −∞). Cached: a run repeats its count pairs."""
    t = math.sqrt(ball(d, th))
    a_np = float(special.ndtri(p))
    a2 = _lower_root(lambda a: inner_mass(a, d, th), q * th, t)
    a1 = _lower_root(lambda a: float(special.ndtr(a)) - inner_mass(a, d, th), p - q * th, t)
    if not math.isfinite(a2):
        a2 = -t
    return min(a_np, a1), max(a_np, a2)


@functools.lru_cache(maxsize=1024)
def _weighted_section(a: float, d: int, th: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes z and weights·G(z) of J(r, a) for every r ≥ 0 (from max(−T, −12) to min(a, T))."""
    t2 = ball(d, th)
    t = math.sqrt(t2)
    low, high = max(-t, -TAIL), min(a, t)
    if not high > low:
        return np.zeros(0), np.zeros(0)
    z, w = _nodes(low, high)
    return z, w * _section(z, d, t2)


def _shifted(r: np.ndarray, a: float, d: int, th: float) -> np.ndarray:
    """J(r, a) for r ≥ 0 on the cached nodes of a."""
    z, g = _weighted_section(a, d, th)
    dens = np.exp(-0.5 * (z[None, :] - r[:, None]) ** 2) / math.sqrt(2.0 * math.pi)
    return dens @ g


def worst_case_mass(r, p: float, q: float, d: int, th: float) -> np.ndarray:
    """A lower bound of R(r) = min P_r(f) over E_P f ≥ p, E_Q f ≥ q, per r ≥ 0 (σ units)."""
    a1, a2 = thresholds(p, q, d, th)
    r = np.atleast_1d(np.asarray(r, dtype=np.float64))
    mass = special.ndtr(a1 - r) + _shifted(r, a2, d, th)
    if math.isfinite(a1):
        mass = mass - _shifted(r, a1, d, th)
    return mass - 2.0 * INTEGRATION_MARGIN


def dsrs_radius(p_lower: float, q_lower: float, sigma: float, d: int, th: float, *,
                search: str = "precise", unit: float = 0.01, tol: float = 1e-5) -> float:
    """The certified ℓ2 radius of DSRS (this module's doc) from p_lower ≤ P(f(x+δ)=c_A) under
    N(0, σ²I) and q_lower ≤ the same under Q (P conditioned on ‖δ‖ ≤ T, P(‖δ‖ ≤ T) = ``th``),
    in ``d`` dimensions: ≥ Cohen's σΦ⁻¹(p_lower); 0.0 when p_lower ≤ ½.

    ``search`` "grid" walks r from Cohen's radius in steps of ``unit``·σ and returns the last
    step before the first one that fails; "precise" (default) then bisects that step to
    ``tol``·σ. Deterministic, cached on its arguments."""
    if search not in SEARCHES:
        raise SmoothcertError(f"search must be one of {SEARCHES}, got {search!r}")
    for name, value in (("p_lower", p_lower), ("q_lower", q_lower)):
        check_in_range(name, value, 0.0, 1.0)
    check_positive_finite("sigma", sigma)
    return sigma * _radius(float(p_lower), float(q_lower), int(d), float(th), search,
                           float(unit), float(tol))


@functools.lru_cache(maxsize=65536)
def _radius(p: float, q: float, d: int, th: float, search: str, unit: float,
            tol: float) -> float:
    """:func:`dsrs_radius` in σ units."""
    if not p > 0.5:
        return 0.0
    cohen = float(special.ndtri(p))
    q = min(max(q, 0.0), 1.0)
    need = 0.5 + CURVATURE * unit * unit
    first, size = 0, 16
    while True:  # chunks of grid steps from Cohen's radius (included), doubling, until one fails
        grid = cohen + unit * np.arange(first, first + size)
        ok = worst_case_mass(grid, p, q, d, th) >= need
        if not ok.all():
            break
        first, size = first + size, 2 * size
    fails = first + int(np.argmin(ok))
    if fails == 0:  # not even Cohen's radius with the margins: Cohen's certificate
        return cohen
    low = cohen + unit * (fails - 1)
    if search == "grid":
        return max(cohen, low)
    high = cohen + unit * fails
    while high - low > tol:  # R ≥ need at low: keep the half whose left end passes
        mid = 0.5 * (low + high)
        if worst_case_mass(mid, p, q, d, th)[0] >= need:
            low = mid
        else:
            high = mid
    return max(cohen, low)
