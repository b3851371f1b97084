"""Double Sampling Randomized Smoothing (Li, Zhang, Xie & Li, ICML 2022, arXiv 2206.07912).

Besides p_A under the run's Gaussian P = N(0, σ²I), estimate the top class's probability q_A
under a second distribution Q, the Gaussian conditioned on ‖δ‖₂ ≤ T (the authors'
thresholded Gaussian, :class:`~smoothcert.noise.dsrs_q.TruncatedGaussian`); the two bounds
together certify an ℓ2 radius at least Cohen's, larger when q_A is above what the
Neyman–Pearson halfspace would have under Q (:mod:`smoothcert.stats.dsrs`).

Per input: ĉ_A from ``n0`` selection draws under P, then n_P = n − nq estimation draws under P
and nq = round(q_share·n) under Q (the run's ``--n`` is the budget of both: the authors
compare DSRS with 50,000 + 50,000 draws to CERTIFY with 100,000). One-sided Clopper–Pearson
lower bounds: p_lower at α·alpha_split, q_lower at α·(1 − alpha_split) (a union bound: both
hold with probability ≥ 1 − α). Q's threshold T² = σ²·F⁻¹_{χ²_d}(th): a fixed percentile th in
(0, 1), or ``x``, the authors' heuristic from p_lower, th = 0.08·(−ln(1 − p_lower) − 5) + 0.6
(0.5 below p_lower ½; clipped to [0.05, 0.99]), chosen before the Q draws, which are fresh, so
q_lower's bound holds given th. Guarantee: with probability ≥ 1 − α over the draws, the
smoothed classifier predicts ``predict`` on the ℓ2 ball of ``radius`` (≥ ``radius_np`` =
σΦ⁻¹(p_lower), Cohen's radius at the same p_lower); −1 (radius 0) when p_lower < ½, and then
no Q draw is made (nq 0).

Deviations from the authors' code: their Clopper–Pearson intervals are two-sided (α = 0.0005
per sampling) and their ``check`` also uses the upper bounds; we use the one-sided lower bounds
at the split α (the upper bounds tighten the certificate only when q_A's upper bound is
below the Q-mass of Cohen's halfspace, where the lower bounds alone give Cohen's radius:
:mod:`smoothcert.stats.dsrs`). Their ``x+`` (the README's best; ``x`` except when all P
votes are for ĉ_A, where the Q budget is drawn under P instead and pooled) is not offered: the
default is ``x``. Q as a Gaussian of another σ (their ``gaussian`` disttype) is not offered:
its certificate needs a 2-D integral.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from ..errors import SmoothcertError
from ..noise.dsrs_q import TruncatedGaussian
from ..registry import option
from ..smoothing.engine import Draws
from ..stats import clopper_pearson_lower
from ..stats.dsrs import MIN_DIM, SEARCHES, dsrs_radius
from .certifier import (
    CERTIFY_COLUMNS,
    Certifier,
    converted_radii,
    radius_columns,
    register_certifier,
)
from .certify import note_too_few_draws
from .columns import Relation, count, distance, probability


def parse_th(text: str) -> float | None:
    """A threshold percentile in (0, 1) as a float, or None for the heuristic ``x``."""
    if text == "x":
        return None
    try:
        th = float(text)
    except ValueError:
        th = math.nan
    if not 0.0 < th < 1.0:
        raise SmoothcertError(f"dsrs: th must be a percentile in (0, 1) or 'x', got {text!r}")
    return th


def th_text(value) -> str:
    """The ``th`` option as text (the CLI's ``--opt th=0.5`` arrives as a number)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SmoothcertError(f"dsrs: th must be a percentile in (0, 1) or 'x', got {value!r}")
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
    """Double sampling (Li et al. 2022): p_A under the Gaussian, q_A under it truncated to a
    ball; an ℓ2 radius never below CERTIFY's at the same p_lower (the module's doc)."""

    @dataclass(frozen=True)
    class Options:
        th: str = option("x", "Q's ball as a percentile of ‖δ‖'s law, in (0, 1), or x: the "
                         "authors' heuristic from p_lower", convert=th_text)
        q_share: float = option(0.5, "share of --n drawn under Q (the rest under P)")
        alpha_split: float = option(0.5, "share of --alpha for p_lower (the rest for q_lower)")
        search: str = option("precise", "radius search: precise (bisection) or grid",
                             choices=SEARCHES)
        unit: float = option(0.01, "radius search step, in units of sigma")

        def __post_init__(self):
            parse_th(self.th)
            for name in ("q_share", "alpha_split"):
                if not 0.0 < getattr(self, name) < 1.0:
                    raise SmoothcertError(f"dsrs: {name} must be in (0, 1), got "
                                          f"{getattr(self, name)}")
            if not 0.0 < self.unit <= 1.0:
                raise SmoothcertError(f"dsrs: unit must be in (0, 1], got {self.unit}")

    columns = CERTIFY_COLUMNS[:-1] + ("q_lower", "nQ", "nq", "th", "radius_np", "seed")
    column_rules = {"q_lower": probability("q_lower"), "nQ": count("nQ"), "nq": count("nq"),
                    "th": probability("th"), "radius_np": distance("radius_np")}
    relations = (
        Relation(("nQ", "nq"), lambda a, n: a > n, lambda a, n: f"nQ is {a}, more than nq ({n})"),
        Relation(("radius", "radius_np"), lambda r, c: r < c,
                 lambda r, c: f"radius is {r}, below Cohen's radius_np {c}"),
    )
    needs_n0 = True
    noises = ("gaussian",)

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
        note_too_few_draws(config, lambda n: None if clopper_pearson_lower(
            split_draws(n, self.q_share)[0], split_draws(n, self.q_share)[0],
            config.alpha * self.alpha_split) > 0.5 else "p_lower <= 1/2 under P")

    def program(self, run, x, label, idx, generator):
        cfg, smoothed = run.config, run.smoothed
        sigma, d = smoothed.noise.scalar_sigma(), x.numel()
        if d < MIN_DIM:
            raise SmoothcertError(f"dsrs needs inputs of at least {MIN_DIM} coordinates, "
                                  f"got {d}")
        x = smoothed.prepare_input(x, generator)
        n_p, nq = split_draws(cfg.n, self.q_share)
        selection, estimation = yield Draws(x, smoothed.noise, (cfg.n0, n_p), generator)
        c_hat = int(selection.argmax())
        n_a = int(estimation[c_hat])
        p_lower = clopper_pearson_lower(n_a, n_p, cfg.alpha * self.alpha_split)
        th = parse_th(self.th)
        th = heuristic_th(p_lower) if th is None else th
        n_qa = 0
        if p_lower >= 0.5:  # an abstention needs no Q draw
            (q_counts,) = yield Draws(x, TruncatedGaussian(sigma, th), (nq,), generator)
            n_qa = int(q_counts[c_hat])
        c = dsrs_certificate(n_a, n_p, n_qa, nq if p_lower >= 0.5 else 0, cfg.alpha,
                             self.alpha_split, sigma, d, th, search=self.search,
                             unit=self.unit)
        predict = -1 if c.abstained else c_hat
        return {"predict": predict, "radius": c.radius, "correct": int(predict == label),
                "p_lower": c.p_lower, "nA": n_a, "n0": cfg.n0, "n": n_p, "alpha": cfg.alpha,
                "sigma": sigma, **radius_columns(converted_radii(c.radius, "l2", d)),
                "q_lower": c.q_lower, "nQ": n_qa, "nq": c.nq, "th": th,
                "radius_np": c.radius_np}


@dataclass(frozen=True)
class DSRSCertificate:
    """Unless ``abstained`` (p_lower < ½: radius 0), with probability ≥ 1 − α over the draws
    the smoothed classifier keeps its class on the ℓ2 ball of ``radius`` ≥ ``radius_np``."""

    radius: float
    radius_np: float
    abstained: bool
    p_lower: float
    q_lower: float
    nq: int


def dsrs_certificate(n_a: int, n_p: int, n_qa: int, nq: int, alpha: float,
                     alpha_split: float, sigma: float, d: int, th: float, *,
                     search: str = "precise", unit: float = 0.01) -> DSRSCertificate:
    """The certificate of ĉ_A from its votes: ``n_a`` of ``n_p`` draws under P, ``n_qa`` of
    ``nq`` under Q (ball of P-mass ``th``, chosen before the Q draws), in ``d`` dimensions;
    p_lower at α·alpha_split, q_lower at α·(1 − alpha_split) (0 when nq is 0)."""
    p_lower = clopper_pearson_lower(n_a, n_p, alpha * alpha_split)
    q_lower = clopper_pearson_lower(n_qa, nq, alpha * (1.0 - alpha_split)) if nq else 0.0
    if p_lower < 0.5:
        return DSRSCertificate(0.0, 0.0, True, p_lower, q_lower, nq)
    radius_np = sigma * float(ndtri(p_lower))
    radius = max(radius_np, dsrs_radius(p_lower, q_lower, sigma, d, th, search=search,
                                        unit=unit))
    return DSRSCertificate(radius, radius_np, False, p_lower, q_lower, nq)
