"""ℓ2 certificates of radial smoothing distributions by the Lagrangian dual: Neyman–Pearson for
the generalized Gaussian P (Zhang et al. 2020; Li et al. 2022's P-only baseline) and double
sampling with a second distribution Q (Li, Zhang, Xie & Li, ICML 2022, DSRS: Q a generalized
Gaussian of another scale, or P truncated to a ball).

P has density ∝ ‖z‖^(−2k)·exp(−‖z‖²/2s²) in d dimensions (k = 0: the Gaussian), so ‖z‖²/s² ~
χ²_m with m = d − 2k. Everything here is in units of s (radii scale with it).

For a shift δ, ‖δ‖ = r, the smoothed classifier keeps its class when R(r) > ½, where R(r) is
the least P_δ(f) (P shifted by δ) over classifiers f with E_P f ≥ p (and E_Q f ≥ q). For ANY
λ₁, λ₂ ≥ 0, weak duality gives, with A = {u : p_δ(u) < λ₁p(u) + λ₂q(u)},

    R(r) ≥ D(λ) = λ₁·(p − P(A)) + λ₂·(q − Q(A)) + P_δ(A)

(E_{P_δ} f ≥ E_{P_δ} f − λ₁(E_P f − p) − λ₂(E_Q f − q) ≥ λ₁p + λ₂q − ∫(λ₁p + λ₂q − p_δ)₊,
and ∫(λ₁p + λ₂q − p_δ)₊ = λ₁P(A) + λ₂Q(A) − P_δ(A)); at the best λ it is R (the
generalized Neyman–Pearson lemma). So the λ found by the search below only decides how tight
the bound is, never whether it holds. Since p, q are radial and decreasing in ‖u‖, A at a
point of norm ρ is ‖u − δ‖ > S(ρ) with S the radius where p falls to λ₁p(ρ) + λ₂q(ρ), and
P_δ(A) needs ‖v + δ‖ < M(‖v‖) for v ~ P, M the radius where λ₁p + λ₂q falls to p(‖v‖): with
the angle to δ, (1 + cos θ)/2 ~ Beta((d − 1)/2, (d − 1)/2), each mass is a one-dimensional
expectation over the radius of an incomplete beta function (composite Gauss–Legendre).

Soundness: each mass is computed twice, at ``PANELS`` and twice as many panels; their
difference (plus the quadrature range's tail mass, 2e-16) is taken as its error, and D is
lowered by (λ₁ + λ₂ + 1) times the largest. The radius is walked, not bisected: R is
Lipschitz in r with L = ½·E_P|∂₁ log p| = ½·E|cos θ|·E[ρ + 2k/ρ] (the feasible set does not
depend on δ, and TV(P, P_h) ≤ h·L), so a bound D(r_i) > ½ certifies every radius up to r_i +
(D(r_i) − ½)/L; the walk starts at R(0) ≥ p and stops when a step is below ``tol``. No
monotonicity of R in r is assumed. For k = 0 and no Q, the radius is Cohen's Φ⁻¹(p) within
``tol`` (tests).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

PANELS = 48  # panels of the radius's quadrature (16 Gauss–Legendre nodes each); 2× for errors
TAIL = 1e-17  # the quadrature covers the radius's quantiles TAIL to 1 − TAIL
LOG_LAMBDA = 60.0  # the searches of log λ stay in [−60, 60]
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(16)


@dataclass(frozen=True)
class RadialLaw:
    """The law of ‖z‖ (in P's units s) of a generalized Gaussian of ``k`` in ``d`` dimensions,
    scale ``c`` relative to P (Q of another σ: c = σ_Q/σ_P), truncated at ``cut`` (Q of
    DSRS's ball; inf: none)."""

    d: int
    k: float
    c: float = 1.0
    cut: float = math.inf

    @property
    def m(self) -> float:
        """Degrees of freedom of ‖z‖²/c²: d − 2k."""
        return self.d - 2.0 * self.k

    @functools.cached_property
    def log_mass(self) -> float:
        """log P(‖z‖ ≤ cut) of the untruncated law."""
        if math.isinf(self.cut):
            return 0.0
        return math.log(special.gammainc(self.m / 2.0, self.cut ** 2 / (2.0 * self.c ** 2)))

    def log_density(self, rho: np.ndarray) -> np.ndarray:
        """log of the density in R^d at norm ρ, up to a constant shared by every law of the
        same d and k (so P's and Q's compare): −2k·ln ρ − ρ²/2c² − m·ln c − log_mass."""
        with np.errstate(divide="ignore"):
            out = (-2.0 * self.k * np.log(rho) - rho * rho / (2.0 * self.c ** 2)
                   - self.m * math.log(self.c) - self.log_mass)
        return np.where(rho <= self.cut, out, -np.inf)

    @functools.lru_cache(maxsize=64)  # noqa: B019 (frozen, hashable: a few laws per run)
    def nodes(self, panels: int, breaks: tuple[float, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
        """Radii and weights of E[h(‖z‖)]: composite 16-point Gauss–Legendre on about
        ``panels`` panels between the law's TAIL and 1 − TAIL quantiles, with panel edges at
        the cut and at ``breaks`` (where h jumps or kinks: Gauss–Legendre needs it smooth)."""
        half_m = self.m / 2.0
        lo = self.c * math.sqrt(2.0 * special.gammaincinv(half_m, TAIL))
        hi = min(self.c * math.sqrt(2.0 * special.gammainccinv(half_m, TAIL)), self.cut)
        cuts = np.unique(np.clip([lo, *breaks, hi], lo, hi))
        edges = np.concatenate([np.linspace(a, b, max(2, round(panels * (b - a) / (hi - lo)))
                                            + 1)[:-1] for a, b in zip(cuts[:-1], cuts[1:])]
                               + [[hi]])
        half = np.diff(edges)[:, None] / 2.0
        rho = ((edges[:-1, None] + half) + half * _NODES[None, :]).ravel()
        log_pdf = ((self.m - 1.0) * np.log(rho) - rho * rho / (2.0 * self.c ** 2)
                   - self.m * math.log(self.c) - (half_m - 1.0) * math.log(2.0)
                   - special.gammaln(half_m) - self.log_mass)
        return rho, (half * _WEIGHTS[None, :]).ravel() * np.exp(log_pdf)


def p_level_radius(level: np.ndarray, k: float) -> np.ndarray:
    """S ≥ 0 where P's log density −2k·ln S − S²/2 equals ``level`` (0 where it never
    reaches it, inf for a level of −inf): for k > 0, S² = 2k·W(e^x), x = −level/k − ln 2k,
    by Newton on w + ln w = x."""
    level = np.asarray(level, dtype=np.float64)
    finite = np.isfinite(level)
    safe = np.where(finite, level, 0.0)
    if k == 0:
        s = np.sqrt(np.maximum(-2.0 * safe, 0.0))
    else:
        x = -safe / k - math.log(2.0 * k)
        w = np.where(x > 1.0, x - np.log(np.maximum(x, 1.0)), np.exp(np.minimum(x, 1.0)))
        for _ in range(40):
            w = np.maximum(w * (1.0 + x - np.log(w)) / (1.0 + w), 1e-300)
        s = np.sqrt(2.0 * k * w)
    return np.where(finite, s, np.where(level < 0, np.inf, 0.0))


def _beta_cdf(arg: np.ndarray, d: int) -> np.ndarray:
    """P((1 + cos θ)/2 ≤ arg) for a direction uniform on the sphere of R^d."""
    half = (d - 1) / 2.0
    return special.betainc(half, half, np.clip(arg, 0.0, 1.0))


@dataclass(frozen=True)
class Problem:
    """The certificate's laws: P, and Q (None for Neyman–Pearson alone), with Q's mass."""

    p_law: RadialLaw
    q_law: RadialLaw | None = None

    def threshold_level(self, rho, lam1: float, lam2: float) -> np.ndarray:
        """log(λ₁p(ρ) + λ₂q(ρ))."""
        out = _log_times(lam1, self.p_law.log_density(rho))
        if self.q_law is not None and lam2 > 0:
            out = np.logaddexp(out, _log_times(lam2, self.q_law.log_density(rho)))
        return out

    def mass_outside(self, law: RadialLaw, r: float, lam1: float, lam2: float,
                     panels: int) -> float:
        """``law``'s mass of the complement of A = {u : p_δ(u) < λ₁p(u) + λ₂q(u)}, ‖δ‖ = r >
        0: small where A's mass is near 1, so computed as itself (1 − P(A) would lose the
        digits that λ₁ multiplies)."""
        rho, w = law.nodes(panels, self._cuts())
        s = p_level_radius(self.threshold_level(rho, lam1, lam2), self.p_law.k)
        inside = ((rho + r) ** 2 - s * s) / (4.0 * rho * r)
        return float(w @ _beta_cdf(1.0 - inside, law.d))  # I_x(a, a) = 1 − I_(1−x)(a, a)

    def shifted_mass(self, r: float, lam1: float, lam2: float, panels: int) -> float:
        """P_δ(A), ‖δ‖ = r > 0: v ~ P, v + δ ∈ A when ‖v + δ‖ < M(‖v‖)."""
        rho, w = self.p_law.nodes(panels, self._shifted_breaks(lam1, lam2))
        target = self.p_law.log_density(rho)
        if self.q_law is None or lam2 == 0:
            big = p_level_radius(target - math.log(lam1), self.p_law.k) if lam1 > 0 else 0 * rho
        else:
            big = self._level_radius(target, lam1, lam2)
        return float(w @ _beta_cdf((big * big - (rho - r) ** 2) / (4.0 * rho * r),
                                   self.p_law.d))

    def _cuts(self) -> tuple[float, ...]:
        """Where the threshold λ₁p + λ₂q jumps: at Q's cut."""
        return () if self.q_law is None or math.isinf(self.q_law.cut) else (self.q_law.cut,)

    def _shifted_breaks(self, lam1: float, lam2: float) -> tuple[float, ...]:
        """The radii of v where M(‖v‖) kinks: p(‖v‖) at the threshold's values on either
        side of its jump."""
        if not self._cuts() or lam2 == 0:
            return ()
        cut = self.q_law.cut
        levels = self.threshold_level(np.array([cut * (1 - 1e-15), cut * (1 + 1e-15)]),
                                      lam1, lam2)
        return tuple(float(b) for b in p_level_radius(levels, self.p_law.k))

    def _level_radius(self, target: np.ndarray, lam1: float, lam2: float) -> np.ndarray:
        """M where log(λ₁p + λ₂q) (decreasing in the radius) falls to ``target``, by
        bisection (each M within 2^−80 of the bracket)."""
        lo = np.zeros_like(target)
        hi = np.full_like(target, 4.0 * (math.sqrt(self.p_law.d) + 10.0))
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            above = self.threshold_level(mid, lam1, lam2) > target
            lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
        return lo

    def dual(self, r: float, p: float, q: float, lam1: float, lam2: float) -> float:
        """A lower bound of R(r) from λ (the module's D), lowered by its quadrature error:
        D = λ₁·(P(Aᶜ) − (1 − p)) + λ₂·(Q(Aᶜ) − (1 − q)) + P_δ(A)."""
        parts = [lambda n: self.mass_outside(self.p_law, r, lam1, lam2, n),
                 lambda n: self.shifted_mass(r, lam1, lam2, n)]
        if self.q_law is not None and lam2 > 0:
            parts.append(lambda n: self.mass_outside(self.q_law, r, lam1, lam2, n))
        values, error = [], 0.0
        for part in parts:
            coarse, fine = part(PANELS), part(2 * PANELS)
            values.append(fine)  # floating point: ~1e-13 relative over the nodes' sum
            error = max(error, abs(fine - coarse) + 1e-13 * fine + 2.0 * TAIL)
        q_term = lam2 * (values[2] - (1.0 - q)) if len(values) > 2 else 0.0
        bound = lam1 * (values[0] - (1.0 - p)) + q_term + values[1]
        return bound - (lam1 + lam2 + 1.0) * error


def _log_times(lam: float, log_density: np.ndarray) -> np.ndarray:
    return log_density + math.log(lam) if lam > 0 else np.full_like(log_density, -np.inf)


def _root(f, lo: float, hi: float) -> float:
    """The root of the increasing f in [lo, hi] (an end where f keeps one sign)."""
    f_lo, f_hi = f(lo), f(hi)
    if f_lo >= 0:
        return lo
    if f_hi <= 0:
        return hi
    return optimize.brentq(f, lo, hi, xtol=1e-10)


def best_multipliers(problem: Problem, r: float, p: float, q: float,
                     panels: int = PANELS // 2) -> tuple[float, float]:
    """(λ₁, λ₂) near the dual optimum: λ₁ with P(A) = p for each λ₂, λ₂ with Q(A) = q
    (0 when Q's constraint adds nothing). Any pair is sound; this one makes D ≈ R."""

    def lam1_for(lam2: float) -> float:
        def excess(log1):  # P(A) − p
            return (1.0 - p) - problem.mass_outside(problem.p_law, r, math.exp(log1), lam2,
                                                    panels)
        if lam2 > 0 and problem.mass_outside(problem.p_law, r, 0.0, lam2, panels) <= 1.0 - p:
            return 0.0
        return math.exp(_root(excess, -LOG_LAMBDA, LOG_LAMBDA))

    if problem.q_law is None:
        return lam1_for(0.0), 0.0

    def q_excess(log2):  # Q(A) − q
        lam2 = math.exp(log2)
        return (1.0 - q) - problem.mass_outside(problem.q_law, r, lam1_for(lam2), lam2, panels)

    lam1 = lam1_for(0.0)
    if problem.mass_outside(problem.q_law, r, lam1, 0.0, panels) <= 1.0 - q:
        return lam1, 0.0
    lam2 = math.exp(_root(q_excess, -LOG_LAMBDA, LOG_LAMBDA))
    return lam1_for(lam2), lam2


def lower_bound(problem: Problem, r: float, p: float, q: float = 0.0) -> float:
    """A sound lower bound of R(r) (s units, r > 0)."""
    lam1, lam2 = best_multipliers(problem, r, p, q)
    return problem.dual(r, p, q, lam1, lam2)


def lipschitz(d: int, k: float) -> float:
    """L = ½·E|cos θ|·E[ρ + 2k/ρ] ≥ |R(r) − R(r')|/|r − r'| (s units; needs d − 2k > 1)."""
    m = d - 2.0 * k
    cos = math.exp(special.gammaln(d / 2.0) - special.gammaln((d + 1) / 2.0)) / math.sqrt(math.pi)
    mean = math.sqrt(2.0) * math.exp(special.gammaln((m + 1) / 2.0) - special.gammaln(m / 2.0))
    inverse = 0.0 if k == 0 else math.exp(
        special.gammaln((m - 1) / 2.0) - special.gammaln(m / 2.0)) / math.sqrt(2.0)
    return 0.5 * cos * (mean + 2.0 * k * inverse)


def certified_radius(problem: Problem, p: float, q: float = 0.0, *,
                     tol: float = 1e-4) -> float:
    """The radius (s units) on which R > ½ is certified by the Lipschitz walk (module doc);
    0.0 when p ≤ ½."""
    if not p > 0.5:
        return 0.0
    big_l = lipschitz(problem.p_law.d, problem.p_law.k)
    r, step = 0.0, (p - 0.5) / big_l  # R(0) ≥ p
    while step >= tol:
        r += step
        step = (lower_bound(problem, r, p, q) - 0.5) / big_l
    return r
