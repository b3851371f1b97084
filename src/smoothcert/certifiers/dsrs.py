"""Double Sampling Randomized Smoothing (Li, Zhang, Xie & Li, ICML 2022, arXiv 2206.07912).

Besides p_A under the run's noise P — the Gaussian, or the generalized Gaussian of the paper's
headline table (``--noise general-gaussian:k=380``) — estimate the top class's probability q_A
under a second distribution Q: P truncated to a ball (``q=ball``, the authors' ``-th``
distributions: their choice on ImageNet) or the same family at a smaller σ (``q=scale``, σ_Q =
q_scale·σ: their choice on MNIST and CIFAR-10, 0.8σ). The two bounds together certify an ℓ2
radius at least Neyman–Pearson's from p alone, larger when q_A is above what the
Neyman–Pearson set has under Q (:mod:`smoothcert.stats.radial_dual`).

Per input: ĉ_A from ``n0`` selection draws under P (or, with ``count=label``, the authors'
counting: the votes of the true label, no selection draws; predict is the label when
certified), then n_P = n − nq estimation draws under P and nq = round(q_share·n) under Q (the
run's ``--n`` is the budget of both: the authors compare DSRS with 50,000 + 50,000 draws to
Neyman–Pearson with 100,000). Clopper–Pearson lower bounds: p_lower at α·alpha_split, q_lower
at α·(1 − alpha_split) (a union bound: both hold with probability ≥ 1 − α); with
``bounds=two-sided`` each at half its share, the levels of the authors' two-sided intervals.
Q's ball: a fixed percentile ``th`` of P's mass, ``x`` (the authors' heuristic from p_lower,
th = 0.08·(−ln(1 − p_lower) − 5) + 0.6; 0.5 below p_lower ½; clipped to [0.05, 0.99]) or
``x+`` (default; the README's best): ``x``, except where every P draw voted ĉ_A, where the Q
budget is drawn under P instead and pooled with the P draws, and the radius is Neyman–Pearson's
at the pooled count (th recorded as 1), bounded at p_lower's share of α: the failure events
{unanimous, pooled bound wrong} and {not unanimous, p_lower wrong} together have probability at
most that share (where p^n_P ≥ the share a unanimous p_lower is right, else the first lies in
the second's {n_A ≥ its threshold}), so with q_lower's share the union stays α (the authors
bound the pooled count at all of α, which this argument does not cover). The ball is chosen
before the Q draws, which are fresh, so q_lower's bound holds given it. Guarantee: with
probability ≥ 1 − α over the draws, the smoothed classifier predicts ``predict`` on the ℓ2 ball
of ``radius`` (≥ ``radius_np``, Neyman–Pearson's at the same p_lower); −1 (radius 0) when
p_lower ≤ ½, and then no Q draw is made (nq 0). Deviations from the authors' code: their
certificate (``algo.py``: ``check``) also uses the upper bounds of the two-sided intervals;
ours uses the lower bounds only (sound; the upper bounds add only where q_A's upper bound is
below the Q-mass of the Neyman–Pearson set). Their radius is a binary search; ours a walk that
needs no monotonicity (radial_dual's doc; the Gaussian with its ball, the common case, takes
:mod:`smoothcert.stats.dsrs`'s faster 1-D integrals, which agree with it).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from ..errors import SmoothcertError
from ..noise.dsrs_q import TruncatedGaussian
from ..registry import option
from ..smoothing.engine import Draws
from ..stats import clopper_pearson_lower
from ..stats.dsrs import MIN_DIM, dsrs_radius
from ..stats.radial_dual import Problem, RadialLaw, certified_radius
from .certifier import (
    CERTIFY_COLUMNS,
    Certifier,
    converted_radii,
    radius_columns,
    register_certifier,
)
from .certify import note_too_few_draws
from .columns import Relation, count, distance, probability

HEURISTICS = ("x", "x+")


def parse_th(text: str) -> float | str:
    """A threshold percentile in (0, 1) as a float, or the heuristic ``x`` / ``x+``."""
    if text in HEURISTICS:
        return text
    try:
        th = float(text)
    except ValueError:
        th = math.nan
    if not 0.0 < th < 1.0:
        raise SmoothcertError(f"dsrs: th must be a percentile in (0, 1), x or x+, got {text!r}")
    return th


def th_text(value) -> str:
    """The ``th`` option as text (the CLI's ``--opt th=0.5`` arrives as a number)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SmoothcertError(f"dsrs: th must be a percentile in (0, 1), x or x+, got {value!r}")
    return str(value)


def heuristic_th(p_lower: float) -> float:
    """The authors' ``x`` (``th_heuristic.get_beta``): 0.08·(−ln(1 − p) − 5) + 0.6 for p ≥ ½,
    else 0.5; clipped to [0.05, 0.99] (a ball of P-mass in (0, 1))."""
    if p_lower < 0.5:
        return 0.5
    if p_lower >= 1.0:
        return 0.99
    return min(max(0.08 * (-math.log1p(-p_lower) - 5.0) + 0.6, 0.05), 0.99)


def split_draws(n: int, q_share: float) -> tuple[int, int]:
    """(n_P, nq): the estimation budget ``n`` split, nq = round(q_share·n)."""
    nq = int(round(q_share * n))
    return n - nq, nq


@register_certifier("dsrs")
class DSRS(Certifier):
    """Double sampling (Li et al. 2022): p_A under the (generalized) Gaussian P, q_A under Q,
    P in a ball or at a smaller σ; an ℓ2 radius never below Neyman–Pearson's at the same
    p_lower (the module's doc)."""

    @dataclass(frozen=True)
    class Options:
        q: str = option("ball", "Q: ball (P truncated to a ball of P-mass th) or scale (P's "
                        "family at sigma q_scale*sigma)", choices=("ball", "scale"))
        th: str = option("x+", "Q's ball as a percentile of P's mass, in (0, 1), or x / x+: "
                         "the authors' heuristics from p_lower (x+: Q drawn under P and pooled "
                         "where every P draw agrees)", convert=th_text)
        q_scale: float = option(0.8, "with q=scale: sigma_Q / sigma, in (0, 1) (the authors: "
                                "0.8)")
        q_share: float = option(0.5, "share of --n drawn under Q (the rest under P)")
        alpha_split: float = option(0.5, "share of --alpha for p_lower (the rest for q_lower)")
        bounds: str = option("lower", "lower: one-sided bounds; two-sided: each at the level "
                             "of the authors' two-sided intervals", choices=("lower", "two-sided"))
        count: str = option("selection", "selection: c_A from --n0 draws; label: the votes of "
                            "the true label, no selection draws (the authors')",
                            choices=("selection", "label"))
        tol: float = option(1e-4, "radius tolerance, in units of sigma")

        def __post_init__(self):
            parse_th(self.th)
            for name in ("q_share", "alpha_split", "q_scale"):
                if not 0.0 < getattr(self, name) < 1.0:
                    raise SmoothcertError(f"dsrs: {name} must be in (0, 1), got "
                                          f"{getattr(self, name)}")
            if not 0.0 < self.tol <= 0.1:
                raise SmoothcertError(f"dsrs: tol must be in (0, 0.1], got {self.tol}")

    columns = CERTIFY_COLUMNS[:-1] + ("q_lower", "nQ", "nq", "th", "radius_np", "seed")
    column_rules = {"q_lower": probability("q_lower"), "nQ": count("nQ"), "nq": count("nq"),
                    "th": probability("th"), "radius_np": distance("radius_np")}
    relations = (
        Relation(("nQ", "nq"), lambda a, n: a > n, lambda a, n: f"nQ is {a}, more than nq ({n})"),
        Relation(("radius", "radius_np"), lambda r, c: r < c,
                 lambda r, c: f"radius is {r}, below Neyman-Pearson's radius_np {c}"),
    )
    needs_n0 = True
    noises = ("gaussian", "general-gaussian")

    def row_passes(self, records):
        """n0 + n (under P) + nq (the draws under Q; 0 where it abstained before them)."""
        return super().row_passes(records) + np.asarray(records["nq"], dtype=np.float64)

    def check(self, config):
        """A note when the P share of ``n`` cannot certify any input (p_lower ≤ ½ at n_P of
        n_P votes), and a refusal of a budget too small to split."""
        n_p, nq = split_draws(config.n, self.q_share)
        if n_p < 1 or nq < 1:
            raise SmoothcertError(f"dsrs: --n {config.n} with q_share {self.q_share} leaves "
                                  f"{n_p} draws under P and {nq} under Q; each needs >= 1")
        level = config.alpha * self.alpha_split / (2.0 if self.bounds == "two-sided" else 1.0)
        note_too_few_draws(config, lambda n: None if clopper_pearson_lower(
            split_draws(n, self.q_share)[0], split_draws(n, self.q_share)[0],
            level) > 0.5 else "p_lower <= 1/2 under P")

    def program(self, run, x, label, idx, generator):
        cfg, smoothed = run.config, run.smoothed
        noise, d = smoothed.noise, x.numel()
        k = float(getattr(noise, "k", None) or 0.0)
        design = Design(d, k, self.q, self.q_scale, self.alpha_split, self.bounds, self.tol)
        x = smoothed.prepare_input(x, generator)
        n_p, nq = split_draws(cfg.n, self.q_share)
        if self.count == "label":
            if not 0 <= int(label) < smoothed.num_classes:
                raise SmoothcertError(f"dsrs with count=label needs labelled inputs; input "
                                      f"{idx} has label {int(label)}")
            (estimation,) = yield Draws(x, noise, (n_p,), generator)
            c_hat, n0 = int(label), 0
        else:
            selection, estimation = yield Draws(x, noise, (cfg.n0, n_p), generator)
            c_hat, n0 = int(selection.argmax()), cfg.n0
        n_a = int(estimation[c_hat])
        p_lower = design.p_lower(n_a, n_p, cfg.alpha)
        th = self._threshold(p_lower, n_a == n_p)
        n_qa, drawn = 0, 0
        if p_lower >= 0.5:  # an abstention needs no Q draw
            q_noise = design.q_noise(noise, th)
            (q_counts,) = yield Draws(x, q_noise, (nq,), generator)
            n_qa, drawn = int(q_counts[c_hat]), nq
        c = scaled(design.certificate(n_a, n_p, n_qa, drawn, cfg.alpha, th),
                   noise.scalar_sigma())
        predict = -1 if c.abstained else c_hat
        return {"predict": predict, "radius": c.radius, "correct": int(predict == label),
                "p_lower": c.p_lower, "nA": n_a, "n0": n0, "n": n_p, "alpha": cfg.alpha,
                "sigma": noise.scalar_sigma(),
                **radius_columns(converted_radii(c.radius, "l2", d)),
                "q_lower": c.q_lower, "nQ": n_qa, "nq": c.nq, "th": th, "radius_np": c.radius_np}

    def _threshold(self, p_lower: float, unanimous: bool) -> float:
        """Q's ball: the option's percentile, the heuristic ``x``, or 1 (Q = P, pooled) for
        ``x+`` where every P draw voted ĉ_A; 1 also for ``q=scale`` (no ball)."""
        th = parse_th(self.th)
        if self.q == "scale" or (th == "x+" and unanimous):
            return 1.0
        return heuristic_th(p_lower) if isinstance(th, str) else th


@dataclass(frozen=True)
class DSRSCertificate:
    """Unless ``abstained`` (p_lower ≤ ½: radius 0), with probability ≥ 1 − α over the draws
    the smoothed classifier keeps its class on the ℓ2 ball of ``radius`` ≥ ``radius_np``."""

    radius: float
    radius_np: float
    abstained: bool
    p_lower: float
    q_lower: float
    nq: int


@dataclass(frozen=True)
class Design:
    """P (the generalized Gaussian of ``k``, k = 0 the Gaussian) and Q in ``d`` dimensions, and
    how the draws become bounds (the certifier's options)."""

    d: int
    k: float = 0.0
    q: str = "ball"
    q_scale: float = 0.8
    alpha_split: float = 0.5
    bounds: str = "lower"
    tol: float = 1e-4

    @property
    def scale(self) -> float:
        """s/σ = √(d/(d − 2k)): the radial laws' unit."""
        m = self.d - 2.0 * self.k
        if self.d < 2 or m < 2:
            raise SmoothcertError(f"dsrs needs d >= 2 and d - 2k >= 2, got d = {self.d}, "
                                  f"k = {self.k:g}")
        return math.sqrt(self.d / m)

    def level(self, share: float, alpha: float) -> float:
        """The one-sided level of a bound given ``share`` of α (half of it when two-sided)."""
        return alpha * share / (2.0 if self.bounds == "two-sided" else 1.0)

    def p_lower(self, n_a: int, n_p: int, alpha: float) -> float:
        return clopper_pearson_lower(n_a, n_p, self.level(self.alpha_split, alpha))

    def q_noise(self, noise, th: float):
        """Q's sampler: P itself (th 1: x+ pooled), P in the ball, or P's family at q_scale·σ."""
        if self.q == "scale":
            return type(noise)(self.q_scale * noise.scalar_sigma())
        return noise if th >= 1.0 else TruncatedGaussian(noise.scalar_sigma(), th, self.k)

    def certificate(self, n_a: int, n_p: int, n_qa: int, nq: int, alpha: float,
                    th: float) -> DSRSCertificate:
        """The certificate (radii in units of σ) of ĉ_A from ``n_a`` of ``n_p`` votes under P
        and ``n_qa`` of ``nq`` under Q (chosen before the Q draws; ``nq`` 0: none drawn).
        With th = 1 under a ball (x+), Q is P: the counts are pooled, bounded at p_lower's
        share of α (the module's doc), Neyman–Pearson's radius."""
        s = self.scale
        if nq and self.q == "ball" and th >= 1.0:
            pooled = self.p_lower(n_a + n_qa, n_p + nq, alpha)
            radius = s * _radius(self, pooled, 0.0, 1.0) if pooled > 0.5 else 0.0
            return DSRSCertificate(radius, radius, pooled <= 0.5, pooled, 0.0, nq)
        p_lower = self.p_lower(n_a, n_p, alpha)
        q_lower = clopper_pearson_lower(n_qa, nq, self.level(1.0 - self.alpha_split, alpha)) \
            if nq else 0.0
        if p_lower <= 0.5:
            return DSRSCertificate(0.0, 0.0, True, p_lower, q_lower, nq)
        radius_np = s * _radius(self, p_lower, 0.0, 1.0)
        both = s * _radius(self, p_lower, q_lower, th) if nq else radius_np
        return DSRSCertificate(max(both, radius_np), radius_np, False, p_lower, q_lower, nq)

    def problem(self, th: float, with_q: bool) -> Problem:
        """The laws in units of s: P, and Q (its ball of P-mass th, or the smaller scale)."""
        p_law = RadialLaw(self.d, self.k)
        if not with_q:
            return Problem(p_law)
        if self.q == "scale":
            return Problem(p_law, RadialLaw(self.d, self.k, c=self.q_scale))
        cut = math.sqrt(2.0 * special.gammaincinv((self.d - 2.0 * self.k) / 2.0, th))
        return Problem(p_law, RadialLaw(self.d, self.k, cut=cut))


@functools.lru_cache(maxsize=65536)
def _radius(design: Design, p: float, q: float, th: float) -> float:
    """The certified radius in units of s (cached: a run repeats its count pairs); q = 0: from
    p alone. The Gaussian (k = 0) takes its fast paths: Cohen's σΦ⁻¹(p) alone, and with its
    ball :func:`~smoothcert.stats.dsrs.dsrs_radius` (1-D halfspace integrals, ~3 ms against
    ~0.3 s for the dual; the two agree to 1e-4 relative: tests/stats/test_radial_dual.py)."""
    if design.k == 0 and q == 0:
        return float(special.ndtri(p)) if p > 0.5 else 0.0
    if design.k == 0 and design.q == "ball" and design.d >= MIN_DIM:
        return dsrs_radius(p, q, 1.0, design.d, th)
    return certified_radius(design.problem(th, q > 0), p, q, tol=design.tol / design.scale)


def dsrs_certificate(n_a: int, n_p: int, n_qa: int, nq: int, alpha: float,
                     alpha_split: float, sigma: float, d: int, th: float,
                     **design) -> DSRSCertificate:
    """The certificate of ĉ_A in pixel units: :meth:`Design.certificate` scaled by σ, for a
    fixed ball ``th`` (or, with ``q="scale"`` in ``design``, Q at q_scale·σ)."""
    c = Design(d, alpha_split=alpha_split, **design).certificate(n_a, n_p, n_qa, nq, alpha, th)
    return scaled(c, sigma)


def scaled(c: DSRSCertificate, sigma: float) -> DSRSCertificate:
    """A certificate in units of σ (:meth:`Design.certificate`) in pixel units."""
    return DSRSCertificate(sigma * c.radius, sigma * c.radius_np, c.abstained, c.p_lower,
                           c.q_lower, c.nq)
